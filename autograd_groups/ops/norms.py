"""Vector norms and the ops built on them: ``vector_norm``, ``normalize``, ``cosine_similarity``.

Every p-norm of the library is the one composite :func:`p_norm`. Its derivative is singular where
the norm is 0 (``sqrt'(0)`` and the slope of ``s ** (1/p)`` at 0 are infinite) and, for ``p < 1``,
at every zero element (``|x| ** p`` has an infinite slope at 0). PyTorch's ``norm_backward`` returns
0 at both; the groups' rules in ``builtin.yaml`` do the same at the ``sqrt`` and ``pow`` nodes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from ..groups.group import autograd_group
from .autocast import autocast_policy

Dims = int | Sequence[int] | None


def reduce_dims(x: torch.Tensor, dim: Dims) -> tuple[int, ...]:
    """The dims a reduction over ``dim`` covers: all of them for None, as PyTorch's reductions.

    >>> reduce_dims(torch.zeros(2, 3), None), reduce_dims(torch.zeros(2, 3), -1)
    ((0, 1), (-1,))
    """
    if dim is None:
        return tuple(range(x.dim()))
    if isinstance(dim, int):
        return (dim,)
    return tuple(dim)


def check_order(p: float, op: str, name: str = "p", negative: bool = True) -> float:
    """``p`` as a float, for a p-norm: any order, or ``p >= 0`` where ``negative`` is False (the
    distances, which torch.cdist and torch.pdist refuse with this RuntimeError for ``p < 0``).

    >>> check_order(2, "ops.vector_norm")
    2.0
    """
    p = float(p)
    if p < 0 and not negative:
        raise RuntimeError(f"{op}: {op.removeprefix('ops.')} only supports non-negative p values, "
                           f"got {name}={p}")
    return p


def p_norm(x: torch.Tensor, p: float, dims: tuple[int, ...], keepdim: bool) -> torch.Tensor:
    """The ``p``-norm of ``x`` over ``dims``, from primitive ops (no special cases of its own).

    ``p = 0`` counts the nonzero elements (a gradient of 0, as torch's), ``p = -inf`` is the least
    absolute value, and other negative ``p`` give ``sum(|x| ** p) ** (1 / p)``, as torch's norms.

    >>> p_norm(torch.tensor([3.0, -4.0]), 2, (0,), False)
    tensor(5.)
    """
    if p == 2:
        return (x * x).sum(dims, keepdim=keepdim).sqrt()
    if p == 1:
        return x.abs().sum(dims, keepdim=keepdim)
    if p == math.inf:
        return x.abs().amax(dims, keepdim=keepdim)
    if p == -math.inf:
        return x.abs().amin(dims, keepdim=keepdim)
    if p == 0:
        return x.abs().sign().sum(dims, keepdim=keepdim)
    return x.abs().pow(p).sum(dims, keepdim=keepdim).pow(1 / p)


@autocast_policy(cpu="fallthrough", cuda="fp32")
@autograd_group("ops.vector_norm")
def vector_norm(x: torch.Tensor, ord: float = 2, dim: Dims = None, keepdim: bool = False, *,
                dtype: torch.dtype | None = None) -> torch.Tensor:
    """``torch.linalg.vector_norm``, any ``ord``; gradient 0 at a zero slice.

    >>> import torch, autograd_groups as ag
    >>> x = torch.tensor([[0.0, 0.0], [3.0, 4.0]], requires_grad=True)
    >>> ag.ops.vector_norm(x, dim=-1).sum().backward()
    >>> x.grad
    tensor([[0.0000, 0.0000],
            [0.6000, 0.8000]])
    """
    if dtype is not None:
        x = x.to(dtype)
    return p_norm(x, check_order(ord, "ops.vector_norm", "ord"), reduce_dims(x, dim), keepdim)


@autocast_policy(cpu="fallthrough", cuda="fp32")
@autograd_group("ops.normalize")
def normalize(input: torch.Tensor, p: float = 2.0, dim: int | Sequence[int] = 1,
              eps: float = 1e-12) -> torch.Tensor:
    """``torch.nn.functional.normalize``: ``input / max(norm, eps)``; at a zero vector ``grad / eps``.

    >>> import torch, autograd_groups as ag
    >>> x = torch.zeros(1, 2, requires_grad=True)
    >>> ag.ops.normalize(x, eps=0.5).sum().backward()
    >>> x.grad
    tensor([[2., 2.]])
    """
    norm = p_norm(input, check_order(p, "ops.normalize"), reduce_dims(input, dim), True)
    return input / norm.clamp_min(eps).expand_as(input)


def _guarded_norm(x: torch.Tensor, dim: int, eps: float) -> torch.Tensor:
    # As ATen's cosine_similarity: eps keeps the division finite but is no part of the function
    # being differentiated, so it is applied to a copy, outside autograd.
    norm = p_norm(x, 2, (dim,), True).clone()
    with torch.no_grad():
        norm.clamp_min_(eps)
    return norm


@autocast_policy(cpu="fallthrough", cuda="fp32")
@autograd_group("ops.cosine_similarity")
def cosine_similarity(x1: torch.Tensor, x2: torch.Tensor, dim: int = 1, eps: float = 1e-8) -> torch.Tensor:
    """``torch.nn.functional.cosine_similarity``; finite gradients at a zero vector, as PyTorch's.

    >>> import torch, autograd_groups as ag
    >>> a = torch.zeros(1, 2, requires_grad=True)
    >>> ag.ops.cosine_similarity(a, torch.tensor([[1.0, 0.0]])).sum().backward()
    >>> bool(torch.isfinite(a.grad).all())
    True
    """
    if x1.shape != x2.shape:
        x1, x2 = torch.broadcast_tensors(x1, x2)
    return ((x1 / _guarded_norm(x1, dim, eps)) * (x2 / _guarded_norm(x2, dim, eps))).sum(dim)

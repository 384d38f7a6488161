"""Moments: ``var`` and ``std``.

The deviations are taken from the mean of the data shifted by its first element, so a constant
slice has deviations, variance and standard deviation of exactly 0 whatever its value (a plain
``x - x.mean()`` leaves rounding residue there). ``std = sqrt(var)`` then has ``sqrt'(0) = inf`` at
a constant slice, where PyTorch's ``std_backward`` returns 0; the ``ops.std`` rule does the same.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..groups.group import autograd_group
from .autocast import autocast_policy
from .norms import Dims, reduce_dims


def _variance(x: torch.Tensor, dims: tuple[int, ...], correction: float, keepdim: bool) -> torch.Tensor:
    shift = x.detach()  # a constant shift leaves the variance and its gradient unchanged
    for d in dims:
        shift = shift.narrow(d, 0, 1)
    mean = shift + (x - shift).mean(dims, keepdim=True)
    # The squared deviations as one op that keeps x itself and the small mean for its backward,
    # where (d * d) keeps a new tensor of deviations, as large as x.
    squares = F.mse_loss(x, mean.expand_as(x), reduction="none")
    count = math.prod([x.shape[d] for d in dims])  # a list: Dynamo cannot trace a generator here
    return squares.sum(dims, keepdim=keepdim) / max(0, count - correction)


def _arguments(name: str, dim: Dims | bool, unbiased: bool | None,
               correction: float | None) -> tuple[Dims, float]:
    """``dim`` and the correction, from either of torch.var's signatures: ``(dim, *, correction)``
    with ``correction=None`` meaning 1, or ``(dim, unbiased)`` and ``(unbiased)``."""
    if isinstance(dim, bool):
        dim, unbiased = None, dim
    if unbiased is None:
        return dim, 1.0 if correction is None else correction
    if correction is not None:
        raise ValueError(f"{name}: got both unbiased={unbiased} and correction={correction}; "
                         f"pass one of them (unbiased=True is correction=1)")
    return dim, float(unbiased)


@autocast_policy(cpu="fallthrough", cuda="fallthrough")
@autograd_group("ops.var")
def var(input: torch.Tensor, dim: Dims | bool = None, unbiased: bool | None = None, keepdim: bool = False,
        *, correction: float | None = None) -> torch.Tensor:
    """``torch.var``: the variance over ``dim`` (all dims for None), divided by ``N - correction``.

    Both of torch.var's signatures: ``correction`` (None is 1), or ``unbiased`` (``True`` is
    ``correction=1``), also as the second positional argument.

    >>> import torch, autograd_groups as ag
    >>> ag.ops.var(torch.tensor([1.0, 2.0, 3.0])), ag.ops.var(torch.tensor([1.0, 2.0, 3.0]), False)
    (tensor(1.), tensor(0.6667))
    """
    dims, c = _arguments("ops.var", dim, unbiased, correction)
    return _variance(input, reduce_dims(input, dims), c, keepdim)


@autocast_policy(cpu="fallthrough", cuda="fallthrough")
@autograd_group("ops.std")
def std(input: torch.Tensor, dim: Dims | bool = None, unbiased: bool | None = None, keepdim: bool = False,
        *, correction: float | None = None) -> torch.Tensor:
    """``torch.std``: the square root of :func:`var` (same arguments); gradient 0 at a constant slice.

    >>> import torch, autograd_groups as ag
    >>> x = torch.full((2, 3), 0.1, requires_grad=True)
    >>> ag.ops.std(x, dim=-1).sum().backward()
    >>> x.grad
    tensor([[0., 0., 0.],
            [0., 0., 0.]])
    """
    dims, c = _arguments("ops.std", dim, unbiased, correction)
    return _variance(input, reduce_dims(input, dims), c, keepdim).sqrt()

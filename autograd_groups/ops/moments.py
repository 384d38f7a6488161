"""Moments: ``var`` and ``std``.

The deviations are taken from the mean of the data shifted by its first element, so a constant
slice has deviations, variance and standard deviation of exactly 0 whatever its value (a plain
``x - x.mean()`` leaves rounding residue there). ``std = sqrt(var)`` then has ``sqrt'(0) = inf`` at
a constant slice, where PyTorch's ``std_backward`` returns 0; the ``ops.std`` rule does the same.
"""

from __future__ import annotations

import math

import torch

from ..groups.group import autograd_group
from .norms import Dims, reduce_dims


def _variance(x: torch.Tensor, dims: tuple[int, ...], correction: float, keepdim: bool) -> torch.Tensor:
    shift = x.detach()  # a constant shift leaves the variance and its gradient unchanged
    for d in dims:
        shift = shift.narrow(d, 0, 1)
    centered = x - shift
    deviation = centered - centered.mean(dims, keepdim=True)
    count = math.prod(x.shape[d] for d in dims)
    return (deviation * deviation).sum(dims, keepdim=keepdim) / max(0, count - correction)


@autograd_group("ops.var")
def var(input: torch.Tensor, dim: Dims = None, *, correction: float = 1,
        keepdim: bool = False) -> torch.Tensor:
    """``torch.var``: the variance over ``dim`` (all dims for None), divided by ``N - correction``.

    >>> import torch, autograd_groups as ag
    >>> ag.ops.var(torch.tensor([1.0, 2.0, 3.0]))
    tensor(1.)
    """
    return _variance(input, reduce_dims(input, dim), correction, keepdim)


@autograd_group("ops.std")
def std(input: torch.Tensor, dim: Dims = None, *, correction: float = 1,
        keepdim: bool = False) -> torch.Tensor:
    """``torch.std``: the square root of :func:`var`; gradient 0 at a constant slice.

    >>> import torch, autograd_groups as ag
    >>> x = torch.full((2, 3), 0.1, requires_grad=True)
    >>> ag.ops.std(x, dim=-1).sum().backward()
    >>> x.grad
    tensor([[0., 0., 0.],
            [0., 0., 0.]])
    """
    return _variance(input, reduce_dims(input, dim), correction, keepdim).sqrt()

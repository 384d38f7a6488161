"""``logsumexp``: ``log(sum(exp(x - m))) + m``, with ``m`` the slice's largest element, outside autograd.

The shift keeps ``exp`` from overflowing and changes neither the value nor the gradient (the function
is shift-invariant). A slice that is all ``-inf`` (a fully masked row) has a sum of 0: the value is
``-inf``, as torch.logsumexp's, and ``log``'s slope ``1 / 0`` meets ``exp(-inf) = 0`` in the backward,
where torch.logsumexp's own gradient, ``exp(x - result) = exp(-inf + inf)``, is NaN. The group's rule
gives that slice the gradient 0, the limit of its softmax weights times a loss that ignores it.
"""

from __future__ import annotations

import math

import torch

from ..groups.group import autograd_group
from .autocast import autocast_policy
from .norms import Dims, reduce_dims


@autocast_policy(cpu="fallthrough", cuda="fp32")
@autograd_group("ops.logsumexp")
def logsumexp(input: torch.Tensor, dim: Dims, keepdim: bool = False) -> torch.Tensor:
    """``torch.logsumexp(input, dim, keepdim)``; gradient 0 for a slice that is all ``-inf``.

    >>> import torch, autograd_groups as ag
    >>> x = torch.tensor([[0.0, 0.0], [-math.inf, -math.inf]], requires_grad=True)
    >>> out = ag.ops.logsumexp(x, 1)
    >>> out.sum().backward()
    >>> out, x.grad
    (tensor([0.6931,   -inf], grad_fn=<AddBackward0>), tensor([[0.5000, 0.5000],
            [0.0000, 0.0000]]))
    """
    dims = reduce_dims(input, dim)
    with torch.no_grad():
        if input.numel() == 0:
            shift = torch.zeros_like(input.sum(dims, keepdim=True))
        else:
            # As ATen's logsumexp: an infinite maximum shifts by 0, so that inf - inf never occurs.
            shift = input.amax(dims, keepdim=True)
            shift.masked_fill_(shift.abs() == math.inf, 0)
    total = (input - shift).exp().sum(dims, keepdim=keepdim).log()
    return total + (shift if keepdim else shift.squeeze(dims))

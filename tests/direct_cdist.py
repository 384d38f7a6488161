"""Euclidean distances in the direct form ``sqrt(sum((x1 - x2)²))``, grouped as ``"cdist"`` with the
cdist example's rule: the plain composite the flag and thread tests compare against.

Its gradient is NaN at every zero distance on every supported release (``sqrt'(0) = inf`` times a
zero difference). The example's ATen form, ``sqrt(clamp_min(|x|² + |y|² - 2x·y, 0))``, is not: from
torch 2.15 ``clamp_min``'s backward passes 0 at the boundary, so at an exact zero its plain gradient
is 0 there (docs/builtins.md, "Where native PyTorch is weaker").
"""

from __future__ import annotations

import torch

import autograd_groups as ag
from conftest import load_example


def euclidean_cdist(x1: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:
    """The plain composite."""
    return (x1.unsqueeze(-2) - x2.unsqueeze(-3)).pow(2).sum(-1).sqrt()


grouped_cdist = ag.autograd_group("cdist")(euclidean_cdist)
#: The rule of examples/cdist.py, and its registration: the two may share one registry scope.
_example = load_example("cdist")
SQRT_AT_ZERO = _example.SQRT_AT_ZERO
register = _example.register

"""Grouped functions shared by the reliability tests, one per rule kind, each a compound op whose
plain backward is NaN at a special point:

- ``cdist``: the Euclidean cdist in the direct form of tests/direct_cdist.py as group
  ``rel_cdist``, with a subgradient rule (``sqrt``, ``result == 0`` -> 0): NaN for identical rows
  without it, on every supported release;
- ``safe_norm``: ``|x|`` over the last dimension as group ``rel_norm``, with an override rule that
  replaces the group's backward when a norm is 0;
- ``safe_power``: ``exp(y * log(x))`` as group ``rel_pow``, with a NaN-safe rule: NaN at ``x = 0``
  without it.

The tests register the rules with :func:`register_rules` inside their own registry scope.
"""

from __future__ import annotations

from pathlib import Path

import direct_cdist
import torch

import autograd_groups as ag

ROOT = Path(__file__).resolve().parents[1]


euclidean_cdist = direct_cdist.euclidean_cdist
cdist = ag.autograd_group("rel_cdist")(euclidean_cdist)


def norm(x: torch.Tensor) -> torch.Tensor:
    """Euclidean norm over the last dimension, from primitive ops."""
    return x.pow(2).sum(-1).sqrt()


safe_norm = ag.autograd_group("rel_norm")(norm)


def power(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``x ** y`` as ``exp(y * log(x))``."""
    return torch.exp(y * torch.log(x))


safe_power = ag.autograd_group("rel_pow")(power)


def _norm_has_zero(ctx: ag.OverrideContext) -> bool:
    return bool((ctx.outputs[0] == 0).any())


def _norm_backward(ctx: ag.OverrideContext, grad: torch.Tensor) -> torch.Tensor:
    (x,), (n,) = ctx.inputs, ctx.outputs
    unit = x / torch.where(n == 0, 1.0, n).unsqueeze(-1)
    return torch.where((n == 0).unsqueeze(-1), 0.0, unit * grad.unsqueeze(-1))


SQRT_AT_ZERO = ag.Subgradient(op="sqrt", when="result == 0", grad=0)
NORM_OVERRIDE = ag.Override(check=_norm_has_zero, backward=_norm_backward)
NAN_SAFE = ag.NanSafe()


def register_rules() -> None:
    """Register the three groups' rules (call inside ``ag.registry_scope()``)."""
    ag.register_rule("rel_cdist", SQRT_AT_ZERO)
    ag.register_rule("rel_norm", NORM_OVERRIDE)
    ag.register_rule("rel_pow", NAN_SAFE)


def native_cdist(x1: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:
    """PyTorch's own cdist, whose backward is 0 for identical points."""
    return torch.cdist(x1, x2, compute_mode="donot_use_mm_for_euclid_dist")


def points(n: int, m: int, d: int, seed: int, dtype: torch.dtype = torch.float64,
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """Integer-valued ``x1[n, d]``, ``x2[m, d]`` (exact distances) whose first rows are identical."""
    g = torch.Generator().manual_seed(seed)
    x1 = torch.randint(-4, 5, (n, d), generator=g).to(dtype)
    x2 = torch.randint(-4, 5, (m, d), generator=g).to(dtype)
    x2[: min(n, m) // 2] = x1[: min(n, m) // 2]
    return x1.requires_grad_(), x2.requires_grad_()

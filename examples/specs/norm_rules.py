"""The Python half of examples/specs/safe_norm.yaml: the override's check and backward.

The spec names them as ``norm_rules:norm_is_zero`` and ``norm_rules:norm_subgradient``, so this
directory must be importable (on ``sys.path``) when the spec is loaded.
"""

from __future__ import annotations

import torch

import autograd_groups as ag


def norm_is_zero(ctx: ag.OverrideContext) -> bool:
    """Fire when the norm is exactly zero, where sqrt's derivative is infinite."""
    return bool((ctx.outputs[0] == 0).any())


def norm_subgradient(ctx: ag.OverrideContext, grad: torch.Tensor) -> torch.Tensor:
    """d|x|/dx = x / |x|, and 0 where |x| == 0 (as torch.linalg.vector_norm's backward)."""
    (x,), (norm,) = ctx.inputs, ctx.outputs
    return torch.where(norm == 0, torch.zeros_like(x), x / norm) * grad

"""One torch call of a watched forward, as the doctor keeps it."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .frames import Frame


@dataclass
class Call:
    """One torch call of the forward: its name, the user's line, its floating-point tensor inputs
    and outputs, for an in-place call (and every call on data alone) whether each was finite when
    it ran, whether a number it was given is infinite or NaN (``masked_fill(mask, -inf)``: a
    value meant, not an overflow), and whether it divides by the number 0 (``x / 0``: a pole)."""

    op: str
    frame: Frame | None
    inputs: list[torch.Tensor]
    outputs: list[torch.Tensor]
    finite_now: list[bool] | None = None
    given_nonfinite: bool = False
    by_zero: bool = False

"""What kind of NaN it is: exactly one of the classes A to G. Only A and B are problems a gradient
rule can fix; for the others the doctor says so, and what to do instead."""

from __future__ import annotations

from dataclasses import dataclass

import torch

#: The classes, with what each means and what to do about it.
CLASSES = {
    "A": ("0·∞: the non-finite gradient is born where the gradient arriving is 0 (a masked element, "
          "the branch a `where` does not take)",
          "a NaN-safe group (the smallest fix below), or mask before the op (the double `where`)"),
    "B": ("a singular point that is used: the op's slope is infinite or undefined where its value "
          "matters (sqrt at 0, x/|x| at 0)",
          "the op's limit or subgradient there: a native op with a hand-written backward, an ag.ops "
          "built-in, or a group with a Subgradient rule"),
    "C": ("a NaN or infinity born in the forward reaches the loss or a gradient",
          "rewrite the forward (mask the argument before the op); no gradient rule can fix a "
          "forward value"),
    "D": ("overflow: values beyond the dtype's range, not a special point",
          "not a gradient-rule problem: a wider dtype, scaled inputs (subtract the max before exp), a "
          "smaller learning rate or gradient clipping"),
    "E": ("the non-finite value enters from the data, or from parameters already non-finite when "
          "the step starts",
          "not a gradient-rule problem: check the batch and the loaded weights (torch.isfinite)"),
    "F": ("the gradients were finite and the optimizer step made the parameters non-finite",
          "not a gradient-rule problem: the learning rate, the optimizer's eps, gradient clipping"),
    "G": ("it did not happen again when the step was replayed",
          "not a special point: nondeterminism (unseeded randomness, data order, nondeterministic "
          "kernels) or hardware, or a script that cannot run again as it ran first (a note says "
          "so); seed the run and try again"),
}


@dataclass(frozen=True)
class Evidence:
    """What the replay saw, for :func:`classify`."""

    reproduced: bool
    entered_parameter: bool
    entered_data: bool
    parameters_were_finite: bool
    loss_finite: bool
    forward_birth: bool
    forward_overflow: bool
    backward_birth: bool
    incoming: str | None
    huge: bool
    #: The gradient the backward was given (``loss.backward(g)``) was not finite: data.
    seeded_nonfinite: bool = False
    #: No op made a non-finite value, and the leaf gradients hold infinities, no NaN: their sum
    #: over the step's backward passes overflowed.
    accumulated_overflow: bool = False
    #: A leaf's gradient was not finite before the backward ran (not zeroed, or set so).
    held_nonfinite: bool = False


def classify(e: Evidence) -> str:
    """The one class of a finding. A value already non-finite in the inputs or parameters at the
    step's start is E (F where the last optimizer step made a finite parameter non-finite), whatever
    follows; then a forward birth that reaches the loss is C, or D where it is an overflow (no
    gradient rule makes that loss finite); then a birth where the arriving gradient is 0 is A, even
    where a forward infinity made the infinite factor; a backward birth B, or D where it is an
    overflow. A gradient given to the backward, or one a leaf held before it, that is not finite is
    E too; with no birth at all, leaf gradients that overflowed as the step's backward passes
    summed them are D.

    >>> base = dict(reproduced=True, entered_parameter=False, entered_data=False,
    ...             parameters_were_finite=True, loss_finite=True, forward_birth=False,
    ...             forward_overflow=False, backward_birth=True, incoming="zero", huge=False)
    >>> classify(Evidence(**base)), classify(Evidence(**{**base, "incoming": "nonzero"}))
    ('A', 'B')
    """
    if not e.reproduced:
        return "G"
    if e.entered_parameter:
        return "F" if e.parameters_were_finite else "E"
    if e.entered_data or e.seeded_nonfinite or e.held_nonfinite:
        return "E"
    if not e.loss_finite or (e.forward_birth and not e.backward_birth):
        return "D" if e.forward_overflow else "C"
    if e.backward_birth and e.incoming == "zero":
        return "A"
    if e.backward_birth:
        return "D" if e.huge else "B"
    return "D" if e.accumulated_overflow else "C"


def huge(values: list[torch.Tensor], dtype: torch.dtype) -> bool:
    """Whether values at a birth are beyond the square root of the dtype's largest number: a
    product of two of them overflows, which is no special point."""
    if not dtype.is_floating_point:
        return False
    limit = torch.finfo(dtype).max ** 0.5
    return any(bool((v.abs() > limit).any()) for v in values if v.numel())

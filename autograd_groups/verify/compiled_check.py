"""A group declared ``compile=True`` checked against itself eagerly: its compiled region's gradient
at a recorded call's inputs, against the eager group's (its rules realised at the autograd nodes).

A compiled region inherits whatever its compiler gets wrong, where the eager group runs PyTorch's
own kernels: the two gradients agree to rounding, or the row says where and by how much they differ.
"""

from __future__ import annotations

from typing import Any

import torch

from ..errors import internal_error
from ..groups.group import autograd_group
from ..observe import anomaly, counters, tracer
from ..observe.recording import Call
from .points import differentiable, generator, outputs_of, projection, seeded
from .verdict import CONSISTENT, INCONSISTENT, NOT_CHECKED, Row

#: The row's rule column: what is checked is the group's compiled region, not one of its rules.
LABEL = "compiled region"
#: How far the two may differ, in units of the dtype's epsilon times the gradient's largest element:
#: the compiled kernels sum and fuse in another order than the eager ones.
ULPS = 256


def compiled_row(call: Call, instance: str, where: str, order: int) -> Row:
    """The row on ``call``'s group compiled as its own region, at ``call``'s inputs."""
    row = Row(group=call.group, instance=instance, where=where, rule=LABEL, kind="compile", op="",
              order=order, status=NOT_CHECKED)
    if order == 2:
        row.reason = ("a compiled backward has no derivative of its own: second derivatives of a "
                      "compile=True group are the eager group's (under torch.func it runs eagerly)")
        return row
    if call.compile is None:
        raise internal_error(f"compiled_row: the call of {call.group!r} was not of a compile=True group")
    eager = autograd_group(call.group)(call.fn)
    compiled = autograd_group(call.group, compile=call.compile)(call.fn)
    # Unobserved: a trace session or detect_nonfinite() would make the compiled group run eagerly.
    with tracer.hidden(), anomaly.paused(), torch.enable_grad():
        want = _gradients(eager, call)
        before = _compiled_calls(call.group)
        got = _gradients(compiled, call)
        ran = _compiled_calls(call.group) - before
    if ran == 0:
        row.reason = "its compiled region did not run at the recorded inputs (see `ag.stats()`'s region)"
        return row
    if got is None or want is None:
        row.reason = "none of its floating-point outputs requires grad at the recorded inputs"
        return row
    worst, at, scale, dtype = 0.0, "", 0.0, torch.float64
    for name, g, w in zip(_names(call), got, want, strict=True):
        if w is None or g is None:
            continue
        dtype = w.dtype
        scale = max(scale, float(w.abs().nan_to_num(0, 0, 0).max()) if w.numel() else 0.0)
        same_nan = g.isnan() & w.isnan()
        gap = (g - w).abs().masked_fill(same_nan, 0).nan_to_num(float("inf"), float("inf"))
        if gap.numel() and float(gap.max()) > worst:
            index = torch.unravel_index(gap.argmax(), gap.shape)
            worst, at = float(gap.max()), f"{name}{[int(i) for i in index]}"
    tolerance = ULPS * torch.finfo(dtype).eps * max(scale, 1.0)
    row.status = CONSISTENT if worst <= tolerance else INCONSISTENT
    row.difference, row.tolerance = worst, tolerance
    verb = "equals" if row.status == CONSISTENT else "differs from"
    row.reason = (f"its compiled region's gradient {verb} the eager group's at the recorded inputs "
                  f"(largest difference {worst:.3g}"
                  f"{' at ' + at if at and worst else ''}, tolerance {tolerance:.3g})")
    return row


def _gradients(fn: Any, call: Call) -> list[torch.Tensor | None] | None:
    """The gradient of a fixed random projection of ``fn``'s outputs with respect to the call's
    floating-point tensor arguments (copies of them)."""
    args = [differentiable(a) for a in call.args]
    kwargs = {k: differentiable(v) for k, v in call.kwargs.items()}
    inputs = [a for a in [*args, *kwargs.values()] if isinstance(a, torch.Tensor) and a.requires_grad]
    with seeded():
        outputs = outputs_of(fn(*args, **kwargs))
    if not outputs or not inputs:
        return None
    return list(torch.autograd.grad(projection(outputs, generator()), inputs, allow_unused=True))


def _names(call: Call) -> list[str]:
    positional = [f"arg{i}" for i, a in enumerate(call.args)
                  if isinstance(a, torch.Tensor) and a.is_floating_point()]
    return positional + [k for k, v in call.kwargs.items()
                         if isinstance(v, torch.Tensor) and v.is_floating_point()]


def _compiled_calls(name: str) -> int:
    calls: int = counters.stats().get(name, {}).get("region", {}).get("compiled_calls", 0)
    return calls

"""Checking a proposed fix: run the changed script to the bad step and compare its gradients with the
replayed original's. A fix passes only where the new gradients are finite, equal to the original
wherever the original was finite (an epsilon or a clamp changes them), and, for a rule, where
``ag.verify`` finds the rule consistent with the math (at second order where the step
differentiates twice)."""

from __future__ import annotations

import contextlib
import io
import os
from dataclasses import dataclass

import torch

from ..observe.recording import Recorder, recording
from ..observe.tracer import trace
from ..rules.registry import registry_scope
from ..verify.verdict import CONSISTENT, INCONSISTENT
from ..verify.verify import MAX_INSTANCES
from ..verify.verify import check as verify_check
from .replay import RandomState, run
from .session import Backward, Grads, Leaves, Session
from .tensors import dense

#: How close a new gradient must be to the original where that was finite: float rounding of a
#: native op against its composite, not a change of value.
RTOL, ATOL = 1e-4, 1e-6
#: How a check that found the gradients still not finite begins.
STILL_NOT_FINITE = "gradients still not finite"


@dataclass
class Baseline:
    """The replayed original step: its bad backward, the tensors it differentiated and their
    gradients, the values it differentiated (its losses), and whether the step differentiated
    twice."""

    bad: Backward
    leaves: Leaves
    grads: Grads
    losses: list[torch.Tensor]
    second_order: bool


def check(script: str, args: list[str], file: str, text: str, baseline: Baseline, start: RandomState,
          rule: bool) -> tuple[bool, str]:
    """Run ``script`` to the bad backward with ``text`` in place of ``file`` (the script, or a module
    of the user's it imports) and judge it: (passed, what was checked or why it failed)."""
    same = os.path.abspath(file) == os.path.abspath(script)
    session = Session(stop_at=baseline.bad.index)
    recorder = Recorder(copies=MAX_INSTANCES)
    printed = io.StringIO()
    with registry_scope(), contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
        with trace() as traced, recording(recorder):
            done = run(script, args, session, start, text if same else None, eager=True,
                       changed=None if same else {os.path.abspath(file): text})
        try:
            verdict = verify_check(traced.instances, recorder, 2 if baseline.second_order else 1,
                                   MAX_INSTANCES, "a group around a statement is checked through the run "
                                   "alone") if rule else None
        finally:
            recorder.close()
    if not done.stopped:
        said = printed.getvalue().strip().splitlines()
        how = f": {said[-1]}" if said else ""
        return False, f"the changed script did not reach backward pass {baseline.bad.index}{how}"
    compared = _compare(baseline, session.last_leaves, session.last_grads, session.last_losses)
    if compared is not None:
        return False, compared
    order = "second" if baseline.second_order else "first"
    checked = (f"backward pass {baseline.bad.index} replayed: gradients finite, equal to the original's "
               f"wherever those were finite, and so is the loss (rtol {RTOL:g})")
    if not _any_finite([*baseline.losses, *(g for g in baseline.grads if g is not None)]):
        checked = (f"backward pass {baseline.bad.index} replayed: gradients and loss finite (the "
                   f"original's were nowhere finite: no value of theirs to compare)")
    if verdict is None:
        return True, checked
    rows = [r for r in verdict.rows if r.scope == ""]
    bad = [r for r in rows if r.status == INCONSISTENT]
    if bad:
        row = bad[0]
        return False, f"ag.verify: the rule is inconsistent at {row.where} ({row.reason or row.point})"
    if not any(r.status == CONSISTENT for r in rows):
        reasons = sorted({r.reason for r in rows if r.reason}) or ["the rule did not fire"]
        return False, f"{checked}; ag.verify did not check the rule ({order} order): {reasons[0]}"
    points = sorted({r.point for r in rows if r.status == CONSISTENT and r.point})
    return True, f"{checked}; ag.verify: consistent ({order} order, {', '.join(points) or 'checked'})"


def _compare(baseline: Baseline, leaves: Leaves, grads: Grads, losses: list[torch.Tensor]) -> str | None:
    """Why the new gradients or losses fail, or None where they pass. The loss is compared too: a
    step whose original gradients are NaN wherever a fix changes them (every element, behind a
    singular op at the output) compares no gradient, and a fix that computes another function (a
    reduction that lost its ``keepdim``) would pass on gradients alone."""
    if len(losses) != len(baseline.losses):
        return f"the changed script differentiated {len(losses)} values, not {len(baseline.losses)}"
    for before, after in zip(baseline.losses, losses):
        if after.shape != before.shape:
            return f"changes the loss's shape from {tuple(before.shape)} to {tuple(after.shape)}"
        moved = _moved(before, after)
        if moved is not None:
            return (f"changes the loss where it was finite: by up to {moved:.3g} (value of shape "
                    f"{tuple(before.shape)})")
    new = _matched(baseline.leaves, leaves, grads)
    for i, (old, now) in enumerate(zip(baseline.grads, new)):
        if old is None:
            continue
        if now is None:
            return f"the changed script gave no gradient for tensor {i} of shape {tuple(old.shape)}"
        # A sparse gradient (an embedding's) is compared element by element as the dense one.
        old, now = dense(old), dense(now)
        if not bool(torch.isfinite(now).all()):
            return (f"{STILL_NOT_FINITE}: {int((~torch.isfinite(now)).sum())} elements of the "
                    f"tensor of shape {tuple(now.shape)}")
        moved = _moved(old, now)
        if moved is not None:
            return (f"changes the gradient where it was finite: by up to {moved:.3g} (tensor of shape "
                    f"{tuple(old.shape)})")
    return None


def _any_finite(tensors: list[torch.Tensor]) -> bool:
    return any(bool(torch.isfinite(dense(t)).any()) for t in tensors)


def _moved(old: torch.Tensor, now: torch.Tensor) -> float | None:
    """How far ``now`` moved from ``old`` where ``old`` was finite, beyond rounding; None within it."""
    old, now = old.detach().double(), now.detach().double()
    kept = torch.isfinite(old)
    scale = float(old[kept].abs().max()) if bool(kept.any()) else 1.0
    diff = (now - old).abs()[kept]
    limit = ATOL * max(scale, 1.0) + RTOL * old.abs()[kept]
    return float(diff.max()) if bool((diff > limit).any()) else None


def _matched(old_leaves: Leaves, new_leaves: Leaves, new_grads: Grads) -> Grads:
    """The new run's gradients in the order of the original's leaves: the same shape, the nearest
    values (two runs of a script make their parameters anew). A graph edge ``grad`` was asked for
    is no tensor to match: it gets no gradient here."""
    free = {i: t for i, t in enumerate(new_leaves) if isinstance(t, torch.Tensor)}
    matched: Grads = []
    for old in old_leaves:
        same = [] if not isinstance(old, torch.Tensor) else \
            [i for i, t in free.items() if t.shape == old.shape and t.dtype == old.dtype]
        if not isinstance(old, torch.Tensor) or not same:
            matched.append(None)
            continue
        best = min(same, key=lambda i: float((free[i].detach() - old.detach()).abs().max())
                   if old.numel() else 0.0)
        del free[best]
        matched.append(new_grads[best])
    return matched

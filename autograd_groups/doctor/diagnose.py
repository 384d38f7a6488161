"""From a NaN in a training step to where it is born, what kind it is, and fixes that are checked:
the steps of ``autograd-groups doctor``."""

from __future__ import annotations

import contextlib
import io
import os

import torch

from .. import compat
from ..script import Exit
from . import locate
from .check import Baseline
from .classify import Evidence, classify, huge
from .instruments import Ran
from .locate import Born
from .propose import propose
from .replay import Instrumented, RandomState, replay, run
from .report import Appears, Diagnosis
from .session import Grads, Session
from .tensors import all_finite, stored

#: How many step ends before the bad step its forward is looked for at most: the replay keeps the
#: tensors of every call it watches.
MOST_LEAD = 16


def diagnose(script: str, args: list[str] | None = None, steps: int | None = None,
             check: bool = True) -> tuple[Diagnosis, Exit]:
    """Run ``script`` as ``python SCRIPT ARGS`` would, watching each backward pass (at most
    ``steps``), and diagnose the first whose loss or leaf gradients are not finite: replay it with
    the instruments on, locate the birth, classify it, and propose fixes, each checked by a replay
    unless ``check`` is False. Returns the report and the script's own exit code (0 where it ran to
    its end or the doctor stopped it, else with how it ended).

    >>> import pathlib, tempfile
    >>> script = pathlib.Path(tempfile.mkdtemp()) / "train.py"
    >>> _ = script.write_text("import torch\\nx = torch.zeros(3, requires_grad=True)\\n"
    ...                       "x.sqrt().sum().backward()\\n")
    >>> report, code = diagnose(str(script))
    >>> report.cls, report.born.node, report.born.line
    ('B', 'SqrtBackward0', 3)
    """
    args = list(args or [])
    start = RandomState.now()
    graphs = compat.graphs_compiled()
    first = run(script, args, Session(limit=steps), start)
    bad = first.session.bad
    watched = first.session.count
    if bad is None:
        clean = Diagnosis("clean", watched)
        clean.notes += skipped_overflows(first.session)
        return clean, first.exit or Exit(0)
    report = Diagnosis("found", watched, step=bad.index)
    if first.process is not None:
        rank, size = first.process
        report.notes.append(f"one process was diagnosed: rank {rank} of {size}; the others may differ")
    # A compiled backward, or any graph Dynamo compiled for the script (backend="eager" makes no
    # compiled backward).
    compiled = first.session.compiled or compat.graphs_compiled() > graphs
    if compiled:
        report.notes.append("the script compiles: the bad step was replayed eagerly "
                            "(torch.compiler.set_stance('force_eager'))")
    errors = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(errors):
        again, seen = replay(script, args, bad, start, eager=True)
        # A forward that ran before an earlier backward or optimizer step of its step (a GAN's
        # generator, before its discriminator's step; losses computed before the first of their
        # backward passes): watched again from the last step end before its earliest node.
        earliest = seen.made_before()
        if earliest is not None and again.session.marks is not None:
            marks = again.session.marks[:bad.ends_before]
            start_at = max((end for end, mark in enumerate(marks, 1) if mark <= earliest), default=0)
            lead = min(bad.ends_before - start_at, MOST_LEAD)
            if lead:
                again, seen = replay(script, args, bad, start, eager=True, lead=lead)
    if not again.stopped and again.exit:
        # Not nondeterminism: the script could not be run again as it ran first.
        said = [line.strip() for line in errors.getvalue().splitlines() if line.strip()]
        how = f"it ended with {said[-1]}" if said else f"it {again.exit.how}"
        report.notes.append(f"the replay did not reach backward pass {bad.index}: {how}. A script "
                            "that needs what its first run left behind (a folder it made, its "
                            "standard input) cannot be run again: make it start over (exist_ok=True, "
                            "arguments instead of input)")
    born_ran, upstream = diagnose_step(report, again.session, seen, again.stopped)
    baseline = Baseline(bad, again.session.last_leaves, again.session.last_grads, again.session.last_losses,
                        again.session.create_graph)
    if check and bad.overflow_from is not None and bad.overflow_from < bad.index:
        baseline = _at_first_overflow(script, args, bad.overflow_from, start, baseline)
        if baseline.bad is not bad:
            report.notes.append(f"the fixes are checked at backward pass {baseline.bad.index}, the first of "
                                f"the loss scaler's overflows up to {bad.index}: it skipped their steps, so "
                                "a fixed script's weights differ from the original's after it")
    report.proposals = propose(script, args, report, born_ran, baseline, start, check,
                               "checks were turned off", upstream)
    return report, Exit(0)


def skipped_overflows(session: Session) -> list[str]:
    """The note on a clean run whose last steps overflowed under a loss scaler (skipped as its own,
    or a NaN the run ended before telling), if they did."""
    skipped = session.skipped()
    if not skipped:
        return []
    return [f"the last {skipped} step(s) overflowed under a loss scaler and were skipped as its own: a "
            "NaN among them is not told until the scaler's scale is down and five steps overflow in a "
            "row; run more steps to be sure"]


def _at_first_overflow(script: str, args: list[str], index: int, start: RandomState,
                       baseline: Baseline) -> Baseline:
    """The original's backward pass ``index`` (the first of a loss scaler's run of overflows that
    ended at ``baseline``'s), to check fixes against; ``baseline`` where the replay did not reach it."""
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        first = run(script, args, Session(stop_at=index), start, eager=True)
    session = first.session
    if not first.stopped or session.last is None or session.last.index != index:
        return baseline
    return Baseline(session.last, session.last_leaves, session.last_grads, session.last_losses,
                    baseline.second_order)


def diagnose_step(report: Diagnosis, session: Session, seen: Instrumented,
                  reproduced: bool) -> tuple[Ran | None, Born | None]:
    """Classify and locate the finding in the instrumented step ``seen`` (``reproduced``: the run
    got to the bad backward again); the node where the backward birth is, and the forward call
    that first made a non-finite value (where one did: a mask's ``-inf``)."""
    if not reproduced or seen.backward is None or seen.backward.finite:
        report.cls = "G"
        return None, None
    found = locate.forward(seen.forward.calls, seen.roots, seen.forward.data)
    back = locate.backward(seen.ran)
    # F: the optimizer's step made a finite parameter non-finite; not where the step left it
    # finite and the script changed it before this one.
    earlier = session.before_last
    finite_before = earlier is not None and earlier.finite and earlier.values_finite
    was_finite = finite_before and session.optimizer_steps > 0 and session.stepped_finite is not True
    parameter = next((e for e in found.entered if e.parameter), None)
    data = next((e for e in found.entered if not e.parameter), None)
    reached = found.reached or (found.births[0] if found.births else None)
    values = []
    if back.born is not None:
        values = locate.saved_tensors(back.born)
        values += [g for g in back.born.grad_outputs if isinstance(g, torch.Tensor)]
    dtype = values[0].dtype if values else torch.float32
    arrived = None if back.born is None else locate.incoming(back.born, locate.born_mask(back.born))
    # A forward value that a mask or an index left out of the loss, saved by a node that mixes
    # elements and whose gradient it poisons (0 * NaN in a matmul's backward): born in the forward,
    # with 0 arriving there.
    carried = arrived is None and back.born is not None and reached is not None \
        and seen.backward.loss_finite and not all_finite(locate.saved_tensors(back.born))
    report.cls = classify(Evidence(
        reproduced=True, entered_parameter=parameter is not None, entered_data=data is not None,
        parameters_were_finite=was_finite, loss_finite=seen.backward.loss_finite,
        forward_birth=reached is not None,
        forward_overflow=reached is not None and locate.overflowed(reached[0], reached[1]),
        backward_birth=back.born is not None,
        incoming="zero" if carried else arrived,
        huge=huge(values, dtype),
        seeded_nonfinite=not seen.backward.seeded_finite,
        accumulated_overflow=_overflowed_in_sum(session.last_grads),
        held_nonfinite=not seen.backward.held_finite))
    if not seen.backward.held_finite:
        report.notes.append("a leaf's gradient was not finite before this backward pass: gradients add "
                            "up across backward passes until zeroed (optimizer.zero_grad()), and this "
                            "one was set so, or left from before the doctor watched")
    if report.cls == "E" and parameter is not None and finite_before and session.optimizer_steps == 0:
        report.notes.append("the parameter was finite at the last backward pass, whose gradients "
                            "were finite too, and the script runs no torch.optim step: if it updates "
                            "its parameters itself (p -= lr * p.grad), that update made it non-finite, "
                            "as an optimizer's step would (class F): lower the learning rate or clip "
                            "the gradients")
    entered = parameter or data
    if report.cls in ("E", "F") and entered is not None:
        report.born = locate.born_entered(entered)
    elif (report.cls in ("C", "D") or carried) and reached is not None:
        report.born = locate.born_forward(reached[0], reached[1])
        report.born.incoming = "zero" if carried else None
    elif back.born is not None:
        report.born = locate.born_backward(back.born, seen.forward.frames)
    if report.born is not None and report.born.file is not None:
        report.born.file = os.path.abspath(report.born.file)
    if report.born is not None and report.born.node == "CheckpointFunctionBackward":
        report.notes.append("it is born inside a reentrant checkpoint (torch.utils.checkpoint with "
                            "use_reentrant=True), whose backward runs the checkpointed function again "
                            "out of the doctor's sight: with use_reentrant=False the report names the "
                            "op inside it and proposes fixes for it")
    if back.appears is not None:
        frame = seen.forward.frames.get(back.appears.node)
        appears = Appears(type(back.appears.node).__name__,
                          None if frame is None else os.path.abspath(frame.file),
                          None if frame is None else frame.line)
        # Where the NaN first shows, if that is not the node the report names (a birth in the
        # forward names the op that made the value; anomaly mode, the node whose gradient shows it).
        born = report.born
        if born is None or (appears.node, appears.file, appears.line) != (born.node, born.file, born.line):
            report.appears = appears
    return back.born, None if reached is None else locate.born_forward(reached[0], reached[1])


def _overflowed_in_sum(grads: Grads) -> bool:
    """Whether the non-finite leaf gradients hold infinities only, no NaN."""
    values = [stored(g) for g in grads if g is not None]
    bad = [v[~torch.isfinite(v)] for v in values if not bool(torch.isfinite(v).all())]
    return bool(bad) and not any(bool(torch.isnan(b).any()) for b in bad)

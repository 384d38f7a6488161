"""``ag.doctor()``: the doctor inside a running program, for code that is no script (a notebook, a
test, a training loop of a framework)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the doctor's modules load when it is first used: `import autograd_groups` stays light
    from .report import Diagnosis
    from .session import Backward, Grads


@contextlib.contextmanager
def doctor() -> Iterator[Diagnosis]:
    """Watch every backward pass in the block with the instruments on, and diagnose the first whose
    loss or leaf gradients are not finite into the yielded report (the one ``autograd-groups
    doctor`` prints). The block's code cannot be run again from here, so its proposals are not
    checked: for checked fixes, run the script under ``autograd-groups doctor``. Each watched step
    costs what an instrumented step does (docs: "Doctor"); compiled code runs eagerly in the block;
    after the finding, nothing more is watched.

    >>> import torch, autograd_groups as ag
    >>> x = torch.zeros(3, requires_grad=True)
    >>> with ag.doctor() as report:
    ...     x.sqrt().sum().backward()
    >>> report.status, report.cls, report.born.node
    ('found', 'B', 'SqrtBackward0')
    """
    from .check import Baseline
    from .diagnose import diagnose_step, skipped_overflows
    from .instruments import ForwardWatch
    from .propose import NOT_REPLAYED, propose
    from .replay import Instrumented, RandomState, linked, stance
    from .report import Diagnosis
    from .session import Session

    report = Diagnosis("clean", 0)
    seen = Instrumented(ForwardWatch(no_grad=False))
    def watch(backward: Backward, roots: list[Any], graph_roots: list[Any], go: Callable[[], Grads]) -> Grads:
        try:
            return seen.watch(backward, roots, graph_roots, go)
        finally:
            # Every backward is watched here: the forward that follows it (a gradient penalty's
            # backward builds a graph the step goes on with; a backward that raised) is recorded.
            seen.forward.recording = True

    session = Session(around=watch, on_window=seen.open, window=0, stops=False,
                      higher_order=linked, check_values=True)

    def after(backward: Backward) -> None:
        report.backward_calls = backward.index
        if not backward.bad:
            # Nothing of a good backward is kept: its gradients die when the script drops them.
            session.last_leaves, session.last_grads, session.last_losses = [], [], []
            seen.ran, seen.grads, seen.roots = [], [], []
            if not backward.create_graph:  # a step's end; a gradient penalty's first backward is not
                seen.forward.reset()
            return
        report.status, report.step = "found", backward.index
        born_ran, upstream = diagnose_step(report, session, seen, True)
        if report.born is not None and report.born.phase == "backward" and report.born.line is None:
            report.notes.append(UNSEEN_FORWARD)
        baseline = Baseline(backward, session.last_leaves, session.last_grads, session.last_losses, False)
        report.proposals = propose("", [], report, born_ran, baseline, RandomState.now(), check_them=False,
                                   unchecked=NOT_REPLAYED, upstream=upstream)
        session.around, session.after = None, None
        seen.forward.recording = False  # its mode leaves the stack with the block

    session.after = after
    try:
        # Compiled code runs eagerly in the block, as in the command's replay: Dynamo would trace
        # the instruments, and a compiled backward's nodes cannot be hooked.
        with session.installed(), stance("force_eager"):
            yield report
    finally:
        seen.close()
        if report.status == "clean":
            report.notes += skipped_overflows(session)


#: Why a birth in process has no line.
UNSEEN_FORWARD = ("the line that made the op is not known: in the block the doctor records the "
                  "forward from the end of the last backward pass on, on the thread that entered the "
                  "block, and this op was made before (a forward that ran before an earlier backward "
                  "of its step, as a GAN's generator) or on another thread; `autograd-groups doctor` "
                  "on the script finds it")


"""Running the user's script under the doctor: once to watch, again to replay the bad step with the
instruments on, and once per proposed fix to check it.

Each run starts from the same random state (torch's, Python's and NumPy's), so that a seeded or
unseeded script makes the same steps again, and imports the script's own modules anew
(:mod:`.modules`); a compiled function runs eagerly in a replay
(``torch.compiler.set_stance("force_eager")``), where autograd nodes can be hooked.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import random
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.overrides import handle_torch_function

from .. import compat, nodes
from ..levels import passes_through
from ..script import Exit, run_script
from . import modules
from .instruments import BackwardWatch, ForwardWatch, Ran
from .session import Backward, Grads, Session, Stop


@dataclass
class RandomState:
    """The random state a run starts from."""

    torch_state: torch.Tensor
    python_state: Any
    numpy_state: Any = None

    @classmethod
    def now(cls) -> RandomState:
        numpy = sys.modules.get("numpy")
        return cls(torch.random.get_rng_state(), random.getstate(),
                   None if numpy is None else numpy.random.get_state())

    def restore(self) -> None:
        torch.random.set_rng_state(self.torch_state)
        random.setstate(self.python_state)
        numpy = sys.modules.get("numpy")
        if numpy is not None and self.numpy_state is not None:
            numpy.random.set_state(self.numpy_state)


@dataclass
class Run:
    """One run of the script: how it ended, what its session saw, and for a script that started a
    process group, its rank and world size."""

    exit: Exit | None
    session: Session
    stopped: bool
    process: tuple[int, int] | None = None


def run(path: str, args: list[str], session: Session, start: RandomState, source: str | None = None,
        eager: bool = False, changed: dict[str, str] | None = None) -> Run:
    """Run the script under ``session`` from the random state ``start``, its own modules imported
    anew (``changed``: the text of some of them, by path; ``source``: the script's); stop at the
    session's backward."""
    start.restore()
    distributed = torch.distributed.is_available()
    before = distributed and torch.distributed.is_initialized()
    code: Exit | None = None
    folder = os.path.dirname(os.path.abspath(path))
    try:
        with session.installed(), stance("force_eager" if eager else None), modules.fresh(folder, changed), \
                _stop_ends_threads():
            code = run_script(path, args, source, passes=(Stop,))
    except Stop:
        pass
    # A script that caught the Stop ran on to its end: it was stopped all the same.
    done = Run(code, session, code is None or session.halted)
    if distributed and not before and torch.distributed.is_initialized():
        # The script's process group: ended, so that the next run can start it again.
        done.process = (torch.distributed.get_rank(), torch.distributed.get_world_size())
        torch.distributed.destroy_process_group()
    return done


@contextlib.contextmanager
def _stop_ends_threads() -> Iterator[None]:
    """A thread of the script that trains ends at the doctor's stop without a traceback (it is
    no error of the script's)."""
    told = threading.excepthook

    def tell(args: Any) -> None:
        if not issubclass(args.exc_type, Stop):
            told(args)

    threading.excepthook = tell
    try:
        yield
    finally:
        threading.excepthook = told


@contextlib.contextmanager
def stance(name: str | None) -> Iterator[None]:
    """Run the block under ``torch.compiler.set_stance(name)`` (nothing where ``name`` is None or
    the release has no stances)."""
    set_stance = getattr(torch.compiler, "set_stance", None)
    if name is None or set_stance is None:
        yield
        return
    with set_stance(name):
        yield


@dataclass
class Instrumented:
    """What the replay's instruments saw of the bad step."""

    forward: ForwardWatch = field(default_factory=ForwardWatch)
    ran: list[Ran] = field(default_factory=list)
    roots: list[torch.Tensor] = field(default_factory=list)
    grads: Grads = field(default_factory=list)
    backward: Backward | None = None
    _on: bool = False

    def open(self) -> None:
        self.forward.__enter__()
        self._on = True

    def close(self) -> None:
        if self._on:
            self._on = False
            self.forward.__exit__(None, None, None)

    def watch(self, backward: Backward, roots: list[torch.Tensor], graph_roots: list[Any],
              go: Callable[[], Grads]) -> Grads:
        """The bad backward: stop recording the forward, hook every node, run it."""
        self.forward.recording = False
        self.backward, self.roots = backward, roots
        watcher = BackwardWatch(nodes.reachable(graph_roots))
        try:
            self.grads = go()
        finally:
            watcher.remove()
            self.ran = watcher.ran
        return self.grads

    def made_before(self) -> int | None:
        """The sequence number of the earliest node of the bad backward made before the forward
        was watched (not by a backward: those take their first-order node's line); None where
        there is none."""
        made = (compat.node_sequence_nr(r.node) for r in self.ran if compat.formula_parent(r.node) is None)
        return min((n for n in made if n < self.forward.first), default=None)


# A replayed torch.func.grad calls autograd through these too (see Session): its backward stays its own.
passes_through(Instrumented.watch.__code__, ForwardWatch.__torch_function__.__code__,
               handle_torch_function.__code__, *(inspect.unwrap(f).__code__
                                                 for f in (torch.autograd.grad, torch.autograd.backward)))


def linked() -> contextlib.AbstractContextManager[Any]:
    """Anomaly mode without its NaN check, around a backward that builds a graph: the nodes it
    makes know the node that made them (a birth at second order is then told at its first-order op)."""
    return torch.autograd.set_detect_anomaly(True, check_nan=False)


def replay(path: str, args: list[str], bad: Backward, start: RandomState, source: str | None = None,
           eager: bool = False, lead: int = 0) -> tuple[Run, Instrumented]:
    """Run the script again up to its bad backward, with the instruments on from the start of that
    step (``lead`` step ends before it: a forward that ran before an earlier backward or optimizer
    step of the same step): the forward watched, every node of that backward hooked, and any
    backward of the step that builds a graph run under anomaly mode without its NaN check (so that
    the nodes it makes know the node that made them)."""
    seen = Instrumented()
    session = Session(stop_at=bad.index, window=bad.ends_before, lead=lead, marks=[], on_window=seen.open,
                      around=seen.watch, higher_order=linked, check_values=True)
    try:
        done = run(path, args, session, start, source, eager)
    finally:
        seen.close()
    return done, seen

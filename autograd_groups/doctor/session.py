"""Watching a script's backward passes: the trigger after each one, and the step to instrument.

While a :class:`Session` is open, ``torch.autograd.backward`` (so ``Tensor.backward``) and
``torch.autograd.grad`` (so ``torch.func.grad``) are wrapped, and every optimizer step is seen
through PyTorch's global optimizer hooks. After each backward the session reads once whether the
loss and the leaf gradients are finite. A *step* ends at an optimizer step or at a backward that
builds no graph of its own (``create_graph=False``); the session counts these ends, so that a second
run of the same script can switch its instruments on at the start of the step that went bad.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.autograd.graph import GradientEdge
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

from .. import compat
from ..levels import graph_roots, passes_through
from ..sites import second_order, tangents
from .tensors import all_finite, finite_groups, floating, leaves_of, plain


class Stop(BaseException):
    """Ends the user's script at the backward the doctor has seen enough of (not an ``Exception``:
    the script's own ``except Exception`` must not swallow it)."""


@dataclass
class Backward:
    """One watched backward pass: its number (from 1), whether it built a graph for a higher order,
    how many step ends came before it, whether its loss and leaf gradients were finite, and whether
    a compiled graph took part."""

    index: int
    create_graph: bool
    ends_before: int
    loss_finite: bool = True
    grads_finite: bool = True
    compiled: bool = False
    values_finite: bool = True
    #: A loss scaler's deliberate overflow: its step is skipped and its scale lowered, no finding.
    scaled_overflow: bool = False
    #: Whether the gradient it was given (``loss.backward(g)``) was finite; read where it went bad.
    seeded_finite: bool = True
    #: Whether the leaves' gradients were finite before it ran (read where it is instrumented): they
    #: add up until zeroed, and one the script set, or left from before the watch, stays non-finite.
    held_finite: bool = True
    #: Under a loss scaler, the number of the first backward of the run of overflows this one is in:
    #: the scaler skipped the steps after it, so a fixed script's weights equal the original's there.
    overflow_from: int | None = None

    @property
    def finite(self) -> bool:
        return self.loss_finite and self.grads_finite

    @property
    def bad(self) -> bool:
        return not self.finite and not self.scaled_overflow


@dataclass
class Overflows:
    """A loss scaler's run of overflowing steps: how many in a row ended (a step ends at
    ``GradScaler.update``), whether a backward since the last update overflowed, and the number of
    the first backward that overflowed in the run."""

    steps: int = 0
    pending: bool = False
    first: int | None = None


#: ``(backward, loss, graph roots, run)``: called around the bad backward of a replay; ``run()``
#: runs it and returns the gradients it computed.
Grads = list[torch.Tensor | None]
#: What a backward differentiates: leaf tensors, or the graph edges ``grad`` was asked for.
Leaves = Sequence[torch.Tensor | GradientEdge]
Around = Callable[[Backward, list[torch.Tensor], list[Any], Callable[[], Grads]], Grads]


@dataclass
class Session:
    """One run of the user's script under watch.

    ``stop_at``: the number of the backward to stop after (None: the first bad one); ``limit``: stop
    after this many backward passes in any case.
    ``window``: how many step ends to let pass before the step to instrument starts; ``on_window``
    is called ``lead`` step ends before that (a forward may run before an earlier backward of its
    step); ``marks``, where given, gets at each step end the sequence number the next autograd
    node will have (which end to open the window at, for a node made that early); ``around``
    wraps that backward; ``higher_order`` wraps every backward of
    the window that builds a graph (``create_graph=True``); ``check_values``: read after each
    backward whether the leaves' own values are finite too. ``around`` wraps every backward where
    ``stop_at`` is None; ``after`` is told of each backward once it is checked; ``stops``: end the
    script (with :class:`Stop`) at ``stop_at``, ``limit`` or the first bad backward.
    """

    stop_at: int | None = None
    limit: int | None = None
    window: int | None = None
    lead: int = 0
    marks: list[int] | None = None
    on_window: Callable[[], None] | None = None
    around: Around | None = None
    higher_order: Callable[[], contextlib.AbstractContextManager[Any]] | None = None
    check_values: bool = False
    stops: bool = True
    after: Callable[[Backward], None] | None = None
    #: How many backward passes were watched; the first bad one (a loss scaler's overflow steps
    #: aside, unless they keep coming); the last one and the one before it. A run of millions of
    #: steps keeps no more than these.
    count: int = 0
    bad: Backward | None = None
    last: Backward | None = None
    before_last: Backward | None = None
    #: Whether a compiled graph took part in a watched backward; whether one built a graph for a
    #: higher order.
    compiled: bool = False
    create_graph: bool = False
    ends: int = 0
    optimizer_steps: int = 0
    #: The tensors the backward that ended the script (or the last told to ``after``) differentiated,
    #: and their gradients (None where it gave none): kept of no other backward, so that the watch
    #: keeps no gradient of an earlier step alive.
    last_leaves: Leaves = field(default_factory=list)
    last_grads: Grads = field(default_factory=list)
    #: And the values it differentiated (its losses).
    last_losses: list[torch.Tensor] = field(default_factory=list)
    _opened: bool = False
    _inside: set[int] = field(default_factory=set)
    #: Set where the session raised :class:`Stop`: a script that catches it (``except:``,
    #: ``except BaseException``) and goes on is stopped again at each backward and optimizer step.
    halted: bool = False
    _halt_hook: Any = None
    #: Each loss scaler's run of overflowing steps (a GAN may have one scaler per model).
    overflows: dict[Any, Overflows] = field(default_factory=dict)
    #: Whether the parameters of the optimizer step that ended the step before the window were
    #: finite right after it (None: no such step): a parameter non-finite at the window's start
    #: that the step left finite was made so by the script (a checkpoint loaded, an assignment).
    stepped_finite: bool | None = None

    def _maybe_open_window(self) -> None:
        if not self._opened and self.window is not None and self.ends >= self.window - self.lead:
            self._opened = True
            if self.on_window is not None:
                self.on_window()

    def _end_step(self) -> None:
        self.ends += 1
        if self.marks is not None:
            self.marks.append(compat.sequence_nr())
        self._maybe_open_window()

    def _watched(self, roots: Sequence[torch.Tensor], create_graph: bool, inputs: Any,
                 call: Callable[[], Any], seed: Any = None) -> Any:
        """Run the backward ``call`` (a partial of autograd's own entry point) and watch it."""
        # A compiler differentiating its graph while it traces is no step, nor is a backward of this
        # library's own (a check of a rule, an ag.verify, a group's tangents computed from its vjp
        # under jacfwd or hessian); a backward inside a watched one (a torch function mode handing
        # the call back to the wrapper on its thread; reentrant checkpointing, from a node of the
        # running backward, maybe on the engine's device thread) is part of it. Another thread's
        # backward, at the same time, is one of its own.
        if self.halted:
            raise Stop
        thread = threading.get_ident()
        if thread in self._inside or compat.current_graph_task_id() != -1 or compat.is_compiling() \
                or second_order.quiet() or tangents.transposing():
            return call()
        self._inside.add(thread)
        try:
            return self._watch(roots, create_graph, inputs, call, seed)
        finally:
            self._inside.discard(thread)

    def _watch(self, roots: Sequence[torch.Tensor], create_graph: bool, inputs: Any,
               call: Callable[[], Any], seed: Any) -> Any:
        # This runs around every backward of a training run: the common case (no torch.func, no
        # compiler, nothing around it) does as little as it can.
        self._maybe_open_window()
        tensors = [r for r in roots if isinstance(r, torch.Tensor)]
        # torch.func.grad builds a graph for its own transforms, not for a higher order of the step.
        functorch = any(map(compat.is_functorch_wrapped_tensor, tensors))
        # Outside torch.func no tensor is wrapped: nothing to unwrap.
        unwrap = functorch or compat.peek_interpreter_stack() is not None
        self.count += 1
        backward = Backward(self.count, bool(create_graph) and not functorch, self.ends)
        self.before_last, self.last = self.last, backward
        self.create_graph |= backward.create_graph
        nodes = graph_roots(tensors)
        # What the backward differentiates: ``inputs`` if given (a ``grad`` call's are), else the
        # leaves it reaches. Only a compiler makes CompiledFunction nodes, and none runs before
        # Dynamo is imported: the graph is walked for them only after.
        reached: Leaves = []
        if inputs is None or compat.dynamo_imported():
            reached, backward.compiled = leaves_of(nodes)
            self.compiled |= backward.compiled
        targets: Leaves = reached if inputs is None else (
            [inputs] if isinstance(inputs, (torch.Tensor, GradientEdge)) else list(inputs))
        returned: list[Any] = []
        if self.around is not None and (self.stop_at is None or backward.index == self.stop_at):
            if inputs is None and not unwrap:
                held = [t.grad for t in targets if isinstance(t, torch.Tensor) and t.grad is not None]
                backward.held_finite = all_finite(floating(held))
            go = functools.partial(self._run, call, targets, create_graph, unwrap, returned)
            grads = self.around(backward, tensors, nodes, go)
        else:
            grads = self._run(call, targets, create_graph, unwrap, returned)
        losses, leaves = tensors, targets
        if unwrap:
            losses = [plain(t) for t in tensors]
            leaves = [plain(t) if isinstance(t, torch.Tensor) else t for t in targets]
        groups = [losses, [g for g in grads if g is not None]]
        if self.check_values:
            groups.append([t for t in leaves if isinstance(t, torch.Tensor)])
        backward.loss_finite, backward.grads_finite, *values = finite_groups(groups)
        backward.values_finite = all(values)
        if not backward.finite:
            seeds = [seed] if isinstance(seed, torch.Tensor) else list(seed or [])
            backward.seeded_finite = all_finite(floating(seeds))
            scaler = next((getattr(r, _SCALED) for r in tensors if hasattr(r, _SCALED)), None)
            if scaler is not None:
                run = self.overflows.setdefault(scaler, Overflows())
                if not run.pending and not run.steps:
                    run.first = backward.index
                run.pending = True
                backward.overflow_from = run.first
                # A scale the script set above the default start takes more halvings to come down.
                high = scaler.get_scale() > STARTING_SCALE
                # Counted by the scaler's steps, not by backward passes: a step may take several
                # (accumulated micro-batches, a gradient penalty's), finite ones among them.
                backward.scaled_overflow = run.steps + 1 < SCALER_SKIPS or high
            if backward.bad and self.bad is None:
                self.bad = backward
        if self.after is not None:
            self.last_leaves, self.last_grads, self.last_losses = leaves, grads, losses
            self.after(backward)
        if not backward.create_graph:
            self._end_step()
        if self.stops and (backward.index == self.stop_at or backward.index == self.limit
                           or (self.stop_at is None and backward.bad)):
            # Copies: a script that catches the Stop may zero its gradients in place.
            self.last_leaves = leaves
            self.last_grads = [None if g is None else g.detach().clone() for g in grads]
            self.last_losses = [t.detach().clone() for t in losses]
            self._halt()
        return returned[0] if returned else None

    def _halt(self) -> None:
        self.halted = True
        self._halt_hook = register_optimizer_step_pre_hook(self._refuse)
        raise Stop

    def _refuse(self, *_: Any) -> None:
        raise Stop

    def _run(self, call: Callable[[], Any], targets: Leaves, create_graph: bool, unwrap: bool,
             returned: list[Any]) -> Grads:
        """Run the backward; the gradients it computed, unwrapped where ``unwrap``."""
        # The script's anomaly mode would raise at the very NaN the watch is there to see: the
        # watch checks instead (anomaly mode's tracebacks stay on).
        nan_check = torch.is_anomaly_enabled() and torch.is_anomaly_check_nan_enabled()
        if nan_check:
            torch.set_anomaly_enabled(True, False)
        try:
            if create_graph and self._opened and self.higher_order is not None:
                with self.higher_order():
                    result = call()
            else:
                result = call()
        finally:
            if nan_check:
                torch.set_anomaly_enabled(True, True)
        returned.append(result)
        # backward: the gradients are in the leaves (an input given as a graph edge has none)
        grads = ([t.grad if isinstance(t, torch.Tensor) else None for t in targets] if result is None
                 else list(result))
        return [None if g is None else plain(g) for g in grads] if unwrap else grads

    @contextlib.contextmanager
    def installed(self) -> Iterator[Session]:
        """Wrap autograd's entry points and hook optimizer steps while the block runs."""
        _sessions.append(self)
        step_hook = register_optimizer_step_post_hook(self._stepped)
        if len(_sessions) == 1:
            _REAL[:] = [torch.autograd.backward, torch.autograd.grad, torch.amp.GradScaler.scale,
                        torch.amp.GradScaler.update]
            torch.autograd.backward, torch.autograd.grad = _backward, _grad
            torch.amp.GradScaler.scale = _scale  # type: ignore[method-assign,assignment]
            torch.amp.GradScaler.update = _update  # type: ignore[method-assign,assignment]
        try:
            self._maybe_open_window()
            yield self
        finally:
            step_hook.remove()
            if self._halt_hook is not None:
                self._halt_hook.remove()
            _sessions.remove(self)
            if not _sessions:
                torch.autograd.backward, torch.autograd.grad = _REAL[:2]
                torch.amp.GradScaler.scale = _REAL[2]  # type: ignore[method-assign]
                torch.amp.GradScaler.update = _REAL[3]  # type: ignore[method-assign]

    def skipped(self) -> int:
        """How many steps in a row, up to the last, a loss scaler skipped (the most of any scaler)."""
        return max((run.steps + run.pending for run in self.overflows.values()), default=0)

    def _scaler_updated(self, scaler: Any) -> None:
        """``scaler``'s step ended: one more that overflowed, or the end of a run of them."""
        run = self.overflows.get(scaler)
        if run is not None:
            run.steps = run.steps + 1 if run.pending else 0
            run.pending = False

    def _stepped(self, optimizer: torch.optim.Optimizer, *_: Any) -> None:
        self.optimizer_steps += 1
        if self.window is not None and self.ends + 1 == self.window:
            self.stepped_finite = all_finite([p for group in optimizer.param_groups for p in group["params"]])
        self._end_step()


#: How many loss-scaler overflow steps in a row the watch lets pass: a scaler lowers its scale and
#: skips the step at an overflow, on purpose; one that keeps overflowing has a real NaN. While its
#: scale is above ``GradScaler``'s default start, every overflow step passes.
SCALER_SKIPS, STARTING_SCALE = 5, 2.0 ** 16
#: The mark ``GradScaler.scale`` leaves on the losses it scales (the scaler), while a session watches.
_SCALED = "_autograd_groups_scaled"

#: The sessions open now (the innermost watches), and autograd's own entry points while they are.
_sessions: list[Session] = []
_REAL: list[Any] = []


def _backward(tensors: Any, grad_tensors: Any = None, retain_graph: Any = None, create_graph: bool = False,
              grad_variables: Any = None, inputs: Any = None) -> None:
    roots = [tensors] if isinstance(tensors, torch.Tensor) else list(tensors)
    call = functools.partial(_REAL[0], tensors, grad_tensors, retain_graph, create_graph, grad_variables,
                             inputs=inputs)
    _sessions[-1]._watched(roots, create_graph, inputs, call, grad_tensors)


def _scale(scaler: Any, outputs: Any) -> Any:
    scaled = _REAL[2](scaler, outputs)
    # A disabled scaler (enabled=False, as under bfloat16) hands the loss back: it skips no step.
    if scaler.is_enabled():
        for t in [scaled] if isinstance(scaled, torch.Tensor) else scaled:
            setattr(t, _SCALED, scaler)
    return scaled


def _update(scaler: Any, new_scale: Any = None) -> None:
    if scaler.is_enabled():
        _sessions[-1]._scaler_updated(scaler)
    _REAL[3](scaler, new_scale)


def _grad(outputs: Any, inputs: Any, *args: Any, **kwargs: Any) -> Any:
    create_graph = kwargs.get("create_graph", args[2] if len(args) > 2 else False)
    roots = [outputs] if isinstance(outputs, torch.Tensor) else list(outputs)
    call = functools.partial(_REAL[1], outputs, inputs, *args, **kwargs)
    seed = kwargs.get("grad_outputs", args[0] if args else None)
    return _sessions[-1]._watched(roots, create_graph, inputs, call, seed)


# torch.func.grad tells its own backward from one its function starts by who calls autograd: these
# frames stand between them and change nothing of that.
passes_through(_backward.__code__, _grad.__code__, Session._watched.__code__, Session._watch.__code__,
               Session._run.__code__)

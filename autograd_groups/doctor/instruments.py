"""The instruments of the step the doctor looks at: every torch call of its forward, with the user's
line that made each autograd node, and every node's gradients in its backward.

Both only keep references while the step runs; whether values are finite is read afterwards, in one
host read for the whole step (:mod:`.locate`), so an instrumented step costs little more than the
hooks themselves. An in-place call is the exception: its inputs are read before it overwrites them.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from .. import compat
from ..nodes import ACCUMULATE_GRAD, saved_names
from .calls import Call
from .frames import Frame, user_frame
from .provenance import Provenance
from .tensors import finite_flags, floating, plain

#: Torch calls that read an attribute or a size rather than compute a value.
_NOT_OPS = frozenset({"__get__", "__set__", "size", "dim", "numel", "item", "tolist", "__len__",
                      "__bool__", "__format__", "__repr__", "data_ptr", "stride", "storage_offset"})

#: Calls that run a backward: the nodes a ``create_graph`` backward makes are a first-order node's,
#: found through anomaly mode's parent links, not the line of the call.
_DIFFERENTIATING = frozenset({"grad", "backward", "vjp"})


def _flat(value: Any) -> Iterator[Any]:
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, (list, tuple)):
            stack.extend(reversed(item))
        elif isinstance(item, dict):
            stack.extend(reversed(list(item.values())))
        else:
            yield item


#: The calls whose second argument divides the first.
_DIVISIONS = frozenset({"div", "div_", "divide", "true_divide", "__truediv__", "__itruediv__", "__div__",
                        "floor_divide", "__floordiv__", "remainder", "fmod", "__mod__"})


def _numbers(args: Sequence[Any], kwargs: dict[str, Any]) -> list[float]:
    return [a for a in _flat([args, kwargs]) if isinstance(a, float)]


def memory_of(tensor: torch.Tensor) -> int | None:
    """Where ``tensor``'s elements live (None for one with no memory of its own to compare, such
    as a sparse tensor): a view shares it with its base."""
    if tensor.layout != torch.strided or not compat.has_storage(tensor):
        return None
    return tensor.untyped_storage().data_ptr()


class ForwardWatch(TorchFunctionMode):
    """Records the torch calls of a forward pass that make a tensor requiring grad, and per
    autograd node the user's line that made it (for a call such as ``F.normalize``,
    every node the call made); and, apart, the calls that compute on data alone (no input
    requires grad), so that a non-finite value the step made of finite data is told from one that
    entered it."""

    def __init__(self, no_grad: bool = True) -> None:
        super().__init__()
        #: Whether calls under ``torch.no_grad()`` are noted as data (a validation pass among
        #: them): the replay of one step does; ``ag.doctor()``, which watches every step, does not.
        self.no_grad = no_grad
        self.calls: list[Call] = []
        #: The calls on data alone, and the detached copies: where the step's data came from.
        self.data: Provenance = Provenance()
        self.frames: dict[Any, Frame] = {}
        #: False once the step's backward starts: the mode stays on the stack (``Tensor.backward``
        #: itself may run inside it) but records nothing more.
        self.recording: bool = True
        #: ``torch.autograd.Function``'s own ``apply`` while the mode is on.
        self._apply: Any = None
        #: The sequence number of the first autograd node made while the mode is on: the nodes
        #: made before are no call's of the watched step.
        self.first: int = 0
        self._thread: int | None = None

    def __torch_function__(self, func: Any, types: Any, args: Sequence[Any] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        name = getattr(func, "__name__", str(func))
        if name in _NOT_OPS or not self.recording or not (self.no_grad or torch.is_grad_enabled()):
            return func(*args, **kwargs)
        given = [a for a in _flat([args, kwargs]) if isinstance(a, torch.Tensor)]
        in_place = name.endswith("_") and not name.endswith("__") or "out" in kwargs
        if in_place and any(a.is_leaf and a.requires_grad for a in given):
            # Initialising, loading or updating parameters is no op of the differentiated step.
            return func(*args, **kwargs)
        if not torch.is_grad_enabled() or not any(a.requires_grad for a in given):
            return self._on_data(name, func, args, kwargs, floating(given), in_place)
        inputs = floating(given)
        before = None
        if in_place:
            self._freeze(inputs)
            before = finite_flags(inputs)
        out = func(*args, **kwargs)
        self._record(name, args, kwargs, inputs, out, before)
        return out

    def _on_data(self, name: str, func: Any, args: Sequence[Any], kwargs: dict[str, Any],
                 inputs: list[torch.Tensor], in_place: bool) -> Any:
        """Run a call on data alone (batching, normalising a batch, a mask, anything under
        ``torch.no_grad()``) and note where its outputs came from (:class:`.Provenance`)."""
        if not inputs:
            return func(*args, **kwargs)
        assigned = name == "__setitem__"
        before = finite_flags(inputs) if in_place or assigned else None
        sources = [self.data.source(t) for t in inputs]
        out = func(*args, **kwargs)
        # ``x[i] = v`` returns nothing: what it wrote is ``x``.
        outputs = floating(args[:1] if assigned else _flat(out))
        if outputs:
            self.data.note(name, user_frame(2), _numbers(args, kwargs), inputs, sources, before, outputs)
        return out

    def _record(self, name: str, args: Sequence[Any], kwargs: dict[str, Any], inputs: list[torch.Tensor],
                out: Any, before: list[bool] | None) -> None:
        outputs = [o for o in _flat(out) if isinstance(o, torch.Tensor)]
        frame = user_frame(2)
        plain_outputs = floating(outputs)
        if not any(o.requires_grad for o in outputs):  # a detached copy, a mask: data from here on
            if plain_outputs:
                sources = [self.data.source(t) for t in inputs]
                self.data.note(name, frame, _numbers(args, kwargs), inputs, sources, before, plain_outputs)
            return
        finite_now = None if before is None else before + finite_flags(plain_outputs)
        divisor = args[1] if name in _DIVISIONS and len(args) > 1 else None
        by_zero = isinstance(divisor, (int, float)) and not isinstance(divisor, bool) and divisor == 0
        self.calls.append(Call(name, frame, inputs, plain_outputs, finite_now,
                               not all(map(math.isfinite, _numbers(args, kwargs))), by_zero))
        if frame is not None and name not in _DIFFERENTIATING:
            for o in outputs:
                self._claim(o.grad_fn, frame)

    def __enter__(self) -> ForwardWatch:
        # A custom autograd.Function's apply is no torch function: the mode would not see it, and
        # its node would take the line of the next call that is one.
        original = self._apply = torch.autograd.Function.__dict__["apply"]
        watch = self

        def apply(cls: type, *args: Any, **kwargs: Any) -> Any:
            given = [a for a in _flat([args, kwargs]) if isinstance(a, torch.Tensor)]
            out = original.__get__(None, cls)(*args, **kwargs)
            if watch.recording and torch.is_grad_enabled() and any(a.requires_grad for a in given):
                watch._record(cls.__name__, args, kwargs, floating(given), out, None)
            return out

        torch.autograd.Function.apply = classmethod(apply)  # type: ignore[method-assign,assignment]
        self.first = compat.sequence_nr()
        self._thread = threading.get_ident()
        return super().__enter__()

    def __exit__(self, *exc: Any) -> None:
        torch.autograd.Function.apply = self._apply  # type: ignore[method-assign]
        # A mode is on one thread's stack: a script that trains in a thread of its own opened it
        # there, and that thread has ended (or stopped) by now.
        if threading.get_ident() == self._thread:
            super().__exit__(*exc)

    def _freeze(self, changing: Sequence[torch.Tensor]) -> None:
        """Read now the flags of the earlier calls whose tensors share memory with what an in-place
        call is about to change: read at the end of the step, a ``matmul``'s output that a
        ``masked_fill_`` then fills with ``-inf`` would look born non-finite in the ``matmul``."""
        memory = {m for m in map(memory_of, changing) if m is not None}
        for call in self.calls:
            if call.finite_now is None and any(memory_of(t) in memory for t in (*call.inputs, *call.outputs)):
                call.finite_now = finite_flags([*call.inputs, *call.outputs])

    def reset(self) -> None:
        """Forget what was recorded and record again (the next step starts)."""
        self.calls.clear()
        self.data.clear()
        self.frames.clear()
        self.recording = True
        self.first = compat.sequence_nr()

    def _claim(self, root: Any, frame: Frame) -> None:
        stack = [root]
        while stack:
            node = stack.pop()
            if node is None or node in self.frames or isinstance(node, ACCUMULATE_GRAD) \
                    or compat.formula_parent(node) is not None \
                    or compat.node_sequence_nr(node) < self.first:  # made by a backward, or before the watch
                continue
            self.frames[node] = frame
            stack.extend(c for c, _ in node.next_functions)


@dataclass
class Ran:
    """One node's backward as it ran: the gradients it received (``grad_outputs``) and passed on
    (``grad_inputs``), and the values it saved in the forward (read in the hook, before a backward
    without ``retain_graph`` frees them)."""

    node: Any
    grad_inputs: tuple[torch.Tensor | None, ...]
    grad_outputs: tuple[torch.Tensor | None, ...]
    saved: dict[str, Any]


class BackwardWatch:
    """A post-hook on every node of a graph, recording what each node received and passed on, in
    the order the engine ran them."""

    def __init__(self, graph: Sequence[Any]) -> None:
        self.ran: list[Ran] = []
        self._handles = [n.register_hook(self._hook(n)) for n in graph
                         if not isinstance(n, ACCUMULATE_GRAD)]

    def _hook(self, node: Any) -> Any:
        def record(grad_inputs: tuple[Any, ...], grad_outputs: tuple[Any, ...]) -> None:
            self.ran.append(Ran(node, _plain(grad_inputs), _plain(grad_outputs), saved_values(node)))
        return record

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()


def _plain(grads: tuple[Any, ...]) -> tuple[torch.Tensor | None, ...]:
    return tuple(plain(g) if isinstance(g, torch.Tensor) else None for g in grads)


def saved_values(node: Any) -> dict[str, Any]:
    """The values a node saved in the forward, by their ``derivatives.yaml`` names, unwrapped
    (those a backward freed left out)."""
    found: dict[str, Any] = {}
    for name in saved_names(node):
        try:
            value = compat.saved_value(node, name)
        except RuntimeError:
            continue
        found[name] = plain(value) if isinstance(value, torch.Tensor) else value
    return found

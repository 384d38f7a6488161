"""Group-level anomaly detection: which group, which op, which forward line made a gradient non-finite.

``detect_nonfinite()`` is ``torch.autograd.detect_anomaly`` at the level of groups. While it is
active, every group instance is created, even one with no rules, and when its outermost enclosing
instance closes, each of its autograd nodes gets a post-hook that runs after any rule hook of the
node: if the node turned a finite incoming gradient into a gradient with a NaN or an infinity, it
raises :class:`~autograd_groups.errors.NonFiniteError` naming the node's innermost group instance,
the op and the forward line that created the instance. The hook never changes a gradient.

The forward is checked too: while a group instance made by ``autograd_group`` (decorator or
``with``) is open, a :class:`ForwardCheck` mode sees every torch call and notes where an op makes a
NaN from inputs without one, or an infinity from finite inputs, and which later values carry it on.
A value that a ``where``, a mask or a select then discards does no harm; one that reaches an output
of the group (a value made in it and used by no later op in it) is an error when the instance
closes, naming the op that first made it, with the user's line: no gradient rule can fix a forward
value.

The switch is thread-local, as the special-cases flag is: a group instance reads it in the forward,
when it is created, and keeps the decision, so the instances a thread creates while it is on are
checked whatever thread the autograd engine runs their backward on, and other threads' instances
are not. Wrap the forward pass (and the backward, for clarity) in the block.
"""

from __future__ import annotations

import contextlib
import linecache
import math
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, TypeVar

import torch
from torch.overrides import TorchFunctionMode
from torch.utils.weak import WeakIdKeyDictionary

from .. import compat, nodes
from ..claims import CLAIM
from ..decorating import decorate
from ..errors import NonFiniteError, internal_error
from ..frames import user_frame
from ..instance import GroupInstance

F = TypeVar("F", bound=Callable[..., Any])


class _Depths(threading.local):
    """This thread's open ``detect_nonfinite()`` blocks: all of them, and those that check the forward."""

    depth = 0
    forward = 0


_depths = _Depths()


def active() -> bool:
    """Whether a ``detect_nonfinite()`` block is open in this thread (read when a group instance is
    created, and kept in it)."""
    return _depths.depth > 0


def forward_active() -> bool:
    """Whether a ``detect_nonfinite()`` block that checks the forward is open in this thread."""
    return _depths.forward > 0


class detect_nonfinite:
    """Raise :class:`~autograd_groups.NonFiniteError` when an op inside a group produces a
    non-finite gradient, naming the group instance, the op and the line that created the group;
    with ``forward`` (the default), also when an op of a group makes a non-finite value in the
    forward pass from inputs that had none, naming the op's line.

    A context manager, and a decorator: a decorated generator function is checked while its body
    runs, at each resume of the generator (as ``torch.no_grad`` decorates one). It watches the
    groups this thread creates (see the module's docstring).

    >>> import torch, autograd_groups as ag
    >>> @ag.autograd_group("root")
    ... def root(x):
    ...     return x.sqrt()
    >>> with ag.detect_nonfinite():
    ...     root(torch.zeros(1, requires_grad=True)).sum().backward()  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    autograd_groups.errors.NonFiniteError: non-finite gradient in group 'root' (created at ...): op sqrt ...
    """

    def __init__(self, forward: bool = True) -> None:
        self.forward: bool = bool(forward)

    def __enter__(self) -> None:
        _depths.depth += 1
        _depths.forward += self.forward

    def __exit__(self, *exc: object) -> None:
        _depths.depth -= 1
        _depths.forward -= self.forward

    def __call__(self, fn: F) -> F:
        return decorate(lambda: detect_nonfinite(self.forward), fn)


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """Inside the block, ``detect_nonfinite()`` checks nothing this thread creates: ``ag.verify``
    samples the plain composite near special points on purpose, where it is not finite. Other
    threads' blocks go on checking theirs."""
    depth, forward = _depths.depth, _depths.forward
    _depths.depth = _depths.forward = 0
    try:
        yield
    finally:
        _depths.depth += depth
        _depths.forward += forward


def _finite(grad: torch.Tensor | None) -> bool:
    return grad is None or bool(torch.isfinite(grad).all())


class NonFiniteCheck:
    """The post-hook on one group node: raise if it made a finite gradient non-finite."""

    __slots__ = ("instance", "op", "node_class")

    def __init__(self, instance: GroupInstance, node: Any) -> None:
        self.instance: GroupInstance = instance
        self.op: str = nodes.node_op(node)
        self.node_class: str = type(node).__name__

    def __call__(self, grad_inputs: Sequence[torch.Tensor | None],
                 grad_outputs: Sequence[torch.Tensor | None]) -> None:
        bad = next((i for i, g in enumerate(grad_inputs) if not _finite(g)), None)
        if bad is None or not all(_finite(g) for g in grad_outputs):
            return
        grad = grad_inputs[bad]
        if grad is None:  # _finite(None) is True: never picked
            raise internal_error(f"NonFiniteCheck picked gradient {bad} of op {self.op}, which is None")
        count = int((~torch.isfinite(grad)).sum())
        inst = self.instance
        named = f"instance {inst.id}, " if inst.id != inst.name else ""
        if _zero_where_bad(grad, grad_outputs):
            fix = (f"The gradient it received is 0 there (0 * inf: a branch a where does not take, a "
                   f"masked element): ag.register_rule({inst.name!r}, ag.NanSafe()) passes 0 on; where "
                   f"the point is one the op itself has no derivative at, give it the value there "
                   f"instead, e.g. ag.register_rule({inst.name!r}, ag.Subgradient(op={self.op!r}, "
                   f"when=..., grad=0))")
        else:
            fix = (f"Give the group a rule for that point, e.g. ag.register_rule({inst.name!r}, "
                   f"ag.Subgradient(op={self.op!r}, when=..., grad=0)), or ag.register_rule("
                   f"{inst.name!r}, ag.NanSafe()) where the gradient it receives there is 0")
        raise NonFiniteError(
            f"non-finite gradient in group {inst.name!r} ({named}created at {inst.where}): op "
            f"{self.op} ({self.node_class}) received a finite gradient and produced {count} NaN/inf "
            f"of {grad.numel()} elements in the gradient of its input {bad}. {fix}",
            inst.name, inst.id, self.op, inst.where)


def _zero_where_bad(grad: torch.Tensor, grad_outputs: Sequence[torch.Tensor | None]) -> bool:
    """Whether every incoming gradient is 0 at the elements where ``grad`` is not finite (for an
    op whose incoming gradient has ``grad``'s shape, as an elementwise op's)."""
    incoming = [g for g in grad_outputs if g is not None]
    if not incoming or any(g.shape != grad.shape for g in incoming):
        return False
    bad = ~torch.isfinite(grad)
    return all(bool((g[bad] == 0).all()) for g in incoming)


def _nonfinite(values: Iterable[Any]) -> tuple[bool, bool]:
    """Whether ``values`` (tensors and numbers, in nested lists and tuples) hold a NaN, an infinity."""
    nan = inf = False
    stack = list(values)
    while stack:
        value = stack.pop()
        if isinstance(value, (list, tuple)):
            stack.extend(value)
        elif isinstance(value, torch.Tensor) and (value.is_floating_point() or value.is_complex()):
            nan = nan or bool(value.isnan().any())
            inf = inf or bool(value.isinf().any())
        elif isinstance(value, (float, complex)):
            nan = nan or value != value
            inf = inf or (math.isinf(value.real) or math.isinf(value.imag))
    return nan, inf


def _skipped(name: str) -> bool:
    # Property reads (x.grad) make no value; empty() returns uninitialised memory.
    return name in ("__get__", "__set__") or "empty" in name


class _Origin:
    """Where a non-finite forward value was first made: the op, the user's line, the counts."""

    __slots__ = ("instance", "op", "where", "source", "count", "total", "inputs")

    def __init__(self, instance: GroupInstance, op: str, count: int, total: int, inputs: str) -> None:
        file, line = user_frame()
        self.instance = instance
        self.op = op
        self.where = f"{file}:{line}"
        self.source = linecache.getline(file, line).strip()
        self.count = count
        self.total = total
        self.inputs = inputs

    def error(self) -> NonFiniteError:
        inst = self.instance
        named = f"instance {inst.id}, " if inst.id != inst.name else ""
        shown = f" ({self.source})" if self.source else ""
        return NonFiniteError(
            f"non-finite value in the forward of group {inst.name!r} ({named}created at {inst.where}): "
            f"op {self.op} at {self.where}{shown} made {self.count} NaN/inf of {self.total} elements from "
            f"{self.inputs}, and it reaches the group's output. No gradient rule can fix a forward "
            f"value: rewrite the group so that the op only sees inputs where it is finite, with "
            f"torch.where or clamp (see the documentation's 'Tutorial', 'A NaN in the forward pass')",
            inst.name, inst.id, self.op, self.where)


class ForwardCheck(TorchFunctionMode):
    """Note where a torch call inside the innermost open group instance of ``stack`` makes a NaN
    from inputs without a NaN, or an infinity from finite inputs, and which values made later in the
    group carry such a value on; :meth:`check` raises for those that reach the instance's outputs.

    One mode per thread, pushed by the outermost watched instance, so a nested group's op is checked
    once and named after the innermost group. In-place ops are judged on their inputs as they were
    before the call."""

    def __init__(self, stack: list[GroupInstance]) -> None:
        super().__init__()
        self.stack = stack
        # Each non-finite value made in a group: (where it first came from, whether a later op
        # of the group read it). Weak: a value nobody holds any more reached nothing.
        self.marks: WeakIdKeyDictionary = WeakIdKeyDictionary()

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        name = getattr(func, "__name__", str(func))
        checked = (bool(self.stack) and not _skipped(name) and not compat.is_compiling()
                   and compat.peek_interpreter_stack() is None)
        inplace = checked and (name.endswith("_") and not name.endswith("__") or name.startswith("__i"))
        before = _nonfinite((args, kwargs)) if inplace else None
        read = self._read((args, kwargs)) if checked else None
        out = func(*args, **kwargs)
        if checked:
            self._note(name, args, kwargs, out, before, read)
        return out

    def _read(self, values: Any) -> _Origin | None:
        """Mark the non-finite values among ``values`` as read; the first one's origin."""
        found = None
        stack = [values]
        while stack:
            value = stack.pop()
            if isinstance(value, (list, tuple, dict)):
                stack.extend(value.values() if isinstance(value, dict) else value)
            elif isinstance(value, torch.Tensor) and value in self.marks:
                origin, _ = self.marks[value]
                self.marks[value] = (origin, True)
                found = found or origin
        return found

    def _note(self, name: str, args: Any, kwargs: Any, out: Any, before: tuple[bool, bool] | None,
              read: _Origin | None) -> None:
        made = [t for t in (out if isinstance(out, (tuple, list)) else (out,))
                if isinstance(t, torch.Tensor) and (t.is_floating_point() or t.is_complex())]
        bad = [t for t in made if not bool(torch.isfinite(t).all())]
        if not bad:
            return
        origin = read
        if origin is None:
            nan, inf = _nonfinite(bad)
            had_nan, had_inf = before if before is not None else _nonfinite((args, kwargs))
            if not (nan and not had_nan) and not (inf and not had_nan and not had_inf):
                return  # passed on from outside the group: not made here
            op = name[2:-2] if name.startswith("__") and name.endswith("__") else name
            count = sum(int((~torch.isfinite(t)).sum()) for t in bad)
            inputs = "inputs without NaN" if nan and not had_nan else "finite inputs"
            origin = _Origin(self.stack[-1], op, count, sum(t.numel() for t in made), inputs)
        for t in bad:
            self.marks[t] = (origin, False)

    def check(self, instance: GroupInstance) -> None:
        """Raise for a non-finite value made in ``instance`` that no later op of it read: one of its
        outputs (the first such value's origin is named)."""
        reached = [origin for origin, read in list(self.marks.values())
                   if not read and origin.instance is instance]
        if reached:
            raise reached[0].error()


def watch(instance: GroupInstance, members: Iterable[Any]) -> None:
    """Hook a check onto every member of ``instance`` when it is an outermost instance (its close
    comes after every rule hook of its members was installed) or an override group (whose subgraph
    no enclosing instance walks)."""
    if instance.parent is not None and instance.rules.override is None:
        return
    for node in members:
        claim = node.metadata.get(CLAIM)
        node.register_hook(NonFiniteCheck(claim.owner if claim is not None else instance, node))

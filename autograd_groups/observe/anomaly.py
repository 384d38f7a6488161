"""Group-level anomaly detection: which group, which op, which forward line made a gradient non-finite.

``detect_nonfinite()`` is ``torch.autograd.detect_anomaly`` at the level of groups. While it is
active, every group instance is created, even one with no rules, and when its outermost enclosing
instance closes, each of its autograd nodes gets a post-hook that runs after any rule hook of the
node: if the node turned a finite incoming gradient into a gradient with a NaN or an infinity, it
raises :class:`~autograd_groups.errors.NonFiniteError` naming the node's innermost group instance,
the op and the forward line that created the instance. The hook never changes a gradient.

The forward is checked too: while a group instance made by ``autograd_group`` (decorator or
``with``) is open, a :class:`ForwardCheck` mode sees every torch call and raises where an op makes a
NaN from inputs without one, or an infinity from finite inputs. No gradient rule can fix such a
value, so it is reported where it is made, with the user's line.

The switch is process-wide (like trace sessions), because the backward runs on autograd's own
threads, and it is read in the forward: instances created while it is on are checked whenever
their backward runs. Wrap the forward pass (and the backward, for clarity) in the block.
"""

from __future__ import annotations

import contextlib
import linecache
import math
import threading
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch
from torch._C._functorch import peek_interpreter_stack
from torch.overrides import TorchFunctionMode

from .. import nodes
from ..claims import CLAIM
from ..errors import NonFiniteError
from ..frames import user_frame
from ..instance import GroupInstance

_lock = threading.Lock()
_depth = 0
_forward_depth = 0


def active() -> bool:
    """Whether a ``detect_nonfinite()`` block is open in any thread."""
    return _depth > 0


def forward_active() -> bool:
    """Whether a ``detect_nonfinite()`` block that checks the forward is open in any thread."""
    return _forward_depth > 0


@contextlib.contextmanager
def detect_nonfinite(forward: bool = True) -> Iterator[None]:
    """Raise :class:`~autograd_groups.NonFiniteError` when an op inside a group produces a
    non-finite gradient, naming the group instance, the op and the line that created the group;
    with ``forward`` (the default), also when an op of a group makes a non-finite value in the
    forward pass from inputs that had none, naming the op's line.

    >>> import torch, autograd_groups as ag
    >>> @ag.autograd_group("root")
    ... def root(x):
    ...     return x.sqrt()
    >>> with ag.detect_nonfinite():
    ...     root(torch.zeros(1, requires_grad=True)).sum().backward()  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    autograd_groups.errors.NonFiniteError: non-finite gradient in group 'root' (created at ...): op sqrt ...
    """
    global _depth, _forward_depth
    with _lock:
        _depth += 1
        _forward_depth += forward
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            _forward_depth -= forward


def _finite(grad: torch.Tensor | None) -> bool:
    return grad is None or bool(torch.isfinite(grad).all())


class NonFiniteCheck:
    """The post-hook on one group node: raise if it made a finite gradient non-finite."""

    __slots__ = ("instance", "op", "node_class")

    def __init__(self, instance: GroupInstance, node: Any) -> None:
        self.instance = instance
        self.op = nodes.node_op(node)
        self.node_class = type(node).__name__

    def __call__(self, grad_inputs: Sequence[torch.Tensor | None],
                 grad_outputs: Sequence[torch.Tensor | None]) -> None:
        bad = next((i for i, g in enumerate(grad_inputs) if not _finite(g)), None)
        if bad is None or not all(_finite(g) for g in grad_outputs):
            return
        grad = grad_inputs[bad]
        assert grad is not None
        count = int((~torch.isfinite(grad)).sum())
        inst = self.instance
        named = f"instance {inst.id}, " if inst.id != inst.name else ""
        raise NonFiniteError(
            f"non-finite gradient in group {inst.name!r} ({named}created at {inst.where}): op "
            f"{self.op} ({self.node_class}) received a finite gradient and produced {count} NaN/inf "
            f"of {grad.numel()} elements in the gradient of its input {bad}. Give the group a rule "
            f"for that point, e.g. ag.register_rule({inst.name!r}, ag.Subgradient(op={self.op!r}, "
            f"when=..., grad=0)), or ag.register_rule({inst.name!r}, ag.NanSafe())",
            inst.name, inst.id, self.op, inst.where)


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


class ForwardCheck(TorchFunctionMode):
    """Raise where a torch call inside the innermost open group instance of ``stack`` makes a NaN
    from inputs without a NaN, or an infinity from finite inputs.

    One mode per thread, pushed by the outermost watched instance, so a nested group's op is checked
    once and named after the innermost group. In-place ops are judged on their inputs as they were
    before the call."""

    def __init__(self, stack: list[GroupInstance]) -> None:
        super().__init__()
        self.stack = stack

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        name = getattr(func, "__name__", str(func))
        checked = (bool(self.stack) and not _skipped(name) and not torch.compiler.is_compiling()
                   and peek_interpreter_stack() is None)
        inplace = checked and (name.endswith("_") and not name.endswith("__") or name.startswith("__i"))
        before = _nonfinite((args, kwargs)) if inplace else None
        out = func(*args, **kwargs)
        if checked:
            self._check(name, args, kwargs, out, before)
        return out

    def _check(self, name: str, args: Any, kwargs: Any, out: Any, before: tuple[bool, bool] | None) -> None:
        made = [t for t in (out if isinstance(out, (tuple, list)) else (out,))
                if isinstance(t, torch.Tensor) and (t.is_floating_point() or t.is_complex())]
        if not made or all(bool(torch.isfinite(t).all()) for t in made):
            return
        nan, inf = _nonfinite(made)
        had_nan, had_inf = before if before is not None else _nonfinite((args, kwargs))
        if not (nan and not had_nan) and not (inf and not had_nan and not had_inf):
            return
        inst = self.stack[-1]
        op = name[2:-2] if name.startswith("__") and name.endswith("__") else name
        file, line = user_frame()
        source = linecache.getline(file, line).strip()
        shown = f" ({source})" if source else ""
        count = sum(int((~torch.isfinite(t)).sum()) for t in made)
        named = f"instance {inst.id}, " if inst.id != inst.name else ""
        inputs = "inputs without NaN" if nan and not had_nan else "finite inputs"
        raise NonFiniteError(
            f"non-finite value in the forward of group {inst.name!r} ({named}created at {inst.where}): "
            f"op {op} at {file}:{line}{shown} made {count} NaN/inf of {sum(t.numel() for t in made)} "
            f"elements from {inputs}. No gradient rule can fix a forward value: rewrite the group so "
            f"that the op only sees inputs where it is finite, with torch.where or clamp (see "
            f"docs/tutorial.md, 'A NaN in the forward pass')",
            inst.name, inst.id, op, f"{file}:{line}")


def watch(instance: GroupInstance, members: Iterable[Any]) -> None:
    """Hook a check onto every member of ``instance`` when it is an outermost instance (its close
    comes after every rule hook of its members was installed) or an override group (whose subgraph
    no enclosing instance walks)."""
    if instance.parent is not None and instance.rules.override is None:
        return
    for node in members:
        claim = node.metadata.get(CLAIM)
        node.register_hook(NonFiniteCheck(claim.owner if claim is not None else instance, node))

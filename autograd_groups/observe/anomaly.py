"""Group-level anomaly detection: which group, which op, which forward line made a gradient non-finite.

``detect_nonfinite()`` is ``torch.autograd.detect_anomaly`` at the level of groups. While it is
active, every group instance is created, even one with no rules, and when its outermost enclosing
instance closes, each of its autograd nodes gets a post-hook that runs after any rule hook of the
node: if the node turned a finite incoming gradient into a gradient with a NaN or an infinity, it
raises :class:`~autograd_groups.errors.NonFiniteError` naming the node's innermost group instance,
the op and the forward line that created the instance. The hook never changes a gradient.

The switch is process-wide (like trace sessions), because the backward runs on autograd's own
threads, and it is read in the forward: instances created while it is on are checked whenever
their backward runs. Wrap the forward pass (and the backward, for clarity) in the block.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch

from .. import nodes
from ..errors import NonFiniteError
from ..groups.claims import CLAIM
from ..groups.instance import GroupInstance

_lock = threading.Lock()
_depth = 0


def active() -> bool:
    """Whether a ``detect_nonfinite()`` block is open in any thread."""
    return _depth > 0


@contextlib.contextmanager
def detect_nonfinite() -> Iterator[None]:
    """Raise :class:`~autograd_groups.NonFiniteError` when an op inside a group produces a
    non-finite gradient, naming the group instance, the op and the line that created the group.

    >>> import torch, autograd_groups as ag
    >>> @ag.autograd_group("root")
    ... def root(x):
    ...     return x.sqrt()
    >>> with ag.detect_nonfinite():
    ...     root(torch.zeros(1, requires_grad=True)).sum().backward()  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    autograd_groups.errors.NonFiniteError: non-finite gradient in group 'root' (created at ...): op sqrt ...
    """
    global _depth
    with _lock:
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1


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


def watch(instance: GroupInstance, members: Iterable[Any]) -> None:
    """Hook a check onto every member of ``instance`` when it is an outermost instance (its close
    comes after every rule hook of its members was installed) or an override group (whose subgraph
    no enclosing instance walks)."""
    if instance.parent is not None and instance.rules.override is None:
        return
    for node in members:
        claim = node.metadata.get(CLAIM)
        node.register_hook(NonFiniteCheck(claim.owner if claim is not None else instance, node))

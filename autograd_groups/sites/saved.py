"""Saved values: whether the forward may read them now, and reading them again under saved-tensor hooks.

A subgradient rule reads its op's saved values (``result == 0``) in a post-hook, after the op's own
backward has read them. Plain autograd allows that, but a saved-tensor hook may not:
``torch.utils.checkpoint(use_reentrant=False)`` hands out each recomputed value once per backward
pass. While a group whose rules read saved values runs under such a hook, :func:`push` stacks a
hook on top of it that packs with the outer hook and keeps what the first unpack of each backward
pass returned, for the rule to read again. The kept value lives as long as the saved variable: until
the op's backward releases it, or with the graph under ``retain_graph=True``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .. import compat


def readable() -> bool:
    """Whether the forward running now may read the values nodes saved: not while a compiler or a
    ``torch.func`` transform traces it, nor under saved-tensor hooks, which would unpack (or
    recompute) them.

    >>> readable()
    True
    """
    return (not compat.is_compiling() and compat.peek_interpreter_stack() is None
            and compat.top_saved_tensors_hooks() is None)


class _Packed:
    __slots__ = ("packed", "task", "value")

    def __init__(self, packed: Any) -> None:
        self.packed = packed
        self.task = -1
        self.value: Any = None


class _Rereadable:
    """Saved-tensor hooks over ``pack``/``unpack`` whose unpack may run twice per backward pass."""

    def __init__(self, pack: Callable[[torch.Tensor], Any], unpack: Callable[[Any], torch.Tensor]) -> None:
        self._pack = pack
        self._unpack = unpack

    def pack(self, tensor: torch.Tensor) -> _Packed:
        return _Packed(self._pack(tensor))

    def unpack(self, packed: _Packed) -> torch.Tensor:
        task = compat.current_graph_task_id()
        if task == -1:  # read outside a backward pass: nothing to share it with
            return self._unpack(packed.packed)
        if packed.task != task:
            # Detached: the unpacked tensor's grad_fn could be the node that holds ``packed``.
            packed.value = self._unpack(packed.packed).detach()
            packed.task = task
        return packed.value


def push() -> bool:
    """Stack re-readable hooks over the current saved-tensor hooks; whether there were any.

    >>> import torch
    >>> push()
    False
    >>> with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
    ...     pushed = push()
    ...     pop()
    >>> pushed
    True
    """
    top = compat.top_saved_tensors_hooks()
    if top is None or isinstance(getattr(top[0], "__self__", None), _Rereadable):
        return False
    hooks = _Rereadable(*top)
    compat.push_saved_tensors_hooks(hooks.pack, hooks.unpack)
    return True


def pop() -> None:
    """Remove the hooks :func:`push` stacked."""
    compat.pop_saved_tensors_hooks()

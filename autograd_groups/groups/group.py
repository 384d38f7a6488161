"""``autograd_group``: mark a region of the forward computation as a group, as a decorator or as
a context manager. The instance lifecycle itself lives in :mod:`autograd_groups.groups.lifecycle`."""

from __future__ import annotations

import functools
import inspect
import threading
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

import torch
from torch.overrides import TorchFunctionMode

from ..errors import GroupError
from ..sites.levels import graph_roots
from ..sites.override import run_override
from .instance import GroupInstance
from .lifecycle import close_instance, open_instance, pop_instance, tensors_of

F = TypeVar("F", bound=Callable[..., Any])
_local = threading.local()

_Entry = tuple["autograd_group", "tuple[GroupInstance, _Recorder] | None"]


def _entries() -> list[_Entry]:
    """The open ``with`` groups of this thread, innermost last."""
    entries: list[_Entry] | None = getattr(_local, "entries", None)
    if entries is None:
        entries = _local.entries = []
    return entries


def _named_inputs(signature: inspect.Signature | None, args: tuple[Any, ...], kwargs: dict[str, Any],
                  ) -> tuple[dict[int, str], list[torch.Tensor], dict[str, Any]]:
    """The tensor arguments of a call (by the id of the node or leaf that stands for each, and in
    order), and every argument by its parameter name."""
    names: list[str] = []
    values: list[Any] = []
    if signature is not None:
        try:
            bound = signature.bind(*args, **kwargs)
            names, values = list(bound.arguments), list(bound.arguments.values())
        except TypeError:
            pass
    if not names:
        names = [f"arg{i}" for i in range(len(args))] + list(kwargs)
        values = [*args, *kwargs.values()]
    named: dict[int, str] = {}
    tensors: list[torch.Tensor] = []
    for name, value in zip(names, values):
        if isinstance(value, torch.Tensor):
            tensors.append(value)
            named[id(value.grad_fn) if value.grad_fn is not None else id(value)] = name
    return named, tensors, dict(zip(names, values))


class _Recorder(TorchFunctionMode):
    """Collects the autograd nodes of every torch call made inside a ``with`` group."""

    def __init__(self) -> None:
        super().__init__()
        self.roots: list[Any] = []

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if torch.compiler.is_compiling():
            # Traced, the op would join a compiled graph that no rule can reach: run it eagerly.
            func = torch.compiler.disable(func)
        out = func(*args, **(kwargs or {}))
        self.roots.extend(graph_roots(tensors_of(out)))
        return out


class autograd_group:
    """Mark a region of the forward computation as the group ``name``.

    As a decorator, the function's tensor arguments are the group's inputs and its return values
    its outputs; as a context manager, the nodes made by torch calls inside the block are the
    group's, and the boundary is found from them.

    >>> import torch, autograd_groups as ag
    >>> @ag.autograd_group("norm2")
    ... def norm2(x):
    ...     return x.pow(2).sum(-1).sqrt()
    >>> with ag.registry_scope():
    ...     _ = ag.register_rule("norm2", ag.Subgradient(op="sqrt", when="result == 0", grad=0))
    ...     x = torch.zeros(3, requires_grad=True)
    ...     norm2(x).backward()
    ...     x.grad
    tensor([0., 0., 0.])
    """

    def __init__(self, name: str) -> None:
        if not isinstance(name, str) or not name:
            raise GroupError(f"a group name must be a non-empty string, not {name!r}")
        self.name = name

    def __call__(self, fn: F) -> F:
        name = self.name
        try:
            signature: inspect.Signature | None = inspect.signature(fn)
        except (TypeError, ValueError):
            signature = None

        @functools.wraps(fn)
        def grouped(*args: Any, **kwargs: Any) -> Any:
            if torch.compiler.is_compiling():
                if torch.compiler.is_exporting() or not torch.is_grad_enabled():
                    return fn(*args, **kwargs)  # no autograd graph for rules: trace through
                # Traced by torch.compile, the group's ops would become one compiled node that no
                # rule can reach; run eagerly instead (a graph break), keeping the real nodes.
                return torch.compiler.disable(this())(*args, **kwargs)
            instance = open_instance(name, 2)
            if instance is None:
                return fn(*args, **kwargs)
            if instance.rules.override is not None:
                named, inputs, arguments = _named_inputs(signature, args, kwargs)
                return run_override(instance, fn, args, kwargs, inputs, named, arguments)
            named = _named_inputs(signature, args, kwargs)[0] if instance.graph is not None else {}
            try:
                out = fn(*args, **kwargs)
            except BaseException:
                pop_instance(instance)
                raise
            close_instance(instance, graph_roots(tensors_of(out)), named)
            return out

        this = weakref.ref(grouped)  # not the function itself: that would be a reference cycle
        grouped.__autograd_group__ = name  # type: ignore[attr-defined]
        return grouped  # type: ignore[return-value]

    def __enter__(self) -> GroupInstance | None:
        entries = _entries()
        instance = open_instance(self.name, 2)
        if instance is None:
            entries.append((self, None))
            return None
        if instance.rules.override is not None:
            pop_instance(instance)
            raise GroupError(
                f"group {self.name!r} has an override rule ({instance.rules.override.label}), which "
                f"needs the group's inputs and outputs: use @autograd_group({self.name!r}) on a "
                f"function instead of a `with` block (at {instance.where})")
        recorder = _Recorder()
        recorder.__enter__()
        entries.append((self, (instance, recorder)))
        return instance

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        entries = _entries()
        if not entries or entries[-1][0] is not self:
            raise GroupError(f"group {self.name!r} was closed out of order: groups must nest like "
                             f"`with` blocks")
        entry = entries.pop()[1]
        if entry is None:
            return
        instance, recorder = entry
        recorder.__exit__(exc_type, *exc)
        if exc_type is not None:
            pop_instance(instance)
            return
        close_instance(instance, list(reversed(recorder.roots)), {})

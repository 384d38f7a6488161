"""What ``ag.verify`` records beyond a trace: the calls of decorator groups, to run them again on
their own inputs, and, at each rule site, the elements a rule changed, to find the input gradients
those elements reach.

A group instance carries a recorder only when it was created inside a trace session while one was
active (decided at forward time and kept on the instance, so that rule sites running on the autograd
engine's threads see it). Outside ``ag.verify`` no instance has one, and nothing here runs.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from .. import compat, levels


@dataclass
class Call:
    """A call of a decorator group: its name, the function it decorates, and copies of its
    arguments, made at forward time (the caller may change the originals in place later, as an
    optimizer does)."""

    group: str
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    #: The ``torch.compile`` options of a group declared ``compile=True`` (it ran eagerly, observed).
    compile: dict[str, Any] | None = None


@dataclass
class RuleRun:
    """One run of a rule at a rule site: the autograd node, the rule, the masks of the elements
    it changed (one per gradient it set, see :mod:`autograd_groups.sites.hooks`), and the node's
    place among the instance's members (``SiteHook.index``)."""

    node: Any
    rule: Any
    masks: list[torch.Tensor]
    index: int | None = None


def _copy(value: Any) -> Any:
    """A copy of an argument: a tensor's plain value under its torch.func wrappers, requiring grad
    where it does at some level (made outside the transforms, which refuse ``requires_grad_``)."""
    if not isinstance(value, torch.Tensor):
        return value
    plain, wanted = levels.unwrapped(value)
    if plain is None:
        raise _Batched
    with levels.outside_transforms():
        return plain.detach().clone().requires_grad_(wanted)


class _Batched(Exception):
    """An argument is a vmap batch: the call is no one point to check."""


class Recorder:
    """Collects, for the instances created while it is active: their creation order; copies of the
    calls of decorator groups, until each rule of a group has fired in ``copies`` copied instances;
    and, when ``record_runs``, each run of a rule at a rule site, with the elements it changed,
    during the first backward pass (until :meth:`stop`).

    The runs hold autograd nodes, whose hooks hold the instances, which hold the recorder: a
    cycle through autograd's C++ graph that the cycle collector cannot see. :meth:`release` cuts it.
    """

    def __init__(self, copies: int = 0, record_runs: bool = False) -> None:
        self.copies = copies
        self.record_runs = record_runs
        self.instances: list[Any] = []
        self.calls: dict[int, Call] = {}
        self.runs: dict[tuple[int, str], list[RuleRun]] = {}
        self._copied: dict[str, list[Any]] = {}
        self._decorated: set[int] = set()
        #: The decorator groups' instances called on vmap batches, which are not copied.
        self.batched: set[int] = set()
        self._lock = threading.Lock()
        self._stopped = False

    def called(self, instance: Any, fn: Callable[..., Any], args: tuple[Any, ...],
               kwargs: dict[str, Any], compile: dict[str, Any] | None = None) -> None:
        """A decorator group's instance ``instance`` was entered: ``fn(*args, **kwargs)``, ``fn``
        the function it decorates (declared with ``compile`` options, if given)."""
        self.instances.append(instance)
        self._decorated.add(id(instance))
        if not self._room(instance):
            return
        try:
            self.calls[id(instance)] = Call(instance.name, fn, tuple(_copy(a) for a in args),
                                            {k: _copy(v) for k, v in kwargs.items()}, compile)
        except _Batched:
            self.batched.add(id(instance))

    def _room(self, instance: Any) -> bool:
        """Whether this call is worth copying: one of the instance's rules has fired in fewer than
        ``copies`` copied instances of its group. Copies of instances whose backward ran without
        firing are dropped here, so that a long script keeps only what will be checked."""
        copied = self._copied.setdefault(instance.name, [])
        for earlier in [i for i in copied if i.reached and not any(i.hits.values())]:
            copied.remove(earlier)
            self.calls.pop(id(earlier), None)
        fired = [sum(bool(i.hits.get(rule.label)) for i in copied) for rule in instance.rules.rules]
        if not any(count < self.copies for count in fired):
            return False
        copied.append(instance)
        return True

    def call(self, instance: Any) -> Call | None:
        """The copied call that created ``instance``, if any."""
        return self.calls.get(id(instance))

    def decorated(self, instance: Any) -> bool:
        """Whether ``instance`` was made by a call of a decorator group (not ``with`` or ``tag``)."""
        return id(instance) in self._decorated

    def changed(self, instance: Any, rule: Any, masks: list[torch.Tensor], index: int | None) -> None:
        """At the running rule site of ``instance`` (member ``index``), ``rule`` changed the elements
        ``masks``."""
        if not self.record_runs or self._stopped or rule not in instance.rules.rules:
            return  # (a rule the instance does not have: the formula guard of create_graph)
        while instance.merged_into is not None:  # tagged chains that met: the runs are the root's
            instance = instance.merged_into
        run = RuleRun(compat.current_autograd_node(), rule, [m.detach() for m in masks], index)
        with self._lock:
            self.runs.setdefault((id(instance), rule.label), []).append(run)

    def stop(self) -> None:
        """Record no more runs: later backward passes over the same graph run the same rule sites."""
        self._stopped = True

    def release(self) -> None:
        """Forget the runs and their autograd nodes, once they have served."""
        with self._lock:
            self.runs.clear()

    def close(self) -> None:
        """Forget everything, once the check has run: a copied call's function holds its globals,
        where a script's ``loss`` keeps the graph whose rule sites hold the instances that hold this
        recorder, a cycle through autograd's graph that the cycle collector cannot see."""
        self.release()
        self.calls.clear()
        self._copied.clear()
        self.instances.clear()


_active: list[Recorder] = []
_active_lock = threading.Lock()


def active() -> Recorder | None:
    """The innermost active recorder, if any (process-wide, as trace sessions are)."""
    return _active[-1] if _active else None


@contextlib.contextmanager
def recording(recorder: Recorder) -> Iterator[Recorder]:
    """Make ``recorder`` the one that instances created inside the block (and traced) carry."""
    with _active_lock:
        _active.append(recorder)
    try:
        yield recorder
    finally:
        with _active_lock:
            _active.remove(recorder)

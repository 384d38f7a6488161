"""Process-wide counters: per group, how often it ran and how often its rules fired.

Counting an element means a reduction over a rule's mask, so elements are counted only for traced
instances (see :class:`~autograd_groups.sites.hooks.SiteHook`); calls and firings are always counted.
"""

from __future__ import annotations

import contextlib
import copy
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ..rules import registry


@dataclass
class _RuleCounter:
    kind: str
    calls: int = 0
    firings: int = 0
    elements: int = 0


@dataclass
class _GroupCounter:
    instances: int = 0
    instances_off: int = 0
    backward_passes: int = 0
    rules: dict[str, _RuleCounter] = field(default_factory=dict)


_lock = threading.Lock()
_groups: dict[str, _GroupCounter] = {}
# Groups that ran inside compiled code. A plain set, no lock: adding to it is atomic, and it is
# also done from a hook that compiled autograd traces with Dynamo, which cannot enter a lock.
_compiled: set[str] = set()


def _group(name: str) -> _GroupCounter:
    found = _groups.get(name)
    if found is None:
        found = _groups.setdefault(name, _GroupCounter())
    return found


def count_instance(name: str, enabled: bool, delta: int = 1) -> None:
    """``delta`` more instances of ``name`` (with special cases ``enabled`` or not)."""
    with _lock:
        counter = _group(name)
        counter.instances += delta
        counter.instances_off += 0 if enabled else delta


def count_compiled(name: str) -> None:
    """A compiler traced an instance or a rule site of ``name`` into a compiled graph, where nothing
    is counted."""
    _compiled.add(name)


def compiled_groups() -> list[str]:
    """The groups torch.compile has traced into a compiled graph."""
    return sorted(_compiled)


def count_backward(name: str) -> None:
    """One more backward pass reached an instance of ``name``."""
    with _lock:
        _group(name).backward_passes += 1


def count_rule(name: str, label: str, kind: str, elements: int = 0, fired: bool = False) -> None:
    """A rule ran once, changed ``elements`` elements (when counted) and ``fired`` (override)."""
    with _lock:
        rule = _group(name).rules.get(label)
        if rule is None:
            rule = _group(name).rules[label] = _RuleCounter(kind)
        rule.calls += 1
        rule.firings += fired
        rule.elements += elements


def stats() -> dict[str, dict[str, Any]]:
    """Per group: instances, instances created with special cases off, backward passes, whether it
    ran inside torch.compile'd code (``compiled``: its instances, passes and rule calls there are not
    counted), whether any rule is ``registered`` under its name now (False for a group with no rules
    registered, such as a misspelled name), and per rule its kind, calls, firings (override) and
    elements changed (subgradient, nan_safe; counted while traced).

    >>> import autograd_groups as ag
    >>> ag.reset_stats(); ag.stats()
    {}
    """
    with _lock:
        names = [*_groups, *sorted(_compiled - set(_groups))]
        snapshot = {name: (g.instances, g.instances_off, g.backward_passes, name in _compiled,
                           {label: (r.kind, r.calls, r.firings, r.elements)
                            for label, r in g.rules.items()})
                    for name, g in ((n, _groups.get(n, _GroupCounter())) for n in names)}
    return {
        name: {
            "instances": instances,
            "instances_off": off,
            "backward_passes": passes,
            "compiled": compiled,
            "registered": registry.has_rules(name),
            "rules": {label: {"kind": kind, "calls": calls, "firings": firings,
                              "elements": elements}
                      for label, (kind, calls, firings, elements) in rules.items()},
        }
        for name, (instances, off, passes, compiled, rules) in snapshot.items()
    }


def reset_stats() -> None:
    """Forget all counts."""
    with _lock:
        _groups.clear()
        _compiled.clear()


@contextlib.contextmanager
def kept() -> Iterator[None]:
    """Leave the counts as they were before the block (``ag.verify`` runs the groups many times;
    counts that other threads make meanwhile are lost too).

    >>> import autograd_groups as ag
    >>> ag.reset_stats()
    >>> with kept():
    ...     count_instance("g", True)
    >>> ag.stats()
    {}
    """
    with _lock:
        groups, compiled = copy.deepcopy(_groups), set(_compiled)
    try:
        yield
    finally:
        with _lock:
            _groups.clear()
            _groups.update(groups)
            _compiled.clear()
            _compiled.update(compiled)

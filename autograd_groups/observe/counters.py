"""Process-wide counters: per group, how often it ran and how often its rules fired.

Counting an element means a reduction over a rule's mask, so elements are counted only for traced
instances (see :class:`~autograd_groups.sites.hooks.SiteHook`); calls and firings are always counted.
A count the backward made on a device (an override's answer there) stays a device tensor, added to
on the device, until :func:`stats` reads it: reading it in the backward would make the host wait.
"""

from __future__ import annotations

import contextlib
import copy
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from ..instance import GroupInstance
from ..rules import compiled_groups, registry
from ..rules.kinds import Rule

#: Where an instance was created: ``(file, line)``, as :attr:`GroupInstance.site`.
CallSite = tuple[str, int]


@dataclass
class _RuleCounter:
    kind: str
    calls: int = 0
    firings: int | torch.Tensor = 0
    elements: int | torch.Tensor = 0
    #: Calls whose elements could not be counted: their masks were vmap batches.
    uncounted: int = 0


@dataclass
class _CallSiteCounter:
    instances: int = 0
    instances_off: int = 0
    backward_passes: int = 0
    nonfinite: int = 0
    rules: dict[str, _RuleCounter] = field(default_factory=dict)


_lock = threading.Lock()
_sites: dict[str, dict[CallSite, _CallSiteCounter]] = {}


def _site(name: str, site: CallSite) -> _CallSiteCounter:
    found = _sites.get(name, {}).get(site)
    if found is None:
        found = _sites.setdefault(name, {}).setdefault(site, _CallSiteCounter())
    return found


def count_instance(name: str, site: CallSite, enabled: bool, delta: int = 1) -> None:
    """``delta`` more instances of ``name`` created at ``site`` (with special cases ``enabled`` or not)."""
    with _lock:
        counter = _site(name, site)
        counter.instances += delta
        counter.instances_off += 0 if enabled else delta


def count_compiled(name: str) -> None:
    """A compiler traced an instance or a rule site of ``name`` into a compiled graph, where nothing
    is counted."""
    compiled_groups.add(name)


def count_backward(name: str, site: CallSite) -> None:
    """One more backward pass reached an instance of ``name`` created at ``site``."""
    with _lock:
        _site(name, site).backward_passes += 1


def note_backward(instance: GroupInstance) -> None:
    """Count the backward pass running now at ``instance``, once (its override calls this)."""
    if instance.new_pass():
        count_backward(instance.name, instance.site)


def count_site(instance: GroupInstance, rules: Sequence[Rule],
               elements: Sequence[int | None] | None = None) -> None:
    """One run of a rule site of ``instance``: the backward pass running now, once per pass, and
    one call of each of ``rules``, with the ``elements`` each changed where counted, under one lock
    (a site runs at every backward of every call)."""
    first = instance.new_pass()
    with _lock:
        counter = _site(instance.name, instance.site)
        counter.backward_passes += first
        for k, rule in enumerate(rules):
            found = counter.rules.get(rule.label)
            if found is None:
                found = counter.rules[rule.label] = _RuleCounter(rule.kind)
            found.calls += 1
            if elements is None:
                continue
            n = elements[k]
            if n is None:
                found.uncounted += 1
            else:
                found.elements += n


def count_nonfinite(name: str, site: CallSite) -> None:
    """A backward pass gave an instance of ``name`` created at ``site`` non-finite input gradients
    (counted while traced)."""
    with _lock:
        _site(name, site).nonfinite += 1


def count_rule(name: str, site: CallSite, label: str, kind: str, elements: int = 0,
               fired: bool | torch.Tensor = False) -> None:
    """A rule ran once, changed ``elements`` elements (when counted) and ``fired`` (override)."""
    with _lock:
        rules = _site(name, site).rules
        rule = rules.get(label)
        if rule is None:
            rule = rules[label] = _RuleCounter(kind)
        rule.calls += 1
        rule.firings += fired
        rule.elements += elements


def _where(site: CallSite) -> str:
    return f"{site[0]}:{site[1]}" if site[1] else site[0]


def _counts(counter: _CallSiteCounter) -> dict[str, Any]:
    return {"instances": counter.instances, "instances_off": counter.instances_off,
            "backward_passes": counter.backward_passes, "nonfinite_gradients": counter.nonfinite,
            "rules": {label: {"kind": r.kind, "calls": r.calls, "firings": int(r.firings),
                              "elements": int(r.elements), "uncounted": r.uncounted}
                      for label, r in counter.rules.items()}}


def _total(counters: list[_CallSiteCounter]) -> _CallSiteCounter:
    total = _CallSiteCounter()
    for counter in counters:
        total.instances += counter.instances
        total.instances_off += counter.instances_off
        total.backward_passes += counter.backward_passes
        total.nonfinite += counter.nonfinite
        for label, rule in counter.rules.items():
            into = total.rules.setdefault(label, _RuleCounter(rule.kind))
            into.calls += rule.calls
            into.firings += rule.firings
            into.elements += rule.elements
            into.uncounted += rule.uncounted
    return total


class Region(Protocol):
    """What ``stats`` reads of a group compiled as its own region (groups/region.py)."""

    @property
    def compiles(self) -> int: ...

    saved_bytes: int | None


#: Per group compiled as its own region: its regions (one per function declared under its name), and
#: its calls by how they ran (``"compiled"``, or why eagerly).
_regions: dict[str, list[Region]] = {}
_region_calls: dict[str, dict[str, int]] = {}


def add_region(name: str, region: Region) -> None:
    """Report the calls of ``region``, group ``name`` compiled as its own region, in :func:`stats`."""
    with _lock:
        _regions.setdefault(name, []).append(region)


def count_region_call(name: str, how: str) -> None:
    """One more call of group ``name``'s region that ran ``how``: ``"compiled"``, or the reason it
    ran eagerly."""
    with _lock:
        calls = _region_calls.setdefault(name, {})
        calls[how] = calls.get(how, 0) + 1


def _region(name: str) -> dict[str, Any]:
    calls = dict(_region_calls.get(name, {}))
    compiled = calls.pop("compiled", 0)
    regions = _regions.get(name, [])
    saved = [r.saved_bytes for r in regions if r.saved_bytes is not None]
    return {"region": {"compiled_calls": compiled, "eager_calls": calls,
                       "compiles": sum(r.compiles for r in regions),
                       "saved_bytes": sum(saved) if saved else None}}


def stats() -> dict[str, dict[str, Any]]:
    """Per group: instances, instances created with special cases off, backward passes, backward
    passes whose input gradients came out non-finite (``nonfinite_gradients``, counted while
    traced), whether it ran inside torch.compile'd code (``compiled``: its instances, passes and
    rule calls there are not counted), whether any rule is ``registered`` under its name now (False
    for a group with no rules registered, such as a misspelled name), per rule its kind, calls,
    firings (override) and elements changed (subgradient, nan_safe; counted while traced), the
    calls whose elements could not be counted (``uncounted``: under ``vmap``, a rule's mask is a
    batch), for a group declared ``compile=True`` its ``region`` (``compiled_calls``,
    ``eager_calls`` by the reason they ran eagerly, ``compiles``: graphs in its caches,
    ``saved_bytes``: what its compiled regions saved for backward, counted at the first call of
    each new graph; summed over the functions declared under its name), and
    ``sites``: the same counts per line of code (``file:line``) that created its instances.

    >>> import autograd_groups as ag
    >>> ag.reset_stats(); ag.stats()
    {}
    """
    compiled = compiled_groups.names()
    with _lock:
        names = [*_sites, *sorted((compiled | set(_region_calls)) - set(_sites))]
        snapshot = {name: {site: _counts(c) for site, c in _sites.get(name, {}).items()} for name in names}
        totals = {name: _counts(_total(list(_sites.get(name, {}).values()))) for name in names}
    return {
        name: {**totals[name], "compiled": name in compiled, "registered": registry.has_rules(name),
               **(_region(name) if name in _region_calls else {}),
               "sites": {_where(site): counts for site, counts in snapshot[name].items()}}
        for name in names
    }


def reset_stats() -> None:
    """Forget all counts."""
    with _lock:
        _sites.clear()
        _region_calls.clear()
        compiled_groups.reset()


@contextlib.contextmanager
def kept() -> Iterator[None]:
    """Leave the counts as they were before the block (``ag.verify`` runs the groups many times;
    counts that other threads make meanwhile are lost too).

    >>> import autograd_groups as ag
    >>> ag.reset_stats()
    >>> with kept():
    ...     count_instance("g", ("f.py", 1), True)
    >>> ag.stats()
    {}
    """
    with _lock:
        sites, compiled = copy.deepcopy(_sites), compiled_groups.names()
        regions, calls = {n: list(r) for n, r in _regions.items()}, copy.deepcopy(_region_calls)
    try:
        yield
    finally:
        with _lock:
            _sites.clear()
            _sites.update(sites)
            _regions.clear()
            _regions.update(regions)
            _region_calls.clear()
            _region_calls.update(calls)
            compiled_groups.reset(compiled)

"""Memory: thousands of forward+backward passes through every form of group leave nothing behind.

The cycle collector is switched off while the iterations run, so that a reference cycle created by
a group instance, a hook, a trace session or the registry cannot be collected silently on the way:
``gc.collect()`` afterwards must find none. Object and tensor counts are taken after a warm-up.
"""

from __future__ import annotations

import gc
import sys
import weakref
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
import torch
from reliability_models import cdist, euclidean_cdist, register_rules, safe_norm, safe_power
from torch.utils.checkpoint import checkpoint

import autograd_groups as ag
from autograd_groups.instance import GroupInstance
from autograd_groups.observe.tracer import Trace
from autograd_groups.sites.hooks import SiteHook
from autograd_groups.sites.saved import _Packed

ITERATIONS = 5000
TRACED_ITERATIONS = 500
WARM_UP = 50
# Caches of Python, torch and pytest fill now and then (up to ~110 objects seen, once per run); a
# leak of even one object per step would add thousands.
MAX_ONE_OFF_OBJECTS = 300

outer = ag.autograd_group("rel_outer")(lambda x1, x2: cdist(x1, x2).exp())


@pytest.fixture(autouse=True)
def _rules() -> None:
    register_rules()
    ag.register_rule("rel_outer", ag.Subgradient(op="exp", when="result > 1e30", grad=0))
    ag.register_rule("rel_ctx", ag.Subgradient(op="sqrt", when="result == 0", grad=0))
    ag.register_rule("rel_tag", ag.Subgradient(op="sqrt", when="result == 0", grad=0))


class Model(torch.nn.Module):
    """Every form of group: decorator, nested decorators, ``with`` block, ``tag`` chain, override
    and NaN-safe groups; identical rows make every rule fire."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(2, 2)

    def forward(self, x1: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:
        z1, z2 = self.lin(x1), self.lin(x2)
        with ag.autograd_group("rel_ctx"):
            in_block = euclidean_cdist(z1, z2)
        squared = ag.tag(ag.tag(z1 - z2[:1], "rel_tag").pow(2).sum(-1), "rel_tag")
        tagged = ag.tag(squared.sqrt(), "rel_tag")
        return (cdist(z1, z2).sum() + outer(z1, z2).sum() + in_block.sum() + tagged.sum()
                + safe_norm(z1 - z2[:1]).sum() + safe_power(z1.abs(), 2 * torch.ones_like(z1)).sum())


def _step(model: Model, i: int) -> list[weakref.ref[torch.Tensor]]:
    """One forward+backward; flag on, off at forward, or off for the backward, by turns."""
    x1 = torch.zeros(3, 2, requires_grad=True)
    x2 = torch.zeros(2, 2, requires_grad=True)
    model.zero_grad(set_to_none=True)
    with ag.special_cases(i % 3 != 1):
        loss = model(x1, x2)
    with ag.special_cases(i % 3 != 2, during="backward"):
        loss.backward()
    assert x1.grad is not None
    return [weakref.ref(t) for t in (x1, x2, x1.grad, loss)]


def _ours(obj: object) -> bool:
    """Objects a cycle through our groups would hold: ours, the test model's, plain tensors."""
    kind = type(obj)
    return (kind.__module__.startswith(("autograd_groups", "reliability_models", "test_memory"))
            or kind in (torch.Tensor, torch.nn.Parameter))


def _cycles(generation: int = 2) -> Counter[str]:
    """Collect ``generation``; return the types of our objects that only reference cycles kept alive.

    Other libraries' garbage is not the subject: torch.compile, run earlier in the same worker,
    leaves cyclic garbage of its own that the collector may find here."""
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        gc.collect(generation)
        found = Counter(type(o).__qualname__ for o in gc.garbage if _ours(o))
    finally:
        gc.garbage.clear()
        gc.set_debug(0)
    gc.collect(min(generation + 1, 2))  # saved, the garbage survived into the next generation
    return found


def _census() -> tuple[int, int, int]:
    """Live objects, live tensors, and live group instances, rule-site hooks and trace sessions."""
    objects = gc.get_objects()
    ours = (GroupInstance, SiteHook, Trace, _Packed)
    return (len(objects), sum(issubclass(type(o), torch.Tensor) for o in objects),
            sum(issubclass(type(o), ours) for o in objects))


def _new_types(known: set[int]) -> Counter[str]:
    return Counter(type(o).__qualname__ for o in gc.get_objects() if id(o) not in known)


def _assert_no_leak(step: Callable[[int], list[weakref.ref[Any]]], iterations: int) -> None:
    """Run ``step(i)`` ``iterations`` times after a warm-up; each step's weakly referenced objects
    must be freed by the end of the step, and nothing may be left over or caught in a cycle.

    Live tensors and our own objects must not grow at all. Python objects may grow by a few hundred
    at most, once (Python's, torch's and pytest's lazily filled caches, now and then), while a
    leak of one object per step would add ``iterations``.
    """
    gc.collect()  # the young garbage of what ran before (a verify run's cycles) is not the subject
    for i in range(WARM_UP):
        step(i)
    if "torch._dynamo" in sys.modules:
        # Functions that other tests of this worker compiled stay in Dynamo's caches, with the
        # group instances and rule sites they traced: not this test's subject.
        torch._dynamo.reset()
    gc.collect()  # garbage of first uses (lazy imports, caches) is not the subject
    gc.disable()
    try:
        objects, tensors, ours = _census()
        known = {id(o) for o in gc.get_objects()}
        alive = 0
        for i in range(iterations):
            alive += sum(ref() is not None for ref in step(i))
        assert alive == 0, "objects of a step outlived it"
        assert _cycles() == Counter()
        objects_after, tensors_after, ours_after = _census()
        # Fewer is no leak: a collection during the run may free garbage an earlier test left.
        assert tensors_after <= tensors and ours_after == ours == 0
        assert objects_after - objects <= MAX_ONE_OFF_OBJECTS, _new_types(known)
    finally:
        gc.enable()


def test_5000_iterations_leave_no_objects_tensors_or_cycles() -> None:
    model = Model()
    _assert_no_leak(lambda i: _step(model, i), ITERATIONS)


def test_trace_sessions_leave_no_objects_or_cycles() -> None:
    model = Model()

    def traced_step(i: int) -> list[weakref.ref[Any]]:
        with ag.trace() as t:
            refs: list[weakref.ref[Any]] = [*_step(model, i)]
        assert len(t.instances) >= 6
        return [*refs, weakref.ref(t)]

    _assert_no_leak(traced_step, TRACED_ITERATIONS)


def test_non_reentrant_checkpoint_leaves_no_objects_or_cycles() -> None:
    """torch.utils.checkpoint(use_reentrant=False) leaves cyclic garbage of its own on every call (7
    objects in PyTorch 2.13, with or without groups): each step collects the young generation, where
    a cycle through the group's saved-tensor hooks would be too, and none of it may be ours."""

    def backward() -> list[weakref.ref[Any]]:
        x1 = torch.zeros(3, 2, requires_grad=True)
        x2 = torch.zeros(2, 2, requires_grad=True)
        loss = checkpoint(cdist, x1, x2, use_reentrant=False).sum()
        loss.backward()
        assert x1.grad is not None and not x1.grad.isnan().any()
        return [weakref.ref(t) for t in (x1, x2, x1.grad, loss)]

    def step(i: int) -> list[weakref.ref[Any]]:
        refs = backward()
        assert _cycles(generation=0) == Counter()
        return refs

    # The rule's first firing at this call site is checked once (sites/first_order.py), by a run
    # whose recorder and group instance hold each other: garbage of one check, not of each step.
    backward()
    _assert_no_leak(step, 1000)


def test_registering_and_unregistering_leaves_no_objects_or_cycles() -> None:
    x1 = torch.zeros(3, 2, requires_grad=True)
    x2 = torch.zeros(2, 2, requires_grad=True)

    def churn(i: int) -> list[weakref.ref[Any]]:
        with ag.registry_scope():
            rule = ag.register_rule("rel_churn", ag.Subgradient(op="sqrt", when="result == 0", grad=0))
            grouped = ag.autograd_group("rel_churn")(euclidean_cdist)
            grouped(x1, x2).sum().backward()
            ag.unregister_rule("rel_churn", rule)
        return [weakref.ref(rule), weakref.ref(grouped)]

    _assert_no_leak(churn, 500)
    assert x1.grad is not None and not x1.grad.isnan().any()


SCRIPT = """
import torch
import autograd_groups as ag
ag.register_rule("G.forward", ag.Subgradient(op="sqrt", when="result == 0", grad=0))
class G(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(2, 2)
    @ag.autograd_group("G.forward")
    def forward(self, z):
        return self.fc(z).pow(2).sum(-1).sqrt()
g = G()
fake = g(torch.ones(3, 2))
"""


def test_a_scripts_namespace_that_keeps_a_methods_group_output_is_collected() -> None:
    """A script's top level keeps ``fake = g(z)``, whose graph holds the group instance: what the
    instance keeps of its call (the module ``self``) must not lead back to the namespace through
    the graph, a cycle the collector cannot see, or the namespace outlives the script."""
    with ag.registry_scope():
        namespace: dict[str, Any] = {}
        exec(compile(SCRIPT, "script.py", "exec"), namespace)
        model = weakref.ref(namespace["g"])
        assert namespace["fake"].grad_fn is not None
        del namespace
        gc.collect()
        assert model() is None

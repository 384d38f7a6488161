"""The 3-op group of issue 23 written by hand, without the library: what Python itself costs.

``profile_call.py`` times these beside the library's group to show how far its per-call cost is
from the least any Python rule site can cost: ``bare`` finds the nodes a call made, hooks the
``sqrt`` and at backward compares its saved result with 0 and fills the gradient there, and nothing
else; ``kept`` adds the bookkeeping the library cannot drop (what docs/guarantees.md promises needs
it): the flag read at forward and at backward, the compiler and tracer checks, counts per call site
under a lock, an instance on the open-group stack and a claim on the hooked node. Neither is a
group: one rule, one op, no errors, no nesting, no torch.func, no compiler. ``express`` is the
library's own instance, rule site (``SiteHook``), counts and claim, opened, walked and hooked in one
short pass for the usual call only: what an express path beside the general one would cost.
"""

from __future__ import annotations

import sys
import threading
from typing import Any

import torch
from torch._C._functorch import peek_interpreter_stack

from autograd_groups import flag, nodes
from autograd_groups.claims import CLAIM, Claim
from autograd_groups.groups.lifecycle import caller, open_instances
from autograd_groups.instance import GroupInstance
from autograd_groups.observe import anomaly, counters, tracer
from autograd_groups.rules import registry
from autograd_groups.sites import saved
from autograd_groups.sites.hooks import SiteHook

_ZERO = torch.zeros(())
_lock = threading.Lock()
_counts: dict[tuple[str, tuple[str, int]], list[int]] = {}
_local = threading.local()


_SQRT = type(torch.ones(1, requires_grad=True).sqrt().grad_fn)
_LEAF = type(torch.ones(1, requires_grad=True).sum().grad_fn.next_functions[0][0])


def sqrt_nodes(out: torch.Tensor, start: int) -> list[Any]:
    """The ``sqrt`` nodes made since sequence number ``start`` that ``out`` depends on."""
    found, seen, stack = [], set(), [out.grad_fn]
    while stack:
        node = stack.pop()
        if id(node) in seen or type(node) is _LEAF or node._sequence_nr() < start:
            continue
        seen.add(id(node))
        if type(node) is _SQRT:
            found.append(node)
        stack.extend(child for child, _ in node.next_functions if child is not None)
    return found


def _fill(grad_inputs: Any, grad_outputs: Any) -> Any:
    grad = grad_inputs[0]
    mask = torch._C._current_autograd_node()._saved_result == _ZERO
    if grad._base is None and grad.data_ptr() != grad_outputs[0].data_ptr():
        grad.masked_fill_(mask, 0.0)
    return grad_inputs


def fill_at_sqrt(out: torch.Tensor, start: int) -> torch.Tensor:
    """``out``, its ``sqrt`` nodes since ``start`` hooked to give gradient 0 where the root is 0:
    the least a post-hook design does (bench_core's floor uses it too)."""
    for node in sqrt_nodes(out, start):
        node.register_hook(_fill)
    return out


def bare(x: torch.Tensor) -> torch.Tensor:
    start = torch._C._autograd._get_sequence_nr()
    return fill_at_sqrt(torch.sqrt((x * x).sum(-1)), start)


class _Instance:
    __slots__ = ("name", "site", "task")


class _Site:
    __slots__ = ("instance",)

    def __init__(self, instance: _Instance) -> None:
        self.instance = instance

    def __call__(self, grad_inputs: Any, grad_outputs: Any) -> Any:
        instance = self.instance
        if torch.compiler.is_compiling() or not flag.backward_enabled(instance.name):
            return None
        if torch.is_grad_enabled() or peek_interpreter_stack() is not None:
            return None
        _fill(grad_inputs, grad_outputs)
        task = torch._C._current_graph_task_id()
        first, instance.task = task != instance.task, task
        with _lock:
            counts = _counts[(instance.name, instance.site)]
            counts[1] += first
            counts[2] += 1
        return grad_inputs


def kept(x: torch.Tensor) -> torch.Tensor:
    name = "lean"
    if not flag.enabled_for(name) or torch.compiler.is_compiling() or torch._C._is_tracing():
        return torch.sqrt((x * x).sum(-1))
    frame = sys._getframe(1)
    site = (frame.f_code.co_filename, frame.f_lineno)
    with _lock:
        counts = _counts.setdefault((name, site), [0, 0, 0])
        counts[0] += 1
    tracer.active(), anomaly.active()
    instance = _Instance()
    instance.name, instance.site, instance.task = name, site, -1
    stack = _local.__dict__.setdefault("stack", [])
    stack.append(instance)
    start = torch._C._autograd._get_sequence_nr()
    out = torch.sqrt((x * x).sum(-1))
    stack.pop()
    for node in sqrt_nodes(out, start):
        node.register_hook(_Site(instance))
        node.metadata["lean"] = instance
    return out


def express(x: torch.Tensor) -> torch.Tensor:
    """The body with group ``bench.norm3``'s rules (registered by the caller), the usual call only."""
    name = "bench.norm3"
    rules = registry.ruleset(name)
    assert flag.enabled_for(name) and rules.override is None and not open_instances()
    assert not (torch.compiler.is_compiling() or torch._C._is_tracing() or peek_interpreter_stack())
    assert tracer.active() is None and not anomaly.active() and torch.autograd.forward_ad._current_level < 0
    where = caller(1)
    counters.count_instance(name, where, True)
    instance = GroupInstance(name, rules, True, None, None, where, False, False)
    stack = open_instances()
    stack.append(instance)
    pushed = rules.reads_saved and saved.push()
    try:
        out = torch.sqrt((x * x).sum(-1))
    finally:
        stack.pop()
        if pushed:
            saved.pop()
    walk, seen = [out.grad_fn], set()
    while walk:
        node = walk.pop()
        if id(node) in seen or type(node) is nodes.ACCUMULATE_GRAD or node._sequence_nr() < instance._start:
            continue
        seen.add(id(node))
        subgradients = rules.at(node)
        if subgradients:
            node.register_hook(SiteHook(instance, subgradients, None, None, node))
            claim = node.metadata[CLAIM] = Claim(instance, None, False)
            claim.ruled.add(subgradients[0].op_key)
        walk.extend(child for child, _ in node.next_functions if child is not None)
    return out

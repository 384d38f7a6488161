"""The life of a group instance: open it at forward time, find the autograd nodes it created, hook
its rules.

An instance opens when the decorated function is called (or the ``with`` block entered) and closes
when it returns. At close, the nodes it created are found by walking back from its outputs through
``next_functions``; the walk stops at leaves, at the function's inputs and at any node older than
the instance (autograd numbers nodes in creation order). Each node whose op has a rule gets a
post-hook (:class:`~autograd_groups.sites.hooks.SiteHook`); nothing else is touched.

Whether special cases are on is decided here, at forward time, and kept on the instance. With
special cases off and no trace session open, a group does nothing at all.
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import sys
import threading
import warnings
from collections.abc import Iterator
from typing import Any

import torch

from .. import compat, finiteness, frames, host_reads, nodes
from ..claims import CLAIM, Claim
from ..errors import GroupError, InertRuleWarning
from ..instance import GroupInstance
from ..observe import anomaly, counters, inputs, recording, subgraph, tracer
from ..rules import registry
from ..rules.kinds import NanSafe, Subgradient
from ..sites import saved
from ..sites.hooks import SiteHook
from ..sites.tangents import linear_levels, transposing
from ..zero_passing import passes_zeros, passing_now

_local = threading.local()
_told: set[tuple[str, str]] = set()  # (what, group) of the warnings given once per group
#: Where an instance made in compiled code was created: Dynamo cannot read the caller's frame.
COMPILED = ("torch.compile'd code", 0)



def open_instances() -> list[GroupInstance]:
    stack: list[GroupInstance] | None = getattr(_local, "stack", None)
    if stack is None:
        stack = _local.stack = []
    return stack


@contextlib.contextmanager
def apart() -> Iterator[None]:
    """Run the block as if no group were open on this thread: the groups it calls are nobody's
    members (a check that runs the user's whole function again, from inside a group's backward)."""
    stack = open_instances()
    _local.stack = []
    try:
        yield
    finally:
        _local.stack = stack


#: Modules whose functions call a group on their own caller's behalf (ops.autocast's policies).
_CALLING_THROUGH: set[str] = set()


def call_through(module: str) -> None:
    """Let the functions of ``module`` call groups for their callers: a group called from one is
    created where that function was called, the frame that :func:`caller` then names."""
    _CALLING_THROUGH.add(module)


def caller(depth: int) -> tuple[str, int]:
    """``(file, line)`` of the code that called a group, ``depth`` frames up: past the functions
    that call groups for their callers and past PyTorch's own frames, so that a group that
    ``torch.func.hessian``, ``torch.autograd.functional.hessian`` or ``checkpoint`` called is
    created at the user's line that called them (where its warnings point)."""
    frame = sys._getframe(depth)
    while frame.f_back is not None and _calls_through(frame.f_globals.get("__name__") or ""):
        frame = frame.f_back
    return frame.f_code.co_filename, frame.f_lineno


def _calls_through(module: str) -> bool:
    return module in _CALLING_THROUGH or module == "torch" or module.startswith("torch.")


def observers(name: str, enabled: bool, where: tuple[str, int],
              compiling: bool) -> tuple[tracer.Trace | None, bool]:
    """Count a new instance of ``name``; the trace session that records it and whether
    ``detect_nonfinite()`` watches it.

    While torch.compile traces the group (on fake tensors, once per compilation), nobody can watch
    it: the instance is counted as compiled, and an open trace session or anomaly check is told so.
    """
    if compiling:
        counters.count_compiled(name)
        if (tracer.active() is not None or anomaly.active()) and ("compile", name) not in _told:
            _told.add(("compile", name))
            warnings.warn(
                f"group {name!r} runs inside a torch.compile'd graph: its rules are fused into the "
                f"compiled backward, where trace() and detect_nonfinite() cannot see them and "
                f"stats() does not count their calls. To inspect the group, run the model eagerly "
                f"(or the group's caller under torch.compiler.disable); see the documentation, "
                f"'torch.compile'",
                stacklevel=2)
        return None, False
    counters.count_instance(name, where, enabled)
    return tracer.active(), anomaly.active()


def recorded_without_rules(name: str, enabled: bool) -> bool:
    """Whether a tracer that keeps ops but no hooks -- ``torch.export``, ``torch.jit.trace`` -- is
    recording this call of group ``name``: its rules would be lost, so it runs as plain ops, and the
    first time (per group) a warning says so."""
    tracer_name = ("torch.export" if compat.is_exporting()
                   else "torch.jit.trace" if torch.jit.is_tracing() else None)
    if tracer_name is None:
        return False
    if enabled and registry.ruleset(name) and (tracer_name, name) not in _told:
        _told.add((tracer_name, name))
        warnings.warn(lost_rules(name, tracer_name), stacklevel=4)
    return True


def lost_rules(name: str, tracer_name: str) -> str:
    """What to tell a user whose ``tracer_name`` records group ``name`` without its rules."""
    return (f"group {name!r} has special-case rules that {tracer_name} cannot carry: what it records "
            f"has the group's plain ops, so gradients taken through it are the plain composite's "
            f"(NaN at the special points). Differentiate the eager or torch.compile'd model instead, "
            f"or record with the group's special cases off to say you know: "
            f"`with ag.special_cases(False, groups=[{name!r}]):` (documentation: 'torch.compile')")


def open_instance(name: str, enabled: bool, where: tuple[str, int]) -> GroupInstance | None:
    """Open an instance of group ``name`` with special cases ``enabled`` (read from the flag by the
    caller), created by the code at ``where``; None when it has nothing to do."""
    compiling = compat.is_compiling()  # torch.export included
    if (compiling or compat.is_jit_tracing()) and recorded_without_rules(name, enabled):
        return None
    session, watched = observers(name, enabled, where, compiling)
    rules = registry.ruleset(name) if enabled else registry.EMPTY
    if not rules and enabled and not compiling:
        registry.note_unruled(name)
    if not rules and session is None and not watched:
        return None
    stack = open_instances()
    parent = stack[-1] if stack else None
    instance = GroupInstance(name, rules, enabled, parent, session, where, watched, transposing(),
                             linear_levels(), recording.active() if session is not None else None)
    if parent is not None:
        parent.nested = True
    stack.append(instance)
    # Popped by pop_instance: the saved-tensor hooks nest like the groups.
    instance.hooks_pushed = rules.reads_saved and saved.push()
    if watched and anomaly.forward_active() and not any(i.forward_check for i in stack[:-1]):
        instance.forward_check = anomaly.ForwardCheck(stack)
        instance.forward_check.__enter__()
    return instance


def pop_instance(instance: GroupInstance) -> None:
    stack = open_instances()
    if not stack or stack[-1] is not instance:
        raise GroupError(f"group {instance.name!r} (created at {instance.where}) was closed out of "
                         f"order: groups must nest like `with` blocks")
    stack.pop()
    if instance.forward_check is not None:
        instance.forward_check.__exit__(None, None, None)
    if instance.hooks_pushed:
        saved.pop()


def _check_forward(instance: GroupInstance) -> None:
    """Raise if a non-finite forward value made in ``instance`` reached its outputs (the forward
    check lives on the outermost watched instance)."""
    holder: GroupInstance | None = instance
    while holder is not None and holder.forward_check is None:
        holder = holder.parent
    if holder is not None:
        holder.forward_check.check(instance)


def tensors_of(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [v for v in value if isinstance(v, torch.Tensor)]
    if isinstance(value, dict):
        return [v for v in value.values() if isinstance(v, torch.Tensor)]
    return []


def close_instance(instance: GroupInstance, roots: list[Any], named: dict[int, str]) -> None:
    """Find the instance's nodes from its output nodes ``roots``; install rules; trace."""
    pop_instance(instance)
    if instance.watched:
        _check_forward(instance)
    traced = instance.graph is not None
    members: list[Any] = []
    boundary: list[Any] = []
    edges: list[tuple[Any, Any]] = []
    # Per node seen: its member index, or below 0 its place among the boundary's nodes.
    index: dict[int, int] = {}
    # A NaN-safe instance writes its structure down as it walks (finiteness.py, "tokens").
    tokens: list[Any] | None = [] if instance.rules.nan_safe is not None else None
    readers = finiteness.READERS
    start = instance._start
    stack: list[tuple[Any, int]] = [(root, 0) for root in reversed(roots)]
    while stack:
        node, nr = stack.pop()
        if node is None:  # an input that needs no gradient
            if tokens is not None:
                tokens.append(None)
            continue
        key = id(node)
        seen = index.get(key)
        if seen is None and (type(node) is nodes.ACCUMULATE_GRAD or key in named
                             or compat.node_sequence_nr(node) < start):
            seen = index[key] = -1 - len(boundary)
            boundary.append(node)
        if seen is not None:
            if tokens is not None:
                tokens.append((seen, nr))
            continue
        index[key] = len(members)
        members.append(node)
        children = node.next_functions
        if tokens is not None:
            cls = type(node)
            read = readers.get(cls, finiteness.UNKNOWN)
            if read is finiteness.UNKNOWN:
                read = finiteness.reader(cls)
            tokens.append((cls, None if read is None else read(node), len(children), nr))
        stack.extend(reversed(children))
        if traced:
            edges.extend((node, child) for child, _ in children if child is not None)
    plan = finiteness.plan(tokens, len(roots)) if tokens is not None else None
    vertices = subgraph.trace_members(instance, members, boundary, edges, roots, named) if traced else {}
    install_rules(instance, members, vertices, plan=plan)
    if traced and instance.rules:
        inputs.watch(instance, members, boundary)
    if instance.session is not None:
        instance.session.add(instance)


def install_rules(instance: GroupInstance, members: list[Any], vertices: dict[int, str],
                  tagged: bool = False, plan: finiteness.Plan | None = None) -> None:
    """Hook the instance's rules onto its members; innermost groups win on the same op.

    ``plan`` has the members (by index) a NaN-safe rule needs and the gradients it zeroes there,
    from the instance's structure; without one (a tagged node, whose inputs are unknown) every
    member that does not pass zeros on is a site."""
    rules = instance.rules
    if rules and compat.dynamo_imported() and (plan is None or plan.compiled):
        _refuse_compiled(instance, members)
    traced = instance.graph is not None
    # A claim says which instance owns a node and what it applied there. An enclosing instance
    # reads them at its rule sites, so every instance with a parent claims the nodes it hooks; a
    # trace, an anomaly check and a tagged chain read them at every node ("observed").
    observed = traced or tagged or instance.watched
    read = instance.nested or observed
    write = observed or instance.parent is not None
    sites: finiteness.Sites | None = None
    if rules.nan_safe is not None:
        if plan is None:
            sites = {i: None for i, node in enumerate(members) if not passes_zeros(node)}
        else:
            sites = dict(plan.sites)
        # The CPU value read, where it still removes hooks: products the structure could not clear;
        # on a structure where it keeps finding non-finite values it is tried less often, but always
        # under a trace, whose rule sites show the call's own values.
        if sites and host_reads.enabled() and saved.readable() and (
                plan is None or instance.graph is not None or plan.worth_reading()):
            quiet = passing_now([(members[i], zeroed) for i, zeroed in sites.items()])
            if plan is not None:
                plan.read(spared=bool(quiet))
            sites = {i: outputs for i, outputs in sites.items() if id(members[i]) not in quiet}
    sited = False
    # Only the sites need a look where no other rule and no claim is to be written.
    quick = sites is not None and not (observed or rules.subgradients)
    visited = sorted(sites) if quick and sites is not None else range(len(members))
    for i in visited:
        node = members[i]
        subgradients = rules.at(node)
        nan_safe = rules.nan_safe
        zeroed: tuple[int, ...] | None = None
        if nan_safe is not None:
            if subgradients:  # a rule may make the backward non-linear in its gradient
                nan_safe = None if passes_zeros(node) else nan_safe
            elif sites is not None and i in sites:
                zeroed = sites[i]
            else:
                nan_safe = None
        if not (subgradients or nan_safe or observed):
            continue
        sited = sited or bool(subgradients)
        claim = node.metadata.get(CLAIM) if read else None
        if claim is not None:
            subgradients = () if nodes.node_key(node) in claim.ruled else subgradients
            nan_safe = None if claim.nan_safe else nan_safe
        vertex = vertices.get(id(node)) if traced else None
        if subgradients or nan_safe is not None:
            node.register_hook(SiteHook(instance, subgradients, nan_safe, vertex, node, zeroed, i))
            if traced:
                sites_rules: list[Subgradient | NanSafe] = [*subgradients, *([nan_safe] if nan_safe else [])]
                instance.graph.nodes[vertex]["rules"].extend(
                    {"label": r.label, "kind": r.kind, "group": instance.id} for r in sites_rules)
        elif not write:
            continue
        if claim is None:
            claim = node.metadata[CLAIM] = Claim(instance, vertex, tagged)
        if subgradients:  # all of one op: the node's
            claim.ruled.add(subgradients[0].op_key)
            claim.cured = claim.cured or any(r.key in _cures() for r in subgradients)
        claim.nan_safe = claim.nan_safe or nan_safe is not None
    if instance.watched:
        anomaly.watch(instance, members)
    # A tag marks one op at a time: the op a rule names may be tagged later, into the same chain.
    if rules.subgradients and members and not sited and not tagged:
        _warn_absent_ops(instance, members)


@functools.cache
def _cures() -> frozenset[tuple[object, ...]]:
    """The keys of the subgradient rules that set the gradient exactly where their op's derivative
    is infinite: a node with one passes zeros on where its input is finite (and, for a root,
    non-negative). Made at first use: a rule looks its op up in autograd's catalogue, which takes
    longer than the rest of ``import autograd_groups``."""
    return frozenset({Subgradient(op="sqrt", when="result == 0", grad=0).key})


#: Ops a rule's op is often written as: ``x ** 0.5`` makes a ``pow`` node, not a ``sqrt`` one.
_WRITTEN_AS = {"sqrt": ("pow",), "rsqrt": ("pow", "div"), "reciprocal": ("div", "pow"),
               "square": ("pow", "mul"), "exp": ("pow",), "div": ("mul", "reciprocal"),
               "clamp_min": ("clamp", "relu", "maximum"), "clamp": ("clamp_min", "clamp_max"),
               "relu": ("clamp_min", "clamp"), "maximum": ("clamp_min",), "norm": ("linalg_vector_norm",)}


def _warn_absent_ops(instance: GroupInstance, members: list[Any]) -> None:
    """Warn, once per group and rule, about a subgradient rule whose op is in no node of an instance
    without any rule site, where an op it is likely written as is (``x ** 0.5`` makes ``pow``, not
    ``sqrt``): the rule never fires there. An instance with no such op is a path of the group that
    needs no rule (``ops.vector_norm`` with ``ord=1`` has no root to guard)."""
    ops = sorted({nodes.node_op(node) for node in members})
    for rule in instance.rules.rules:
        if not isinstance(rule, Subgradient) or ("absent " + rule.label, instance.name) in _told:
            continue
        likely = [op for op in _WRITTEN_AS.get(rule.op, ()) if op in ops] or \
            difflib.get_close_matches(rule.op, ops, n=1, cutoff=0.6)
        if not likely:
            continue
        _told.add(("absent " + rule.label, instance.name))
        frames.warn(
            f"group {instance.name!r} (created at {instance.where}), rule {rule.label}: no node of this "
            f"instance is a {rule.op}, so the rule never fires here; the instance's ops are "
            f"{', '.join(ops)}, and the likely one is {likely[0]!r}: set op={likely[0]!r} in the rule "
            f"(with a 'when' over that op's saved values), or write the code with {rule.op} itself",
            InertRuleWarning)


def _refuse_compiled(instance: GroupInstance, members: list[Any]) -> None:
    """Raise if a member is a torch.compile'd graph: its ops are out of the rules' reach."""
    if any(type(node).__name__ == "CompiledFunctionBackward" for node in members):
        labels = ", ".join(r.label for r in instance.rules.rules)
        raise GroupError(
            f"group {instance.name!r} (created at {instance.where}) contains a torch.compile'd graph "
            f"(a CompiledFunctionBackward node): autograd cannot see the ops inside it, so the "
            f"group's rules ({labels}) cannot be applied there. Call the @autograd_group function "
            f"from compiled code (it runs eagerly, as a graph break) rather than grouping or tagging "
            f"compiled code, or wrap the grouped code in torch.compiler.disable")

"""Groups: mark the autograd nodes of a compound op, and install its rules on them.

A group instance opens when the decorated function is called (or the ``with`` block entered) and
closes when it returns. At close, the nodes it created are found by walking back from its outputs
through ``next_functions``; the walk stops at leaves, at the function's inputs and at any node
older than the instance (autograd numbers nodes in creation order). Each node whose op has a rule
gets a post-hook (:class:`~autograd_groups.dispatch.SiteHook`); nothing else is touched.

Whether special cases are on is decided here, at forward time, and kept on the instance. With
special cases off and no trace session open, a group does nothing at all.
"""

from __future__ import annotations

import functools
import inspect
import sys
import threading
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

import torch
from torch.overrides import TorchFunctionMode

from . import anomaly, counters, flag, nodes, registry, tracer
from .dispatch import SiteHook
from .errors import GroupError
from .registry import RuleSet
from .rules import NanSafe, Subgradient

F = TypeVar("F", bound=Callable[..., Any])

_CLAIM = "autograd_groups"
_OUTSIDE = "autograd_groups.outside"
_ACCUMULATE: type = torch._C._functions.AccumulateGrad  # type: ignore[attr-defined]
_local = threading.local()
# torch.compile's CompiledFunctionBackward nodes cannot exist before Dynamo is imported.
_DYNAMO = "torch._dynamo"


class GroupInstance:
    """One entry into a group: its rules, its place in the nesting, and (when traced) its graph.

    ``graph`` is a ``networkx.DiGraph`` when a ``trace()`` session was open, else None.
    ``inputs`` and ``outputs`` are vertex ids of ``graph``; ``hits`` maps rule labels to the number
    of elements each rule changed in this instance (counted while traced).
    """

    def __init__(self, name: str, rules: RuleSet, enabled: bool, parent: GroupInstance | None,
                 session: tracer.Trace | None, where: tuple[str, int]) -> None:
        self.name = name
        self.rules = rules
        self.enabled = enabled
        self.parent = parent
        self.id = session.new_id(name) if session is not None else name
        self.graph: Any = None
        if session is not None:
            import networkx as nx

            self.graph = nx.DiGraph(name=name, id=self.id)
        self.inputs: list[str] = []
        self.outputs: list[str] = []
        self.hits: dict[str, int] = {}
        self.session = session
        self.nested = False
        self.merged_into: GroupInstance | None = None
        self._where = where
        self._task = -1
        self._start = torch._C._autograd._get_sequence_nr()

    @property
    def where(self) -> str:
        """``file:line`` of the forward code that created the instance."""
        return f"{self._where[0]}:{self._where[1]}"

    def __repr__(self) -> str:
        return f"<GroupInstance {self.id} at {self.where}>"

    def note_backward(self) -> None:
        """Count one backward pass through this instance (called by its rule sites)."""
        task = torch._C._current_graph_task_id()
        if task != self._task:
            self._task = task
            counters.count_backward(self.name)

    def record_hit(self, vertex: str | None, label: str, elements: int) -> None:
        """Add a rule's changed-element count to this traced instance."""
        self.hits[label] = self.hits.get(label, 0) + elements
        if vertex is not None and vertex in self.graph:
            site = self.graph.nodes[vertex]["hits"]
            site[label] = site.get(label, 0) + elements


class _Claim:
    """What a node's ``metadata`` remembers: its innermost instance and the rules applied to it."""

    __slots__ = ("owner", "ruled", "nan_safe", "vertex", "tagged")

    def __init__(self, owner: GroupInstance, vertex: str | None, tagged: bool) -> None:
        self.owner = owner
        self.ruled: set[str] = set()
        self.nan_safe = False
        self.vertex = vertex
        self.tagged = tagged


def _stack() -> list[GroupInstance]:
    stack: list[GroupInstance] | None = getattr(_local, "stack", None)
    if stack is None:
        stack = _local.stack = []
    return stack


_Entry = tuple["autograd_group", "tuple[GroupInstance, _Recorder] | None"]


def _entries() -> list[_Entry]:
    """The open ``with`` groups of this thread, innermost last."""
    entries: list[_Entry] | None = getattr(_local, "entries", None)
    if entries is None:
        entries = _local.entries = []
    return entries


def _caller(depth: int) -> tuple[str, int]:
    frame = sys._getframe(depth)
    return frame.f_code.co_filename, frame.f_lineno


def _open(name: str, depth: int) -> GroupInstance | None:
    enabled = flag.current_state().for_group(name)
    session = tracer.active()
    counters.count_instance(name, enabled)
    rules = registry.ruleset(name) if enabled else registry.EMPTY
    if not rules and session is None and not anomaly.active():
        return None
    stack = _stack()
    parent = stack[-1] if stack else None
    instance = GroupInstance(name, rules, enabled, parent, session, _caller(depth + 1))
    if parent is not None:
        parent.nested = True
    stack.append(instance)
    return instance


def _pop(instance: GroupInstance) -> None:
    stack = _stack()
    if not stack or stack[-1] is not instance:
        raise GroupError(f"group {instance.name!r} (created at {instance.where}) was closed out of "
                         f"order: groups must nest like `with` blocks")
    stack.pop()


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [v for v in value if isinstance(v, torch.Tensor)]
    if isinstance(value, dict):
        return [v for v in value.values() if isinstance(v, torch.Tensor)]
    return []


def _close(instance: GroupInstance, roots: list[Any], named: dict[int, str]) -> None:
    """Find the instance's nodes from its output nodes ``roots``; install rules; trace."""
    _pop(instance)
    traced = instance.graph is not None
    members: list[Any] = []
    boundary: list[Any] = []
    edges: list[tuple[Any, Any]] = []
    seen: set[int] = set()
    start = instance._start
    stack = list(reversed(roots))
    while stack:
        node = stack.pop()
        key = id(node)
        if key in seen:
            continue
        seen.add(key)
        if type(node) is _ACCUMULATE or key in named or node._sequence_nr() < start:
            boundary.append(node)
            continue
        members.append(node)
        for child, _ in reversed(node.next_functions):
            if child is not None:
                stack.append(child)
                if traced:
                    edges.append((node, child))
    vertices = _trace_members(instance, members, boundary, edges, roots, named) if traced else {}
    _install(instance, members, vertices)
    if instance.session is not None:
        instance.session.add(instance)


def _install(instance: GroupInstance, members: list[Any], vertices: dict[int, str],
             tagged: bool = False) -> None:
    """Hook the instance's rules onto its members; innermost groups win on the same op."""
    rules = instance.rules
    if rules and _DYNAMO in sys.modules:
        _refuse_compiled(instance, members)
    traced = instance.graph is not None
    read = instance.nested or traced or tagged
    write = read or instance.parent is not None
    for node in members:
        subgradients = rules.at(node)
        nan_safe = rules.nan_safe
        claim = node.metadata.get(_CLAIM) if read else None
        if claim is not None:
            subgradients = () if nodes.node_key(node) in claim.ruled else subgradients
            nan_safe = None if claim.nan_safe else nan_safe
        vertex = vertices.get(id(node))
        if subgradients or nan_safe is not None:
            node.register_hook(SiteHook(instance, subgradients, nan_safe, vertex))
            if traced:
                sites: list[Subgradient | NanSafe] = [*subgradients, *([nan_safe] if nan_safe else [])]
                instance.graph.nodes[vertex]["rules"].extend(
                    {"label": r.label, "kind": r.kind, "group": instance.id} for r in sites)
        elif not write:
            continue
        if claim is None:
            claim = node.metadata[_CLAIM] = _Claim(instance, vertex, tagged)
        claim.ruled.update(r.op_key for r in subgradients)
        claim.nan_safe = claim.nan_safe or nan_safe is not None
    if anomaly.active():
        anomaly.watch(instance, members)


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


def _trace_members(instance: GroupInstance, members: list[Any], boundary: list[Any],
                   edges: list[tuple[Any, Any]], roots: list[Any],
                   named: dict[int, str]) -> dict[int, str]:
    graph = instance.graph
    vertices: dict[int, str] = {}
    for k, node in enumerate(members):
        claim = node.metadata.get(_CLAIM)
        vertex = claim.vertex if claim is not None and claim.vertex else f"{instance.id}:{k}"
        vertices[id(node)] = vertex
        graph.add_node(vertex, **describe_with_group(node, claim.owner if claim else instance))
        outside = node.metadata.pop(_OUTSIDE, None)
        if outside is not None:
            _rename_outside(outside, vertex)
    for j, node in enumerate(boundary):
        vertices[id(node)] = _boundary_vertex(instance, node, j, named)
        instance.inputs.append(vertices[id(node)])
    for consumer, producer in edges:
        graph.add_edge(vertices[id(consumer)], vertices[id(producer)])
    consumed = {id(p) for _, p in edges}
    for node in roots:
        if id(node) in vertices and id(node) not in consumed and vertices[id(node)] not in instance.outputs:
            instance.outputs.append(vertices[id(node)])
    return vertices


def describe_with_group(node: Any, owner: GroupInstance) -> dict[str, Any]:
    attrs = tracer.describe(node)
    attrs["group"] = owner.id
    return attrs


def _boundary_vertex(instance: GroupInstance, node: Any, j: int, named: dict[int, str]) -> str:
    graph = instance.graph
    leaf = tracer.leaf_tensor(node)
    name = named.get(id(node)) or (named.get(id(leaf)) if leaf is not None else None)
    claim = node.metadata.get(_CLAIM)
    if claim is not None and claim.vertex is not None:
        vertex = claim.vertex
        graph.add_node(vertex, **describe_with_group(node, claim.owner))
    elif leaf is not None and instance.session is not None:
        vertex = instance.session.leaf_vertex(node)
        graph.add_node(vertex, kind="input", op="leaf", node_class=type(node).__name__,
                       shape=[list(leaf.shape)], dtype=[str(leaf.dtype).replace("torch.", "")],
                       saved=[], rules=[], hits={}, group=None)
    else:
        # One vertex per outside node, whichever instances see it (see _rename_outside).
        outside = node.metadata.setdefault(_OUTSIDE, [f"{instance.id}:in{j}"])
        outside.append(instance)
        vertex = outside[0]
        graph.add_node(vertex, **tracer.describe(node))
        graph.nodes[vertex].update(kind="input", group=None)
    if name is not None:
        graph.nodes[vertex]["name"] = name
    return vertex


def _rename_outside(outside: list[Any], vertex: str) -> None:
    """A node that nested instances saw as an outside input is a member of an enclosing one:
    give it the member's vertex id in the nested instances' graphs too."""
    import networkx as nx

    old = outside[0]
    for seen_by in outside[1:]:
        nx.relabel_nodes(seen_by.graph, {old: vertex}, copy=False)
        seen_by.inputs = [vertex if v == old else v for v in seen_by.inputs]


def _named_inputs(signature: inspect.Signature | None, args: tuple[Any, ...],
                  kwargs: dict[str, Any]) -> tuple[dict[int, str], list[torch.Tensor]]:
    """The tensor arguments of a call, by the id of the node (or leaf) that stands for each."""
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
    return named, tensors


class _Recorder(TorchFunctionMode):
    """Collects the autograd nodes of every torch call made inside a ``with`` group."""

    def __init__(self) -> None:
        super().__init__()
        self.roots: list[Any] = []

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in _tensors(out):
            if t.grad_fn is not None:
                self.roots.append(t.grad_fn)
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
        from .override import run_override

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
            instance = _open(name, 2)
            if instance is None:
                return fn(*args, **kwargs)
            if instance.rules.override is not None:
                named, inputs = _named_inputs(signature, args, kwargs)
                return run_override(instance, fn, args, kwargs, inputs, named)
            named = _named_inputs(signature, args, kwargs)[0] if instance.graph is not None else {}
            try:
                out = fn(*args, **kwargs)
            except BaseException:
                _pop(instance)
                raise
            _close(instance, [t.grad_fn for t in _tensors(out) if t.grad_fn is not None], named)
            return out

        this = weakref.ref(grouped)  # not the function itself: that would be a reference cycle
        grouped.__autograd_group__ = name  # type: ignore[attr-defined]
        return grouped  # type: ignore[return-value]

    def __enter__(self) -> GroupInstance | None:
        entries = _entries()
        instance = _open(self.name, 2)
        if instance is None:
            entries.append((self, None))
            return None
        if instance.rules.override is not None:
            _pop(instance)
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
            _pop(instance)
            return
        _close(instance, list(reversed(recorder.roots)), {})


def tag(tensor: torch.Tensor, name: str) -> torch.Tensor:
    """Mark the op that produced ``tensor`` as part of group ``name``; return ``tensor``.

    Tagged ops that feed each other directly form one instance, as in
    ``a = tag(x + y, "g"); b = tag(a * y, "g")``. Only the tagged ops are members: tag every op of
    the compound op (see docs/groups.md).

    >>> import torch, autograd_groups as ag
    >>> x = torch.ones(2, requires_grad=True)
    >>> y = ag.tag(x.sqrt(), "g")
    >>> y is ag.tag(y, "g")
    True
    """
    node: Any = tensor.grad_fn
    if node is None:
        return tensor
    enabled = flag.current_state().for_group(name)
    session = tracer.active()
    if not enabled and session is None and not anomaly.active():
        return tensor
    claim = node.metadata.get(_CLAIM)
    if claim is not None and claim.tagged and claim.owner.name == name:
        return tensor
    owners: list[GroupInstance] = []
    for child, _ in node.next_functions:
        child_claim = child.metadata.get(_CLAIM) if child is not None else None
        if child_claim is not None and child_claim.tagged and child_claim.owner.name == name:
            owner = _root(child_claim.owner)
            if owner not in owners:
                owners.append(owner)
    if owners:
        instance = owners[0]
        for other in owners[1:]:
            _merge(instance, other)
    else:
        counters.count_instance(name, enabled)
        rules = registry.ruleset(name) if enabled else registry.EMPTY
        stack = _stack()
        instance = GroupInstance(name, rules, enabled, stack[-1] if stack else None, session,
                                 _caller(2))
        if session is not None:
            session.add(instance)
    vertices = _trace_tagged(instance, node) if instance.graph is not None else {}
    _install(instance, [node], vertices, tagged=True)
    return tensor


def _root(instance: GroupInstance) -> GroupInstance:
    while instance.merged_into is not None:
        instance = instance.merged_into
    return instance


def _merge(into: GroupInstance, other: GroupInstance) -> None:
    """Two tagged chains of one group met at an op: from now on they are one instance."""
    other.merged_into = into
    counters.count_instance(other.name, other.enabled, -1)
    if into.graph is not None and other.graph is not None:
        into.graph.add_nodes_from(other.graph.nodes(data=True))
        into.graph.add_edges_from(other.graph.edges)
        into.inputs.extend(v for v in other.inputs if v not in into.inputs)
        into.outputs.extend(other.outputs)
        for label, count in other.hits.items():
            into.hits[label] = into.hits.get(label, 0) + count
        if other.session is not None:
            other.session.remove(other)
    # The rule sites already hooked still point at ``other``: let them record into ``into``.
    other.graph, other.hits, other.inputs, other.outputs = into.graph, into.hits, into.inputs, into.outputs


def _trace_tagged(instance: GroupInstance, node: Any) -> dict[int, str]:
    graph = instance.graph
    vertex = f"{instance.id}:{graph.number_of_nodes()}"
    graph.add_node(vertex, **describe_with_group(node, instance))
    for child, _ in node.next_functions:
        if child is None:
            continue
        claim = child.metadata.get(_CLAIM)
        if claim is not None and _root(claim.owner) is instance and claim.vertex is not None:
            graph.add_edge(vertex, claim.vertex)
            if claim.vertex in instance.outputs:
                instance.outputs.remove(claim.vertex)
        else:
            child_vertex = _boundary_vertex(instance, child, len(instance.inputs), {})
            instance.inputs.append(child_vertex)
            graph.add_edge(vertex, child_vertex)
    instance.outputs.append(vertex)
    return {id(node): vertex}

"""``tag``: mark the op that produced a tensor as part of a group, as the seed of the idea sketches
(``at::add(x, y).autograd_group('group1')``). Tagged ops that feed each other form one instance."""

from __future__ import annotations

from typing import Any

import torch

from .. import compat, flag
from ..claims import CLAIM
from ..instance import GroupInstance
from ..levels import graph_roots
from ..observe import anomaly, counters, recording, subgraph, tracer
from ..rules import registry
from ..sites import tangents
from . import compiled
from .lifecycle import COMPILED, caller, install_rules, observers, open_instances


def tag(tensor: torch.Tensor, name: str) -> torch.Tensor:
    """Mark the op that produced ``tensor`` as part of group ``name``; return ``tensor``.

    Tagged ops that feed each other directly form one instance, as in
    ``a = tag(x + y, "g"); b = tag(a * y, "g")``. Only the tagged ops are members: tag every op of
    the compound op (documentation: "Groups and rules").

    >>> import torch, autograd_groups as ag
    >>> x = torch.ones(2, requires_grad=True)
    >>> y = ag.tag(x.sqrt(), "g")
    >>> y is ag.tag(y, "g")
    True
    """
    if torch.compiler.is_dynamo_compiling():
        if compat.is_exporting():
            compiled.refuse_export(name)
        if compat.is_exporting() or not compiled.needed(name):
            return tensor
        out: torch.Tensor = compiled.enter(_tag_in_graph, (tensor, name), {})
        return out
    return _tag(tensor, name, caller(2))


def _tag(tensor: torch.Tensor, name: str, where: tuple[str, int]) -> torch.Tensor:
    registry.declare(name)
    enabled = flag.current_state().for_group(name)
    if not enabled and tracer.active() is None and not anomaly.active():
        return tensor
    if enabled and tangents.active((tensor,)) and not tangents.running() and registry.has_rules(name):
        raise tangents.refuse_block(name, where, "tag(), which marks ops after they ran,")
    # Under torch.func each grad transform level has its own node for the op, and its own chains.
    for node in graph_roots([tensor]):
        _tag_node(node, name, enabled, where)
    return tensor


def _tag_in_graph(flag_key: tuple[Any, ...], generation: int, watched: bool,
                  args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor:
    """``tag`` as a compiled graph traces it (see compiled.py)."""
    tensor, name = args
    with flag.restored(flag.FlagState.from_key(flag_key)):
        return _tag(tensor, name, COMPILED)


def _tag_node(node: Any, name: str, enabled: bool, where: tuple[str, int]) -> None:
    claim = node.metadata.get(CLAIM)
    if claim is not None and claim.tagged and claim.owner.name == name:
        return
    owners: list[GroupInstance] = []
    for child, _ in node.next_functions:
        child_claim = child.metadata.get(CLAIM) if child is not None else None
        if child_claim is not None and child_claim.tagged and child_claim.owner.name == name:
            owner = root(child_claim.owner)
            if owner not in owners:
                owners.append(owner)
    if owners:
        instance = owners[0]
        for other in owners[1:]:
            merge(instance, other)
    else:
        session, watched = observers(name, enabled, where, compat.is_compiling())
        rules = registry.ruleset(name) if enabled else registry.EMPTY
        stack = open_instances()
        instance = GroupInstance(name, rules, enabled, stack[-1] if stack else None, session, where, watched,
                                 tangents.transposing(), tangents.linear_levels(),
                                 recording.active() if session is not None else None)
        if session is not None:
            session.add(instance)
    vertices = trace_tagged(instance, node) if instance.graph is not None else {}
    install_rules(instance, [node], vertices, tagged=True)


def root(instance: GroupInstance) -> GroupInstance:
    while instance.merged_into is not None:
        instance = instance.merged_into
    return instance


def merge(into: GroupInstance, other: GroupInstance) -> None:
    """Two tagged chains of one group met at an op: from now on they are one instance."""
    other.merged_into = into
    counters.count_instance(other.name, other.site, other.enabled, -1)
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


def trace_tagged(instance: GroupInstance, node: Any) -> dict[int, str]:
    graph = instance.graph
    vertex = f"{instance.id}:{graph.number_of_nodes()}"
    graph.add_node(vertex, **subgraph.describe_with_group(node, instance))
    for child, _ in node.next_functions:
        if child is None:
            continue
        claim = child.metadata.get(CLAIM)
        if claim is not None and root(claim.owner) is instance and claim.vertex is not None:
            graph.add_edge(vertex, claim.vertex)
            if claim.vertex in instance.outputs:
                instance.outputs.remove(claim.vertex)
        else:
            child_vertex = subgraph.boundary_vertex(instance, child, len(instance.inputs), {})
            instance.inputs.append(child_vertex)
            graph.add_edge(vertex, child_vertex)
    instance.outputs.append(vertex)
    return {id(node): vertex}

"""The traced form of a group instance: its nodes and boundary as vertices of a networkx graph.

Only called while a ``trace()`` session is open (see :mod:`autograd_groups.observe.tracer`).
"""

from __future__ import annotations

from typing import Any

from ..claims import CLAIM, OUTSIDE
from ..instance import GroupInstance
from . import tracer


def trace_members(instance: GroupInstance, members: list[Any], boundary: list[Any],
                   edges: list[tuple[Any, Any]], roots: list[Any],
                   named: dict[int, str]) -> dict[int, str]:
    graph = instance.graph
    vertices: dict[int, str] = {}
    for k, node in enumerate(members):
        claim = node.metadata.get(CLAIM)
        vertex = claim.vertex if claim is not None and claim.vertex else f"{instance.id}:{k}"
        vertices[id(node)] = vertex
        graph.add_node(vertex, **describe_with_group(node, claim.owner if claim else instance))
        outside = node.metadata.pop(OUTSIDE, None)
        if outside is not None:
            rename_outside(outside, vertex)
    for j, node in enumerate(boundary):
        vertices[id(node)] = boundary_vertex(instance, node, j, named)
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


def boundary_vertex(instance: GroupInstance, node: Any, j: int, named: dict[int, str]) -> str:
    graph = instance.graph
    leaf = tracer.leaf_tensor(node)
    name = named.get(id(node)) or (named.get(id(leaf)) if leaf is not None else None)
    claim = node.metadata.get(CLAIM)
    if claim is not None and claim.vertex is not None:
        vertex = claim.vertex
        graph.add_node(vertex, **describe_with_group(node, claim.owner))
    elif leaf is not None and instance.session is not None:
        vertex = instance.session.leaf_vertex(node)
        graph.add_node(vertex, kind="input", op="leaf", node_class=type(node).__name__,
                       shape=[list(leaf.shape)], dtype=[str(leaf.dtype).replace("torch.", "")],
                       saved=[], rules=[], hits={}, group=None)
    else:
        # One vertex per outside node, whichever instances see it (see rename_outside).
        outside = node.metadata.setdefault(OUTSIDE, [f"{instance.id}:in{j}"])
        outside.append(instance)
        vertex = outside[0]
        graph.add_node(vertex, **tracer.describe(node))
        graph.nodes[vertex].update(kind="input", group=None)
    if name is not None:
        graph.nodes[vertex]["name"] = name
    return vertex


def rename_outside(outside: list[Any], vertex: str) -> None:
    """A node that nested instances saw as an outside input is a member of an enclosing one:
    give it the member's vertex id in the nested instances' graphs too."""
    import networkx as nx

    old = outside[0]
    for seen_by in outside[1:]:
        nx.relabel_nodes(seen_by.graph, {old: vertex}, copy=False)
        seen_by.inputs = [vertex if v == old else v for v in seen_by.inputs]

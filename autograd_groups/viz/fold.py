"""Fold a trace: repeated instances of a group with the same structure become one cluster ``×N``.

Two instances have the same structure when they belong to the same group, have the same special-case
state, and their vertices, taken in walk order, agree on (kind, op, node class, shape, dtype, rules),
their edges connect the same positions, and their nested instances have the same structure, in the
same order. A training loop of 1,000 steps then draws as one cluster per distinct group body.

Folding is top-down: instances with no traced parent fold among themselves; inside a folded cluster,
the nested instances of its representative fold among siblings, and the nested instances of every
other member are mapped onto them position by position. Every vertex of every instance maps to one
vertex of the representative, so hit counts add up and edges between instances follow.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import networkx as nx

from ..errors import GroupError


class InstanceLike(Protocol):
    """What folding reads from a group instance: a live ``GroupInstance`` or a loaded record."""

    name: str
    id: str
    enabled: bool
    graph: Any
    inputs: list[str]
    outputs: list[str]
    hits: dict[str, int]

    @property
    def parent(self) -> Any: ...

    @property
    def where(self) -> str: ...


@dataclass
class Cluster:
    """One folded group: ``count`` instances per parent instance (``total`` in all)."""

    key: str
    name: str
    count: int
    total: int
    enabled: bool
    wheres: list[str]
    parent: str | None
    children: list[str] = field(default_factory=list)
    vertices: list[str] = field(default_factory=list)
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    hits: dict[str, int] = field(default_factory=dict)
    collapsed: bool = False


@dataclass
class FoldedGraph:
    """The folded drawing of a trace.

    ``graph`` has one vertex per folded autograd node (attributes as in a traced instance's graph,
    plus ``cluster``: the key of the innermost cluster, None for boundary inputs; ``output``: whether
    it is a group output; ``hits`` summed over the folded instances). Edges point the way gradients
    flow. ``clusters`` is in top-down order; a collapsed cluster is one vertex of kind ``"group"``.
    """

    graph: Any
    clusters: dict[str, Cluster]
    roots: list[str]
    instances: int
    collapsed: list[str] = field(default_factory=list)

    def subtree(self, key: str) -> list[str]:
        """``key`` and the keys of all clusters nested in it, top-down."""
        found: list[str] = []
        stack = [key]
        while stack:
            k = stack.pop()
            found.append(k)
            stack.extend(reversed(self.clusters[k].children))
        return found

    def nesting(self) -> Iterator[tuple[str, Cluster, int]]:
        """The clusters in drawing order, ``depth`` 1 at the top: ``("open", cluster, depth)``, then
        its nested clusters, then ``("close", cluster, depth)``; a collapsed cluster comes once, as
        ``("box", cluster, depth)``."""
        stack: list[tuple[bool, str, int]] = [(False, k, 1) for k in reversed(self.roots)]
        while stack:
            closing, key, depth = stack.pop()
            cluster = self.clusters[key]
            if closing or cluster.collapsed:
                yield ("close" if closing else "box"), cluster, depth
                continue
            yield "open", cluster, depth
            stack.append((True, key, depth))
            stack.extend((False, k, depth + 1) for k in reversed(cluster.children))


def short_where(where: str) -> str:
    """``file:line`` with the file relative to the working directory when it lies inside it."""
    path, sep, line = where.rpartition(":")
    if not sep or not line.isdigit():
        return where
    # Also through symbolic links: the working directory is a resolved path, and a script's may not be.
    for candidate in (path, os.path.realpath(path)):
        try:
            rel = os.path.relpath(candidate)
        except ValueError:  # another drive, on Windows
            continue
        if rel != os.pardir and not rel.startswith(os.pardir + os.sep):
            return f"{rel}:{line}"
    return where


def _position(vertex: str) -> tuple[int, str]:
    tail = vertex.rpartition(":")[2]
    return (int(tail), vertex) if tail.isdigit() else (1 << 62, vertex)


def _describe(attrs: dict[str, Any]) -> tuple[Any, ...]:
    return (attrs.get("kind"), attrs.get("op"), attrs.get("node_class"),
            tuple(tuple(s) for s in attrs.get("shape", ())), tuple(attrs.get("dtype", ())),
            tuple(sorted((r["label"], r["kind"]) for r in attrs.get("rules", ()))))


class _Index:
    """Per instance: its traced children, its own vertices and its vertices in canonical order."""

    def __init__(self, instances: Sequence[InstanceLike]) -> None:
        by_id = {i.id: i for i in instances}
        self.children: dict[str, list[InstanceLike]] = {i.id: [] for i in instances}
        self.roots: list[InstanceLike] = []
        for inst in instances:
            parent = inst.parent
            traced = by_id.get(parent.id) if parent is not None else None
            if traced is not None and traced is parent:
                self.children[traced.id].append(inst)
            else:
                self.roots.append(inst)
        self.own: dict[str, list[str]] = {}
        self.order: dict[str, list[str]] = {}
        self.signature: dict[str, int] = {}
        self._signatures: dict[tuple[Any, ...], int] = {}
        for inst in self._bottom_up():
            self._index(inst)

    def _bottom_up(self) -> list[InstanceLike]:
        done: list[InstanceLike] = []
        stack: list[tuple[InstanceLike, bool]] = [(r, False) for r in reversed(self.roots)]
        while stack:
            inst, expanded = stack.pop()
            if expanded:
                done.append(inst)
                continue
            stack.append((inst, True))
            stack.extend((c, False) for c in reversed(self.children[inst.id]))
        return done

    def _index(self, inst: InstanceLike) -> None:
        graph = inst.graph
        own = sorted((v for v, d in graph.nodes(data=True) if d.get("group") == inst.id), key=_position)
        order = list(own)
        seen = set(own)
        for child in self.children[inst.id]:
            for v in self.order[child.id]:
                if v not in seen and v in graph:
                    seen.add(v)
                    order.append(v)
        for v in inst.inputs:
            if v not in seen:
                seen.add(v)
                order.append(v)
        rest = sorted((v for v in graph if v not in seen), key=_position)
        order.extend(rest)
        pos = {v: k for k, v in enumerate(order)}
        nodes = graph.nodes
        nested = {v for c in self.children[inst.id] for v in self.order[c.id]}
        signature = (
            inst.name, inst.enabled,
            tuple(_describe(nodes[v]) for v in own),
            tuple(self.signature[c.id] for c in self.children[inst.id]),
            tuple(_describe(nodes[v]) for v in order[len(own):] if v not in nested),
            tuple(sorted((pos[u], pos[v]) for u, v in graph.edges)),
            tuple(pos.get(v, -1) for v in inst.inputs),
            tuple(pos.get(v, -1) for v in inst.outputs),
        )
        self.own[inst.id] = own
        self.order[inst.id] = order
        self.signature[inst.id] = self._signatures.setdefault(signature, len(self._signatures))


def select(instances: Sequence[InstanceLike], group: str | None) -> list[InstanceLike]:
    """The instances of ``group`` and every instance nested in one (all of them when None)."""
    if group is None:
        return list(instances)
    chosen: list[InstanceLike] = []
    ids: set[str] = set()
    for inst in instances:
        ancestor = inst.parent
        while ancestor is not None and ancestor.id not in ids and ancestor.name != group:
            ancestor = ancestor.parent
        if inst.name == group or ancestor is not None:
            chosen.append(inst)
            ids.add(inst.id)
    if not chosen:
        names = sorted({i.name for i in instances})
        close = difflib.get_close_matches(group, names, n=3, cutoff=0.6)
        hint = f"; did you mean {' or '.join(map(repr, close))}?" if close else ""
        raise GroupError(f"no instance of group {group!r} was traced; traced groups: "
                         f"{', '.join(names) or 'none'}{hint}")
    return chosen


def fold(instances: Sequence[InstanceLike], group: str | None = None) -> FoldedGraph:
    """Fold traced instances (creation order) into clusters; ``group`` keeps only that group's
    instances and the instances nested in them.

    >>> import torch, autograd_groups as ag
    >>> @ag.autograd_group("double")
    ... def double(x):
    ...     return x * 2
    >>> x = torch.ones(2, requires_grad=True)
    >>> with ag.trace() as t:
    ...     for _ in range(3):
    ...         double(x).sum().backward()
    >>> folded = fold(t.instances)
    >>> [(c.name, c.count) for c in folded.clusters.values()]
    [('double', 3)]
    """
    chosen = select(instances, group)
    index = _Index(chosen)
    clusters: dict[str, Cluster] = {}
    vmap: dict[str, str] = {}
    input_pairs: list[tuple[list[str], list[str]]] = []
    members_of: dict[str, list[InstanceLike]] = {}
    stack: list[tuple[str | None, InstanceLike, list[InstanceLike], int]] = [
        (None, rep, members, len(members)) for rep, members in reversed(_by_signature(index, index.roots))]
    while stack:
        parent, rep, members, count = stack.pop()
        cluster = Cluster(f"c{len(clusters)}", rep.name, count, len(members), rep.enabled,
                          list(dict.fromkeys(m.where for m in members)), parent)
        clusters[cluster.key] = cluster
        members_of[cluster.key] = members
        if parent is not None:
            clusters[parent].children.append(cluster.key)
        own = index.own[rep.id]
        cluster.vertices = list(own)
        for m in members:
            vmap.update(zip(index.own[m.id], own))
            input_pairs.append((m.inputs, rep.inputs))
            for label, n in m.hits.items():
                cluster.hits[label] = cluster.hits.get(label, 0) + n
        kids = index.children[rep.id]
        groups: dict[int, list[int]] = {}
        for j, kid in enumerate(kids):
            groups.setdefault(index.signature[kid.id], []).append(j)
        for positions in reversed(groups.values()):
            sub = [index.children[m.id][j] for m in members for j in positions]
            stack.append((cluster.key, kids[positions[0]], sub, len(positions)))
    for _, rep_inputs in input_pairs:
        for v in rep_inputs:
            vmap.setdefault(v, v)
    for m_inputs, rep_inputs in input_pairs:
        for a, b in zip(m_inputs, rep_inputs):
            vmap.setdefault(a, vmap[b])
    graph = _folded_graph(clusters, members_of, vmap)
    for cluster in clusters.values():
        cluster.inputs = list(dict.fromkeys(vmap.get(v, v) for v in members_of[cluster.key][0].inputs))
        cluster.outputs = list(dict.fromkeys(vmap.get(v, v) for v in members_of[cluster.key][0].outputs))
        for v in cluster.outputs:
            graph.nodes[v]["output"] = True
    roots = [k for k, c in clusters.items() if c.parent is None]
    return FoldedGraph(graph, clusters, roots, len(chosen))


def _by_signature(index: _Index,
                  instances: list[InstanceLike]) -> list[tuple[InstanceLike, list[InstanceLike]]]:
    found: dict[int, list[InstanceLike]] = {}
    for inst in instances:
        found.setdefault(index.signature[inst.id], []).append(inst)
    return [(members[0], members) for members in found.values()]


def _folded_graph(clusters: dict[str, Cluster], members_of: dict[str, list[InstanceLike]],
                  vmap: dict[str, str]) -> Any:
    graph = nx.DiGraph()
    owner = {v: c.key for c in clusters.values() for v in c.vertices}
    for key in clusters:
        for m in members_of[key]:
            nodes = m.graph.nodes
            for v, attrs in nodes(data=True):
                target = vmap.get(v, v)
                if target not in graph:
                    base = {k: x for k, x in nodes.get(target, attrs).items() if k not in ("rules", "hits")}
                    graph.add_node(target, **base, cluster=owner.get(target), output=False, rules=[], hits={})
                folded = graph.nodes[target]
                for rule in attrs.get("rules", ()):
                    entry = {"label": rule["label"], "kind": rule["kind"],
                             "group": rule["group"].partition("#")[0]}
                    if entry not in folded["rules"]:
                        folded["rules"].append(entry)
                for label, n in attrs.get("hits", {}).items():
                    folded["hits"][label] = folded["hits"].get(label, 0) + n
            graph.add_edges_from((vmap.get(u, u), vmap.get(v, v)) for u, v in m.graph.edges)
    return graph


def collapse(folded: FoldedGraph, max_nodes: int) -> FoldedGraph:
    """Draw clusters as single boxes, biggest first, until at most ``max_nodes`` vertices remain
    (or every top-level cluster is one box). Changes ``folded`` in place and returns it.

    >>> import torch, autograd_groups as ag
    >>> @ag.autograd_group("double")
    ... def double(x):
    ...     return x * 2 + 1
    >>> with ag.trace() as t:
    ...     double(torch.ones(2, requires_grad=True)).sum().backward()
    >>> small = collapse(fold(t.instances), 2)
    >>> sorted(d["kind"] for _, d in small.graph.nodes(data=True))
    ['group', 'input']
    """
    graph = folded.graph
    while graph.number_of_nodes() > max_nodes:
        open_keys = [k for k, c in folded.clusters.items() if not c.collapsed]
        if not open_keys:
            break
        sizes = {k: sum(len(folded.clusters[s].vertices) for s in folded.subtree(k)) for k in open_keys}
        key = max(open_keys, key=lambda k: (sizes[k], -int(k[1:])))
        _collapse_one(folded, key)
    return folded


def _collapse_one(folded: FoldedGraph, key: str) -> None:
    graph = folded.graph
    cluster = folded.clusters[key]
    keys = folded.subtree(key)
    inside = {v for k in keys for v in folded.clusters[k].vertices}
    box = f"cluster:{key}"
    graph.add_node(box, kind="group", op=cluster.name, node_class="", shape=[], dtype=[], saved=[],
                   rules=[], hits=dict(cluster.hits), cluster=cluster.parent, output=False,
                   count=cluster.count, size=len(inside),
                   sites=sum(1 for v in inside if graph.nodes[v]["rules"]))
    for u, v in list(graph.edges):
        if (u in inside) != (v in inside):
            graph.add_edge(box if u in inside else u, box if v in inside else v)
    graph.remove_nodes_from(inside)
    for k in keys[1:]:
        del folded.clusters[k]
    cluster.children = []
    cluster.vertices = [box]
    cluster.collapsed = True
    cluster.outputs = [box]
    folded.collapsed.append(cluster.name)

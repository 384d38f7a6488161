"""The folded trace as a rich tree, for the terminal: clusters, nested clusters, their ops."""

from __future__ import annotations

from typing import Any

from rich.markup import escape
from rich.tree import Tree

from . import style
from .fold import FoldedGraph


def _op_line(attrs: dict[str, Any]) -> str:
    lines = style.vertex_lines(attrs)
    head = " ".join(escape(line) for line in lines[:2])
    role = style.vertex_role(attrs)
    if role == "input":
        return f"[blue]← {head}[/]"
    if role == "group":
        return f"[bold]▣ {escape(' · '.join(lines))}[/]"
    text = head + ("  [dim](output)[/]" if attrs.get("output") else "")
    if role == "site":
        color = "red" if style.fired(attrs) else "yellow"
        pairs = zip(lines[2::2], lines[3::2])
        text += "".join(f"\n[{color}]{escape(rule)}: {escape(hits)}[/]" for rule, hits in pairs)
    return text


def to_tree(folded: FoldedGraph) -> Tree:
    """A rich ``Tree``: one branch per folded cluster (``×N``), its ops in walk order, then its
    boundary inputs; rule sites show their rules and how many elements each changed.

    >>> import torch, autograd_groups as ag
    >>> from rich.console import Console
    >>> from autograd_groups.viz.fold import fold
    >>> @ag.autograd_group("double")
    ... def double(x):
    ...     return x * 2
    >>> with ag.trace() as t:
    ...     double(torch.ones(2, requires_grad=True)).sum().backward()
    >>> Console(width=60).print(to_tree(fold(t.instances)))  # doctest: +ELLIPSIS
    1 group instance in 1 cluster, ...
    └── double  ...
        ├── mul [2]  (output)
        └── ← x: leaf [2]
    """
    graph = folded.graph
    root = Tree(escape(style.summary(folded)))
    stack: list[tuple[str, Tree]] = [(k, root) for k in reversed(folded.roots)]
    while stack:
        key, parent = stack.pop()
        cluster = folded.clusters[key]
        if cluster.collapsed:
            parent.add(_op_line(graph.nodes[cluster.vertices[0]]))
            continue
        title, *rest = style.cluster_lines(cluster)
        branch = parent.add(f"[bold]{escape(title)}[/]  [dim]{escape(' · '.join(rest))}[/]")
        for v in cluster.vertices:
            branch.add(_op_line(graph.nodes[v]))
        for v in cluster.inputs:
            attrs = graph.nodes[v]
            source = folded.clusters.get(attrs["cluster"]) if attrs["cluster"] is not None else None
            if attrs["kind"] == "input":
                branch.add(_op_line(attrs))
            elif source is not None and source.key != key and source.key not in cluster.children:
                shown = " ".join(style.vertex_lines(attrs)[:2])
                branch.add(f"[blue]← {escape(shown)} (from {escape(style.cluster_title(source))})[/]")
        stack.extend((k, branch) for k in reversed(cluster.children))
    return root

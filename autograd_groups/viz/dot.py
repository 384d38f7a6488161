"""DOT text of a folded trace: one ``subgraph cluster_*`` per folded group, nested as the groups
nest; rule sites filled and labelled with their rules; boundary inputs as ellipses outside the
clusters; group outputs with a double border. Each vertex keeps its trace id as the ``id``
attribute (it becomes the element id in SVG output) and its role as ``class``.
"""

from __future__ import annotations

from typing import Any

from . import style
from .fold import FoldedGraph

_GRAPH = ('graph [rankdir=TB, newrank=true, fontname="Helvetica", fontsize=11, labelloc=t, '
          'nodesep=0.25, ranksep=0.35];')
_NODE = 'node [shape=box, style="rounded,filled", fontname="Helvetica", fontsize=10, margin="0.08,0.04"];'
_EDGE = 'edge [color="#475569", arrowsize=0.6];'
_LOOK = {
    "op": 'fillcolor="#f8fafc", color="#64748b"',
    "site": 'fillcolor="#fef3c7", color="#b45309", penwidth=2',
    "fired": 'fillcolor="#fdba74", color="#b45309", penwidth=2',
    "input": 'shape=ellipse, style=filled, fillcolor="#dbeafe", color="#2563eb"',
    "group": 'shape=box3d, style=filled, fillcolor="#e2e8f0", color="#334155"',
}
_CLUSTER_COLORS = ("#1d4ed8", "#7c3aed", "#0f766e", "#be185d")


def quote(text: str) -> str:
    """A DOT double-quoted string; newlines become centred line breaks.

    >>> quote('a "b"\\nc')
    '"a \\\\"b\\\\"\\\\nc"'
    """
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _vertex(name: str, vertex: str, attrs: dict[str, Any]) -> str:
    role = style.vertex_role(attrs)
    look = "fired" if role == "site" and style.fired(attrs) else role
    classes = [role]
    if role == "site":
        classes += sorted({r["kind"] for r in attrs["rules"]})
    if attrs.get("output"):
        classes.append("output")
    extra = ", peripheries=2" if attrs.get("output") else ""
    tooltip = f"{attrs.get('node_class', '')} saves: {', '.join(attrs.get('saved', ())) or 'nothing'}"
    return (f"{name} [label={quote(chr(10).join(style.vertex_lines(attrs)))}, {_LOOK[look]}{extra}, "
            f"id={quote(vertex)}, class={quote(' '.join(classes))}, tooltip={quote(tooltip)}];")


def to_dot(folded: FoldedGraph) -> str:
    """DOT text for ``folded``; edges point the way gradients flow (consumer -> producer).

    >>> import torch, autograd_groups as ag
    >>> from autograd_groups.viz.fold import fold
    >>> @ag.autograd_group("double")
    ... def double(x):
    ...     return x * 2
    >>> with ag.trace() as t:
    ...     double(torch.ones(2, requires_grad=True)).sum().backward()
    >>> "subgraph cluster_c0" in to_dot(fold(t.instances))
    True
    """
    graph = folded.graph
    names = {v: f"v{k}" for k, v in enumerate(graph)}
    lines = ["digraph autograd_groups {", "  " + _GRAPH, "  " + _NODE, "  " + _EDGE,
             f"  label={quote(style.summary(folded))};"]
    emitted: set[str] = set()
    for event, cluster, depth in folded.nesting():
        pad = "  " * depth
        if event == "close":
            lines.append(pad + "}")
            continue
        if event == "box":
            box = cluster.vertices[0]
            emitted.add(box)
            lines.append(pad + _vertex(names[box], box, graph.nodes[box]))
            continue
        color = _CLUSTER_COLORS[(depth - 1) % len(_CLUSTER_COLORS)]
        lines.append(f"{pad}subgraph cluster_{cluster.key} {{")
        lines.append(f"{pad}  label={quote(chr(10).join(style.cluster_lines(cluster)))};")
        lines.append(f'{pad}  style="rounded"; color="{color}"; fontcolor="{color}"; '
                     f"id={quote('cluster:' + cluster.key)}; class=\"group\";")
        emitted.update(cluster.vertices)
        lines.extend(pad + "  " + _vertex(names[v], v, graph.nodes[v]) for v in cluster.vertices)
    lines.extend("  " + _vertex(names[v], v, attrs) for v, attrs in graph.nodes(data=True)
                 if v not in emitted)
    lines.extend(f"  {names[u]} -> {names[v]};" for u, v in graph.edges)
    lines.append("}")
    return "\n".join(lines) + "\n"

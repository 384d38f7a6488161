"""Mermaid flowchart of a folded trace: renders on GitHub and in Markdown, no binary needed.

Clusters become nested ``subgraph`` blocks; rule sites, fired rule sites, boundary inputs and
collapsed clusters get their own ``classDef``; inputs are drawn as stadiums.
"""

from __future__ import annotations

from typing import Any

from . import style
from .fold import FoldedGraph

_CLASSES = (
    "classDef op fill:#f8fafc,stroke:#64748b",
    "classDef site fill:#fef3c7,stroke:#b45309,stroke-width:2px",
    "classDef fired fill:#fdba74,stroke:#b45309,stroke-width:2px",
    "classDef input fill:#dbeafe,stroke:#2563eb",
    "classDef group fill:#e2e8f0,stroke:#334155",
    "classDef output stroke-width:3px",
)


def text(value: str) -> str:
    """A Mermaid quoted label: entity codes for the characters Mermaid reads, ``<br/>`` for lines.

    >>> text('cdist#0 "x"\\n<y>')
    'cdist#35;0 #quot;x#quot;<br/>#lt;y#gt;'
    """
    escaped = (value.replace("#", "#35;").replace('"', "#quot;").replace("<", "#lt;")
               .replace(">", "#gt;"))
    return escaped.replace("\n", "<br/>")


def _vertex(name: str, attrs: dict[str, Any]) -> tuple[str, str]:
    label = text("\n".join(style.vertex_lines(attrs)))
    role = style.vertex_role(attrs)
    role = "fired" if role == "site" and style.fired(attrs) else role
    shape = f'(["{label}"])' if role == "input" else f'["{label}"]'
    return f"{name}{shape}", role


def to_mermaid(folded: FoldedGraph) -> str:
    """Mermaid ``flowchart`` text for ``folded``; arrows point the way gradients flow.

    >>> import torch, autograd_groups as ag
    >>> from autograd_groups.viz.fold import fold
    >>> @ag.autograd_group("double")
    ... def double(x):
    ...     return x * 2
    >>> with ag.trace() as t:
    ...     double(torch.ones(2, requires_grad=True)).sum().backward()
    >>> to_mermaid(fold(t.instances)).splitlines()[:2]
    ['flowchart TB', '  %% 1 group instance in 1 cluster, 2 vertices; gradients flow along the arrows']
    """
    graph = folded.graph
    names = {v: f"v{k}" for k, v in enumerate(graph)}
    lines = ["flowchart TB", f"  %% {style.summary(folded)}"]
    roles: dict[str, list[str]] = {}
    emitted: set[str] = set()

    def emit(pad: str, vertex: str) -> None:
        emitted.add(vertex)
        node, role = _vertex(names[vertex], graph.nodes[vertex])
        roles.setdefault(role, []).append(names[vertex])
        if graph.nodes[vertex].get("output"):
            roles.setdefault("output", []).append(names[vertex])
        lines.append(pad + node)

    for event, cluster, depth in folded.nesting():
        pad = "  " * depth
        if event == "close":
            lines.append(pad + "end")
        elif event == "box":
            emit(pad, cluster.vertices[0])
        else:
            lines.append(f'{pad}subgraph {cluster.key}["{text(chr(10).join(style.cluster_lines(cluster)))}"]')
            for v in cluster.vertices:
                emit(pad + "  ", v)
    for v in graph:
        if v not in emitted:
            emit("  ", v)
    lines.extend(f"  {names[u]} --> {names[v]}" for u, v in graph.edges)
    lines.extend("  " + c for c in _CLASSES)
    lines.extend(f"  class {','.join(members)} {role}" for role, members in roles.items())
    return "\n".join(lines) + "\n"

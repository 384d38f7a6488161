"""The words shared by every drawing: vertex and cluster labels, and how a vertex is classed."""

from __future__ import annotations

from typing import Any

from .fold import Cluster, FoldedGraph, short_where


def shape_text(attrs: dict[str, Any]) -> str:
    """``[4, 4]``, or several shapes side by side for a node with several outputs."""
    return " ".join(f"[{', '.join(str(n) for n in s)}]" for s in attrs.get("shape", ()))


def vertex_role(attrs: dict[str, Any]) -> str:
    """``input``, ``group`` (a collapsed cluster), ``site`` (a rule site) or ``op``."""
    if attrs["kind"] in ("input", "group"):
        return str(attrs["kind"])
    return "site" if attrs["rules"] else "op"


def fired(attrs: dict[str, Any]) -> bool:
    """Whether any rule at this vertex changed at least one element (or an override fired)."""
    return any(n > 0 for n in attrs["hits"].values())


def vertex_lines(attrs: dict[str, Any]) -> list[str]:
    """The text lines of a vertex: op and shape, then one line per rule with its hit count."""
    role = vertex_role(attrs)
    if role == "group":
        times = f" ×{attrs['count']}" if attrs["count"] > 1 else ""
        lines = [f"{attrs['op']}{times}", f"{attrs['size']} nodes, {attrs['sites']} rule sites (collapsed)"]
        lines += [f"{label}: {n} hits" for label, n in attrs["hits"].items()]
        return lines
    if role == "input":
        what = "leaf" if attrs["op"] == "leaf" else f"{attrs['op']} (outside)"
        name = attrs.get("name")
        return [f"{name}: {what}" if name else what, shape_text(attrs)]
    lines = [str(attrs["op"]), shape_text(attrs)]
    for rule in attrs["rules"]:
        lines.append(f"⚑ {rule['label']}")
        lines.append(f"{attrs['hits'].get(rule['label'], 0)} elements changed")
    return [line for line in lines if line]


def cluster_title(cluster: Cluster) -> str:
    """``cdist ×50``."""
    return f"{cluster.name} ×{cluster.count}" if cluster.count > 1 else cluster.name


def cluster_lines(cluster: Cluster) -> list[str]:
    """Title, the forward line that created it, and its rule hits (or that special cases were off)."""
    where = short_where(cluster.wheres[0])
    more = len(cluster.wheres) - 1
    lines = [cluster_title(cluster), where + (f" (+{more} more call sites)" if more else "")]
    if not cluster.enabled:
        lines.append("special cases off")
    lines += [f"{label}: {n}" for label, n in cluster.hits.items()]
    return lines


def _count(n: int, noun: str, plural: str | None = None) -> str:
    return f"{n} {noun if n == 1 else plural or noun + 's'}"


def summary(folded: FoldedGraph) -> str:
    """One line about the whole drawing."""
    text = (f"{_count(folded.instances, 'group instance')} in {_count(len(folded.clusters), 'cluster')}, "
            f"{_count(folded.graph.number_of_nodes(), 'vertex', 'vertices')}; gradients flow along the "
            f"arrows")
    if folded.collapsed:
        text += f"; collapsed: {', '.join(folded.collapsed)}"
    return text

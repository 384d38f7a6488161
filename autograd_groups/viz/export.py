"""Write a trace to a file chosen by its extension, and show it in Jupyter."""

from __future__ import annotations

import base64
import os
from collections.abc import Sequence
from typing import Any

from ..errors import GroupError
from .dot import to_dot
from .fold import FoldedGraph, InstanceLike, collapse, fold, select
from .io import atomic_write, dumps
from .mermaid import to_mermaid
from .render import FORMATS, GraphvizNotFound, html_page, render_dot
from .style import summary

TEXT_SUFFIXES = (".dot", ".mmd", ".json")
SUFFIXES = TEXT_SUFFIXES + tuple(FORMATS)
DEFAULT_MAX_NODES = 500


def draw(instances: Sequence[InstanceLike], group: str | None = None,
         max_nodes: int | None = None) -> FoldedGraph:
    """Fold ``instances`` (only ``group``'s, when given) and collapse clusters down to
    ``max_nodes`` vertices (no limit when None)."""
    folded = fold(instances, group)
    return collapse(folded, max_nodes) if max_nodes is not None else folded


def suffix_of(path: str | os.PathLike[str]) -> str:
    """The output kind of ``path`` (its lower-case extension), checked against what can be written."""
    suffix = os.path.splitext(os.fspath(path))[1].lower()
    if suffix not in SUFFIXES:
        raise GroupError(f"cannot write {os.fspath(path)!r}: the extension must be one of "
                         f"{', '.join(SUFFIXES)}")
    return suffix


def write(instances: Sequence[InstanceLike], path: str | os.PathLike[str], group: str | None = None,
           max_nodes: int | None = DEFAULT_MAX_NODES) -> FoldedGraph | None:
    """Write ``instances`` to ``path``: ``.json`` the trace itself; ``.dot``/``.mmd`` the folded
    drawing as text; ``.svg``/``.png``/``.pdf``/``.html`` drawn by :func:`render.render_dot
    <autograd_groups.viz.render.render_dot>` (pygraphviz, else a ``dot`` on ``PATH``; else
    :class:`GraphvizNotFound` and no file). Returns the folded drawing (None for ``.json``). The file
    is written whole or not at all.

    >>> import os, tempfile, torch, autograd_groups as ag
    >>> @ag.autograd_group("double")
    ... def double(x):
    ...     return x * 2
    >>> with ag.trace() as t:
    ...     double(torch.ones(2, requires_grad=True)).sum().backward()
    >>> path = os.path.join(tempfile.mkdtemp(), "double.mmd")
    >>> write(t.instances, path).clusters["c0"].name
    'double'
    """
    suffix = suffix_of(path)
    if suffix == ".json":
        atomic_write(path, dumps(select(instances, group)).encode())
        return None
    folded = draw(instances, group, max_nodes)
    if suffix == ".dot":
        data = to_dot(folded).encode()
    elif suffix == ".mmd":
        data = to_mermaid(folded).encode()
    elif suffix == ".html":
        title = f"autograd-groups: {summary(folded)}"
        data = html_page(render_dot(to_dot(folded), "svg").decode(), title).encode()
    else:
        data = render_dot(to_dot(folded), FORMATS[suffix])
    atomic_write(path, data)
    return folded


def mimebundle(instances: Sequence[InstanceLike]) -> dict[str, Any]:
    """Jupyter's view of a trace: SVG and PNG (VS Code needs both) when a picture can be drawn (see
    :func:`render.render_dot <autograd_groups.viz.render.render_dot>`), else the Mermaid text;
    always a plain-text summary."""
    folded = draw(instances, max_nodes=DEFAULT_MAX_NODES)
    bundle: dict[str, Any] = {"text/plain": f"<Trace: {summary(folded)}>"}
    source = to_dot(folded)
    try:
        svg, png = render_dot(source, "svg"), render_dot(source, "png")
    except GraphvizNotFound:
        bundle["text/markdown"] = f"```mermaid\n{to_mermaid(folded)}```\n"
        return bundle
    bundle["image/svg+xml"] = svg.decode()
    bundle["image/png"] = base64.b64encode(png).decode("ascii")
    return bundle

"""Trace sessions: record each group instance's subgraph as a ``networkx.DiGraph``.

Tracing is opt-in: outside ``trace()`` no graph object is built on the forward or backward path.
Vertices are named ``<group>#<n>:<k>`` (instance ``n`` of the group in this session, ``k``-th node
in walk order), so the same program gives the same ids. Edges point the way gradients flow, from
the node that consumes a tensor to the node that produced it.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from typing import Any, cast

import torch

from .. import compat, nodes
from ..instance import GroupInstance


def describe(node: Any) -> dict[str, Any]:
    """The vertex attributes of an autograd node: op, class, output shape/dtype, saved names."""
    meta = compat.input_metadata(node)
    return {
        "kind": "op",
        "op": nodes.node_op(node),
        "node_class": type(node).__name__,
        "shape": [list(m.shape) for m in meta],
        "dtype": [str(m.dtype).replace("torch.", "") for m in meta],
        "saved": list(nodes.saved_names(node)),
        "rules": [],
        "hits": {},
    }


class Trace:
    """What one ``trace()`` session saw: its group instances, in creation order."""

    def __init__(self) -> None:
        self.instances: list[GroupInstance] = []
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}
        self._leaves: dict[int, tuple[Any, str]] = {}

    def new_id(self, name: str) -> str:
        """The id of the next instance of group ``name``: ``name#n``."""
        with self._lock:
            n = self._counts.get(name, 0)
            self._counts[name] = n + 1
        return f"{name}#{n}"

    def add(self, instance: GroupInstance) -> None:
        """Record a finished instance."""
        with self._lock:
            self.instances.append(instance)

    def remove(self, instance: GroupInstance) -> None:
        """Forget an instance (one merged into another)."""
        with self._lock:
            self.instances.remove(instance)

    def leaf_vertex(self, node: Any) -> str:
        """The one vertex id this session gives a leaf tensor's AccumulateGrad node."""
        with self._lock:
            found = self._leaves.get(id(node))
            if found is None:
                # Holding the node keeps its id from being reused by another leaf in this session.
                found = self._leaves[id(node)] = (node, f"leaf:{len(self._leaves)}")
        return found[1]

    def to_dot(self) -> str:
        """Graphviz DOT text: each group a cluster, repeated instances folded into one ``×N``."""
        from ..viz import draw, to_dot

        return to_dot(draw(self.instances))

    def to_mermaid(self) -> str:
        """The same drawing as a Mermaid flowchart (renders on GitHub and in Markdown)."""
        from ..viz import draw, to_mermaid

        return to_mermaid(draw(self.instances))

    def save(self, path: str | os.PathLike[str]) -> None:
        """Save the instances and their graphs to ``path`` as JSON (``"schema": 1``)."""
        from ..viz import save

        save(self.instances, path)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Trace:
        """A trace saved by :meth:`save`; its instances are ``viz.InstanceRecord`` objects with the
        same fields as a ``GroupInstance`` (name, id, parent, where, enabled, graph, inputs,
        outputs, hits) but no rules."""
        from ..viz import load

        trace = cls()
        trace.instances = cast("list[GroupInstance]", load(path))
        return trace

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None, **kwargs: Any) -> dict[str, Any]:
        """Jupyter display: SVG and PNG when Graphviz is installed, else Mermaid text."""
        from ..viz import mimebundle

        return mimebundle(self.instances)


_sessions: list[Trace] = []
_sessions_lock = threading.Lock()


class _Hidden(threading.local):
    """The sessions that this thread's open :func:`hidden` blocks hide from it."""

    sessions: frozenset[Trace] = frozenset()


_hidden = _Hidden()


def active() -> Trace | None:
    """The innermost open trace session, if any (sessions are process-wide), leaving out those that
    were open when this thread entered a :func:`hidden` block it is still in."""
    if not _sessions:
        return None
    hidden = _hidden.sessions
    return next((s for s in reversed(_sessions) if s not in hidden), None) if hidden else _sessions[-1]


@contextlib.contextmanager
def trace() -> Iterator[Trace]:
    """Record every group instance created inside the block, in any thread.

    >>> import torch, autograd_groups as ag
    >>> @ag.autograd_group("double")
    ... def double(x):
    ...     return x * 2
    >>> with ag.trace() as t:
    ...     double(torch.ones(2, requires_grad=True)).sum().backward()
    >>> [(i.name, sorted(d["op"] for _, d in i.graph.nodes(data=True) if d["kind"] == "op"))
    ...  for i in t.instances]
    [('double', ['mul'])]
    """
    session = Trace()
    with _sessions_lock:
        _sessions.append(session)
    try:
        yield session
    finally:
        with _sessions_lock:
            _sessions.remove(session)
            session._leaves.clear()
        # Each instance points back at its session: cut that cycle so that a finished trace is
        # freed by reference counting, not left to the cycle collector.
        for instance in session.instances:
            instance.session = None


@contextlib.contextmanager
def hidden() -> Iterator[None]:
    """Inside the block, no trace session open at its start records the instances this thread
    creates (``ag.verify``'s and the second-order check's own runs of a group are not the user's:
    ``viz`` and ``stats`` under the command line show the script's instances only); other threads'
    instances go on being recorded, and a session opened inside the block records as usual.

    >>> import torch, autograd_groups as ag
    >>> double = ag.autograd_group("double")(lambda x: x * 2)
    >>> with ag.trace() as t:
    ...     with hidden():
    ...         _ = double(torch.ones(2, requires_grad=True))
    >>> t.instances
    []
    """
    before = _hidden.sessions
    with _sessions_lock:
        _hidden.sessions = before.union(_sessions)
    try:
        yield
    finally:
        _hidden.sessions = before


def leaf_tensor(node: Any) -> torch.Tensor | None:
    """The leaf tensor behind an AccumulateGrad node, else None."""
    return getattr(node, "variable", None)

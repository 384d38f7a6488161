"""A group instance: one entry into a group, with the decisions taken when it was created.

Its life -- opened at forward time, closed when the group returns, its rule sites hooked -- is in
:mod:`autograd_groups.groups.lifecycle`.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from .observe import counters
from .rules.registry import RuleSet


class Session(Protocol):
    """What an instance needs of the trace session recording it
    (:class:`~autograd_groups.observe.tracer.Trace`)."""

    def new_id(self, name: str) -> str: ...
    def add(self, instance: GroupInstance) -> None: ...
    def remove(self, instance: GroupInstance) -> None: ...
    def leaf_vertex(self, node: Any) -> str: ...


class GroupInstance:
    """One entry into a group: its rules, its place in the nesting, and (when traced) its graph.

    ``graph`` is a ``networkx.DiGraph`` when a ``trace()`` session was open, else None; ``watched``
    says whether ``detect_nonfinite()`` was active.
    ``inputs`` and ``outputs`` are vertex ids of ``graph``; ``hits`` maps rule labels to the number
    of elements each rule changed in this instance (counted while traced).
    """

    # Slots: an instance is made on every call of a group, on its hot path.
    __slots__ = ("name", "watched", "rules", "enabled", "parent", "id", "graph", "inputs", "outputs", "hits",
                 "session", "nested", "merged_into", "_where", "_task", "hooks_pushed", "transposed",
                 "forward_check", "_start")

    def __init__(self, name: str, rules: RuleSet, enabled: bool, parent: GroupInstance | None,
                 session: Session | None, where: tuple[str, int], watched: bool, transposed: bool) -> None:
        self.name = name
        self.watched = watched
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
        self.hooks_pushed = False
        #: Whether the instance runs to give a forward-mode pass its tangents (sites/tangents.py):
        #: decided by the caller at forward time, for the hooks that run on the engine's threads.
        self.transposed = transposed
        #: The forward check (a torch function mode) this instance pushed, under detect_nonfinite().
        self.forward_check: Any = None
        self._start = torch._C._autograd._get_sequence_nr()

    @property
    def where(self) -> str:
        """``file:line`` of the forward code that created the instance (just the first part where
        the line is unknown, as in torch.compile'd code)."""
        return f"{self._where[0]}:{self._where[1]}" if self._where[1] else self._where[0]

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

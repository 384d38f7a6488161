"""A group instance: one entry into a group, with the decisions taken when it was created.

Its life -- opened at forward time, closed when the group returns, its rule sites hooked -- is in
:mod:`autograd_groups.groups.lifecycle`.
"""

from __future__ import annotations

from typing import Any, Protocol

from . import compat
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
    of elements each rule changed in this instance (counted while traced). ``recorder`` is the
    ``ag.verify`` recorder of a traced instance made while one was active (the caller reads it),
    else None.
    """

    # Slots: an instance is made on every call of a group, on its hot path.
    __slots__ = ("name", "watched", "rules", "enabled", "parent", "id", "graph", "inputs", "outputs", "hits",
                 "session", "recorder", "nested", "merged_into", "site", "_task", "hooks_pushed",
                 "nonfinite_task", "transposed", "linear_levels", "forward_check", "_start", "call", "outer",
                 "part")

    def __init__(self, name: str, rules: RuleSet, enabled: bool, parent: GroupInstance | None,
                 session: Session | None, where: tuple[str, int], watched: bool, transposed: bool,
                 linear_levels: frozenset[int] = frozenset(), recorder: Any = None) -> None:
        self.name: str = name
        self.watched: bool = watched
        self.rules: RuleSet = rules
        self.enabled: bool = enabled
        self.parent: GroupInstance | None = parent
        self.id: str = session.new_id(name) if session is not None else name
        self.graph: Any = None
        if session is not None:
            import networkx as nx

            self.graph = nx.DiGraph(name=name, id=self.id)
        self.inputs: list[str] = []
        self.outputs: list[str] = []
        self.hits: dict[str, int] = {}
        self.session: Session | None = session
        self.recorder: Any = recorder
        self.nested: bool = False
        self.merged_into: GroupInstance | None = None
        #: ``(file, line)`` of the forward code that created the instance.
        self.site: tuple[str, int] = where
        self._task = -1
        self.hooks_pushed: bool = False
        #: The backward pass (graph task) that last gave this traced instance non-finite input
        #: gradients, so that a pass is counted once (observe/inputs.py).
        self.nonfinite_task: int = -1
        #: Whether the instance runs to give a forward-mode pass its tangents (sites/tangents.py):
        #: decided by the caller at forward time, for the hooks that run on the engine's threads.
        self.transposed: bool = transposed
        #: The grad levels that differentiate this instance's backward only in its cotangent
        #: (sites/tangents.py), decided likewise.
        self.linear_levels: frozenset[int] = linear_levels
        #: The forward check (a torch function mode) this instance pushed, under detect_nonfinite().
        self.forward_check: Any = None
        self._start = compat.sequence_nr()
        #: A decorator group's call, detached (``sites.second_order.remember``), so that a second
        #: derivative through a rule can be checked on the group's own inputs; None for a ``with``
        #: block or ``tag``, which cannot be re-run.
        self.call: tuple[Any, tuple[Any, ...], dict[str, Any], frozenset[int]] | None = None
        #: Likewise, the call of the function around it that a PyTorch transform differentiates
        #: (``torch.func.hessian(f)``; ``sites.second_order.enclosing``), or None: where the group's
        #: own inputs cannot decide, the check runs that function.
        self.outer: tuple[Any, tuple[Any, ...], dict[str, Any], frozenset[int]] | None = None
        #: Whether the instance runs one call of its group's function (a rule site under forward
        #: mode, sites/forward_sites.py): ``call`` is then the whole group's, and its members'
        #: places are not the whole group's.
        self.part: bool = False

    @property
    def where(self) -> str:
        """``file:line`` of the forward code that created the instance (just the first part where
        the line is unknown, as in torch.compile'd code)."""
        return f"{self.site[0]}:{self.site[1]}" if self.site[1] else self.site[0]

    def __repr__(self) -> str:
        return f"<GroupInstance {self.id} at {self.where}>"

    @property
    def reached(self) -> bool:
        """Whether a backward pass has reached the instance's rule sites."""
        return self._task != -1

    def new_pass(self) -> bool:
        """Whether the backward pass running now reaches this instance for the first time (its rule
        sites ask, so that a pass is counted once)."""
        task = compat.current_graph_task_id()
        if task == self._task:
            return False
        self._task = task
        return True

    def record_hit(self, vertex: str | None, label: str, elements: int) -> None:
        """Add a rule's changed-element count to this traced instance."""
        self.hits[label] = self.hits.get(label, 0) + elements
        if vertex is not None and vertex in self.graph:
            site = self.graph.nodes[vertex]["hits"]
            site[label] = site.get(label, 0) + elements

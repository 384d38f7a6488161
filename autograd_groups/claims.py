"""What a group leaves in an autograd node's ``metadata``: which instance owns the node and which
rules were applied to it, so nested groups and tagged chains can see each other's work."""

from __future__ import annotations

from .instance import GroupInstance

CLAIM = "autograd_groups"
# A node outside an instance that traced instances drew as an input: its one vertex id, and who drew it.
OUTSIDE = "autograd_groups.outside"


class Claim:
    """What a node's ``metadata`` remembers: its innermost instance and the rules applied to it."""

    __slots__ = ("owner", "ruled", "nan_safe", "vertex", "tagged", "cured")

    def __init__(self, owner: GroupInstance, vertex: str | None, tagged: bool) -> None:
        self.owner: GroupInstance = owner
        self.ruled: set[str] = set()
        self.nan_safe: bool = False
        self.vertex: str | None = vertex
        self.tagged: bool = tagged
        #: Whether a rule applied here sets the gradient where the op's derivative is infinite
        #: (``sqrt`` at ``result == 0``), so that the node passes zeros on (finiteness.py).
        self.cured: bool = False

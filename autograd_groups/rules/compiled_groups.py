"""The groups a compiler has traced into a compiled graph: a fact about group names, which the flag
reads (its backward-scoped form cannot turn their rules off there) and ``stats`` reports.

>>> add("example.group"); "example.group" in names()
True
>>> reset(names() - {"example.group"})
"""

from __future__ import annotations

from collections.abc import Iterable

# A plain set, no lock: adding to it is atomic, and it is also done from a hook that compiled
# autograd traces with Dynamo, which cannot enter a lock.
_names: set[str] = set()


def add(name: str) -> None:
    """Note that a compiler traced an instance or a rule site of group ``name`` into a compiled graph."""
    _names.add(name)


def names() -> frozenset[str]:
    """The groups noted so far."""
    return frozenset(_names)


def reset(names: Iterable[str] = ()) -> None:
    """Make ``names`` the groups noted (none by default)."""
    _names.clear()
    _names.update(names)

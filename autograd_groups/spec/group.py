"""A group as a spec declares it: one record from reading the file to what ``load_spec`` returns."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..rules.kinds import Rule


@dataclass(frozen=True)
class SpecGroup:
    """A group of a spec: its signature, doc and rules, and where it is defined.

    ``where`` is the ``file:line:col`` of the group's name, ``rule_wheres`` that of each rule;
    ``compile`` the ``torch.compile`` options that the spec's ``compile:`` gives its functions.
    Read from a file, ``rules`` are the rules the spec declares; in a :class:`SpecHandle`, they are
    the rule objects registered (those registered before, where a group had the same rules already).

    >>> import autograd_groups as ag
    >>> spec = "- name: tmp_safe(Tensor x) -> Tensor\\n  special_cases: [nan_safe: true]\\n"
    >>> with ag.load_spec(spec) as handle:
    ...     group = handle.groups[0]
    ...     group.where, group.rule_wheres, position(group.where)
    ('<string>:1:9', ('<string>:2:19',), ('<string>', 1, 9))
    """

    name: str
    signature: str
    params: tuple[tuple[str, str], ...]
    returns: str
    doc: str
    rules: tuple[Rule, ...]
    where: str
    rule_wheres: tuple[str, ...] = field(default=(), compare=False, repr=False)
    #: ``compile:``: the options its decorated functions compile with (None: as the decorator says).
    compile: dict[str, Any] | None = field(default=None, compare=False, repr=False)


def position(where: str) -> tuple[str, int, int]:
    """``(file, line, col)`` of a ``file:line:col`` (the file may hold colons itself)."""
    file, line, col = where.rsplit(":", 2)
    return file, int(line), int(col)

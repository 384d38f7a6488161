"""The ``stats`` report: per group, how often it ran, how often its rules changed anything, and
whether its special cases could be turned off; as two tables that fit 80 columns, or as JSON."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rich.markup import escape
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

KEEP = "keep on"
SAFE = "can be off"
NO_RULES = "no rules registered"
OFF = "was off"
NOT_RUN = "no backward"
COMPILED = "unknown: compiled"
LEGEND = {
    KEEP: "its rules changed gradients: it reaches special points",
    SAFE: "its rules ran but never changed an element in this run",
    NO_RULES: "no rule is registered under the group's name: is it misspelled?",
    OFF: "every instance was created with special cases off",
    NOT_RUN: "no backward pass reached its rule sites",
    COMPILED: "it ran inside torch.compile'd code, where its rules' hits are not counted",
}


@dataclass
class RuleRow:
    """One rule of a group: ``changed`` is elements set (subgradient, nan_safe) or firings (override)."""

    label: str
    kind: str
    calls: int
    changed: int


@dataclass
class GroupReport:
    """One group's line of the report."""

    name: str
    instances: int
    instances_off: int
    backward_passes: int
    compiled: bool = False
    rules: list[RuleRow] = field(default_factory=list)

    @property
    def verdict(self) -> str:
        """What the counts say about turning the group's special cases off."""
        if not self.rules:
            return NO_RULES
        if self.instances and self.instances_off == self.instances:
            return OFF
        if any(r.changed for r in self.rules):
            return KEEP
        if self.compiled:
            return COMPILED
        return SAFE if any(r.calls for r in self.rules) else NOT_RUN


def reports(counts: Mapping[str, Mapping[str, Any]],
            registered: Mapping[str, Sequence[Any]]) -> list[GroupReport]:
    """Join ``ag.stats()`` with ``ag.list_rules()``: one report per group counted in ``counts``;
    its registered rules that never ran appear with zero calls.

    >>> [r.verdict for r in reports({"g": {"instances": 2, "instances_off": 0, "backward_passes": 2,
    ...     "rules": {"nan_safe": {"kind": "nan_safe", "calls": 4, "firings": 0, "elements": 0}}}}, {})]
    ['can be off']
    """
    found: list[GroupReport] = []
    for name in sorted(counts):
        count = counts[name]
        report = GroupReport(name, count["instances"], count["instances_off"], count["backward_passes"],
                             count.get("compiled", False))
        for label, rule in count.get("rules", {}).items():
            changed = rule["firings"] if rule["kind"] == "override" else rule["elements"]
            report.rules.append(RuleRow(label, rule["kind"], rule["calls"], changed))
        seen = {r.label for r in report.rules}
        report.rules += [RuleRow(r.label, r.kind, 0, 0) for r in registered.get(name, ())
                         if r.label not in seen]
        found.append(report)
    return found


def group_table(found: Sequence[GroupReport]) -> Table:
    """One row per group of ``found``: its instances, passes and verdict. The rules have their own
    table (:func:`rule_table`): in one table, eight columns cannot fit 80 without cutting names.
    Every column folds rather than ellipsises when the terminal is too narrow."""
    out = Table(title="special cases per group, this run",
                caption="off: instances made with special cases off")
    out.add_column("group", overflow="fold")
    for column in ("instances", "off", "backward\npasses"):
        out.add_column(column, justify="right", overflow="fold")
    out.add_column("verdict", overflow="fold")
    for report in found:
        color = {KEEP: "red", SAFE: "green"}.get(report.verdict, "dim")
        out.add_row(escape(report.name), str(report.instances), str(report.instances_off),
                    str(report.backward_passes) if report.rules else "-",
                    f"[{color}]{escape(report.verdict)}[/]")
    return out


def rule_table(found: Sequence[GroupReport]) -> Table | None:
    """Per group of ``found`` with rules, a row with its name, then one row per rule (None when no
    group has a rule). Names and rules share one column, so that neither shrinks the other."""
    if not any(report.rules for report in found):
        return None
    out = Table(title="their rules", caption="changed: elements a subgradient or nan_safe rule set, "
                "or firings of an override")
    out.add_column("group / rule", overflow="fold")
    out.add_column("calls", justify="right", overflow="fold")
    out.add_column("changed", justify="right", overflow="fold")
    for report in (r for r in found if r.rules):
        out.add_row(Text(report.name, style="bold"), "", "")
        for k, rule in enumerate(report.rules):
            out.add_row(Padding(Text(rule.label), (0, 0, 0, 2)), str(rule.calls), str(rule.changed),
                        end_section=k == len(report.rules) - 1)
    return out


def to_json(found: Sequence[GroupReport]) -> dict[str, Any]:
    """``stats --json``: the tables' content. ``groups``: per group ``name``, ``instances``,
    ``instances_off``, ``backward_passes``, ``compiled``, ``verdict`` and ``rules`` (per rule
    ``label``, ``kind``, ``calls``, ``changed``); ``can_be_off``: the groups whose special cases can
    be turned off.

    >>> to_json(reports({"g": {"instances": 1, "instances_off": 0, "backward_passes": 1,
    ...     "rules": {}}}, {}))["groups"][0]["verdict"]
    'no rules registered'
    """
    return {
        "groups": [{"name": r.name, "instances": r.instances, "instances_off": r.instances_off,
                    "backward_passes": r.backward_passes, "compiled": r.compiled, "verdict": r.verdict,
                    "rules": [{"label": rule.label, "kind": rule.kind, "calls": rule.calls,
                               "changed": rule.changed} for rule in r.rules]}
                   for r in found],
        "can_be_off": _can_be_off(found),
    }


def legend(found: Sequence[GroupReport]) -> list[str]:
    """One line per verdict that appears in ``found``: what it means."""
    verdicts = dict.fromkeys(r.verdict for r in found)
    return [f"{verdict}: {LEGEND[verdict]}" for verdict in verdicts]


def _can_be_off(found: Sequence[GroupReport]) -> list[str]:
    return [r.name for r in found if r.verdict == SAFE]


def off_line(found: Sequence[GroupReport]) -> str | None:
    """The ``with`` line that turns off the special cases of every group that never hit one."""
    names = _can_be_off(found)
    return f"with ag.special_cases(False, groups={json.dumps(names)}):" if names else None

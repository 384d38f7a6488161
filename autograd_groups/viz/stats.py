"""The ``stats`` report: per group, how often it ran, how often its rules changed anything, and
whether its special cases could be turned off."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rich.markup import escape
from rich.table import Table

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


def table(found: Sequence[GroupReport]) -> Table:
    """The rich table of ``found``: one row per rule (one per group without rules)."""
    out = Table(title="special cases per group, this run", caption="changed: elements a subgradient or "
                "nan_safe rule set, or firings of an override; off: instances made with special cases off")
    out.add_column("group", overflow="fold")
    for column in ("instances", "off", "backward passes"):
        out.add_column(column, justify="right")
    out.add_column("rule", overflow="fold")
    out.add_column("calls", justify="right")
    out.add_column("changed", justify="right")
    out.add_column("verdict", no_wrap=True)
    for report in found:
        rows = report.rules or [RuleRow("-", "-", 0, 0)]
        color = {KEEP: "red", SAFE: "green"}.get(report.verdict, "dim")
        for k, rule in enumerate(rows):
            first = k == 0
            numbers = [str(report.instances), str(report.instances_off),
                       str(report.backward_passes) if report.rules else "-"] if first else ["", "", ""]
            counts = [str(rule.calls), str(rule.changed)] if report.rules else ["-", "-"]
            out.add_row(escape(report.name) if first else "", *numbers, escape(rule.label), *counts,
                        f"[{color}]{escape(report.verdict)}[/]" if first else "",
                        end_section=k == len(rows) - 1)
    return out


def legend(found: Sequence[GroupReport]) -> list[str]:
    """One line per verdict that appears in ``found``: what it means."""
    verdicts = dict.fromkeys(r.verdict for r in found)
    return [f"{verdict}: {LEGEND[verdict]}" for verdict in verdicts]


def off_line(found: Sequence[GroupReport]) -> str | None:
    """The ``with`` line that turns off the special cases of every group that never hit one."""
    names = [r.name for r in found if r.verdict == SAFE]
    return f"with ag.special_cases(False, groups={json.dumps(names)}):" if names else None

"""The ``stats`` report: per group and line of code that created its instances, how often it ran,
how often its rules changed anything, whether its input gradients came out non-finite, and whether
its special cases could be turned off; as two tables that fit 80 columns, or as JSON."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rich.markup import escape
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from .fold import short_where

KEEP = "keep on"
SAFE = "can be off"
NONFINITE = "non-finite gradients"
NO_RULES = "no rules registered"
OFF = "was off"
NOT_RUN = "no backward"
COMPILED = "unknown: compiled"
UNCOUNTED = "unknown: under vmap"
LEGEND = {
    KEEP: "its rules changed gradients: it reaches special points",
    NONFINITE: "its input gradients came out NaN or infinite with its rules on: its rules did not fix "
               "them (a rule that never applies, or a special point no rule covers)",
    SAFE: "its rules ran but never changed an element in this run",
    NO_RULES: "no rule is registered under the group's name: is it misspelled?",
    OFF: "every instance was created with special cases off",
    NOT_RUN: "no backward pass reached its rule sites",
    COMPILED: "it ran inside torch.compile'd code, where its rules' hits are not counted",
    UNCOUNTED: "its rules ran under vmap, where the elements they changed are a batch and are not "
               "counted",
}


@dataclass
class RuleRow:
    """One rule of a group: ``changed`` is elements set (subgradient, nan_safe) or firings (override)."""

    label: str
    kind: str
    calls: int
    changed: int
    uncounted: int = 0


@dataclass
class GroupReport:
    """One line of the report: a group's instances created at one line of code (``where``)."""

    name: str
    instances: int
    instances_off: int
    backward_passes: int
    compiled: bool = False
    rules: list[RuleRow] = field(default_factory=list)
    where: str = ""
    nonfinite: int = 0

    @property
    def verdict(self) -> str:
        """What the counts say about turning the group's special cases off."""
        if not self.rules:
            return NO_RULES
        if self.instances and self.instances_off == self.instances:
            return OFF
        if self.nonfinite:
            return NONFINITE
        if any(r.changed for r in self.rules):
            return KEEP
        if self.compiled:
            return COMPILED
        if any(r.uncounted for r in self.rules):
            return UNCOUNTED
        return SAFE if any(r.calls for r in self.rules) else NOT_RUN


def reports(counts: Mapping[str, Mapping[str, Any]],
            registered: Mapping[str, Sequence[Any]]) -> list[GroupReport]:
    """Join ``ag.stats()`` with ``ag.list_rules()``: one report per group counted in ``counts`` and
    line of code that created its instances (its ``sites``); its registered rules that never ran
    appear with zero calls.

    >>> [r.verdict for r in reports({"g": {"instances": 2, "instances_off": 0, "backward_passes": 2,
    ...     "rules": {"nan_safe": {"kind": "nan_safe", "calls": 4, "firings": 0, "elements": 0}}}}, {})]
    ['can be off']
    """
    found: list[GroupReport] = []
    for name in sorted(counts):
        count = counts[name]
        for where, site in sorted((count.get("sites") or {"": count}).items(), key=_by_line):
            report = GroupReport(name, site["instances"], site["instances_off"], site["backward_passes"],
                                 count.get("compiled", False), where=where,
                                 nonfinite=site.get("nonfinite_gradients", 0))
            for label, rule in site.get("rules", {}).items():
                changed = rule["firings"] if rule["kind"] == "override" else rule["elements"]
                report.rules.append(RuleRow(label, rule["kind"], rule["calls"], changed,
                                            rule.get("uncounted", 0)))
            seen = {r.label for r in report.rules}
            report.rules += [RuleRow(r.label, r.kind, 0, 0) for r in registered.get(name, ())
                             if r.label not in seen]
            found.append(report)
    return found


def _by_line(item: tuple[str, Any]) -> tuple[str, int]:
    """``file:line`` sorted by file, then by line number."""
    path, _, line = item[0].rpartition(":")
    return (path, int(line)) if line.isdigit() else (item[0], 0)


def _title(report: GroupReport) -> Text:
    """The group's name, and below it where its instances were created."""
    title = Text(report.name, style="bold")
    if report.where:
        title.append(f"\n  at {short_where(report.where)}", style="dim")
    return title
#: How each verdict is drawn: red only where something is wrong (non-finite gradients); "keep on" is
#: advice, not an error.
VERDICT_STYLES = {KEEP: "cyan", NONFINITE: "bold red", SAFE: "green"}


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
        color = VERDICT_STYLES.get(report.verdict, "dim")
        out.add_row(_title(report), str(report.instances), str(report.instances_off),
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
        out.add_row(_title(report), "", "")
        for k, rule in enumerate(report.rules):
            out.add_row(Padding(Text(rule.label), (0, 0, 0, 2)), str(rule.calls),
                        str(rule.changed) + (f" + ? ({rule.uncounted} under vmap)" if rule.uncounted else ""),
                        end_section=k == len(report.rules) - 1)
    return out


def to_json(found: Sequence[GroupReport], unused: Mapping[str, Sequence[str]] | None = None,
            ) -> dict[str, Any]:
    """``stats --json``: the tables' content. ``groups``: per group and line of code, ``name``,
    ``where``, ``instances``, ``instances_off``, ``backward_passes``, ``nonfinite_gradients``,
    ``compiled``, ``verdict`` and ``rules`` (per rule ``label``, ``kind``, ``calls``, ``changed``,
    ``uncounted``: calls under vmap whose elements were not counted);
    ``can_be_off``: the groups whose special cases can be turned off everywhere; ``unused_rules``:
    names with rules that no group used, each with the group names close to it.

    >>> to_json(reports({"g": {"instances": 1, "instances_off": 0, "backward_passes": 1,
    ...     "rules": {}}}, {}))["groups"][0]["verdict"]
    'no rules registered'
    """
    return {
        "groups": [{"name": r.name, "where": r.where, "instances": r.instances,
                    "instances_off": r.instances_off, "backward_passes": r.backward_passes,
                    "nonfinite_gradients": r.nonfinite, "compiled": r.compiled, "verdict": r.verdict,
                    "rules": [{"label": rule.label, "kind": rule.kind, "calls": rule.calls,
                               "changed": rule.changed, "uncounted": rule.uncounted} for rule in r.rules]}
                   for r in found],
        "can_be_off": _can_be_off(found),
        "unused_rules": {name: list(close) for name, close in (unused or {}).items()},
    }


def region_lines(counts: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Per group declared ``compile=True``: how many calls ran compiled, how many eagerly and why,
    how many graphs its cache holds, and what its compiled region saved for backward.

    >>> import textwrap
    >>> (line,) = region_lines({"g": {"region": {"compiled_calls": 3, "compiles": 1, "saved_bytes": 5376,
    ...                                          "eager_calls": {"torch.func transform": 1}}}})
    >>> print(textwrap.fill(line, 80))
    g (compile=True): 3 calls compiled, 1 eagerly (torch.func transform: 1); 1
    compiled graph, which saved 5376 bytes for backward
    """
    lines = []
    for name in sorted(counts):
        region = counts[name].get("region")
        if region is None:
            continue
        eager = region["eager_calls"]
        why = f" ({', '.join(f'{reason}: {n}' for reason, n in eager.items())})" if eager else ""
        graphs = region["compiles"]
        saved = region.get("saved_bytes")
        kept = "" if saved is None else f", which saved {saved} bytes for backward"
        lines.append(f"{name} (compile=True): {region['compiled_calls']} calls compiled, "
                     f"{sum(eager.values())} eagerly{why}; {graphs} compiled graph{'s' * (graphs != 1)}"
                     f"{kept}")
    return lines


def legend(found: Sequence[GroupReport]) -> list[str]:
    """One line per verdict that appears in ``found``: what it means."""
    verdicts = dict.fromkeys(r.verdict for r in found)
    return [f"{verdict}: {LEGEND[verdict]}" for verdict in verdicts]


def _can_be_off(found: Sequence[GroupReport]) -> list[str]:
    """The groups every line of which can be off."""
    names = dict.fromkeys(r.name for r in found)
    return [name for name in names if all(r.verdict == SAFE for r in found if r.name == name)]


def off_line(found: Sequence[GroupReport]) -> str | None:
    """The ``with`` line that turns off the special cases of every group that never hit one."""
    names = _can_be_off(found)
    return f"with ag.special_cases(False, groups={json.dumps(names)}):" if names else None


def site_lines(found: Sequence[GroupReport]) -> list[str]:
    """For a group that must stay on at some lines of code but never met a special point at
    others: those lines, where a ``with`` around the call alone may turn it off."""
    whole = set(_can_be_off(found))
    lines = []
    for report in found:
        if report.verdict == SAFE and report.name not in whole and report.where:
            lines.append(f"{report.name} never reached a special point at {short_where(report.where)}; "
                         f"that call alone may run under\n  with ag.special_cases(False, "
                         f"groups={json.dumps([report.name])}):")
    return lines


def unchanged_lines(found: Sequence[GroupReport]) -> list[str]:
    """For a group whose gradients came out non-finite while its NaN-safe rule changed nothing: why
    the rule could not help, and how to find the op that made the value.

    >>> report = GroupReport("attend", 1, 0, 1, where="nf.py:14", nonfinite=1,
    ...                      rules=[RuleRow("nan_safe", "nan_safe", 2, 0)])
    >>> print(unchanged_lines([report])[0][:72])
    attend at nf.py:14: nan_safe changed no element, yet its input gradients
    """
    lines = []
    for report in found:
        if report.verdict != NONFINITE:
            continue
        for rule in report.rules:
            if rule.kind == "nan_safe" and rule.calls and not rule.changed and not rule.uncounted:
                at = f" at {short_where(report.where)}" if report.where else ""
                lines.append(
                    f"{report.name}{at}: nan_safe changed no element, yet its input gradients came "
                    f"out non-finite: NaN-safe zeroes only a 0 times an infinite derivative (0 * inf), "
                    f"so the non-finite value was made in the forward (a softmax of a row that is all "
                    f"-inf) or came in with the incoming gradient. Run the forward under "
                    f"ag.detect_nonfinite() to name the op that made it, and guard that op's input")
    return lines


def unused_lines(unused: Mapping[str, Sequence[str]], registered: Mapping[str, Sequence[Any]]) -> list[str]:
    """One line per name that has rules no group used: they never took effect.

    >>> unused_lines({"lenght": ["length"]}, {"lenght": [object()]})
    ["rules under 'lenght', a name no group used, never took effect (1 rule); did you mean 'length'?"]
    """
    lines = []
    for name, close in unused.items():
        count = len(registered.get(name, ()))
        hint = f"; did you mean {' or '.join(map(repr, close))}?" if close else ""
        lines.append(f"rules under {name!r}, a name no group used, never took effect "
                     f"({count} rule{'s' if count != 1 else ''}){hint}")
    return lines

"""What ``ag.verify`` found: one :class:`Row` per (group, rule, instance), and the :class:`Report`
that prints them as a table within 80 columns, explains every row that is not consistent, and
converts to JSON."""

from __future__ import annotations

import dataclasses
import io
import math
import os
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.markup import escape
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

CONSISTENT = "consistent"
INCONSISTENT = "inconsistent"
NOT_CHECKED = "not checked"
#: The ``scope`` of a row that checks a decorator group's rule through the whole function given to
#: ``ag.verify``, rather than on the group's own inputs.
END_TO_END = "end to end"
_COLORS = {CONSISTENT: "green", INCONSISTENT: "red", NOT_CHECKED: "yellow"}


@dataclass
class Row:
    """One rule in one instance (``instance`` is empty for a row about all of a group's instances).

    ``point``: "smooth" (the limits along every direction agree), "kink" (they differ: the rule must
    lie within their range), "cusp" (a limit is infinite), or "" when nothing was compared.
    ``scope``: "" for the group checked on its own inputs (or, for a ``with`` block or ``tag``,
    through the function), :data:`END_TO_END` for the rule checked again through the whole function.
    ``changed``: elements the rule changed in the run (for an override, its firings); ``checked``:
    input-gradient elements compared. At the element that differs most (``input``, ``index``,
    ``input_value``): the rule's value, the limits' range ``low`` to ``high``, how far outside it
    the rule's value lies (``difference``, 0 inside) and how far it may (``tolerance``).
    ``origin``: where the rule's value is not finite, the op that made it so, and whether that op is
    the rule's own (see :func:`~autograd_groups.verify.origin.nonfinite_origin`), else "".
    """

    group: str
    instance: str
    where: str
    rule: str
    kind: str
    op: str
    order: int
    status: str
    reason: str = ""
    changed: int = 0
    point: str = ""
    checked: int = 0
    difference: float | None = None
    tolerance: float | None = None
    rule_value: float | None = None
    low: float | None = None
    high: float | None = None
    input: str = ""
    index: list[int] = field(default_factory=list)
    input_value: float | None = None
    scope: str = ""
    origin: str = ""


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


def _what(order: int) -> str:
    return "gradient" if order == 1 else "Hessian-vector product"


_POINTS = {"smooth": "a smooth point", "kink": "a kink", "cusp": "a cusp"}


def explain(row: Row) -> str:
    """One sentence on ``row``: where, what was compared, and the numbers.

    >>> import textwrap
    >>> print(textwrap.fill(explain(Row("g", "g#0", "x.py:3", "override(f)", "override", "", 1,
    ...     INCONSISTENT, point="kink", checked=1, difference=4.0, tolerance=5e-6, rule_value=5.0,
    ...     low=-1.0, high=1.0, input="x[0]", index=[0], input_value=0.0)), 80))
    g#0 (created at x.py:3), override(f): inconsistent at a kink: at x[0] = 0, the
    rules give 5 and the limits of the automatic gradient range over [-1, 1]
    (difference 4, tolerance 5e-06)
    """
    who = f"{row.instance or row.group + ' (all instances)'} (created at {row.where}), {row.rule}"
    if row.scope:
        who += f", {row.scope} (through the function given to ag.verify)"
    if not row.checked:
        return f"{who}: {row.status}: {row.reason}"
    if row.point == "smooth":
        limit = f"the limit of the automatic {_what(row.order)} is {_number(row.low)}"
    else:
        limit = (f"the limits of the automatic {_what(row.order)} range over [{_number(row.low)}, "
                 f"{_number(row.high)}]")
    numbers = (f"at {row.input} = {_number(row.input_value)}, the rules give {_number(row.rule_value)} "
               f"and {limit} (difference {_number(row.difference)}, tolerance {_number(row.tolerance)})")
    if row.origin:
        numbers += f"; {row.origin}"
    if row.status == NOT_CHECKED:
        return f"{who}: not checked: {row.reason}. Near {_POINTS[row.point]}, {numbers}"
    return f"{who}: {row.status} at {_POINTS[row.point]}: {numbers}"


@dataclass
class Report:
    """The rows of one ``ag.verify`` run; ``ok`` is False when a rule is inconsistent.

    >>> report = Report([Row("g", "g#0", "x.py:3", "nan_safe", "nan_safe", "mul", 1, CONSISTENT,
    ...                      point="smooth", checked=2, difference=0.0, tolerance=1e-9)], 1)
    >>> report.ok, report.to_json()["rows"][0]["status"]
    (True, 'consistent')
    """

    rows: list[Row]
    order: int

    @property
    def ok(self) -> bool:
        """Whether no rule is inconsistent (a row that is not checked does not make it False)."""
        return not any(row.status == INCONSISTENT for row in self.rows)

    def counts(self) -> dict[str, int]:
        """How many rows have each status."""
        return {status: sum(row.status == status for row in self.rows)
                for status in (CONSISTENT, INCONSISTENT, NOT_CHECKED)}

    def table(self) -> Table:
        """A row per instance with its rules below it: op, point kind, status, worst difference.
        Every column folds rather than cuts when the terminal is narrow."""
        out = Table(title=f"ag.verify: rules against the limits of the automatic {_what(self.order)}",
                    caption="difference: how far the rule's value lies outside the limits' range")
        out.add_column("instance / rule", overflow="fold")
        out.add_column("op", overflow="fold")
        out.add_column("point", overflow="fold")
        out.add_column("status", overflow="fold")
        out.add_column("difference", justify="right", overflow="fold")
        headed = None
        for k, row in enumerate(self.rows):
            head = (row.group, row.instance)
            if head != headed:
                headed = head
                title = row.instance or f"{row.group} (all instances)"
                out.add_row(Text.assemble((title, "bold"), "  ", (_short(row.where), "dim")), "", "", "",
                            "")
            last = k + 1 == len(self.rows) or (self.rows[k + 1].group, self.rows[k + 1].instance) != head
            rule = f"{row.rule} ({row.scope})" if row.scope else row.rule
            out.add_row(Padding(Text(rule), (0, 0, 0, 2)), escape(row.op or "-"), row.point or "-",
                        f"[{_COLORS[row.status]}]{row.status}[/]", _number(row.difference),
                        end_section=last)
        return out

    def __rich__(self) -> RenderableType:
        counts = self.counts()
        lines = [Text(explain(row)) for row in self.rows if row.status != CONSISTENT]
        summary = Text(", ".join(f"{n} {status}" for status, n in counts.items()))
        if not self.rows:
            return Text("no group with rules ran: nothing to check")
        return Group(self.table(), *lines, summary)

    def __str__(self) -> str:
        buffer = io.StringIO()
        Console(file=buffer, width=80, color_system=None, highlight=False).print(self)
        return buffer.getvalue()

    def to_json(self) -> dict[str, Any]:
        """The report as JSON-ready data: ``order``, ``ok``, ``counts`` and ``rows`` (each row's
        fields, as :class:`Row`; infinite and NaN numbers as the strings ``"inf"``, ``"-inf"``,
        ``"nan"``)."""
        return {"order": self.order, "ok": self.ok, "counts": self.counts(),
                "rows": [{k: _json_number(v) for k, v in dataclasses.asdict(row).items()}
                         for row in self.rows]}


def _short(where: str) -> str:
    return os.path.basename(where)


def _json_number(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value

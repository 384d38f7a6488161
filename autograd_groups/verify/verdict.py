"""What ``ag.verify`` found: one :class:`Row` per (group, rule, instance), and the :class:`Report`
that prints them as a table within 80 columns, explains every row that is not consistent, and
converts to JSON."""

from __future__ import annotations

import dataclasses
import io
import math
import os
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # rich is imported where a report is drawn: it takes longer than the rest of the package
    from rich.console import Console, ConsoleOptions, RenderResult
    from rich.table import Table

CONSISTENT = "consistent"
INCONSISTENT = "inconsistent"
NOT_CHECKED = "not checked"
#: The ``scope`` of a row that checks a decorator group's rule through the whole function given to
#: ``ag.verify``, rather than on the group's own inputs.
END_TO_END = "end to end"
#: The ``reference`` of a row: what the rules' derivative was compared with at the element shown --
#: the limits of the automatic derivative at nearby points, or, where it has no finite limit, the
#: one-sided finite differences of the function's value.
LIMITS = "limits"
DIFFERENCES = "finite differences"
#: ... or, where the point is special only in the narrower dtype its inputs were recorded in (a
#: float32 overflow), the automatic derivative of float64 copies, where it is not special.
FLOAT64 = "float64"
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
    the rule's value lies (``difference``, 0 inside) and how far it may (``tolerance``), and the
    ``reference`` those limits are of: :data:`LIMITS` (of the automatic derivative at nearby points),
    :data:`DIFFERENCES` (of the function's value, where the automatic gradient has no finite limit)
    or :data:`FLOAT64` (the automatic derivative itself, in float64, where the point is special only
    in the dtype its inputs were recorded in; the rules' value is the recorded dtype's there);
    ``differences``: how many of the ``checked`` elements were compared with finite differences.
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
    reference: str = ""
    differences: int = 0
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
    who = f"{row.instance or row.group + ' (all instances)'} (created at {_display(row.where)}), {row.rule}"
    return f"{who}{', ' if row.scope else ': '}{finding(row)}"


def finding(row: Row) -> str:
    r"""What :func:`explain` says of ``row`` after naming it: its status, the reason, the numbers.

    >>> print("\n".join(wrap(finding(Row("g", "g#0", "x.py:3", "nan_safe", "nan_safe", "mul", 1,
    ...     CONSISTENT, point="smooth", checked=3, difference=0.0, tolerance=1e-9, rule_value=2.0,
    ...     low=2.0, high=2.0, input="x[1, 0]", index=[1, 0], input_value=0.0, reference=DIFFERENCES,
    ...     differences=3)), 80)))
    consistent at a smooth point: at x[1, 0] = 0, the rules give 2 and the finite
    differences of the function's value tend to 2 (difference 0, tolerance 1e-09)
    """
    if row.scope:
        return f"{row.scope} (through the function given to ag.verify): {finding(replace(row, scope=''))}"
    if not row.checked:
        return f"{row.status}: {row.reason}"
    if row.reference == FLOAT64:
        limit = (f"the automatic {_what(row.order)} of float64 copies, where the point is not special, "
                 f"is {_number(row.low)}")
    elif row.reference == DIFFERENCES:
        what = "the finite differences of the function's value"
        limit = (f"{what} tend to {_number(row.low)}" if row.point == "smooth" else
                 f"{what} range over [{_number(row.low)}, {_number(row.high)}]")
    elif row.point == "smooth":
        limit = f"the limit of the automatic {_what(row.order)} is {_number(row.low)}"
    else:
        limit = (f"the limits of the automatic {_what(row.order)} range over [{_number(row.low)}, "
                 f"{_number(row.high)}]")
    numbers = (f"at {row.input} = {_number(row.input_value)}, the rules give {_number(row.rule_value)} "
               f"and {limit} (difference {_number(row.difference)}, tolerance {_number(row.tolerance)})")
    if row.origin:
        numbers += f"; {row.origin}"
    if row.status == NOT_CHECKED:
        return f"not checked: {row.reason}. Near {_POINTS[row.point]}, {numbers}"
    if row.reason:
        return f"{row.status} at {_POINTS[row.point]}: {numbers}; {row.reason}"
    return f"{row.status} at {_POINTS[row.point]}: {numbers}"


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

    def notes(self) -> list[str]:
        """Each finding that a row which is not consistent, or has a reason, states, once, in the
        order of the rows; row ``k`` refers to ``notes()[self.note(k)]``."""
        return list(dict.fromkeys(finding(row) for row in self.rows if _noted(row)))

    def table(self, width: int = 80) -> Table:
        """A row per instance with its rules below it: op, point kind, status (with the number of
        its note, see :meth:`notes`), worst difference, for a terminal ``width`` columns wide.
        Every column folds rather than cuts when the terminal is narrow."""
        from rich.markup import escape
        from rich.padding import Padding
        from rich.table import Table
        from rich.text import Text

        out = Table(title=f"ag.verify: rules against the limits of the automatic {_what(self.order)}",
                    caption="difference: how far the rule's value lies outside the limits' range")
        # Wide enough for every location (which then wraps whole onto its own line), as far as the
        # other columns' narrowest (48 columns with the borders) leave room.
        out.add_column("instance / rule", overflow="fold",
                       min_width=max(1, min(width - 48, max((len(_display(row.where)) for row in self.rows),
                                                            default=1))))
        out.add_column("op", overflow="fold", max_width=12)
        out.add_column("point", overflow="fold")
        out.add_column("status", overflow="fold")
        out.add_column("difference", justify="right", overflow="fold")
        numbers = {note: k + 1 for k, note in enumerate(self.notes())}
        headed = None
        for k, row in enumerate(self.rows):
            head = (row.group, row.instance)
            if head != headed:
                headed = head
                title = row.instance or f"{row.group} (all instances)"
                out.add_row(Text.assemble((title, "bold"), "  ", (_display(row.where), "dim")), "", "",
                            "", "")
            last = k + 1 == len(self.rows) or (self.rows[k + 1].group, self.rows[k + 1].instance) != head
            rule = f"{row.rule} ({row.scope})" if row.scope else row.rule
            note = f" [{numbers[finding(row)]}]" if _noted(row) else ""
            out.add_row(Padding(Text(rule), (0, 0, 0, 2)), escape(row.op or "-"), row.point or "-",
                        f"[{_COLORS[row.status]}]{row.status}[/]{escape(note)}", _number(row.difference),
                        end_section=last)
        return out

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        from rich.text import Text

        if not self.rows:
            yield Text("no group with rules ran: nothing to check")
            return
        yield self.table(options.max_width)
        for k, note in enumerate(self.notes()):
            # Wrapped here rather than by rich, which breaks at any space: an index (x1[4, 10]) or a
            # range ([-1, 1]) stays on one line.
            yield Text("\n".join(wrap(f"[{k + 1}] {note}", options.max_width, indent=len(str(k + 1)) + 3)),
                       overflow="fold")
        yield Text(", ".join(f"{n} {status}" for status, n in self.counts().items()))

    def __str__(self) -> str:
        from rich.console import Console

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


def _noted(row: Row) -> bool:
    return row.status != CONSISTENT or bool(row.reason)


def _display(where: str) -> str:
    """``where`` (``path:line``) with the path relative to the working directory, where it is under
    it."""
    path, colon, line = where.rpartition(":")
    if not colon or not line.isdigit():
        path, line = where, ""
    if os.path.isabs(path):
        try:
            relative = os.path.relpath(path)
        except ValueError:  # another drive, on Windows
            relative = path
        if not relative.startswith(os.pardir):
            path = relative
    return f"{path}:{line}" if line else path


def wrap(text: str, width: int, indent: int = 0) -> list[str]:
    """``text`` in lines of at most ``width`` characters, broken at spaces outside brackets only,
    each line after the first indented by ``indent`` spaces (a word longer than a line is left
    whole, for the caller to fold).

    >>> wrap("at x1[4, 10] = 4, the limits range over [-10.6, -9.5]", 24, indent=2)
    ['at x1[4, 10] = 4, the', '  limits range over', '  [-10.6, -9.5]']
    """
    words, depth, current = [], 0, ""
    for char in text:
        depth += (char == "[") - (char == "]" and depth > 0)
        if char == " " and depth == 0:
            if current:
                words.append(current)
            current = ""
        else:
            current += char
    if current:
        words.append(current)
    lines: list[str] = []
    line = ""
    for word in words:
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = " " * indent + word
        else:
            line = f"{line} {word}" if line else word
    return [*lines, line] if line else lines


def _json_number(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value

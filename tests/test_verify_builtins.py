"""``ag.verify`` on every built-in at its special points (the cases of ``tests/ops_cases.py``, and a
fully masked ``ops.logsumexp`` row), at orders 1 and 2: each rule that fired has a status that the
table of docs/builtins.md ("Checked against the math") lists, with the reason, and each status that
table lists occurs."""

from __future__ import annotations

import functools
import math
import re
from pathlib import Path

import pytest
import torch
from ops_cases import CASES, inputs

import autograd_groups as ag
from autograd_groups import ops

ROOT = Path(__file__).resolve().parents[1]
_CELL = re.compile(r"(?<!\\)\|")


def documented() -> dict[tuple[str, str], tuple[set[str], set[str]]]:
    """(op, rule label) -> the statuses docs/builtins.md allows at order 1 and at order 2."""
    text = (ROOT / "docs" / "builtins.md").read_text()
    section = text.split("## Checked against the math")[1].split("\n## ")[0]
    found = {}
    for line in section.splitlines():
        cells = [c.strip().replace("\\|", "|") for c in _CELL.split(line.strip())[1:-1]]
        if len(cells) != 5 or not cells[1].startswith("`"):
            continue
        first, second = ({s.strip() for s in cell.split(" or ")} for cell in cells[2:4])
        for op in re.findall(r"`(ops\.\w+)`", cells[0]):
            found[(op, cells[1].strip("`"))] = (first, second)
    return found


def _runs():
    for case in CASES:
        yield case.id, functools.partial(case.ours, **case.kwargs), inputs(case, torch.float64)
    masked = torch.tensor([[0.0, 1.0, -2.0], [-math.inf, -math.inf, -math.inf]], dtype=torch.float64)
    yield "logsumexp-masked-row", lambda x: ops.logsumexp(x, 1), (masked,)


@pytest.mark.parametrize("order", [1, 2])
def test_every_builtin_at_its_special_points_has_the_documented_status(order: int) -> None:
    table = documented()
    seen: set[tuple[str, str, str]] = set()
    wrong = []
    for case, fn, args in _runs():
        for row in ag.verify(fn, *args, order=order).rows:
            if not row.instance:  # a rule that did not fire, in this case's group
                continue
            allowed = table.get((row.group, row.rule), (set(), set()))[order - 1]
            seen.add((row.group, row.rule, row.status))
            if row.status not in allowed:
                wrong.append(f"{case}: {row.group} {row.rule}: {row.status} ({row.reason}), "
                             f"docs/builtins.md allows {sorted(allowed)}")
    assert not wrong, "\n".join(wrong)
    listed = {(op, rule, status) for (op, rule), statuses in table.items() for status in statuses[order - 1]}
    assert sorted(listed - seen) == [], "docs/builtins.md lists statuses no case has"

"""The doctor's report: one object for the command line, the JSON file and the in-process form."""

from __future__ import annotations

import os
import shutil
import textwrap
from dataclasses import dataclass, field
from typing import Any

from .classify import CLASSES
from .locate import Born


@dataclass
class Proposal:
    """A fix, smallest first: ``kind`` is "native", "builtin", "rule", "rewrite" or "advice";
    ``diff`` a unified diff of the user's file (empty where there is none); ``checked`` whether
    applying it and replaying the step gave finite gradients equal to the original wherever those
    were finite (and, for a rule, ``ag.verify`` consistent); ``check`` says what was checked, or
    why it was not."""

    kind: str
    summary: str
    diff: str = ""
    checked: bool = False
    check: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "summary": self.summary, "diff": self.diff, "checked": self.checked,
                "check": self.check}


@dataclass
class Appears:
    """Where a NaN first shows in the backward, when that is another node than the birth: the node
    PyTorch's anomaly mode names."""

    node: str
    file: str | None
    line: int | None

    def to_json(self) -> dict[str, Any]:
        return {"node": self.node, "file": self.file, "line": self.line}


@dataclass
class Diagnosis:
    """What ``autograd-groups doctor`` found.

    ``status`` is "clean" (every watched backward had a finite loss and finite leaf gradients) or
    "found"; ``backward_calls`` how many backward passes were watched; ``cls`` the class "A" to "G"
    (``class`` in JSON), ``born`` where the non-finite value was born, ``appears`` where a NaN first
    shows if that is another node, ``proposals`` the fixes, smallest first. ``step`` is the number
    of the backward pass that went bad, ``notes`` what the reader should know about how it was found.

    >>> Diagnosis("clean", 3).to_json()["status"]
    'clean'
    """

    status: str
    backward_calls: int
    cls: str | None = None
    born: Born | None = None
    appears: Appears | None = None
    proposals: list[Proposal] = field(default_factory=list)
    step: int | None = None
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """The report as the JSON that ``--json`` writes (these keys are fixed)."""
        return {"status": self.status, "backward_calls": self.backward_calls, "class": self.cls,
                "born": None if self.born is None else self.born.to_json(),
                "appears": None if self.appears is None else self.appears.to_json(),
                "proposals": [p.to_json() for p in self.proposals], "step": self.step,
                "notes": self.notes}

    def __str__(self) -> str:
        return "\n".join(self.lines(shutil.get_terminal_size().columns))

    def lines(self, width: int = 80) -> list[str]:
        """The report as the command prints it, its prose wrapped at ``width`` columns (the lines of
        code and of a diff are kept whole, as they must be copied)."""
        return [wrapped for line in self._lines()
                for wrapped in ([line[len(_CODE):]] if line.startswith(_CODE) else _wrap(line, width))]

    def _lines(self) -> list[str]:
        if self.status == "clean":
            return [f"clean: {self.backward_calls} backward pass(es) watched, every loss and leaf "
                    "gradient finite", *(f"note: {n}" for n in self.notes)]
        out = [f"backward pass {self.step}: non-finite loss or leaf gradients"]
        meaning, todo = CLASSES[self.cls or "G"]
        out.append(f"class {self.cls}: {meaning}")
        born = self.born
        if born is not None:
            order = " (second order: in the backward of the first-order op)" if born.order > 1 else ""
            out.append(f"born in the {born.phase} at {born.node or born.op} ({born.op}){order}, "
                       f"{_where(born.file, born.line)} in {born.function}")
            source = _source(born.file, born.line)
            if source:
                out.append(f"{_CODE}    {source}")
            if born.indices and not any(born.indices):  # a 0-d tensor: its one element has no index
                out.append("  its one element non-finite")
            else:
                shown = " ".join("[" + ",".join(map(str, i)) + "]" for i in born.indices)
                out.append(f"  {born.elements} of {born.total} elements non-finite: {shown}")
            if born.values:
                values = "; ".join(f"{k} = {v}" for k, v in born.values.items())
                out.append(f"  values there: {values}")
            if born.incoming is not None:
                out.append(f"  gradient arriving there: {born.incoming}")
        if self.appears is not None:
            out.append(f"  a NaN first shows at {self.appears.node}, "
                       f"{_where(self.appears.file, self.appears.line)}: the node anomaly mode names")
        out.append(f"what to do: {todo}")
        for i, p in enumerate(self.proposals, 1):
            mark = "checked" if p.checked else "not checked"
            out.append(f"fix {i} ({p.kind}): {p.summary}")
            out.extend(f"{_CODE}    {line}" for line in p.diff.splitlines())
            if p.kind != "advice":
                out.append(f"    {mark}: {p.check}")
        out.extend(f"note: {n}" for n in self.notes)
        return out


#: Marks a line of code or diff among the report's lines: printed whole, never wrapped.
_CODE = "\0"


def _wrap(line: str, width: int) -> list[str]:
    indent = " " * (len(line) - len(line.lstrip()) + 2)
    return textwrap.wrap(line, max(width, 40), subsequent_indent=indent, break_long_words=False,
                         break_on_hyphens=False) or [line]


def _where(file: str | None, line: int | None) -> str:
    if file is None:
        return "(no line of yours)"
    return f"{shown_path(file)}:{line}"


def shown_path(path: str) -> str:
    """``path`` relative to the working directory where it lies under it."""
    here = os.getcwd() + os.sep
    return path[len(here):] if path.startswith(here) else path


def _source(file: str | None, line: int | None) -> str:
    if file is None or line is None or not os.path.isfile(file):
        return ""
    with open(file) as f:
        lines = f.read().splitlines()
    return lines[line - 1].strip() if 0 < line <= len(lines) else ""

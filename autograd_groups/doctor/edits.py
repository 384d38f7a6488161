"""Changes to the user's file, made on its syntax tree and shown as a unified diff: a native op in
place of an expression, a group decorator on a function, a ``with`` block around a statement, and
the lines that import the library and register a rule."""

from __future__ import annotations

import ast
import difflib
import os
from dataclasses import dataclass

import torch

#: The name the changes give the library where the file does not import it already.
ALIAS = "ag"
#: The mark a name of the tree carries where the file binds it by an import (a module, as a rule).
_IMPORTED = "_imported"


@dataclass
class Source:
    """A user's file: its path, lines and syntax tree."""

    path: str
    lines: list[str]
    tree: ast.Module

    def __post_init__(self) -> None:
        # The recognisers of native ops read a call on an imported name (``F.softmax(z)``) as a
        # function's, not a tensor method's.
        imported = {a.asname or a.name.split(".")[0] for n in ast.walk(self.tree)
                    if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names}
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Name) and node.id in imported:
                setattr(node, _IMPORTED, True)

    @classmethod
    def read(cls, path: str) -> Source | None:
        """The file, or None where it cannot be read or parsed."""
        try:
            with open(path) as f:
                text = f.read()
            return cls(path, text.splitlines(keepends=True), ast.parse(text))
        except (OSError, SyntaxError, ValueError):
            return None

    @property
    def text(self) -> str:
        return "".join(self.lines)

    def names(self) -> set[str]:
        """Every name the file binds or reads."""
        names: set[str] = set()
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Name):
                names.add(node.id)
            elif isinstance(node, ast.arg):
                names.add(node.arg)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.alias):
                names.add(node.asname or node.name.split(".")[0])
        return names

    def alias(self, module: str = "autograd_groups") -> str | None:
        """The name the file imports ``module`` as at its top level, if it does."""
        for node in self.tree.body:
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.name == module:
                        return a.asname or a.name
        return None

    def innermost_function(self, line: int) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
        """The innermost function whose body holds ``line``."""
        holding = [n for n in ast.walk(self.tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                   and n.body[0].lineno <= line <= (n.end_lineno or n.lineno)]
        return max(holding, key=lambda n: n.lineno, default=None)

    def lambda_on(self, line: int) -> ast.Lambda | None:
        """The innermost lambda written on ``line`` alone."""
        lambdas = [n for n in ast.walk(self.tree) if isinstance(n, ast.Lambda) and n.lineno == line
                   and n.end_lineno == line]
        return max(lambdas, key=lambda n: n.col_offset, default=None)

    def top_statement(self, line: int) -> ast.stmt | None:
        """The module-level statement that holds ``line``."""
        return next((s for s in self.tree.body if s.lineno <= line <= (s.end_lineno or s.lineno)), None)

    def simple_statement(self, line: int) -> ast.stmt | None:
        """The innermost statement holding ``line`` that holds no block of its own (an assignment,
        an expression, a return)."""
        found = [n for n in ast.walk(self.tree) if isinstance(n, ast.stmt) and not hasattr(n, "body")
                 and n.lineno <= line <= (n.end_lineno or n.lineno)]
        return max(found, key=lambda n: n.lineno, default=None)

    def value_of(self, name: ast.expr, line: int) -> ast.expr | None:
        """What the variable ``name`` holds on ``line``: the value of its one assignment earlier in
        the same function (or at module level), where nothing that value reads is assigned by it
        or again, or changed in place, before ``line``, and where computing it again on ``line``
        gives the same (:func:`repeatable`); None for anything else."""
        if not isinstance(name, ast.Name):
            return None
        scope: ast.AST = self.innermost_function(line) or self.tree
        kinds = (ast.Assign, ast.AugAssign, ast.AnnAssign)
        assigned = [n for n in ast.walk(scope) if isinstance(n, kinds) and (n.end_lineno or n.lineno) < line]
        targets = {id(n): {t.id for t in ast.walk(n) if isinstance(t, ast.Name)
                           and isinstance(t.ctx, ast.Store)} for n in assigned}
        setting = [n for n in assigned if name.id in targets[id(n)]]
        if len(setting) != 1 or not isinstance(setting[0], ast.Assign) or len(setting[0].targets) != 1 \
                or not isinstance(setting[0].targets[0], ast.Name):
            return None
        value = setting[0].value
        read = {n.id for n in ast.walk(value) if isinstance(n, ast.Name)}
        # ``v = (v ** 2).sum()`` reads what it replaces: its value's ``v`` is gone on ``line``.
        later = [n for n in assigned if n.lineno >= setting[0].lineno and read & targets[id(n)]]
        # ``v[0] = 4.0`` or ``v.clamp_(1e-6)`` between the two changes what ``v`` holds.
        between = [n for n in ast.walk(scope) if isinstance(n, (ast.stmt, ast.expr))
                   and setting[0].lineno < n.lineno < line]
        # ``z.div_(4.0)`` after ``p = softmax(z)`` changes the ``z`` a fix on ``line`` would read.
        changed = any(_changes(n, v) for n in between for v in read | {name.id})
        return None if later or changed or not repeatable(value) else value

    def calls_on(self, line: int, within: tuple[int, int] | None = None) -> list[ast.Call | ast.BinOp]:
        r"""The calls and binary operations (``x / y``) that start and end on ``line``, outermost
        first; with ``within`` (the columns of the call that made a value), those that hold it,
        innermost first, where any does: of two logs on a line, the one that made the value; of
        ``x / n / tau``, the division that made it before the one around it.

        >>> source = Source("f.py", ["y = torch.log(p) + torch.log(1 - p)\n"],
        ...                 ast.parse("y = torch.log(p) + torch.log(1 - p)"))
        >>> [source.segment(c) for c in source.calls_on(1, within=(19, 35))]
        ['torch.log(1 - p)', 'torch.log(p) + torch.log(1 - p)']
        """
        calls = [n for n in ast.walk(self.tree) if isinstance(n, (ast.Call, ast.BinOp)) and n.lineno == line
                 and n.end_lineno == line]
        outermost = sorted(calls, key=lambda c: (c.col_offset, -(c.end_col_offset or 0)))
        if within is None:
            return outermost
        start, end = within
        holding = [c for c in calls if c.col_offset <= start and end <= (c.end_col_offset or 0)]
        return sorted(holding, key=lambda c: (c.end_col_offset or 0) - c.col_offset) or outermost

    def segment(self, node: ast.AST) -> str:
        return ast.get_source_segment(self.text, node) or ""


class Edit:
    """A changed copy of a :class:`Source`, line by line."""

    def __init__(self, source: Source) -> None:
        self.source = source
        self.lines: list[str] = list(source.lines)
        self._inserted: list[tuple[int, int]] = []  # (original line, lines inserted before it)

    def _at(self, line: int) -> int:
        """The index in the changed lines of the original 1-based ``line``."""
        return line - 1 + sum(n for at, n in self._inserted if at <= line)

    def insert(self, before: int, new: list[str]) -> None:
        """Insert ``new`` lines before the original line ``before`` (past the end: append)."""
        index = self._at(before) if before <= len(self.source.lines) else len(self.lines)
        if index == len(self.lines) and self.lines and not self.lines[-1].endswith("\n"):
            self.lines[-1] += "\n"  # a file that ends without a newline: not joined to the new line
        self.lines[index:index] = [n if n.endswith("\n") else n + "\n" for n in new]
        self._inserted.append((before, len(new)))

    def replace(self, node: ast.expr, text: str) -> None:
        """Replace the expression ``node`` (on one line) with ``text``."""
        index = self._at(node.lineno)
        line = self.lines[index]
        raw = line.encode()
        start, end = node.col_offset, node.end_col_offset or node.col_offset
        self.lines[index] = (raw[:start].decode() + text + raw[end:].decode())

    def indent(self, first: int, last: int, by: str = "    ") -> None:
        for line in range(first, last + 1):
            index = self._at(line)
            self.lines[index] = by + self.lines[index] if self.lines[index].strip() else self.lines[index]

    def import_library(self) -> str:
        """Import ``autograd_groups`` where the file does not; the name to call it by."""
        name = self.source.alias()
        if name is not None:
            return name
        if ALIAS in self.source.names():
            # The file has an ``ag`` of its own: the library goes by its full name.
            self._import("import autograd_groups")
            return "autograd_groups"
        self._import(f"import autograd_groups as {ALIAS}")
        return ALIAS

    def import_torch(self) -> None:
        """Import ``torch`` where the file does not (a module of helpers that only takes tensors),
        for a change that calls it by that name."""
        if self.source.alias("torch") != "torch" and "torch" not in self.source.names():
            self._import("import torch")

    def _import(self, statement: str) -> None:
        # After the docstring and the imports the file starts with: an import further down may
        # come after the code that a change makes call the library.
        after = 0
        for i, node in enumerate(self.source.tree.body):
            docstring = i == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) \
                and isinstance(node.value.value, str)
            if not (docstring or isinstance(node, (ast.Import, ast.ImportFrom))):
                break
            after = node.end_lineno or node.lineno
        self.insert(after + 1, [statement])

    @property
    def text(self) -> str:
        return "".join(self.lines)

    def diff(self) -> str:
        """The change as a unified diff: a file under the working directory named from there as git
        names it (``a/train.py``, ``b/train.py``: ``git apply`` or ``patch -p1``), any other by its
        full path (``patch -p0``)."""
        path = os.path.relpath(self.source.path) if os.path.isabs(self.source.path) else self.source.path
        old, new = f"a/{path}", f"b/{path}"
        if path.startswith(".."):
            old = new = os.path.abspath(self.source.path)
        lines = difflib.unified_diff(self.source.lines, self.lines, fromfile=old, tofile=new)
        # A last line without a newline is marked, as diff does, or patch and git apply refuse it.
        return "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n"
                       for line in lines)


def _changes(node: ast.AST, name: str) -> bool:
    """Whether ``node`` changes what the variable ``name`` holds without assigning it: an item or
    an attribute set on it (``v[0] = 4.0``), or an in-place method or function (``v.clamp_(1e-6)``,
    ``torch.nn.init.zeros_(v)``)."""
    if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        return any(isinstance(t, (ast.Subscript, ast.Attribute)) and _root(t) == name for t in targets)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        attr = node.func.attr
        if not attr.endswith("_") or attr.endswith("__"):
            return False
        changed = node.args[0] if is_module(node.func.value) and node.args else node.func.value
        return _root(changed) == name
    return False


#: Builtins a value may call and still be computed again to the same effect.
_PURE_BUILTINS = frozenset({"float", "int", "abs", "len", "min", "max", "range", "tuple", "list"})
#: torch's functions and tensor methods that draw random numbers (besides ``rand*`` and the
#: dropouts): computed twice, they differ.
_RANDOM = frozenset({"bernoulli", "multinomial", "normal", "poisson", "gumbel_softmax", "rrelu"})
#: Where a function called on a module is torch's own.
_TORCH_NAMESPACES = (torch, torch.nn.functional, torch.linalg, torch.special, torch.fft)


def repeatable(value: ast.expr) -> bool:
    r"""Whether computing ``value`` a second time gives the same and changes nothing, as a fix that
    writes it again on another line does: its only calls are torch's functions and tensor methods
    (none random, none in place) and a few builtins, not a model (``model(x)``: a batch norm's
    statistics, a dropout mask) nor anything reached through ``self``.

    >>> source = Source("f.py", [], ast.parse("a = torch.exp(z.sum(-1)) * float('inf')\nb = self.net(x) + z"))
    >>> [repeatable(statement.value) for statement in source.tree.body]
    [True, False]
    """
    for node in ast.walk(value):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if isinstance(f, ast.Name):
            if f.id not in _PURE_BUILTINS:
                return False
            continue
        if not isinstance(f, ast.Attribute) or f.attr.endswith("_") or f.attr.startswith("rand") \
                or "dropout" in f.attr or f.attr in _RANDOM or _root(f.value) == "self":
            return False
        known = any(hasattr(space, f.attr) for space in _TORCH_NAMESPACES) if is_module(f.value) \
            else hasattr(torch.Tensor, f.attr)
        if not known:
            return False
    return True


def _root(node: ast.expr) -> str | None:
    """The variable at the root of ``v[0].x``: ``v``."""
    while isinstance(node, (ast.Subscript, ast.Attribute)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def is_module(node: ast.expr) -> bool:
    """Whether ``node`` is a module, or one of its namespaces: ``torch``, ``torch.linalg``, or a
    name the file imports (``F`` of ``import torch.nn.functional as F``). A call on one is a
    function's (its first argument the operand), not a tensor method's."""
    while isinstance(node, ast.Attribute):
        node = node.value
    return isinstance(node, ast.Name) and (node.id == "torch" or getattr(node, _IMPORTED, False))


def indentation(source: Source, line: int) -> str:
    text = source.lines[line - 1]
    return text[:len(text) - len(text.lstrip())]

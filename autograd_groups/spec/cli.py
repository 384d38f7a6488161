"""``autograd-groups check SPEC...`` and ``autograd-groups list [--spec FILE]``."""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table
from rich.text import Text

from ..rules.kinds import NanSafe, Override, Rule, Subgradient
from ..rules.registry import list_rules
from .loader import check, origin
from .schema import GroupEntry


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``check`` and ``list`` to the ``autograd-groups`` command."""
    check_parser = subparsers.add_parser(
        "check", help="validate spec files",
        description="Validate spec files as load_spec would, without running any of their code: the "
                    "modules that override rules name are only looked for (--imports imports them). "
                    "Exit 0: valid; 1: invalid, every error printed as file:line:col: message; "
                    "2: usage error such as a missing file.")
    check_parser.add_argument("specs", nargs="+", metavar="SPEC", help="spec files, checked together")
    _imports_flag(check_parser)
    check_parser.set_defaults(run=run_check)
    list_parser = subparsers.add_parser(
        "list", help="show groups, their rules and docs",
        description="Show the registered groups (the built-in library) or, with --spec, the groups of "
                    "spec files, with their rules and docs.")
    list_parser.add_argument("--spec", action="append", default=[], metavar="FILE",
                             help="list the groups of this spec file instead (repeatable)")
    _imports_flag(list_parser)
    list_parser.set_defaults(run=run_list)


def _imports_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--imports", action="store_true",
                        help="import the modules that override rules name (this runs their code), with "
                             "each spec's folder first on sys.path, and check that their functions exist")


def _missing(paths: list[str], command: str) -> int:
    for path in paths:
        if not Path(path).is_file():
            print(f"autograd-groups {command}: error: no such file: {path}", file=sys.stderr)
            return 2
    return 0


def _validate(paths: list[str], command: str, imports: bool,
              ) -> tuple[int, list[tuple[str, tuple[GroupEntry, ...]]]]:
    code = _missing(paths, command)
    if code:
        return code, []
    checked = check([Path(p) for p in paths], imports="run" if imports else "find")
    for file, line, col, message in checked.errors:
        print(f"{file}:{line}:{col}: {message}")
    if checked.errors:
        print(f"{len(checked.errors)} error(s) in {len(paths)} spec file(s)", file=sys.stderr)
        return 1, []
    return 0, list(checked.files)


def run_check(args: argparse.Namespace) -> int:
    """Validate ``args.specs``; print errors as ``file:line:col: message``; return the exit code."""
    code, files = _validate(args.specs, "check", args.imports)
    for file, entries in files:
        rules = sum(len(e.rules) for e in entries)
        print(f"{file}: ok ({len(entries)} group(s), {rules} rule(s))")
    return code


def run_list(args: argparse.Namespace) -> int:
    """Print a table of groups and rules: of ``args.spec`` files, else of the registry."""
    rows: list[tuple[str, str, tuple[Rule, ...]]] = []
    if args.spec:
        code, files = _validate(args.spec, "list", args.imports)
        if code:
            return code
        rows = [(e.signature, e.doc, tuple(r for r, _ in e.rules)) for _, entries in files for e in entries]
    else:
        importlib.import_module("autograd_groups.ops")
        for name, rules in sorted(list_rules().items()):
            group = next((g for g in map(origin, rules) if g is not None), None)
            rows.append((group.signature if group else name, group.doc if group else "", rules))
    Console().print(_table(rows))
    return 0


def _table(rows: list[tuple[str, str, tuple[Rule, ...]]]) -> Table:
    table = Table(title="autograd groups", show_lines=True)
    for column in ("group", "rule", "details", "doc"):
        table.add_column(column, overflow="fold")
    for signature, doc, rules in rows:
        group = Text.assemble((signature, "bold"), ("\n" + doc if doc else "", "dim"))
        for i, rule in enumerate(rules):
            table.add_row(group if i == 0 else Text(), Text(rule.kind), Text(_details(rule)), Text(rule.doc))
    return table


def _details(rule: Rule) -> str:
    if isinstance(rule, Subgradient):
        target = "" if rule.input is None else f", input {rule.input}"
        return f"op {rule.op}{target}: where {rule.when}, grad = {rule.grad}"
    if isinstance(rule, Override):
        return f"check {_name(rule.check)}, backward {_name(rule.backward_fn)}"
    assert isinstance(rule, NanSafe)
    return "zero incoming gradient passes on zero"


def _name(fn: object) -> str:
    return f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', fn)}"

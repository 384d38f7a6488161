"""``autograd-groups check SPEC...`` and ``autograd-groups list [--spec FILE]``."""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console, Group
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from ..errors import internal_error
from ..rules.kinds import NanSafe, Override, Rule, Subgradient
from ..rules.registry import list_rules
from ..spec.group import SpecGroup
from ..spec.loader import check, origin


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
    list_parser.add_argument("--json", action="store_true",
                             help="print the same content as JSON (keys: documentation, 'Command line')")
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
              ) -> tuple[int, list[tuple[str, tuple[SpecGroup, ...]]]]:
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
        if not entries:
            print(f"{file}: warning: the spec defines no group (is the file empty?), so it registers "
                  f"no rule", file=sys.stderr)
    return code


@dataclass(frozen=True)
class Listed:
    """One group as ``list`` shows it."""

    name: str
    signature: str
    doc: str
    rules: tuple[Rule, ...]


def run_list(args: argparse.Namespace) -> int:
    """Print the groups and their rules, of ``args.spec`` files, else of the registry: as text that
    wraps at word boundaries to any width, or with ``args.json`` as JSON."""
    listed: list[Listed] = []
    if args.spec:
        code, files = _validate(args.spec, "list", args.imports)
        if code:
            return code
        listed = [Listed(e.name, e.signature, e.doc, e.rules)
                  for _, entries in files for e in entries]
    else:
        importlib.import_module("autograd_groups.ops")
        for name, rules in sorted(list_rules().items()):
            group = next((g for g in map(origin, rules) if g is not None), None)
            listed.append(Listed(name, group.signature if group else name, group.doc if group else "", rules))
    if args.json:
        print(json.dumps(to_json(listed), indent=2))
    else:
        Console().print(_blocks(listed))
    return 0


def to_json(listed: list[Listed]) -> dict[str, object]:
    """``list --json``: ``{"groups": [{"name", "signature", "doc", "rules": [{"kind", "label",
    "details", "doc"}]}]}``, the groups in the order ``list`` prints them."""
    return {"groups": [{"name": g.name, "signature": g.signature, "doc": g.doc,
                        "rules": [{"kind": r.kind, "label": r.label, "details": _details(r), "doc": r.doc}
                                  for r in g.rules]}
                       for g in listed]}


def _blocks(listed: list[Listed]) -> Group:
    # One block per group, not a table: a table's four columns at 80 terminal columns cut signatures
    # and names mid-word; blocks wrap only at spaces.
    parts: list[Text | Padding] = []
    kind_width = max((len(r.kind) for g in listed for r in g.rules), default=0)
    for group in listed:
        parts.append(Text(group.signature, style="bold"))
        if group.doc:
            parts.append(Padding(Text(group.doc, style="dim"), (0, 0, 0, 2), expand=False))
        rules = Table.grid(padding=(0, 2))
        rules.add_column(no_wrap=True, min_width=kind_width)
        rules.add_column()
        for rule in group.rules:
            rules.add_row(Text(rule.kind, style="cyan"),
                          Text.assemble(_details(rule), ("\n" + rule.doc if rule.doc else "", "dim")))
        parts += [Padding(rules, (0, 0, 0, 2), expand=False), Text()]
    return Group(*parts)


def _details(rule: Rule) -> str:
    if isinstance(rule, Subgradient):
        target = "" if rule.input is None else f", input {rule.input}"
        return f"op {rule.op}{target}: where {rule.when}, grad = {rule.grad}"
    if isinstance(rule, Override):
        return f"check {_name(rule.check)}, backward {_name(rule.backward_fn)}"
    if not isinstance(rule, NanSafe):
        raise internal_error(f"a rule of a kind the listing does not know: {rule!r}")
    return "zero incoming gradient passes on zero"


def _name(fn: object) -> str:
    return f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', fn)}"

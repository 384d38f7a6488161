"""``autograd-groups viz`` and ``autograd-groups stats``: run a script under a trace session, then
draw what it traced or report its rule hits.

Exit codes: 0 done; 1 the script failed (its traceback is shown, no file is written) or the
drawing could not be made (e.g. neither pygraphviz nor Graphviz's ``dot`` for a picture: the
``.dot`` is written instead);
2 usage errors, a missing script included. A script that calls ``sys.exit(n)`` exits with ``n``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from typing import Any

from rich.console import Console

from ..errors import GroupError
from .export import DEFAULT_MAX_NODES

VIZ_USAGE = "autograd-groups viz SCRIPT.py [--out FILE] [--group NAME] [--max-nodes N] [-- ARGS]"
STATS_USAGE = "autograd-groups stats SCRIPT.py [--json] [-- ARGS]"


def _script_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("script", metavar="SCRIPT.py")
    # nargs="+" made optional, not "*": argparse would match an empty "*" right after SCRIPT.py and
    # then reject what follows "--"; "+" waits for the arguments after "--" (or none at all).
    rest = parser.add_argument("args", nargs="+", default=[], metavar="ARGS",
                               help="arguments for the script, after --")
    rest.required = False


def register(subparsers: Any) -> None:
    """Add the ``viz`` and ``stats`` subcommands to ``subparsers`` (from ``add_subparsers``).

    >>> import argparse
    >>> parser = argparse.ArgumentParser(prog="autograd-groups")
    >>> register(parser.add_subparsers(dest="command"))
    >>> args = parser.parse_args(["viz", "train.py", "--out", "g.svg", "--", "--epochs", "2"])
    >>> args.out, args.args
    ('g.svg', ['--epochs', '2'])
    """
    viz = subparsers.add_parser(
        "viz", usage=VIZ_USAGE, help="run a script under a trace session and draw its groups",
        description="Run SCRIPT.py as `python SCRIPT.py ARGS` would, under a trace session, and draw "
                    "the autograd graph of every traced group instance: one cluster per group, "
                    "repeated instances folded into one cluster ×N, rule sites marked with their "
                    "hit counts. Without --out, print a tree.")
    _script_arguments(viz)
    viz.add_argument("--out", metavar="FILE",
                     help="write FILE instead of printing a tree: .dot, .mmd (Mermaid), .json (the "
                          "trace), or a picture .svg, .png, .pdf, .html (drawn with pygraphviz, "
                          "pip install 'autograd-groups[viz]', or Graphviz's dot)")
    viz.add_argument("--group", metavar="NAME",
                     help="draw only group NAME's instances and the groups nested in them")
    viz.add_argument("--max-nodes", metavar="N", type=int, default=DEFAULT_MAX_NODES,
                     help="collapse the biggest clusters into one box each until at most N vertices "
                          f"remain (default {DEFAULT_MAX_NODES})")
    viz.set_defaults(run=run_viz)
    stats = subparsers.add_parser(
        "stats", usage=STATS_USAGE, help="run a script and report rule hits per group",
        description="Run SCRIPT.py under a trace session and report, per group, its instances, "
                    "backward passes and rule hits, and which groups never hit a special point "
                    "(their special cases can be turned off).")
    _script_arguments(stats)
    stats.add_argument("--json", action="store_true",
                       help="print the report as JSON (keys: docs/cli.md); the script's own output "
                            "goes to stderr")
    stats.set_defaults(run=run_stats)


def _check_script(command: str, path: str) -> bool:
    if os.path.isfile(path):
        return True
    print(f"autograd-groups {command}: error: no such script: {path}", file=sys.stderr)
    return False


def _say(message: str) -> None:
    print(message, file=sys.stderr)


def run_viz(args: argparse.Namespace) -> int:
    """The ``viz`` command; returns its exit code."""
    import autograd_groups as ag

    from . import export, render, tree

    if args.max_nodes < 1:
        _say("autograd-groups viz: error: --max-nodes must be at least 1")
        return 2
    out = args.out
    if out is not None:
        try:
            suffix = export.suffix_of(out)
        except GroupError as e:
            _say(f"autograd-groups viz: error: {e}")
            return 2
        if suffix in render.FORMATS and render.renderer() is None:
            out = os.path.splitext(out)[0] + ".dot"
            _say(f"neither pygraphviz nor Graphviz's `dot` is installed: {args.out} cannot be drawn, "
                 f"{out} will be written instead")
    if not _check_script("viz", args.script):
        return 2
    with ag.trace() as session:
        code = _run(args.script, args.args)
    if code:
        return code
    try:
        if out is None:
            Console().print(tree.to_tree(export.draw(session.instances, args.group, args.max_nodes)))
            return 0
        folded = export.write(session.instances, out, args.group, args.max_nodes)
    except GroupError as e:
        _say(f"autograd-groups viz: error: {e}")
        return 1
    if folded is not None and folded.collapsed:
        _say(f"collapsed {len(folded.collapsed)} clusters to fit --max-nodes {args.max_nodes}")
    _say(f"wrote {out}")
    if out != args.out:
        _say(f"autograd-groups viz: error: {args.out} not drawn: no Graphviz; {render.INSTALL_HINT}, "
             f"then run this command again")
        return 1
    return 0


def run_stats(args: argparse.Namespace) -> int:
    """The ``stats`` command; returns its exit code."""
    import autograd_groups as ag

    from . import stats

    if not _check_script("stats", args.script):
        return 2
    ag.reset_stats()
    # Elements changed are counted only for traced instances, so the script runs traced. With
    # --json, stdout holds the JSON alone: what the script prints goes to stderr.
    with ag.trace(), contextlib.redirect_stdout(sys.stderr if args.json else sys.stdout):
        code = _run(args.script, args.args)
    if code:
        return code
    found = stats.reports(ag.stats(), ag.list_rules())
    if args.json:
        print(json.dumps(stats.to_json(found), indent=2))
        return 0
    console = Console()
    if not found:
        console.print("no group instance was created")
        return 0
    console.print(stats.group_table(found))
    rules = stats.rule_table(found)
    if rules is not None:
        console.print(rules)
    for meaning in stats.legend(found):
        console.print(meaning, markup=False, highlight=False)
    line = stats.off_line(found)
    if line is not None:
        print("These groups never reached a special point; their special cases can be off:")
        print(line)
    return 0


def _run(script: str, argv: list[str]) -> int:
    from .script import run_script

    sys.stdout.flush()
    code = run_script(script, argv)
    sys.stdout.flush()
    return code

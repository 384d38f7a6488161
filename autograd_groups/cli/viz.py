"""``autograd-groups viz`` and ``autograd-groups stats``: run a script under a trace session, then
draw what it traced or report its rule hits.

Exit codes: 0 done; the script's own exit code when it fails (1 for an exception, ``n`` for
``sys.exit(n)``): what it recorded up to then is still drawn or reported, and the command says how
the script ended; 1 the drawing could not be made (e.g. neither pygraphviz nor Graphviz's ``dot``
for a picture: the ``.dot`` is written instead); 2 usage errors, a missing script included.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from typing import Any

from rich.console import Console

import autograd_groups as ag

from ..errors import GroupError
from ..rules import registry
from ..script import Exit, check_script, run_flushed, say, script_arguments
from ..viz.export import DEFAULT_MAX_NODES

VIZ_USAGE = "autograd-groups viz SCRIPT.py [--out FILE] [--group NAME] [--max-nodes N] [-- ARGS]"
STATS_USAGE = "autograd-groups stats SCRIPT.py [--json] [-- ARGS]"


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
    script_arguments(viz)
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
    script_arguments(stats)
    stats.add_argument("--json", action="store_true",
                       help="print the report as JSON (keys: documentation, 'Command line'); "
                            "the script's own output goes to stderr")
    stats.set_defaults(run=run_stats)


def _ended(command: str, script: str, code: Exit) -> None:
    say(f"autograd-groups {command}: {script} failed: it {code.how or 'ended'}, exit code {int(code)}; "
        f"what it recorded up to then is {'drawn' if command == 'viz' else 'reported'} above")


def run_viz(args: argparse.Namespace) -> int:
    """The ``viz`` command; returns its exit code."""
    from ..viz import export, render

    if args.max_nodes < 1:
        say("autograd-groups viz: error: --max-nodes must be at least 1")
        return 2
    out = args.out
    if out is not None:
        try:
            suffix = export.suffix_of(out)
        except GroupError as e:
            say(f"autograd-groups viz: error: {e}")
            return 2
        if suffix in render.FORMATS and render.renderer() is None:
            out = os.path.splitext(out)[0] + ".dot"
            say(f"neither pygraphviz nor Graphviz's `dot` is installed: {args.out} cannot be drawn, "
                f"{out} will be written instead")
    if not check_script("viz", args.script):
        return 2
    with ag.trace() as session:
        code = run_flushed(args.script, args.args)
    drawn = _draw(args, out, session.instances)
    if code:
        _ended("viz", args.script, code)
        return code
    return drawn


def _draw(args: argparse.Namespace, out: str | None, instances: list[Any]) -> int:
    """Print the tree of ``instances``, or write ``out``; the exit code of that part."""
    from ..viz import export, render, tree

    try:
        if out is None:
            Console().print(tree.to_tree(export.draw(instances, args.group, args.max_nodes)))
            return 0
        folded = export.write(instances, out, args.group, args.max_nodes)
    except GroupError as e:
        say(f"autograd-groups viz: error: {e}")
        return 1
    if folded is not None and folded.collapsed:
        say(f"collapsed {len(folded.collapsed)} clusters to fit --max-nodes {args.max_nodes}")
    say(f"wrote {out}")
    if out != args.out:
        say(f"autograd-groups viz: error: {args.out} not drawn: no Graphviz; {render.INSTALL_HINT}, "
            f"then run this command again")
        return 1
    return 0


def run_stats(args: argparse.Namespace) -> int:
    """The ``stats`` command; returns its exit code."""
    if not check_script("stats", args.script):
        return 2
    ag.reset_stats()
    # Elements changed are counted only for traced instances, so the script runs traced. With
    # --json, stdout holds the JSON alone: what the script prints goes to stderr.
    with ag.trace(), contextlib.redirect_stdout(sys.stderr if args.json else sys.stdout):
        code = run_flushed(args.script, args.args)
    _report(args.json)
    if code:
        _ended("stats", args.script, code)
    return code


def _report(as_json: bool) -> None:
    """Print the ``stats`` report of what ran."""
    from ..viz import stats

    registered = ag.list_rules()
    counts = ag.stats()
    found, unused = stats.reports(counts, registered), registry.unused()
    if as_json:
        print(json.dumps({**stats.to_json(found, unused), "regions": {
            name: count["region"] for name, count in counts.items() if "region" in count}}, indent=2))
        return
    console = Console()
    if not found:
        console.print("no group instance was created")
    else:
        console.print(stats.group_table(found))
        rules = stats.rule_table(found)
        if rules is not None:
            console.print(rules)
        for meaning in stats.legend(found):
            console.print(meaning, markup=False, highlight=False)
        for text in stats.unchanged_lines(found):
            console.print(text, markup=False, highlight=False)
    for text in stats.region_lines(counts):
        console.print(text, markup=False, highlight=False)
    for text in stats.unused_lines(unused, registered):
        console.print(text, markup=False, highlight=False)
    off = stats.off_line(found)
    if off is not None:
        print("These groups never reached a special point; their special cases can be off:")
        print(off)
    for text in stats.site_lines(found):
        print(text)

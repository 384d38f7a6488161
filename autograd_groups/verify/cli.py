"""``autograd-groups verify``: run a script as ``viz`` and ``stats`` do, recording what ``ag.verify``
needs, then check every rule that fired against the math (documentation: "Checking rules").

Exit codes: 0 every checked rule is consistent; 1 a rule is inconsistent; 2 usage errors, a missing
script included; the script's own code when it fails (what it recorded is still checked and shown).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from typing import Any

from rich.console import Console

from ..observe.recording import Recorder, recording
from ..observe.tracer import trace
from ..viz.cli import _check_script, _ended, _run, _say, _script_arguments
from .verify import MAX_INSTANCES, check

USAGE = "autograd-groups verify SCRIPT.py [--order 2] [--max-instances N] [--json] [-- ARGS]"
#: Why a ``with`` block or a ``tag`` in a script is not checked: only a function can be run again.
NO_FUNCTION = ("a `with` block or tag() cannot be run again on its own inputs, and a script is no "
               "function of its tensors: check it with ag.verify(fn, *tensors) on the function that "
               "contains it")


def register(subparsers: Any) -> None:
    """Add the ``verify`` subcommand to ``subparsers`` (from ``add_subparsers``).

    >>> import argparse
    >>> parser = argparse.ArgumentParser(prog="autograd-groups")
    >>> register(parser.add_subparsers(dest="command"))
    >>> args = parser.parse_args(["verify", "train.py", "--order", "2", "--", "--steps", "1"])
    >>> args.order, args.max_instances, args.args
    (2, 5, ['--steps', '1'])
    """
    verify = subparsers.add_parser(
        "verify", usage=USAGE, help="run a script and check every rule that fired against the math",
        description="Run SCRIPT.py as `python SCRIPT.py ARGS` would, then check each rule that fired "
                    "in the first N instances of each group: its gradient at the point against the "
                    "limits of the automatic gradient at nearby points (help(autograd_groups.verify)). "
                    "Print a table; exit with 1 if a rule is inconsistent.")
    _script_arguments(verify)
    verify.add_argument("--order", type=int, choices=(1, 2), default=1,
                        help="2: check Hessian-vector products (through create_graph) instead of "
                             "gradients")
    verify.add_argument("--max-instances", metavar="N", type=int, default=MAX_INSTANCES,
                        help=f"check the first N instances of each group where a rule fired "
                             f"(default {MAX_INSTANCES})")
    verify.add_argument("--json", action="store_true",
                        help="print the report as JSON (keys: documentation, 'Command line'); "
                             "the script's own output goes to stderr")
    verify.set_defaults(run=run_verify)


def run_verify(args: argparse.Namespace) -> int:
    """The ``verify`` command; returns its exit code."""
    if args.max_instances < 1:
        _say("autograd-groups verify: error: --max-instances must be at least 1")
        return 2
    if not _check_script("verify", args.script):
        return 2
    recorder = Recorder(copies=args.max_instances)
    with trace() as session, recording(recorder), \
            contextlib.redirect_stdout(sys.stderr if args.json else sys.stdout):
        code = _run(args.script, args.args)
    try:
        report = check(session.instances, recorder, args.order, args.max_instances, NO_FUNCTION)
    finally:
        recorder.close()
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        Console().print(report)
    if code:
        _ended("verify", args.script, code)
        return code
    return 0 if report.ok else 1

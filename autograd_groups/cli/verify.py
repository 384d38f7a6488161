"""``autograd-groups verify``: run a script as ``viz`` and ``stats`` do, recording what ``ag.verify``
needs, then check every rule that fired against the math (documentation: "Checking rules").

Exit codes (:data:`EXIT_CODES`): 0 the script ran to its end and no rule is inconsistent; 1 a rule is
inconsistent; 2 usage errors, a missing script included; 3 the script failed (raised, or exited
with a code other than 0) and no rule it recorded is inconsistent -- what it recorded is still
checked and shown, and the message names its own exit code.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Iterator
from typing import Any

from rich.console import Console
from rich.status import Status

from ..observe.recording import Recorder, recording
from ..observe.tracer import trace
from ..script import Exit, check_script, run_flushed, say, script_arguments
from ..verify.verify import MAX_INSTANCES, Progress, check

#: The command's exit codes; an inconsistent rule is reported as 1 whether or not the script failed.
EXIT_CODES = {0: "the script ran to its end and no rule is inconsistent", 1: "a rule is inconsistent",
              2: "usage error (a missing script, a bad option)",
              3: "the script failed (raised, or exited with a code other than 0), and no rule it "
                 "recorded is inconsistent"}
SCRIPT_FAILED = 3

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
                    "Print a table, each finding below it once. On a terminal, progress goes to stderr.",
        epilog="exit codes: " + "; ".join(f"{code} {meaning}" for code, meaning in EXIT_CODES.items()))
    script_arguments(verify)
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
        say("autograd-groups verify: error: --max-instances must be at least 1")
        return 2
    if not check_script("verify", args.script):
        return 2
    recorder = Recorder(copies=args.max_instances)
    with trace() as session, recording(recorder), \
            contextlib.redirect_stdout(sys.stderr if args.json else sys.stdout):
        code = run_flushed(args.script, args.args)
    try:
        with _progress() as progress:
            report = check(session.instances, recorder, args.order, args.max_instances, NO_FUNCTION,
                           progress=progress)
    finally:
        recorder.close()
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        Console().print(report)
    if code:
        _failed(args.script, code, report.ok)
    return 1 if not report.ok else SCRIPT_FAILED if code else 0


@contextlib.contextmanager
def _progress() -> Iterator[Progress | None]:
    """What ``check`` is doing, as a line on stderr that it rewrites, when stderr is a terminal (in
    a pipe or a log, nothing); gone when the checks end."""
    if not sys.stderr.isatty():
        yield None
        return
    console = Console(file=sys.stderr)
    with Status("autograd-groups verify: checking the rules that fired", console=console) as status:
        def told(done: int, total: int, what: str) -> None:
            status.update(f"autograd-groups verify: checking {what} ({done + 1} of {total})")

        yield told


def _failed(script: str, code: Exit, ok: bool) -> None:
    exit_code = 1 if not ok else SCRIPT_FAILED
    say(f"autograd-groups verify: {script} failed: it {code.how or 'ended'}, exit code {int(code)}; "
        f"what it recorded up to then is checked above; exiting with {exit_code} "
        f"({EXIT_CODES[exit_code]})")

"""``autograd-groups doctor``: run a script, and at its first backward pass with a non-finite loss or
leaf gradient say where the value was born, what kind of problem it is, and which fixes pass a
replay of that step.

Exit codes: 0 every watched backward pass was finite; 1 a problem was found; 2 usage errors, a
missing script included; the script's own code when it fails before any finding (the command says
how it ended).
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from ..doctor.diagnose import diagnose
from ..script import check_script, say, script_arguments

USAGE = "autograd-groups doctor SCRIPT.py [--steps N] [--json PATH] [-- ARGS]"


def register(subparsers: Any) -> None:
    """Add the ``doctor`` subcommand to ``subparsers`` (from ``add_subparsers``).

    >>> import argparse
    >>> parser = argparse.ArgumentParser(prog="autograd-groups")
    >>> register(parser.add_subparsers(dest="command"))
    >>> args = parser.parse_args(["doctor", "train.py", "--json", "r.json", "--", "--lr", "1"])
    >>> args.json, args.steps, args.args
    ('r.json', None, ['--lr', '1'])
    """
    doctor = subparsers.add_parser(
        "doctor", usage=USAGE, help="find where a NaN in a training step is born, and checked fixes",
        description="Run SCRIPT.py as `python SCRIPT.py ARGS` would, reading after each backward pass "
                    "whether the loss and the leaf gradients are finite. At the first that is not, the "
                    "script stops; the doctor replays it to that step with instruments on, and "
                    "reports where the non-finite value was born (op, line, elements, values), its "
                    "class (A-G), and fixes, each checked by replaying the step with it. Exit 0: "
                    "clean; 1: a problem found.")
    script_arguments(doctor)
    doctor.add_argument("--steps", metavar="N", type=int,
                        help="watch at most N backward passes, then stop the script")
    doctor.add_argument("--json", metavar="PATH", help="also write the report as JSON to PATH")
    doctor.set_defaults(run=run_doctor)


def run_doctor(args: argparse.Namespace) -> int:
    """The ``doctor`` command; returns its exit code."""
    if args.steps is not None and args.steps < 1:
        say("autograd-groups doctor: error: --steps must be at least 1")
        return 2
    if not check_script("doctor", args.script):
        return 2
    if args.json and not _writable(args.json):
        say(f"autograd-groups doctor: error: cannot write the report to {args.json}: its folder does not "
            "exist or is not writable, or it is a folder")
        return 2
    report, code = diagnose(args.script, args.args, args.steps)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report.to_json(), f, indent=2)
    if report.status == "clean" and code:
        say(f"autograd-groups doctor: {args.script} failed before any non-finite gradient: it "
            f"{code.how or 'ended'}, exit code {int(code)}")
        return int(code)
    print(report)
    if report.backward_calls == 0:
        say(f"autograd-groups doctor: {args.script} ran no backward pass (Tensor.backward, "
            "torch.autograd.grad): nothing was watched")
    return 1 if report.status == "found" else 0


def _writable(path: str) -> bool:
    """Whether a file can be written at ``path`` (checked before the script runs, not after)."""
    folder = os.path.dirname(os.path.abspath(path))
    return not os.path.isdir(path) and os.path.isdir(folder) and os.access(folder, os.W_OK) \
        and (not os.path.exists(path) or os.access(path, os.W_OK))

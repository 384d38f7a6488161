"""The ``autograd-groups`` command, one module per part of the library it shows (``spec``, ``viz``
and ``stats``, ``verify``, ``doctor``), each a thin layer over that part's public API."""

from __future__ import annotations

import argparse
import sys

from .. import __version__
from . import doctor, spec, verify, viz


def main(argv: list[str] | None = None) -> int:
    r"""Run ``autograd-groups`` with ``argv`` (default: the command line); return the exit code.

    >>> import pathlib, tempfile
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "groups.yaml"
    >>> _ = path.write_text("- name: g(Tensor x) -> Tensor\n  special_cases:\n    - nan_safe: true\n")
    >>> main(["check", str(path)])  # doctest: +ELLIPSIS
    /.../groups.yaml: ok (1 group(s), 1 rule(s))
    0
    """
    parser = argparse.ArgumentParser(
        prog="autograd-groups",
        description="Inspect autograd groups: validate spec files, list rules, draw traced graphs, "
                    "check rules against the math, and find where a NaN in a training step is born "
                    "(doctor).")
    parser.add_argument("--version", action="version", version=f"autograd-groups {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    spec.register(commands)
    viz.register(commands)
    verify.register(commands)
    doctor.register(commands)
    args, extra = parser.parse_known_args(argv)
    if extra:
        unknown = " ".join(extra)
        if getattr(args, "script", None) is None:
            parser.error(f"unrecognized arguments: {unknown}")
        # viz/stats/...: the script's own options, written without the `--` that passes them on.
        given = sys.argv[1:] if argv is None else argv
        tail = given[given.index(args.script) + 1:] if args.script in given else []
        theirs = [t for t in tail if t in extra or t in args.args] or [*args.args, *extra]
        print(f"autograd-groups {args.command}: error: unrecognized arguments: {unknown}; arguments "
              f"for the script go after `--`: autograd-groups {args.command} {args.script} -- "
              f"{' '.join(theirs)}", file=sys.stderr)
        return 2
    code: int = args.run(args)
    return code

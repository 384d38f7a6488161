"""The ``autograd-groups`` command: each subcommand lives with the part of the library it shows."""

from __future__ import annotations

import argparse
import sys

from .spec import cli as spec_cli
from .viz import cli as viz_cli


def main(argv: list[str] | None = None) -> int:
    """Run ``autograd-groups`` with ``argv`` (default: the command line); return the exit code.

    >>> main(["check", "--help"])  # doctest: +SKIP
    """
    parser = argparse.ArgumentParser(
        prog="autograd-groups",
        description="Inspect autograd groups: validate spec files, list rules, draw traced graphs.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    spec_cli.register(commands)
    viz_cli.register(commands)
    args = parser.parse_args(argv)
    code: int = args.run(args)
    return code


if __name__ == "__main__":
    sys.exit(main())

"""The ``autograd-groups`` command: each subcommand lives with the part of the library it shows."""

from __future__ import annotations

import argparse
import sys
from importlib.metadata import PackageNotFoundError, version

from .observe import cli as observe_cli
from .spec import cli as spec_cli
from .viz import cli as viz_cli


def main(argv: list[str] | None = None) -> int:
    r"""Run ``autograd-groups`` with ``argv`` (default: the command line); return the exit code.

    >>> import pathlib, tempfile
    >>> spec = pathlib.Path(tempfile.mkdtemp()) / "groups.yaml"
    >>> _ = spec.write_text("- name: g(Tensor x) -> Tensor\n  special_cases:\n    - nan_safe: true\n")
    >>> main(["check", str(spec)])  # doctest: +ELLIPSIS
    /.../groups.yaml: ok (1 group(s), 1 rule(s))
    0
    """
    parser = argparse.ArgumentParser(
        prog="autograd-groups",
        description="Inspect autograd groups: validate spec files, list rules, draw traced graphs, "
                    "check rules against the math.")
    parser.add_argument("--version", action="version", version=f"autograd-groups {_version()}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    spec_cli.register(commands)
    viz_cli.register(commands)
    observe_cli.register(commands)
    args = parser.parse_args(argv)
    code: int = args.run(args)
    return code


def _version() -> str:
    try:
        return version("autograd-groups")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


if __name__ == "__main__":
    sys.exit(main())

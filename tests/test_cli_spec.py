"""``autograd-groups check`` and ``list`` as a user runs them: a subprocess, its exit code, its output.

Each run starts Python and imports torch, so only the exit codes and output formats are tested here;
what is checked is tested in-process in test_spec*.py.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import autograd_groups as ag
from conftest import ROOT, assert_fits

SPECS = ROOT / "examples" / "specs"
ERROR_LINE = re.compile(r"^(?P<file>.+):(?P<line>\d+):(?P<col>\d+): (?P<message>.+)$")


def cli(*args: str, columns: str = "200") -> subprocess.CompletedProcess[str]:
    """``autograd-groups ARGS`` in a subprocess whose stdout is a pipe, not a terminal."""
    env = {**os.environ, "PYTHONPATH": str(SPECS), "COLUMNS": columns}
    return subprocess.run([sys.executable, "-m", "autograd_groups.cli", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


def test_check_valid_specs_exits_0() -> None:
    done = cli("check", "examples/specs/cdist.yaml", "examples/specs/safe_norm.yaml")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["examples/specs/cdist.yaml: ok (1 group(s), 1 rule(s))",
                                        "examples/specs/safe_norm.yaml: ok (1 group(s), 1 rule(s))"]


def test_check_invalid_spec_exits_1_with_every_error_as_file_line_col(tmp_path: Path) -> None:
    spec = tmp_path / "bad.yaml"
    spec.write_text("- name: a(Tensor x) -> Tensor\n"
                    "  special_cases:\n"
                    "    - subgradient: {op: sqrt, when: reslt == 0}\n"
                    "    - nan_safe: maybe\n")
    done = cli("check", str(spec), "examples/specs/cdist.yaml")
    assert done.returncode == 1
    lines = done.stdout.splitlines()
    assert [ERROR_LINE.match(line) is not None for line in lines] == [True, True]
    col = spec.read_text().splitlines()[2].index("reslt") + 1
    assert lines == [
        f"{spec}:3:{col}: 'when' names 'reslt', which sqrt does not save; it saves result (and every rule "
        f"sees 'grad'); did you mean 'result'?",
        f"{spec}:4:17: 'nan_safe' must be true or a mapping with a 'doc', not a string ('maybe')",
    ]
    assert done.stderr.strip() == "2 error(s) in 2 spec file(s)"


@pytest.mark.parametrize(("args", "stderr"), [
    (["check"], "autograd-groups check: error: the following arguments are required: SPEC"),
    (["check", "examples/specs/cdist.yaml", "no/such/file.yaml"],
     "autograd-groups check: error: no such file: no/such/file.yaml"),
])
def test_usage_errors_exit_2(args: list[str], stderr: str) -> None:
    done = cli(*args)
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.strip().splitlines()[-1] == stderr


def blocks(output: str) -> list[str]:
    """``list``'s output, one string per group: its lines joined, runs of spaces made one."""
    return [" ".join(block.split()) for block in output.strip().split("\n\n")]


def test_list_spec_shows_groups_rules_and_docs() -> None:
    done = cli("list", "--spec", "examples/specs/cdist.yaml", "--spec", "examples/specs/safe_norm.yaml")
    assert done.returncode == 0, done.stderr
    assert blocks(done.stdout) == [
        "cdist(Tensor x1, Tensor x2) -> Tensor Euclidean distances between the rows of x1 and x2, computed "
        "as sqrt(clamp_min(|x|^2 + |y|^2 - 2 x.y, 0)). subgradient op sqrt: where result == 0, grad = 0 "
        "distance 0: PyTorch's cdist gives gradient 0 there",
        "safe_norm(Tensor x) -> Tensor The 2-norm of all elements of x, with gradient 0 at x == 0 as "
        "torch.linalg.vector_norm. override check norm_rules:norm_is_zero, backward "
        "norm_rules:norm_subgradient at norm 0 the gradient is 0 (the norm's subgradient PyTorch picks)",
    ]


@pytest.mark.parametrize("columns", ["200", "80"])
def test_list_without_spec_shows_every_registered_group_whole(columns: str) -> None:
    done = cli("list", columns=columns)
    assert done.returncode == 0, done.stderr
    import autograd_groups.ops  # noqa: F401  (what `list` shows: the built-in library)

    registered = ag.list_rules()
    shown = [block.split("(")[0] for block in blocks(done.stdout)]
    assert shown == sorted(registered)
    assert_fits(done.stdout, int(columns), whole=[f"{name}(" for name in registered])


def test_list_json_has_every_group_and_rule_of_the_registry() -> None:
    done = cli("list", "--json")
    assert done.returncode == 0, done.stderr
    import autograd_groups.ops  # noqa: F401

    listed = json.loads(done.stdout)["groups"]
    assert {g["name"]: [(r["kind"], r["label"], r["doc"]) for r in g["rules"]] for g in listed} == {
        name: [(r.kind, r.label, r.doc) for r in rules] for name, rules in ag.list_rules().items()}
    cdist = next(g for g in listed if g["name"] == "ops.cdist")
    assert cdist["signature"].startswith("ops.cdist(Tensor x1, Tensor x2")
    assert cdist["rules"][0]["details"] == "op sqrt: where result == 0, grad = 0"


def test_list_json_of_a_spec_file() -> None:
    done = cli("list", "--json", "--spec", "examples/specs/cdist.yaml")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"groups": [{
        "name": "cdist", "signature": "cdist(Tensor x1, Tensor x2) -> Tensor",
        "doc": "Euclidean distances between the rows of x1 and x2, computed as "
               "sqrt(clamp_min(|x|^2 + |y|^2 - 2 x.y, 0)).",
        "rules": [{"kind": "subgradient", "label": "subgradient(sqrt: result == 0 -> 0)",
                   "details": "op sqrt: where result == 0, grad = 0",
                   "doc": "distance 0: PyTorch's cdist gives gradient 0 there"}]}]}

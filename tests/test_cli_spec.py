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


def test_check_refuses_what_would_fail_at_every_backward(tmp_path: Path) -> None:
    forms = ["1", "true", "'True'", "result", "'result * 2'"]
    spec = tmp_path / "when.yaml"
    spec.write_text("".join(f"- name: g{k}(Tensor x) -> Tensor\n  special_cases:\n"
                            f"    - subgradient: {{op: sqrt, when: {when}, grad: 0}}\n"
                            for k, when in enumerate(forms)))
    inputs = tmp_path / "input.yaml"
    inputs.write_text("- name: h(Tensor x) -> Tensor\n  special_cases:\n"
                      "    - subgradient: {op: sqrt, when: result == 0, grad: 0, input: 3}\n")
    done = cli("check", str(spec), str(inputs))
    assert done.returncode == 1
    found = [ERROR_LINE.match(line) for line in done.stdout.splitlines()]
    assert all(found) and len(found) == 6
    lines = spec.read_text().splitlines()
    for k, (when, match) in enumerate(zip(forms, found)):
        assert match is not None and match["file"] == str(spec)
        assert (int(match["line"]), int(match["col"])) == (3 * k + 3, lines[3 * k + 2].index(when) + 1 +
                                                           (when[0] == "'"))
    assert [m["message"].split(":")[0] for m in found[:5] if m is not None] == [
        "'when' is the constant 1", "'when' is the constant True", "'when' is the constant True",
        "'when' must be an elementwise condition (a comparison such as 'result == 0', combined with &, | "
        "and ~), not a saved value ('result')",
        "'when' must be an elementwise condition (a comparison such as 'result == 0', combined with &, | "
        "and ~), not a number ('result * 2')"]
    assert found[5] is not None and found[5]["message"] == (
        "'input': input 3 is out of range: sqrt has 1 input (position 0, in the order of next_functions)")


def bare_cli(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The command as a user runs it from ``cwd``, with no PYTHONPATH."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([sys.executable, "-m", "autograd_groups.cli", *args], cwd=cwd, env={**env,
                          "COLUMNS": "200"}, capture_output=True, text=True, timeout=300)


def test_check_runs_no_code_unless_asked_and_finds_modules_next_to_the_spec(tmp_path: Path) -> None:
    folder = tmp_path / "specs"
    folder.mkdir()
    marker = tmp_path / "imported"
    (folder / "ag_writes_on_import.py").write_text(
        f"open({str(marker)!r}, 'w').close()\n\ndef check(ctx):\n    return True\n\n"
        f"def backward(ctx, grad):\n    return grad\n")
    spec = folder / "writes.yaml"
    spec.write_text("".join(f"- name: {group}(Tensor x) -> Tensor\n  special_cases:\n"
                            f"    - override: {{check: 'ag_writes_on_import:{check}', "
                            f"backward: 'ag_writes_on_import:backward'}}\n"
                            for group, check in (("g", "check"), ("h", "nope"))))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = bare_cli(elsewhere, "check", str(spec))
    assert done.returncode == 0, done.stdout + done.stderr
    assert not marker.exists()
    done = bare_cli(elsewhere, "check", "--imports", str(spec))
    assert done.returncode == 1 and marker.exists()
    col = spec.read_text().splitlines()[5].index("nope") + 1
    assert done.stdout.splitlines() == [
        f"{spec}:6:{col}: 'check': module 'ag_writes_on_import' has no 'nope'"]
    done = bare_cli(elsewhere, "check", str(ROOT / "examples" / "specs" / "safe_norm.yaml"))
    assert done.returncode == 0, done.stdout + done.stderr
    missing = folder / "missing.yaml"
    missing.write_text("- name: g(Tensor x) -> Tensor\n  special_cases:\n"
                       "    - override: {check: 'ag_not_here.sub:check', backward: 'ag_not_here:b'}\n")
    done = bare_cli(elsewhere, "check", str(missing))
    assert done.returncode == 1
    col = missing.read_text().splitlines()[2].index("ag_not_here.sub") + 1
    assert done.stdout.splitlines()[0] == (
        f"{missing}:3:{col}: 'check': cannot find module 'ag_not_here.sub' in the spec's folder {folder} and "
        f"sys.path (looked up without importing it; check with --imports to import it)")

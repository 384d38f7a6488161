"""``autograd-groups verify SCRIPT.py``: exit 1 on an inconsistent rule (naming the group), 0 when the
rules are right, the script's own code when it fails, 2 for usage errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from autograd_groups import cli
from conftest import assert_fits

ROTATION = textwrap.dedent('''
    import sys
    import torch
    import autograd_groups as ag

    ag.register_rule("rodrigues", ag.Subgradient(op="sqrt", when="result == 0", grad=0))
    ag.register_rule("length", ag.Subgradient(op="sqrt", when="result == 0", grad=0))


    @ag.autograd_group("rodrigues")
    def rodrigues(v):
        theta = v.pow(2).sum().sqrt()
        x, y, z = (v / theta.clamp_min(1e-30)).unbind()
        zero = torch.zeros_like(x)
        k = torch.stack([zero, -z, y, z, zero, -x, -y, x, zero]).reshape(3, 3)
        return torch.eye(3) + torch.sin(theta) * k + (1 - torch.cos(theta)) * (k @ k)


    @ag.autograd_group("length")
    def length(v):
        return v.pow(2).sum().sqrt()


    v = torch.zeros(3, requires_grad=True)
    for _ in range(2):
        loss = length(v) + (rodrigues(v)[0, 1] if "--rotate" in sys.argv else 0)
        loss.backward()
    print("trained")
    if "--fail" in sys.argv:
        sys.exit(3)
''')


def _script(tmp_path: Path, source: str = ROTATION) -> Path:
    path = tmp_path / "train.py"
    path.write_text(source)
    return path


def test_a_script_with_right_rules_exits_0(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["verify", str(_script(tmp_path))]) == 0
    out = capsys.readouterr().out
    assert "length#0" in out and "length#1" in out and "2 consistent, 0 inconsistent" in out


def test_a_script_with_a_wrong_rule_exits_1_and_names_the_group(tmp_path: Path) -> None:
    # As a user runs it: a subprocess, its stdout a pipe 80 columns wide.
    done = subprocess.run([sys.executable, "-m", "autograd_groups.cli", "verify",
                           str(_script(tmp_path)), "--max-instances", "1", "--", "--rotate"],
                          capture_output=True, text=True, env=dict(os.environ, COLUMNS="80"), timeout=300)
    assert done.returncode == 1, done.stderr
    assert_fits(done.stdout, 80, ["rodrigues#0", "inconsistent", "length#0", "consistent"])
    flat = " ".join(done.stdout.split())
    assert "rodrigues#0 (created at" in flat and "inconsistent at a smooth point" in flat
    assert "rodrigues#1" not in flat and "1 more instance(s) where it fired (max_instances=1)" in flat


def test_json_has_the_report_alone_on_stdout(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["verify", str(_script(tmp_path)), "--json", "--order", "2", "--", "--rotate"]) == 1
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert "trained" in captured.err
    assert (report["order"], report["ok"]) == (2, False)
    assert {(row["group"], row["status"]) for row in report["rows"] if row["instance"]} >= {
        ("rodrigues", "inconsistent")}


def test_a_failing_script_exits_with_its_code_after_the_report(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["verify", str(_script(tmp_path)), "--", "--fail"]) == 3
    assert "2 consistent, 0 inconsistent" in capsys.readouterr().out


def test_a_with_block_in_a_script_is_not_checked_and_says_how_to_check_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = textwrap.dedent('''
        import torch
        import autograd_groups as ag

        ag.register_rule("block", ag.Subgradient(op="sqrt", when="result == 0", grad=0))
        v = torch.zeros(3, requires_grad=True)
        with ag.autograd_group("block"):
            n = v.pow(2).sum().sqrt()
        n.backward()
    ''')
    assert cli.main(["verify", str(_script(tmp_path, source))]) == 0
    assert "check it with ag.verify(fn, *tensors)" in " ".join(capsys.readouterr().out.split())


def test_usage_errors_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["verify", str(tmp_path / "missing.py")]) == 2
    assert "no such script" in capsys.readouterr().err
    assert cli.main(["verify", str(_script(tmp_path)), "--max-instances", "0"]) == 2
    assert "--max-instances must be at least 1" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exited:
        cli.main(["verify", str(_script(tmp_path)), "--order", "3"])
    assert exited.value.code == 2

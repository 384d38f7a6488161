"""``autograd-groups verify SCRIPT.py``: exit 1 on an inconsistent rule (naming the group), 0 when the
rules are right, 3 when the script fails (and no rule is inconsistent), 2 for usage errors; progress
on stderr only on a terminal; each finding said once; indices whole; paths relative."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import autograd_groups as ag
from autograd_groups import cli
from autograd_groups.cli import verify as verify_cli
from autograd_groups.verify.verdict import NOT_CHECKED
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
        sys.exit(1)
    if "--raise" in sys.argv:
        raise ValueError("the script's own error")
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
    note = re.search(r"inconsistent \[(\d+)\]", flat)
    assert note and f"[{note.group(1)}] inconsistent at a smooth point" in flat
    assert "rodrigues#1" not in flat and "1 more instance(s) where it fired (max_instances=1)" in flat
    assert done.stderr.count("checking") == 0  # no progress in a pipe


def test_json_has_the_report_alone_on_stdout(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["verify", str(_script(tmp_path)), "--json", "--order", "2", "--", "--rotate"]) == 1
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert "trained" in captured.err
    assert (report["order"], report["ok"]) == (2, False)
    assert {(row["group"], row["status"]) for row in report["rows"] if row["instance"]} >= {
        ("rodrigues", "inconsistent")}


@pytest.mark.parametrize("how", ["--fail", "--raise"])
def test_a_failing_script_exits_3_after_the_report_and_names_its_own_code(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], how: str) -> None:
    """sys.exit(1) and an exception (whose code is 1) are told apart from an inconsistent rule."""
    assert cli.main(["verify", str(_script(tmp_path)), "--", how]) == 3
    captured = capsys.readouterr()
    assert "2 consistent, 0 inconsistent" in captured.out
    assert "exit code 1;" in captured.err and "exiting with 3 (the script failed" in captured.err


def test_an_inconsistent_rule_exits_1_even_when_the_script_fails(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["verify", str(_script(tmp_path)), "--max-instances", "1", "--", "--rotate",
                     "--fail"]) == 1
    assert "exiting with 1 (a rule is inconsistent)" in capsys.readouterr().err


def test_the_exit_codes_are_in_the_help_and_the_docs(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["verify", "--help"])
    flat = " ".join(capsys.readouterr().out.split())
    docs = " ".join((Path(__file__).resolve().parents[1] / "docs" / "cli.md").read_text().split())
    for code, meaning in verify_cli.EXIT_CODES.items():
        assert f"{code} {meaning}" in flat
        assert f"| {code} | {meaning}" in docs


def _on_a_terminal(argv: list[str]) -> tuple[int, str]:
    """Run the command with stderr on a pseudo-terminal (stdout a pipe); its code and stderr."""
    main, secondary = pty.openpty()
    process = subprocess.Popen([sys.executable, "-m", "autograd_groups.cli", *argv], stdout=subprocess.PIPE,
                               stderr=secondary, env=dict(os.environ, COLUMNS="80"))
    os.close(secondary)
    seen = b""
    while True:
        ready, _, _ = select.select([main], [], [], 300)
        if not ready:
            break
        try:
            chunk = os.read(main, 4096)
        except OSError:  # the command ended and closed the terminal
            break
        if not chunk:
            break
        seen += chunk
    process.communicate(timeout=300)
    os.close(main)
    return process.returncode, seen.decode(errors="replace")


def test_progress_goes_to_stderr_on_a_terminal_only(tmp_path: Path) -> None:
    code, stderr = _on_a_terminal(["verify", str(_script(tmp_path))])
    assert code == 0
    # The terminal shows whichever update it drew last: the first, or the second.
    assert re.search(r"autograd-groups verify: checking length#\d+ \([12] of 2\)", stderr), stderr
    # In a pipe, none: test_a_script_with_a_wrong_rule_exits_1_and_names_the_group.


def test_each_finding_is_said_once_and_rows_refer_to_it(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """Two instances of one group at the same point: one numbered note, both rows pointing at it."""
    assert cli.main(["verify", str(_script(tmp_path)), "--max-instances", "2", "--", "--rotate"]) == 1
    out = capsys.readouterr().out
    notes = re.findall(r"inconsistent \[(\d+)\]", out)
    assert len(notes) == 2 and notes[0] == notes[1]
    assert out.count(f"[{notes[0]}] inconsistent at a smooth point") == 1
    assert out.count("inconsistent at a smooth point") == 1


def test_indices_and_ranges_stay_whole_and_paths_are_relative(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    rows = [ag.Row("cdist", f"cdist#{k}", str(tmp_path / "examples" / "cdist.py") + ":60",
                   "subgradient(sqrt: result == 0 -> 0)", "subgradient", "sqrt", 1, NOT_CHECKED,
                   reason=f"{k + 5} of the 4096 elements it reaches cannot be checked, e.g. x1[4, 10]: "
                          f"the automatic gradient has no limit there along some direction")
            for k in range(3)]
    text = str(ag.Report(rows, 1))
    assert_fits(text, 80, ["x1[4, 10]", "examples/cdist.py:60"])
    assert str(tmp_path) not in text
    assert [line[:4] for line in text.splitlines() if line[:1] == "["] == ["[1] ", "[2] ", "[3] "]


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


def test_the_cdist_example_is_checked_at_its_kink(capsys: pytest.CaptureFixture[str]) -> None:
    """The matmul form's squared distance cancels at small steps, so along some directions the
    automatic gradient of an identical pair has no limit; the value's finite differences see the
    cone there (its gradient 0 within the one-sided slopes), and every element is checked."""
    example = Path(__file__).resolve().parents[1] / "examples" / "cdist.py"
    assert cli.main(["verify", str(example), "--max-instances", "1", "--json", "--",
                     "--size", "32", "32", "16", "--repeat", "1"]) == 0
    (row,) = json.loads(capsys.readouterr().out)["rows"]
    # Where a release's matmul form rounds otherwise (torch 2.15: the changed elements reach no
    # input gradient of the float64 copies), the row is not checked and says why.
    if row["status"] == "not checked":
        assert row["instance"] == "cdist#0" and row["reason"]
        return
    assert (row["instance"], row["status"], row["point"]) == ("cdist#0", "consistent", "kink")
    assert row["checked"] == 32 * 16 and row["differences"] >= 1

"""The metric-learning demo tells its story: plain autograd gives NaN, the group trains, and where
distances never reach 0 the special cases can be turned off without changing a thing."""

from __future__ import annotations

import io
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from rich.console import Console

import autograd_groups as ag
from autograd_groups.viz.stats import KEEP, SAFE
from conftest import ROOT, load_example

pytestmark = pytest.mark.xdist_group(name="demo")  # one worker runs the module's single demo run
STEPS = 30


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory):
    module = load_example("metric_learning")
    out = tmp_path_factory.mktemp("demo")
    printed = io.StringIO()
    result = module.run_demo(steps=STEPS, seed=0, out=out, console=Console(file=printed, width=120))
    return module, result, out, printed.getvalue()


def test_plain_composite_run_hits_nan_and_stops(demo) -> None:
    _, result, _, _ = demo
    plain = result.plain
    assert not plain.special_cases
    assert plain.nan_step is not None and plain.nan_in in ("loss", "gradients")
    assert len(plain.losses) == plain.nan_step - 1
    assert plain.accuracy is None
    assert plain.min_distance == 0.0


def test_grouped_run_trains_through_the_zero_diagonal(demo) -> None:
    _, result, _, _ = demo
    grouped = result.grouped
    assert grouped.special_cases and grouped.nan_step is None
    assert len(grouped.losses) == STEPS and all(math.isfinite(v) for v in grouped.losses)
    assert grouped.min_distance == 0.0          # the special point was really reached
    first, last = grouped.losses[:5], grouped.losses[-5:]
    assert sum(last) < 0.75 * sum(first)
    assert grouped.accuracy is not None and 0.0 <= grouped.accuracy <= 1.0


def test_prototype_runs_are_finite_and_identical_with_rules_on_or_off(demo) -> None:
    _, result, _, _ = demo
    on, off = result.prototypes_on, result.prototypes_off
    assert on.special_cases and not off.special_cases
    assert on.nan_step is None and off.nan_step is None
    assert len(off.losses) == STEPS and all(math.isfinite(v) for v in off.losses)
    assert on.min_distance > 0.0                # never at the special point ...
    assert on.losses == off.losses              # ... so the rules change nothing
    assert on.accuracy == off.accuracy
    assert off.losses[-1] < off.losses[0]
    assert result.speedup > 0 and len(on.step_seconds) == len(off.step_seconds) == STEPS


def test_stats_audit_tells_which_model_may_turn_special_cases_off(demo) -> None:
    _, result, _, text = demo
    verdicts = {name: {r.name: r.verdict for r in reports} for name, reports in result.audit.items()}
    assert verdicts["pairwise"]["ops.cdist"] == KEEP
    assert verdicts["prototypes"]["ops.cdist"] == SAFE
    assert 'special_cases(False, groups=["ops.cdist"])' in text


def test_graph_files_are_written(demo) -> None:
    _, result, out, _ = demo
    dot = out / "metric_learning.dot"
    assert dot in result.files and "cdist" in dot.read_text()
    if shutil.which("dot") is not None:
        svg = out / "metric_learning.svg"
        assert svg in result.files and svg.read_text().lstrip().startswith("<?xml")


def test_script_runs_from_the_command_line(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(ROOT / "examples" / "metric_learning.py"), "--steps", "3",
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "(b)" in done.stdout and (tmp_path / "metric_learning.dot").exists()


def test_steps_must_be_positive() -> None:
    module = load_example("metric_learning")
    with pytest.raises(SystemExit) as exit_info:
        module.main(["--steps", "0"])
    assert exit_info.value.code == 2


def test_without_graphviz_the_dot_file_is_still_written(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    module = load_example("metric_learning")
    x = torch.tensor([[0.0, 1.0], [2.0, 3.0]], requires_grad=True)
    with ag.trace() as session:
        module.cdist(x, x).sum().backward()
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    printed = io.StringIO()
    files = module.write_graph(session, tmp_path, Console(file=printed, width=200))
    assert files == [tmp_path / "metric_learning.dot"] and files[0].read_text().startswith("digraph")
    assert "Install Graphviz" in printed.getvalue()

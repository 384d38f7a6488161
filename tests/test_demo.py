"""The metric-learning demo tells its story: plain autograd gives NaN, the group trains, and where
distances never reach 0 the special cases can be turned off without changing a thing."""

from __future__ import annotations

import io
import math
import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import torch
from rich.console import Console

import autograd_groups as ag
from autograd_groups.viz.stats import KEEP, SAFE
from conftest import ROOT, assert_fits, load_example

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
    dot, svg = out / "metric_learning.dot", out / "metric_learning.svg"
    assert result.files == [dot, svg]
    assert "cdist" in dot.read_text()
    assert ET.parse(svg).getroot().tag == "{http://www.w3.org/2000/svg}svg" and "ops.cdist" in svg.read_text()


def test_the_svg_is_drawn_with_no_dot_on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    module = load_example("metric_learning")
    x = torch.tensor([[0.0, 1.0], [2.0, 3.0]], requires_grad=True)
    with ag.trace() as session:
        module.cdist(x, x).sum().backward()
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert shutil.which("dot") is None
    files = module.write_graph(session, tmp_path, Console(file=io.StringIO()))
    assert files == [tmp_path / "metric_learning.dot", tmp_path / "metric_learning.svg"]
    assert "ops.cdist" in files[1].read_text()


def test_script_output_fits_80_columns_in_a_log(tmp_path: Path) -> None:
    # stdout is a pipe, as in `make demo | tee log`: no progress bar, and every label whole.
    done = subprocess.run([sys.executable, str(ROOT / "examples" / "metric_learning.py"), "--steps", "3",
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "COLUMNS": "80"})
    assert done.returncode == 0, done.stderr
    labels = ["(a) plain composite", "(b) group, rules on", "(c) prototypes, on", "(c) prototypes, off",
              "pairwise", "prototypes", "ops.cdist", "subgradient(sqrt: result == 0 -> 0)", "keep on",
              "can be off", "step 1, gradients"]
    assert_fits(done.stdout, 80, whole=labels)
    assert "cdist(emb, emb)" not in done.stdout + done.stderr     # the progress bar's task names
    assert (tmp_path / "metric_learning.svg").exists()


def test_a_terminal_gets_a_progress_bar(tmp_path: Path) -> None:
    module = load_example("metric_learning")
    screen = io.StringIO()
    terminal = Console(file=screen, force_terminal=True, width=80)
    module.run_demo(steps=2, seed=0, out=tmp_path, console=terminal)
    assert "(a) and (b): cdist(emb, emb)" in screen.getvalue() and "100%" in screen.getvalue()


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
    monkeypatch.setitem(sys.modules, "pygraphviz", None)
    printed = io.StringIO()
    files = module.write_graph(session, tmp_path, Console(file=printed, width=200))
    assert files == [tmp_path / "metric_learning.dot"] and files[0].read_text().startswith("digraph")
    assert "pip install 'autograd-groups[viz]'" in printed.getvalue()
    assert "apt-get install graphviz" in printed.getvalue()


@pytest.mark.slow
def test_compile_trains_the_same_model_to_the_same_losses(tmp_path: Path) -> None:
    # A few steps: torch.compile takes tens of seconds on 2 cores, once. Over hundreds of steps the
    # two runs drift apart as float rounding (reordered by inductor) grows; the demo says when.
    module = load_example("metric_learning")
    printed = io.StringIO()
    try:
        result = module.run_demo(steps=4, seed=0, out=tmp_path, console=Console(file=printed, width=80),
                                 with_compile=True)
    finally:
        torch._dynamo.reset()
    eager, compiled = result.grouped, result.compiled
    assert compiled is not None and compiled.nan_step is None and compiled.min_distance == 0.0
    assert len(compiled.losses) == 4
    torch.testing.assert_close(compiled.losses, eager.losses, rtol=1e-5, atol=1e-6)
    assert compiled.accuracy == eager.accuracy
    text = printed.getvalue()
    ms = eager.seconds_per_step * 1e3, compiled.seconds_per_step * 1e3
    assert_fits(text, 80, whole=["(b) torch.compile", f"{ms[0]:.2f} ms/step eager, {ms[1]:.2f} compiled",
                                 "for 4 of 4 steps;", f"k-NN accuracy {eager.accuracy:.3f} compiled"])

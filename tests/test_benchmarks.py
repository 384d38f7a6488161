"""The core benchmark runs, and its variants compute the gradients they are compared on.

Timings are not asserted here (a shared machine is too noisy for that): ``make bench`` reports them.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

import autograd_groups as ag

ROOT = Path(__file__).resolve().parents[1]


def test_bench_core_runs_and_checks_its_variants() -> None:
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_core.py"), "--repeats", "1"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    rows = [line for line in done.stdout.splitlines() if line.startswith("| (") and "N, M, D" not in line]
    assert [row.split(" | ")[0] for row in rows] == ["| (4, 4, 3)", "| (1024, 1024, 64)"]


def test_the_floor_variant_is_checked_against_the_group() -> None:
    """The gradient check before the timings fails for a variant that computes something else."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import bench_core
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    bench_core.example.register()
    x1, x2 = bench_core.points(4, 4, 3)
    bench_core.same_gradients({"group": bench_core.example.grouped_cdist,
                               "floor": bench_core.floor_cdist}, x1, x2)
    with pytest.raises(SystemExit, match="bench_core: doubled computes other gradients than the group"):
        bench_core.same_gradients({"group": bench_core.example.grouped_cdist,
                                   "doubled": lambda a, b: 2 * bench_core.example.grouped_cdist(a, b)},
                                  x1, x2)


def _bench_module(name: str):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        return __import__(name)
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))


def test_nan_safe_floor_checks_its_variants_and_prints_a_row_per_workload() -> None:
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "nan_safe_floor.py"), "--repeats", "1"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    rows = [line.split(" | ")[0] for line in done.stdout.splitlines() if "µs" in line]
    assert rows == ["| rodrigues (64, 3)", "| rodrigues (4096, 3)", "| entropy (256, 64)",
                    "| entropy (4096, 64)"]


def test_bench_targets_prints_each_target_with_met_or_missed() -> None:
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_targets.py"), "--repeats", "1"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    rows = [line.split(" | ") for line in done.stdout.splitlines() if line.startswith("| ") and "×" in line]
    assert [row[0] for row in rows] == ["| NaN-safe entropy vs double where, (256, 64) / (4096, 64)",
                                        "| NaN-safe Rodrigues vs no group, batch 64 / 4096",
                                        "| 3-op group sqrt(sum(x*x)), (4, 3), rules on vs plain"]
    assert [row[2] for row in rows] == ["≤ 1.3×", "≤ 1.3×", "≤ 1.6×"]
    assert all(row[3] in ("met |", "missed |") for row in rows)
    starts = [line.split(" | ") for line in done.stdout.splitlines()
              if line.startswith("| ") and " ms |" in line]
    assert [(row[0], row[2]) for row in starts] == [
        ("| import autograd_groups after import torch", "≤ 100 ms"),
        ("| import autograd_groups, then ag.ops (the built-in spec)", "≤ 100 ms"),
        ("| first ag.ops.cdist call + backward, (4, 3) x (5, 3)", "≤ 50 ms")]
    assert all(float(row[1].removesuffix(" ms")) > 0 and row[3] in ("met |", "missed |") for row in starts)


def test_target_row_is_met_only_when_every_figure_is_within_the_bound() -> None:
    common = _bench_module("common")
    assert common.target_row("x", [1.2, 1.3], 1.3) == ["x", "1.20× / 1.30×", "≤ 1.3×", "met"]
    assert common.target_row("x", [1.2, 1.31], 1.3)[3] == "missed"


def test_the_targets_reference_checks_fail_for_other_gradients() -> None:
    """The NaN-safe variants are compared with double-where references that agree with them."""
    bench = _bench_module("bench_targets")
    v = bench.rotations(16)
    bench.check("rodrigues", bench.rodrigues_double_where, bench.rodrigues_double_where, v)
    with pytest.raises(SystemExit, match="bench_targets: the plain body computes other values"):
        bench.check("the plain body", bench.rodrigues, bench.rodrigues_double_where, v)
    p = bench.probabilities(8)
    with pytest.raises(SystemExit, match="bench_targets: the plain entropy computes other values"):
        bench.check("the plain entropy", bench.entropy, bench.entropy_double_where, p)


def test_profile_call_prints_every_phase_the_floors_and_the_kernels() -> None:
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "profile_call.py"), "--calls", "20"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    phases = [line.split(" | ")[0][2:] for line in done.stdout.splitlines() if line.startswith("| f")
              or line.startswith("| backward")]
    assert phases == ["forward, ops", "forward, entry", "forward, open", "forward, walk",
                      "forward, hook install", "backward, engine", "backward, hook", "forward + backward"]
    floors = [line.split(" | ")[0][2:] for line in done.stdout.splitlines() if line.startswith("| group")]
    assert floors == ["group, rules on", "group, hook that returns None", "group, no hook installed",
                      "group, rules on, once torch._dynamo is imported"]
    by_hand = [line.split(" | ")[0][2:] for line in done.stdout.splitlines() if line.startswith("| by hand")]
    assert by_hand == ["by hand (lean_group.py): walk, hook, compare, fill",
                       "by hand, with the bookkeeping the library keeps"]
    assert "| the library's instance, site hook and counts, opened and hooked by hand |" in done.stdout
    assert done.stdout.count("| NaN-safe, (") == 4


def test_the_hand_written_groups_give_the_norms_gradient() -> None:
    """profile_call's floors are worth comparing only if lean_group's rule sites do the rule's work:
    the gradient of the norm, 0 at the zero row, where the plain composite gives NaN."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import bench_targets
        import lean_group
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    x = bench_targets.vectors()
    want = torch.autograd.grad(bench_targets.norm3_reference(x).sum(), x)[0]
    with ag.registry_scope():
        ag.register_rule("bench.norm3", ag.Subgradient(op="sqrt", when="result == 0", grad=0))
        for fn in (lean_group.bare, lean_group.kept, lean_group.express):
            got = torch.autograd.grad(fn(x).sum(), x)[0]
            torch.testing.assert_close(got, want)
    assert torch.autograd.grad(bench_targets.norm3(x).sum(), x)[0].isnan().any()


def test_bench_nan_safe_prints_each_issue_30_target_with_met_or_missed() -> None:
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_nan_safe.py"), "--repeats", "1"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    rows = [line.split(" | ") for line in done.stdout.splitlines() if line.startswith("| ") and "≤" in line]
    assert [row[0].split(",")[0] for row in rows] == [
        "| NaN-safe Rodrigues vs hand double where", "| NaN-safe entropy vs hand double where",
        "| slerp with nested ops.atan2 and ops.vector_norm vs hand", "| extra ATen ops over hand",
        "| 3-op subgradient group vs plain"]
    assert all(row[3].strip(" |") in ("met", "missed") for row in rows)


def test_bench_doctor_runs_its_rows() -> None:
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_doctor.py"), "--repeats", "1",
                           "--block", "1"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    rows = [line for line in done.stdout.splitlines() if line.startswith("| doctor's")]
    assert [row.split(" | ")[0] for row in rows] == [
        "| doctor's trigger per backward / plain step, batch 64 / batch 256 / quickstart MLP",
        "| doctor's instrumented step / plain step, batch 64 / batch 256 / quickstart MLP"]
    floor = [line for line in done.stdout.splitlines() if line.startswith("| reading")]
    assert [row.split(" | ")[0] for row in floor] == [
        "| reading the loss and every gradient once after the backward / plain step, batch 64 / batch 256 / "
        "quickstart MLP"]


def test_bench_region_runs_its_rows() -> None:
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_region.py"), "--quick",
                           "--repeats", "1"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    rows = [line.split(" | ")[0] for line in done.stdout.splitlines() if line.startswith("| ")][2:]
    assert rows == [
        "| Rodrigues, compile=True group / hand double-where eager, batch 64",
        "| Rodrigues, compile=True group / hand double-where eager, batch 4096",
        "| Rodrigues, compile=True group / hand double-where eager, batch 65536",
        "| entropy (4096, 64), compile=True group / hand eager",
        "| compile=True group / plain torch.compile of the hand code, Rodrigues 64 / 4096 / 65536, entropy",
        "| tiny 3-op compile=True group per call / plain compiled function of the body",
        "| saved bytes, compile=True group / hand eager: Rodrigues, entropy, ops.cdist"]

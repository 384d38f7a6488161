"""The core benchmark runs, and its variants compute the gradients they are compared on.

Timings are not asserted here (a shared machine is too noisy for that): ``make bench`` reports them.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

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
    with pytest.raises(SystemExit, match="bench_core: plain computes other gradients than the group"):
        bench_core.same_gradients({"group": bench_core.example.grouped_cdist,
                                   "plain": bench_core.example.euclidean_cdist}, x1, x2)

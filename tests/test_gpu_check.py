"""scripts/gpu_check.py: skips cleanly without CUDA, and its checks pass when run on the CPU."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_check.py"


def test_without_cuda_it_says_so_and_exits_0() -> None:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, env=env,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == ("gpu_check: no CUDA device here (torch.cuda.is_available() is False): "
                                   "nothing checked.")


def _load() -> Any:
    """benchmarks/gpu_check.py as a module."""
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    assert spec is not None and spec.loader is not None
    gpu_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_check)
    return gpu_check


def test_the_checks_pass_on_the_cpu(capsys: pytest.CaptureFixture[str]) -> None:
    gpu_check = _load()
    try:
        assert gpu_check.main(["--device", "cpu", "--repeat", "1", "--scale", "16"]) == 0
    finally:
        # Its compiled variants keep their group instances in Dynamo's cache, which the leak
        # checks of tests/test_memory.py would count if they ran next on this worker.
        torch._dynamo.reset()
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| ") and line.endswith(" | ok |")]
    assert len(rows) == 2 * len(gpu_check.ops_cases.CASES)
    flag_checks, kinds = 5, 3
    assert out.count("- ok  ") == flag_checks + len(gpu_check.ops_cases.CASES) + kinds and "FAIL" not in out
    assert "| cdist (64, 64, 64), p=2 |" in out
    compiled = [line for line in out.splitlines() if line.startswith("| (") and "N, M, D" not in line]
    assert [line.split(" | ")[0] for line in compiled] == ["| (4, 4, 3)", "| (64, 64, 16)", "| (64, 64, 64)"]
    assert out.rstrip().endswith("All checks passed.")
    section = out.split("## NaN-safe groups", 1)[1].split("\n## ", 1)[0]
    nan_safe = [line for line in section.splitlines()
                if line.startswith(("| Rodrigues, batch", "| entropy, ("))]
    assert len(nan_safe) == len(gpu_check.RODRIGUES_BATCHES) + len(gpu_check.ENTROPY_ROWS)
    assert not any("FAIL" in line for line in nan_safe)
    regions = out.split("## Compiled groups", 1)[1]
    assert len([line for line in regions.splitlines() if line.startswith("| Rodrigues, batch")]) == \
        len(gpu_check.RODRIGUES_BATCHES)


def test_the_nan_safe_table_alone_for_a_short_device_run(capsys: pytest.CaptureFixture[str]) -> None:
    gpu_check = _load()
    assert gpu_check.main(["--device", "cpu", "--repeat", "1", "--scale", "4096", "--only", "nan-safe"]) == 0
    out = capsys.readouterr().out
    rows = [line.split(" | ") for line in out.splitlines() if line.startswith(("| Rodrigues", "| entropy"))]
    assert len(rows) == 8 and all(float(row[4]) > 0 and float(row[5].strip(" |")) > 0 for row in rows)
    assert "## Built-ins" not in out and out.rstrip().endswith("All checks passed.")


def test_the_compiled_groups_table_alone_for_a_short_device_run(capsys: pytest.CaptureFixture[str]) -> None:
    gpu_check = _load()
    try:
        assert gpu_check.main(["--device", "cpu", "--repeat", "1", "--scale", "4096", "--only",
                               "region"]) == 0
    finally:
        torch._dynamo.reset()
    out = capsys.readouterr().out
    rows = [line.split(" | ") for line in out.splitlines() if line.startswith("| Rodrigues")]
    assert len(rows) == len(gpu_check.RODRIGUES_BATCHES)
    assert all(len(row) == 6 and float(row[-1].strip(" |")) > 0 for row in rows)
    assert out.rstrip().endswith("All checks passed.")

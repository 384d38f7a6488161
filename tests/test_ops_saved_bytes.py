"""What the built-ins keep for their backward: no more than the bounds of docs/builtins.md#memory.

Saved bytes are deterministic, so they are asserted here (their timings live in the benchmarks):
``benchmarks/common.py``'s ``saved_bytes`` counts the distinct storages that the saved-tensor hooks
see, and every row of ``benchmarks/bench_ops.py`` carries its documented bound.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import torch

import autograd_groups as ag

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import bench_ops  # noqa: E402
from common import saved_bytes  # noqa: E402

sys.path.remove(str(ROOT / "benchmarks"))


@pytest.mark.parametrize("bench", bench_ops.BENCHES, ids=lambda b: b.name)
def test_every_builtin_keeps_at_most_its_documented_bound(bench: bench_ops.Bench) -> None:
    inputs = bench_ops.inputs_of(bench)
    assert bench_ops.saved_ratio(bench.ours, bench.native, inputs, bench.kwargs) <= bench.saved


def test_the_bounds_are_the_ones_docs_builtins_lists() -> None:
    text = (ROOT / "docs" / "builtins.md").read_text()
    section = text[text.index("## Memory"):]
    listed = dict(re.findall(r"^\| `([^`]+)` \|.*?\| ≤ ([0-9.]+)× \|", section, re.MULTILINE))
    assert listed == {b.name: f"{b.saved:g}" for b in bench_ops.BENCHES}


def _cdist_points(n: int, m: int, d: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randn(n, d, generator=g).requires_grad_(), torch.randn(m, d, generator=g).requires_grad_()


@pytest.mark.parametrize("size", [(1024, 1024, 64), (4096, 4096, 16)], ids=str)
def test_cdist_matmul_form_keeps_one_distance_matrix(size: tuple[int, int, int]) -> None:
    """torch.cdist keeps x1, x2 and its result; ops.cdist keeps those and ATen's two concatenated
    operands, ``(rows, columns + 2)`` each, but no second ``N x M`` matrix (the unclamped squares)."""
    n, m, d = size
    x1, x2 = _cdist_points(n, m, d)
    native = saved_bytes(torch.cdist, x1, x2)
    assert native == 4 * (n * d + m * d + n * m)
    assert saved_bytes(ag.ops.cdist, x1, x2) == native + 4 * (n + m) * (d + 2)
    assert saved_bytes(ag.ops.cdist, x1, x2) / native <= 1.3  # issue 23's bound


MOMENTS = {"std": (ag.ops.std, torch.std), "var": (ag.ops.var, torch.var),
           "logsumexp": (ag.ops.logsumexp, torch.logsumexp)}


@pytest.mark.parametrize("name", list(MOMENTS))
@pytest.mark.parametrize("dim", [-1, 0, (0, 2)], ids=str)
@pytest.mark.parametrize("keepdim", [False, True])
def test_std_var_logsumexp_keep_at_most_native_plus_their_output(name: str, dim, keepdim: bool) -> None:
    ours, native = MOMENTS[name]
    x = torch.randn(6, 5, 4, requires_grad=True)
    out = ours(x, dim, keepdim=keepdim)
    native_bytes = saved_bytes(native, x, dim, keepdim=keepdim)
    assert saved_bytes(ours, x, dim, keepdim=keepdim) <= native_bytes + out.numel() * out.element_size()


@pytest.mark.slow
@pytest.mark.xdist_group("compile")
def test_compiled_cdist_keeps_what_compiled_torch_cdist_keeps() -> None:
    x1, x2 = _cdist_points(1024, 1024, 64)
    ours = torch.compile(ag.ops.cdist, fullgraph=True)
    native = torch.compile(torch.cdist, fullgraph=True)
    assert saved_bytes(ours, x1, x2) == saved_bytes(native, x1, x2) == 4 * (2 * 1024 * 64 + 1024 * 1024)

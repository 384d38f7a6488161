"""The torch.compile benchmark: a group with its rule, compiled, against what a user would write.

    python benchmarks/bench_compile.py [--repeats N] [--sizes small|all]

For the Euclidean cdist(x1[N, D], x2[M, D]) of examples/cdist.py, forward + backward, float32, CPU,
with 1/8 of the rows of x2 equal to rows of x1 (so the rule fires), it times side by side, in one
process and interleaved: the plain composite, the group with its rule, a hand-written
autograd.Function with the same subgradient, and torch.cdist, each eager and compiled with inductor
(``fullgraph=True``, static shapes), and the compiled group with special cases off. Every variant
with the rule is checked to give the group's gradients first.
"""

from __future__ import annotations

import argparse
import platform
import sys
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_core import HandWrittenCdist, example, points, same_gradients, step  # noqa: E402
from common import interleaved_medians, markdown_table  # noqa: E402

SIZES = [(4, 4, 3), (64, 64, 16), (1024, 1024, 64)]
#: target ratio per (N, M, D), None where the issue sets none.
TARGETS: dict[str, dict[int, float | None]] = {
    "c.group / c.Function": {4: None, 64: 1.15, 1024: 1.05},
    "c.group / e.Function": {4: None, 64: None, 1024: 0.70},
    "c.group / c.plain": {4: 1.05, 64: 1.05, 1024: 1.05},
    "c.off / c.plain": {4: 1.02, 64: 1.02, 1024: 1.02},
}


def compiled(fn: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    return torch.compile(fn, fullgraph=True, dynamic=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--repeats", type=int, default=0, help="default: 300 small, 100 middle, 15 large")
    parser.add_argument("--sizes", choices=["small", "all"], default="all",
                        help="small: only (4, 4, 3), for a quick check")
    args = parser.parse_args()
    example.register()
    torch._dynamo.config.cache_size_limit = 64
    rows = []
    for size in SIZES if args.sizes == "all" else SIZES[:1]:
        x1, x2 = points(*size)
        eager = {"plain": example.euclidean_cdist, "group": example.grouped_cdist,
                 "Function": HandWrittenCdist.apply, "torch.cdist": torch.cdist}
        # One compiled function per variant, so that each keeps its own graph.
        built = {name: compiled(fn) for name, fn in eager.items()}
        off = compiled(example.grouped_cdist)
        # Compiled kernels sum in another order: float32 rounding, relative to the largest entry.
        scale = float(torch.autograd.grad(example.grouped_cdist(x1, x2).sum(), x1)[0].abs().max())
        same_gradients({"group": example.grouped_cdist, "c.group": built["group"],
                        "c.Function": built["Function"], "torch.cdist": torch.cdist}, x1, x2,
                       rtol=1e-4, atol=1e-5 * scale)
        variants = {f"e.{name}": step(fn, x1, x2) for name, fn in eager.items()}
        variants |= {f"c.{name}": step(fn, x1, x2) for name, fn in built.items()}
        variants["c.off"] = step(off, x1, x2, enabled=False)
        repeats = args.repeats or {4: 300, 64: 100, 1024: 15}[size[0]]
        medians = interleaved_medians(variants, repeats)
        ratios = {key: medians[key.split(" / ")[0]] / medians[key.split(" / ")[1]] for key in TARGETS}
        cells = []
        for key, ratio in ratios.items():
            target = TARGETS[key][size[0]]
            verdict = "" if target is None else f" (≤ {target}: {'met' if ratio <= target else 'MISSED'})"
            cells.append(f"{ratio:.2f}{verdict}")
        rows.append([str(size), str(repeats), *(f"{medians[k] * 1e6:.0f}" for k in variants), *cells])
        header_times = [f"{name} µs" for name in variants]
    print(f"torch {torch.__version__}, {platform.processor() or platform.machine()}, "
          f"{torch.get_num_threads()} threads, float32, forward + backward, medians "
          f"(e. eager, c. compiled with inductor)")
    print(markdown_table(["(N, M, D)", "reps", *header_times, *TARGETS], rows))


if __name__ == "__main__":
    main()

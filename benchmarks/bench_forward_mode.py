"""What forward mode costs through a group of subgradient rules: by its rule sites (PyTorch's own
tangents but at the rule-site calls, the route such a group takes), transposed whole (the route of a
NaN-safe or override group, forced here on the same group), and the plain function without a group.

    python benchmarks/bench_forward_mode.py [--repeats N]

Medians of N runs (default 20), one thread, float64, at ordinary points (no rule fires).
"""

from __future__ import annotations

import argparse
import platform
import sys
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
from torch.func import jacfwd, jvp

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import markdown_table, median_time  # noqa: E402

import autograd_groups as ag  # noqa: E402
from autograd_groups.sites import forward_sites  # noqa: E402

F64 = torch.float64


def _sinc_of_length(v: torch.Tensor) -> torch.Tensor:
    return torch.sinc(v.pow(2).sum(-1, keepdim=True).sqrt()) * v


def _distances(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return ((x[:, None] - y[None]) ** 2).sum(-1).clamp_min(0).sqrt()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    torch.set_num_threads(1)
    warnings.simplefilter("ignore", ag.RuleWarning)
    rule = ag.Subgradient(op="sqrt", when="result == 0", grad=0)
    ag.register_rule("bench.sinc_of_length", rule)
    ag.register_rule("bench.distances", rule)
    sinc_of_length = ag.autograd_group("bench.sinc_of_length")(_sinc_of_length)
    distances = ag.autograd_group("bench.distances")(_distances)
    v = torch.tensor([0.3, -0.2, 0.4], dtype=F64)
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(32, 3, generator=generator, dtype=F64)
    y = torch.randn(32, 3, generator=generator, dtype=F64) + 3.0
    t = torch.randn(32, 3, generator=generator, dtype=F64)

    def rbf(d: Callable[..., torch.Tensor]) -> Callable[[torch.Tensor], torch.Tensor]:
        return lambda p: torch.exp(-d(p, y) ** 2).sum()

    cases: list[tuple[str, Callable[..., object], Callable[..., object], Callable[[], object]]] = [
        ("length-scaled sinc, v in R^3, jacfwd", _sinc_of_length,
         lambda: jacfwd(sinc_of_length)(v), lambda: jacfwd(_sinc_of_length)(v)),
        ("RBF kernel of pairwise distances, 32 x 3 points, jvp", _distances,
         lambda: jvp(rbf(distances), (x,), (t,)), lambda: jvp(rbf(_distances), (x,), (t,))),
    ]
    rows = []
    for name, inner, grouped, plain in cases:
        grouped()  # warm-up: the first call of each function reads the nodes it makes
        by_sites = median_time(grouped, args.repeats)
        forward_sites._whole.add(inner)
        try:
            grouped()
            whole = median_time(grouped, args.repeats)
        finally:
            forward_sites._whole.discard(inner)
        bare = median_time(plain, args.repeats)
        rows.append([name, f"{by_sites * 1e3:.2f} ms", f"{whole * 1e3:.2f} ms", f"{bare * 1e3:.2f} ms"])
    print(markdown_table(["case", "by its rule sites", "transposed whole", "no group"], rows))
    print(f"\ntorch {torch.__version__}, {platform.processor() or platform.machine()}, 1 thread, "
          f"median of {args.repeats}")


if __name__ == "__main__":
    main()

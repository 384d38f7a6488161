"""Issue 28's cost of the second-order check: the first time a second derivative flows through a
fired rule at a call site, the group is run again and checked as ``ag.verify(order=2)`` does.

    python benchmarks/bench_second_order.py [--repeats N]

Per case: the Hessian the first time at a call site (with the check), again at the same site (the
verdict kept), and their difference, the check; what keeping a group's call for it costs at each
forward (a call of a one-op group with and without it); and, inside a torch.func transform, what
looking for the function it differentiates costs per call. Medians of N runs (default 5), one thread.
"""

from __future__ import annotations

import argparse
import platform
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.func import hessian, jacrev

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import markdown_table, median_time, once_per_call_site  # noqa: E402

import autograd_groups as ag  # noqa: E402
from autograd_groups.sites import second_order  # noqa: E402

F64 = torch.float64


def _cases() -> dict[str, Callable[[], torch.Tensor]]:
    ag.register_rule("bench.length", ag.Subgradient(op="sqrt", when="result == 0", grad=0))
    length = ag.autograd_group("bench.length")(lambda v: (v * v).sum().sqrt())
    ag.register_rule("bench.softplus", ag.NanSafe())
    softplus = ag.autograd_group("bench.softplus")(
        lambda x: torch.where(x < 20, torch.log1p(torch.exp(x)), x))
    points = torch.randn(16, 3, generator=torch.Generator().manual_seed(0), dtype=F64)

    def axis_angle(q: torch.Tensor) -> torch.Tensor:
        # 2 v atan2(|v|, w) / |v|, with a sinc whose double backward is finite at 0.
        half = ag.ops.atan2(ag.ops.vector_norm(q[1:], dim=-1, keepdim=True), q[:1])
        small = half.abs() < 1e-3
        safe = torch.where(small, torch.ones_like(half), half)
        sinc = torch.where(small, 1 - half**2 / 6, torch.sin(safe) / safe)
        return q[1:] * 2 * torch.cos(half) / (q[:1] * sinc)

    wide = torch.linspace(-5, 1000, 64, dtype=F64)
    return {
        "cos of the length of v, v in R^3, jacrev(jacrev)": lambda: jacrev(jacrev(
            lambda v: torch.cos(length(v))))(torch.zeros(3, dtype=F64)),
        "RBF kernel of ops.cdist, 16 x 3 points, hessian": lambda: hessian(
            lambda p: torch.exp(-ag.ops.cdist(p, points) ** 2).sum())(points),
        "NaN-safe softplus, 64 elements, hessian": lambda: hessian(lambda x: softplus(x).sum())(wide),
        # The group's own inputs cannot decide (|v| at 0): checked through the function differentiated.
        "quaternion to axis-angle at the identity, hessian": lambda: hessian(axis_angle)(
            torch.tensor([1.0, 0.0, 0.0, 0.0], dtype=F64)),
    }


def _forget() -> None:
    """Make every call site a new one, as far as the check knows."""
    second_order._verdicts.clear()


def _inside(transform: Callable[[Callable[[torch.Tensor], torch.Tensor]], Callable[[torch.Tensor], Any]],
            double: Callable[[torch.Tensor], torch.Tensor], repeats: int) -> tuple[float, float]:
    """Seconds per call of ``double`` inside ``transform``, with and without looking for the function
    it differentiates (done at each call of a group with rules where two or more transforms that
    differentiate are open)."""
    calls = 500

    def of(x: torch.Tensor) -> torch.Tensor:
        for _ in range(calls):
            double(x)
        return x.sum()

    def forward() -> None:
        transform(of)(torch.ones(8))

    looked = median_time(forward, repeats) / calls
    real = second_order.enclosing
    second_order.enclosing = lambda: None  # type: ignore[assignment]
    try:
        bare = median_time(forward, repeats) / calls
    finally:
        second_order.enclosing = real
    return looked, bare


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    warnings.simplefilter("ignore", ag.SecondOrderWarning)
    print(once_per_call_site(_cases(), _forget, args.repeats))

    ag.register_rule("bench.double", ag.NanSafe())
    double = ag.autograd_group("bench.double")(lambda x: x * 2)
    x = torch.ones(8, requires_grad=True)
    calls = 20000

    def forward() -> None:
        for _ in range(calls):
            double(x)

    kept = median_time(forward, args.repeats) / calls
    real = second_order.remember
    second_order.remember = lambda fn, args, kwargs: None  # type: ignore[assignment,return-value]
    try:
        bare = median_time(forward, args.repeats) / calls
    finally:
        second_order.remember = real
    print()
    print(markdown_table(["one-op group, forward only", "with its call kept", "without", "difference"],
                         [["per call", f"{kept * 1e6:.2f} µs", f"{bare * 1e6:.2f} µs",
                           f"{(kept - bare) * 1e6:.2f} µs"]]))
    inside = {"jacrev": jacrev, "jacrev(jacrev)": lambda f: jacrev(jacrev(f))}
    rows = []
    for name, transform in inside.items():
        looked, bare = _inside(transform, double, args.repeats)
        rows.append([name, f"{looked * 1e6:.2f} µs", f"{bare * 1e6:.2f} µs",
                     f"{(looked - bare) * 1e6:.2f} µs"])
    print()
    print(markdown_table(["one-op group inside", "with the function looked for", "without", "difference"],
                         rows))
    print(f"\ntorch {torch.__version__}, {platform.processor() or platform.machine()}, 1 thread, "
          f"median of {args.repeats}")


if __name__ == "__main__":
    main()

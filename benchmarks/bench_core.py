"""Issue 2's benchmark: what a group with one subgradient rule costs, on the cdist example.

    python benchmarks/bench_core.py [--repeats N]

For cdist(x1[N, D], x2[M, D]) forward + backward, float32, CPU, with some identical rows so the rule
fires, it times side by side: the plain composite, the group with special cases off, the group with
its rule on, a hand-written autograd.Function with the same subgradient, and the floor of the design
(the same node walk and post-hook with none of the library's bookkeeping); and it counts the bytes
of saved tensors with the rule on and off.
"""

from __future__ import annotations

import argparse
import platform
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))

import cdist as example  # noqa: E402
from common import interleaved_medians, markdown_table, saved_bytes  # noqa: E402
from lean_group import fill_at_sqrt  # noqa: E402

import autograd_groups as ag  # noqa: E402

SIZES = [(4, 4, 3), (1024, 1024, 64)]
TARGETS = {"off / plain": (1.02, 1.02), "on / off": (1.25, 1.15)}


class HandWrittenCdist(torch.autograd.Function):
    """The Euclidean cdist with a hand-written backward and PyTorch's subgradient at distance 0."""

    @staticmethod
    def forward(ctx, x1: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        result = example.euclidean_cdist(x1, x2)
        ctx.save_for_backward(x1, x2, result)
        return result

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # type: ignore[override]
        x1, x2, result = ctx.saved_tensors
        ratio = (grad / result).masked_fill_(result == 0, 0)
        grad_x1 = x1 * ratio.sum(-1, keepdim=True) - ratio @ x2
        grad_x2 = x2 * ratio.sum(-2).unsqueeze(-1) - ratio.transpose(-2, -1) @ x1
        return grad_x1, grad_x2


def floor_cdist(x1: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:
    """The least a post-hook design costs: the walk to the ``sqrt`` and one hook filling the
    gradient in place; no flag, counters, claims, rule lookup or expression."""
    start = torch._C._autograd._get_sequence_nr()
    return fill_at_sqrt(example.euclidean_cdist(x1, x2), start)


def same_gradients(variants: dict, x1: torch.Tensor, x2: torch.Tensor, rtol: float = 1e-4,
                   atol: float = 1e-5) -> None:
    """Every timed variant with the rule computes the same gradients (and no NaN)."""
    want = None
    for name, fn in variants.items():
        got = torch.autograd.grad(fn(x1, x2).sum(), (x1, x2))
        if want is None:
            want = got
        for g, w in zip(got, want):
            if g.isnan().any() or not torch.allclose(g, w, rtol=rtol, atol=atol):
                raise SystemExit(f"bench_core: {name} computes other gradients than the group")


def points(n: int, m: int, d: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x1 = torch.randn(n, d, generator=g)
    x2 = torch.randn(m, d, generator=g)
    x2[: max(1, min(n, m) // 8)] = x1[: max(1, min(n, m) // 8)]
    return x1.requires_grad_(), x2.requires_grad_()


def step(fn, x1: torch.Tensor, x2: torch.Tensor, enabled: bool = True):
    def run() -> None:
        x1.grad = x2.grad = None
        with ag.special_cases(enabled):
            out = fn(x1, x2)
        out.sum().backward()

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--repeats", type=int, default=0, help="default: 400 small, 25 large")
    args = parser.parse_args()
    example.register()
    torch.manual_seed(0)
    rows = []
    for size in SIZES:
        x1, x2 = points(*size)
        repeats = args.repeats or (400 if size[0] < 100 else 25)
        same_gradients({"group": example.grouped_cdist, "custom": HandWrittenCdist.apply,
                        "floor": floor_cdist}, x1, x2)
        medians = interleaved_medians({
            "plain": step(example.euclidean_cdist, x1, x2),
            "off": step(example.grouped_cdist, x1, x2, enabled=False),
            "on": step(example.grouped_cdist, x1, x2),
            "custom": step(HandWrittenCdist.apply, x1, x2),
            "floor": step(floor_cdist, x1, x2),
        }, repeats)
        ratios = {"off / plain": medians["off"] / medians["plain"],
                  "on / off": medians["on"] / medians["off"],
                  "on / custom Function": medians["on"] / medians["custom"],
                  "floor / off": medians["floor"] / medians["off"]}
        with ag.special_cases(False):
            off_bytes = saved_bytes(example.grouped_cdist, x1, x2)
        memory = saved_bytes(example.grouped_cdist, x1, x2) / off_bytes
        big = size[0] >= 100
        rows.append([str(size), f"{repeats}"] + [f"{medians[k] * 1e6:.1f}" for k in medians]
                    + [f"{ratios[k]:.3f}" + (f" (≤ {TARGETS[k][big]})" if k in TARGETS else "")
                       for k in ratios]
                    + [f"{memory:.2f} (≤ 1.00)"])
    header = ["(N, M, D)", "reps", "plain µs", "off µs", "on µs", "custom µs", "floor µs", "off / plain",
              "on / off", "on / custom Function", "floor / off", "saved bytes on / off"]
    print(f"torch {torch.__version__}, {platform.processor() or platform.machine()}, "
          f"{torch.get_num_threads()} threads, float32, forward + backward, medians")
    print(markdown_table(header, rows))


if __name__ == "__main__":
    main()

"""The Euclidean cdist of PyTorch's Distance.cpp, written from primitive ops, as group ``cdist``.

Its backward is NaN for every pair of identical points (``sqrt'(0) = inf``) up to torch 2.14. One
rule fixes that: at the group's ``sqrt``, where ``result == 0``, the gradient is 0 -- PyTorch's own
subgradient. From torch 2.15, ``clamp_min``'s backward passes 0 at its boundary, which hides the NaN
where the squared distance is exactly 0 (the table then shows no NaN for the plain composite); the
direct form ``sqrt(sum((x1 - x2)²))`` is NaN there on every release.

    python examples/cdist.py            # the table: plain -> NaN, grouped -> finite, flag off -> NaN
"""

from __future__ import annotations

import argparse
import time

import torch
from rich.console import Console
from rich.table import Table

import autograd_groups as ag


def euclidean_cdist(x1: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:
    """``euclidean_dist_out`` of aten/src/ATen/native/Distance.cpp, op for op."""
    x1_norm = x1.pow(2).sum(-1, keepdim=True)
    x1_pad = torch.ones_like(x1_norm)
    x2_norm = x2.pow(2).sum(-1, keepdim=True)
    x2_pad = torch.ones_like(x2_norm)
    x1_ = torch.cat([x1.mul(-2), x1_norm, x1_pad], -1)
    x2_ = torch.cat([x2, x2_pad, x2_norm], -1)
    result = x1_.matmul(x2_.transpose(-2, -1))
    return result.clamp_min(0).sqrt()


grouped_cdist = ag.autograd_group("cdist")(euclidean_cdist)
SQRT_AT_ZERO = ag.Subgradient(op="sqrt", when="result == 0", grad=0,
                              doc="distance 0: PyTorch's cdist gives gradient 0 there")


def register() -> None:
    """Register the cdist group's rule (once)."""
    if SQRT_AT_ZERO not in ag.list_rules().get("cdist", ()):
        ag.register_rule("cdist", SQRT_AT_ZERO)


def _points(n: int, m: int, d: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x1 = torch.randint(-4, 5, (n, d), generator=g).double()
    x2 = torch.randint(-4, 5, (m, d), generator=g).double()
    x2[: min(n, m) // 2] = x1[: min(n, m) // 2]  # identical rows: distance exactly 0
    return x1.requires_grad_(), x2.requires_grad_()


def _run(fn, x1: torch.Tensor, x2: torch.Tensor, repeat: int) -> tuple[torch.Tensor, float]:
    times = []
    for _ in range(repeat):
        x1.grad = None
        start = time.perf_counter()
        fn(x1, x2).sum().backward()
        times.append(time.perf_counter() - start)
    assert x1.grad is not None
    return x1.grad.clone(), sorted(times)[len(times) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--size", type=int, nargs=3, default=(256, 256, 16), metavar=("N", "M", "D"))
    parser.add_argument("--repeat", type=int, default=21)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    register()
    x1, x2 = _points(*args.size, args.seed)
    native = lambda a, b: torch.cdist(a, b, compute_mode="donot_use_mm_for_euclid_dist")  # noqa: E731
    reference, t_native = _run(native, x1, x2, args.repeat)
    variants = [("plain composite", euclidean_cdist, True), ("group cdist, rules on", grouped_cdist, True),
                ("group cdist, special cases off", grouped_cdist, False)]
    table = Table(title=f"d/dx1 of cdist(x1[{args.size[0]},{args.size[2]}], x2[{args.size[1]},"
                        f"{args.size[2]}]).sum(), {args.size[0] // 2} identical rows")
    # Headers on two lines keep the table within 80 columns, every variant's name on one line.
    for column in ("variant", "NaN in\nx1.grad", "equals\ntorch.cdist", "median\nfwd+bwd"):
        table.add_column(column)
    table.add_row("torch.cdist (native)", "0", "-", f"{t_native * 1e3:.2f} ms")
    for label, fn, enabled in variants:
        with ag.special_cases(enabled):
            grad, seconds = _run(fn, x1, x2, args.repeat)
        nans = int(grad.isnan().sum())
        same = torch.allclose(grad, reference, equal_nan=False)
        table.add_row(label, f"[red]{nans}[/]" if nans else "0",
                      "[green]yes[/]" if same else "[red]no[/]", f"{seconds * 1e3:.2f} ms")
    Console().print(table)


if __name__ == "__main__":
    main()

"""The cost of the first-order check of users' rules: the first time a user's subgradient or NaN-safe
rule fires in the first backward pass at a call site, the group is run again and checked as
``ag.verify`` does.

    python benchmarks/bench_first_order.py [--repeats N]

Per case: a backward pass the first time the rule fires at a call site (with the check), again at
the same site (nothing read), and their difference, the check. Then what the later passes cost: a
forward and backward of a one-op group whose rule never fires, at one call site, with the check on
and off. Medians of N runs
(default 5), one thread, in CPU time of the process (``time.process_time``): on a shared machine the
wall clock also counts the other processes' turns.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import markdown_table, median_time, once_per_call_site  # noqa: E402

import autograd_groups as ag  # noqa: E402
from autograd_groups.sites import first_order  # noqa: E402

F64 = torch.float64


def _hat(v: torch.Tensor) -> torch.Tensor:
    zero = torch.zeros((), dtype=v.dtype)
    return torch.stack([torch.stack([zero, -v[2], v[1]]), torch.stack([v[2], zero, -v[0]]),
                        torch.stack([-v[1], v[0], zero])])


def _cases() -> dict[str, Callable[[], None]]:
    ag.register_rule("bench.rodrigues", ag.Subgradient(op="sqrt", when="result == 0", grad=0))

    @ag.autograd_group("bench.rodrigues")
    def rodrigues(v: torch.Tensor) -> torch.Tensor:
        theta = (v * v).sum().sqrt()
        k = _hat(v / theta.clamp_min(1e-12))
        return torch.eye(3, dtype=v.dtype) + torch.sin(theta) * k + (1 - torch.cos(theta)) * (k @ k)

    ag.register_rule("bench.distance", ag.Subgradient(op="sqrt", when="result == 0", grad=0))
    distance = ag.autograd_group("bench.distance")(
        lambda a, b: ((a[:, None] - b[None]) ** 2).sum(-1).sqrt())
    ag.register_rule("bench.power", ag.NanSafe())
    power = ag.autograd_group("bench.power")(lambda x, y: torch.exp(y * torch.log(x)))
    points = torch.randn(16, 3, generator=torch.Generator().manual_seed(0), dtype=F64)
    x = torch.cat([torch.zeros(8, dtype=F64), torch.rand(56, dtype=F64)])

    def backward(f: Callable[..., torch.Tensor], *args: torch.Tensor) -> Callable[[], None]:
        def run() -> None:
            leaves = [a.clone().requires_grad_() for a in args]
            f(*leaves).sum().backward()
        return run

    return {
        "roma's Rodrigues at v = 0 (wrong: warns)": backward(rodrigues, torch.zeros(3, dtype=F64)),
        "distances of 16 x 3 points to themselves": backward(distance, points, points),
        "NaN-safe exp(y log x), 64 elements (wrong: warns)": backward(
            lambda a: power(a, torch.full_like(a, 2.0)), x),
    }


def _forget() -> None:
    """Make every call site a new one, as far as the check knows."""
    first_order._verdicts.clear()
    first_order._looked.clear()
    first_order._done.clear()


def _unfired(repeats: int) -> list[list[str]]:
    ag.register_rule("bench.lean", ag.Subgradient(op="sqrt", when="result == 0", grad=0))
    lean = ag.autograd_group("bench.lean")(lambda a: a.sqrt())
    x = torch.rand(64, dtype=F64) + 1  # no zero: the rule never fires

    def step() -> None:
        for _ in range(200):
            a = x.clone().requires_grad_()
            lean(a).sum().backward()

    rows = []
    for on in (True, False):
        ag.set_rule_checks(on)
        step()
        rows.append([f"check {'on' if on else 'off'}",
                     f"{median_time(step, repeats, time.process_time) / 200 * 1e6:.1f} µs"])
    ag.set_rule_checks(True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    warnings.simplefilter("ignore", ag.FirstOrderWarning)
    print(once_per_call_site(_cases(), _forget, args.repeats, time.process_time))
    print()
    print("A one-op group (sqrt of 64 elements) whose rule never fires: forward and backward, per call")
    print(markdown_table(["", "per call"], _unfired(args.repeats)))
    print(f"\ntorch {torch.__version__}, Python {platform.python_version()}, one thread")


if __name__ == "__main__":
    main()

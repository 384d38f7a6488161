"""Issue 30's targets: NaN-safe groups against the hand-written double ``where``, in a process that
has imported ``torch._dynamo``, and the ops and hooks they dispatch.

    python benchmarks/bench_nan_safe.py [--repeats N]

Timed rows (1 thread, float32, forward + backward, medians of interleaved runs; the group's ratio
to its reference): the Rodrigues rotation and the entropy of ``bench_targets.py`` against their
double-``where`` forms; slerp built from ``ops.atan2`` and ``ops.vector_norm`` inside a NaN-safe
group against the double-``where`` slerp with torch's own ``atan2`` and ``vector_norm``; and the
3-op subgradient group ``sqrt(sum(x * x))`` against its plain composite, measured before and after
``torch._dynamo`` is imported (the row gives the ratio of the two ratios).

Counted rows (op_counts.py, deterministic): the ATen ops one forward + backward dispatches and the
rule-site hooks it installs, group and hand, with the CPU value reads on and off (off is what a GPU
runs); the target is the group's extra ops over the hand's with the reads off.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_targets as bt  # noqa: E402
from common import markdown_table  # noqa: E402
from op_counts import count  # noqa: E402

import autograd_groups as ag  # noqa: E402

Fn = Callable[..., torch.Tensor]


def _slerp(p0: torch.Tensor, p1: torch.Tensor, t: torch.Tensor, atan2: Fn, norm: Fn,
           guard: bool) -> torch.Tensor:
    """Spherical interpolation of unit vectors, with the angle from ``atan2(|p0 x p1|, p0 . p1)``;
    ``guard`` keeps the sine away from 0 in the unselected branch (the double where)."""
    omega = atan2(norm(torch.linalg.cross(p0, p1), dim=-1, keepdim=True), (p0 * p1).sum(-1, keepdim=True))
    small = omega < 1e-4
    s = torch.sin(torch.where(small, 1.0, omega)) if guard else torch.sin(omega)
    a = torch.where(small, 1 - t, torch.sin((1 - t) * omega) / s)
    b = torch.where(small, t, torch.sin(t * omega) / s)
    return a * p0 + b * p1


def slerp(p0: torch.Tensor, p1: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """The NaN-safe group's body: built-in groups nested inside."""
    return _slerp(p0, p1, t, ag.ops.atan2, ag.ops.vector_norm, guard=False)


def slerp_double_where(p0: torch.Tensor, p1: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    return _slerp(p0, p1, t, torch.atan2, torch.linalg.vector_norm, guard=True)


def register() -> dict[str, Fn]:
    """The grouped variants, with their rules registered."""
    grouped = bt.register()
    ag.register_rule("bench.slerp", ag.NanSafe())
    return {**grouped, "slerp": ag.autograd_group("bench.slerp")(slerp)}


def endpoints(batch: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Unit vectors, 1/8 of the pairs equal (angle 0), and the interpolation parameter."""
    g = torch.Generator().manual_seed(0)
    p0 = torch.nn.functional.normalize(torch.randn(batch, 3, generator=g), dim=-1)
    p1 = torch.nn.functional.normalize(torch.randn(batch, 3, generator=g), dim=-1)
    p1[: max(1, batch // 8)] = p0[: max(1, batch // 8)]
    return p0, p1, torch.full((batch, 1), 0.3)


def _on_first(fn: Fn, *rest: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    return lambda x: fn(x, *rest)


def _checked(name: str, fn: Fn, reference: Fn, x: torch.Tensor) -> None:
    """Exit unless ``fn`` gives the reference's values and gradients (finite) at ``x``, to float32's
    rounding of the two formulas."""
    got_out, want_out = fn(x), reference(x)
    got = torch.autograd.grad(got_out, x, torch.ones_like(got_out))[0]
    want = torch.autograd.grad(want_out, x, torch.ones_like(want_out))[0]
    if not (got.isfinite().all() and torch.allclose(got_out, want_out, rtol=1e-4, atol=1e-5)
            and torch.allclose(got, want, rtol=1e-4, atol=1e-4)):
        raise SystemExit(f"bench_nan_safe: {name} computes other values or gradients than its reference")


def _row(what: str, figures: list[float], bounds: list[float], unit: str = "×", digits: int = 2) -> list[str]:
    status = "met" if all(f <= b for f, b in zip(figures, bounds)) else "missed"
    return [what, " / ".join(f"{f:.{digits}f}{unit}" for f in figures),
            " / ".join(f"≤ {b:g}{unit}" for b in bounds), status]


def _ratio(fn: Callable[[torch.Tensor], torch.Tensor], base: Callable[[torch.Tensor], torch.Tensor],
           x: torch.Tensor, repeats: int) -> float:
    return bt.ratio(fn, base, x, repeats)


def norm3_ratio(repeats: int) -> float:
    grouped = ag.autograd_group("bench.norm3")(bt.norm3)
    x = bt.vectors()
    bt.check("the 3-op group", grouped, bt.norm3_reference, x)
    return _ratio(grouped, bt.norm3, x, repeats)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--repeats", type=int, default=0, help="default: 1000 small, 60 large")
    args = parser.parse_args()
    torch.set_num_threads(1)

    def reps(large: bool) -> int:
        return args.repeats or (60 if large else 1000)

    grouped = register()
    without_dynamo = norm3_ratio(reps(False))
    importlib.import_module("torch._dynamo")  # every other row runs as in a process that compiles
    with_dynamo = norm3_ratio(reps(False))

    rows: list[list[str]] = []
    counted: list[list[str]] = []
    extra: dict[str, int] = {}
    for what, name, hand, small, large, bounds in (
            ("NaN-safe Rodrigues vs hand double where, batch 64 / 4096", "rodrigues",
             bt.rodrigues_double_where, bt.rotations(64), bt.rotations(4096), [1.3, 1.15]),
            ("NaN-safe entropy vs hand double where, (256, 64) / (4096, 64)", "entropy",
             bt.entropy_double_where, bt.probabilities(256), bt.probabilities(4096), [1.3, 1.1])):
        fn = grouped[name]
        for x in (small, large):
            _checked(what, fn, hand, x)
        rows.append(_row(what, [_ratio(fn, hand, small, reps(False)), _ratio(fn, hand, large, reps(True))],
                         bounds))
        for x in (small, large):
            on, off, by_hand = count(fn, x, True), count(fn, x, False), count(hand, x, False)
            counted.append([f"{name} {tuple(x.shape)}", f"{on.ops} ({on.views}) / {on.hooks}",
                            f"{off.ops} ({off.views}) / {off.hooks}", f"{by_hand.ops} ({by_hand.views})"])
            extra[name] = max(extra.get(name, 0), off.ops - by_hand.ops)

    p0, p1, t = endpoints(4096)
    nested, hand_slerp = _on_first(grouped["slerp"], p1, t), _on_first(slerp_double_where, p1, t)
    _checked("slerp", nested, hand_slerp, p0.requires_grad_())
    rows.append(_row("slerp with nested ops.atan2 and ops.vector_norm vs hand, batch 4096",
                     [_ratio(nested, hand_slerp, p0, reps(True))], [1.5]))
    on, off, by_hand = count(nested, p0, True), count(nested, p0, False), count(hand_slerp, p0, False)
    counted.append(["slerp (4096, 3)", f"{on.ops} ({on.views}) / {on.hooks}",
                    f"{off.ops} ({off.views}) / {off.hooks}", f"{by_hand.ops} ({by_hand.views})"])
    rows.append(_row("extra ATen ops over hand, value reads off: Rodrigues / entropy",
                     [extra["rodrigues"], extra["entropy"]], [10, 4], unit=" ops", digits=0))
    rows.append(_row("3-op subgradient group vs plain, torch._dynamo imported / not (ratio of the ratios; "
                     f"{with_dynamo:.2f}× / {without_dynamo:.2f}×)", [with_dynamo / without_dynamo], [1.1]))

    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread, float32, forward + backward, "
          f"medians of interleaved runs, torch._dynamo imported")
    print(markdown_table(["target", "figure", "bound", "status"], rows))
    print()
    print(markdown_table(["ATen ops (views) / hooks per forward + backward", "group, reads on (CPU)",
                          "group, reads off (GPU)", "hand double where"], counted))


if __name__ == "__main__":
    main()

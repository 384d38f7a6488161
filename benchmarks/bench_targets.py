"""Issue 23's per-call targets: what a NaN-safe group and a tiny group cost against the code they
replace.

    python benchmarks/bench_targets.py [--repeats N] [--only NAME]   (--only start: the three start rows)

Each row times two variants side by side (1 thread, float32, forward + backward, medians of
interleaved runs) and reports the ratio:

- entropy ``-(where(p > 0, p * log p, 0)).sum(-1)`` in a NaN-safe group against the hand-written
  double ``where`` (``log`` of ``where(p > 0, p, 1)``), (256, 64) and (4096, 64), 1/8 of p zero;
- the Rodrigues rotation matrix of an axis-angle vector (33 autograd nodes: ``theta = sqrt(sum v²)``,
  ``where``-guarded ``sin θ / θ`` and ``(1 - cos θ) / θ²``, skew matrices) in a NaN-safe group
  against the same body without a group, batch 64 and 4096, 1/8 of the vectors zero;
- the 3-op group ``sqrt(sum(x * x))`` on a (4, 3) tensor with its ``sqrt`` rule, against the plain
  composite, one row of x zero.

Three more rows time a new interpreter's start (medians of 5 fresh interpreters, after one that
writes the bytecode caches, as an installed package has them; CPU seconds of the process, which an
idle machine's clock would show and other processes cannot inflate): ``import autograd_groups``
after ``import torch``; that and ``ag.ops`` on first use (it loads the built-in spec); and the first
``ag.ops.cdist`` call with its backward. Each starts after a full garbage collection of what
``import torch`` left (tens of milliseconds, due at whatever allocates next: it is torch's, not this
package's).

Before timing, every variant's gradients are checked against a reference.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import TARGET_HEADER, interleaved_medians, markdown_table, target_row  # noqa: E402

import autograd_groups as ag  # noqa: E402


def entropy(p: torch.Tensor) -> torch.Tensor:
    return -(torch.where(p > 0, p * torch.log(p), 0.0)).sum(-1)


def entropy_double_where(p: torch.Tensor) -> torch.Tensor:
    positive = p > 0
    return -(torch.where(positive, p * torch.log(torch.where(positive, p, 1.0)), 0.0)).sum(-1)


def rodrigues(v: torch.Tensor) -> torch.Tensor:
    """The rotation matrix of the axis-angle vectors ``v`` (..., 3), with Taylor terms near 0."""
    theta2 = (v * v).sum(-1, keepdim=True)
    theta = torch.sqrt(theta2)
    small = theta2 < 1e-8
    a = torch.where(small, 1 - theta2 / 6, torch.sin(theta) / theta)
    b = torch.where(small, 0.5 - theta2 / 24, (1 - torch.cos(theta)) / theta2)
    return _rotation(v, a, b)


def _rotation(v: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``I + a K + b K²`` for the skew matrices ``K`` of ``v``."""
    x, y, z = v.unbind(-1)
    zero = torch.zeros_like(x)
    k = torch.stack([zero, -z, y, z, zero, -x, -y, x, zero], -1).reshape(*v.shape[:-1], 3, 3)
    return torch.eye(3, dtype=v.dtype, device=v.device) + a.unsqueeze(-1) * k + b.unsqueeze(-1) * (k @ k)


def rodrigues_double_where(v: torch.Tensor) -> torch.Tensor:
    """The reference: ``rodrigues`` with theta kept away from 0 in the unselected branches."""
    theta2 = (v * v).sum(-1, keepdim=True)
    small = theta2 < 1e-8
    theta = torch.sqrt(torch.where(small, 1.0, theta2))
    a = torch.where(small, 1 - theta2 / 6, torch.sin(theta) / theta)
    b = torch.where(small, 0.5 - theta2 / 24, (1 - torch.cos(theta)) / theta ** 2)
    return _rotation(v, a, b)


def norm3(x: torch.Tensor) -> torch.Tensor:
    return torch.sqrt((x * x).sum(-1))


def norm3_reference(x: torch.Tensor) -> torch.Tensor:
    return torch.linalg.vector_norm(x, dim=-1)


def register() -> dict[str, Callable[[torch.Tensor], torch.Tensor]]:
    """The grouped variants, with their rules registered."""
    ag.register_rule("bench.entropy", ag.NanSafe())
    ag.register_rule("bench.rodrigues", ag.NanSafe())
    ag.register_rule("bench.norm3", ag.Subgradient(op="sqrt", when="result == 0", grad=0))
    return {"entropy": ag.autograd_group("bench.entropy")(entropy),
            "rodrigues": ag.autograd_group("bench.rodrigues")(rodrigues),
            "norm3": ag.autograd_group("bench.norm3")(norm3)}


def probabilities(rows: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    p = torch.rand(rows, 64, generator=g)
    p[p < 0.125] = 0
    return (p / p.sum(-1, keepdim=True)).requires_grad_()


def rotations(batch: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    v = torch.randn(batch, 3, generator=g)
    v[: max(1, batch // 8)] = 0
    return v.requires_grad_()


def vectors() -> torch.Tensor:
    x = torch.randn(4, 3, generator=torch.Generator().manual_seed(0))
    x[0] = 0
    return x.requires_grad_()


def check(name: str, fn: Callable[[torch.Tensor], torch.Tensor],
          reference: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> None:
    """Exit unless ``fn`` gives the reference's values and gradients (finite) at ``x``."""
    got_out, want_out = fn(x), reference(x)
    got = torch.autograd.grad(got_out, x, torch.ones_like(got_out))[0]
    want = torch.autograd.grad(want_out, x, torch.ones_like(want_out))[0]
    if not (got.isfinite().all() and torch.allclose(got_out, want_out, atol=1e-6)
            and torch.allclose(got, want, rtol=1e-4, atol=1e-5)):
        raise SystemExit(f"bench_targets: {name} computes other values or gradients than its reference")


def step(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> Callable[[], None]:
    def run() -> None:
        x.grad = None
        out = fn(x)
        out.backward(torch.ones_like(out))

    return run


def ratio(fn: Callable[[torch.Tensor], torch.Tensor], base: Callable[[torch.Tensor], torch.Tensor],
          x: torch.Tensor, repeats: int) -> float:
    medians = interleaved_medians({"fn": step(fn, x), "base": step(base, x)}, repeats)
    return medians["fn"] / medians["base"]


Fn = Callable[[torch.Tensor], torch.Tensor]


def _nan_safe_row(what: str, grouped: Fn, base: Fn, reference: Fn, small: torch.Tensor,
                  large: torch.Tensor, reps: Callable[[bool], int]) -> list[str]:
    for x in (small, large):
        check(what, grouped, reference, x)
    figures = [ratio(grouped, base, small, reps(False)), ratio(grouped, base, large, reps(True))]
    return target_row(what, figures, 1.3)


def entropy_row(grouped: dict[str, Fn], reps: Callable[[bool], int]) -> list[str]:
    return _nan_safe_row("NaN-safe entropy vs double where, (256, 64) / (4096, 64)", grouped["entropy"],
                         entropy_double_where, entropy_double_where, probabilities(256), probabilities(4096),
                         reps)


def rodrigues_row(grouped: dict[str, Fn], reps: Callable[[bool], int]) -> list[str]:
    return _nan_safe_row("NaN-safe Rodrigues vs no group, batch 64 / 4096", grouped["rodrigues"], rodrigues,
                         rodrigues_double_where, rotations(64), rotations(4096), reps)


def norm3_row(grouped: dict[str, Fn], reps: Callable[[bool], int]) -> list[str]:
    x = vectors()
    check("the 3-op group", grouped["norm3"], norm3_reference, x)
    return target_row("3-op group sqrt(sum(x*x)), (4, 3), rules on vs plain",
                      [ratio(grouped["norm3"], norm3, x, reps(False))], 1.6)


#: One fresh interpreter's start, printed as three CPU times in seconds.
_START = """
import gc, time
import torch
gc.collect()
clock = time.process_time
start = clock()
import autograd_groups as ag
imported = clock()
ag.ops
loaded = clock()
x, y = torch.randn(4, 3, requires_grad=True), torch.randn(5, 3)
called = clock()
ag.ops.cdist(x, y).sum().backward()
print(imported - start, loaded - imported, clock() - called)
"""


@functools.cache
def start_times(samples: int) -> tuple[float, ...]:
    """Medians over ``samples`` fresh interpreters of the three times ``_START`` prints, in ms."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(ag.__file__)))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
    with tempfile.TemporaryDirectory() as caches:
        env["PYTHONPYCACHEPREFIX"] = caches
        runs = [subprocess.run([sys.executable, "-c", _START], env=env, capture_output=True, text=True,
                               check=True).stdout for _ in range(samples + 1)]
    figures = [[1000 * float(f) for f in run.split()] for run in runs[1:]]
    return tuple(statistics.median(column) for column in zip(*figures))


def _samples(reps: Callable[[bool], int]) -> int:
    return min(reps(False), 5)


def import_row(grouped: dict[str, Fn], reps: Callable[[bool], int]) -> list[str]:
    return target_row("import autograd_groups after import torch", [start_times(_samples(reps))[0]], 100,
                      " ms")


def ops_row(grouped: dict[str, Fn], reps: Callable[[bool], int]) -> list[str]:
    times = start_times(_samples(reps))
    return target_row("import autograd_groups, then ag.ops (the built-in spec)", [times[0] + times[1]], 100,
                      " ms")


def first_call_row(grouped: dict[str, Fn], reps: Callable[[bool], int]) -> list[str]:
    return target_row("first ag.ops.cdist call + backward, (4, 3) x (5, 3)", [start_times(_samples(reps))[2]],
                      50, " ms")


ROWS = {"entropy": entropy_row, "rodrigues": rodrigues_row, "norm3": norm3_row, "start: import": import_row,
        "start: ops": ops_row, "start: first call": first_call_row}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--repeats", type=int, default=0, help="default: 1000 small, 60 large")
    parser.add_argument("--only", default="", help=f"one of {', '.join(ROWS)}")
    args = parser.parse_args()
    torch.set_num_threads(1)
    grouped = register()

    def reps(large: bool) -> int:
        return args.repeats or (60 if large else 1000)

    rows = [row(grouped, reps) for name, row in ROWS.items() if args.only in name]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread, float32, forward + backward, "
          f"medians of interleaved runs")
    print(markdown_table(TARGET_HEADER, rows))


if __name__ == "__main__":
    main()

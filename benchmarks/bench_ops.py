"""Forward + backward time and saved bytes of each built-in op against PyTorch's native op.

For every op at a medium size, variants run side by side, their repetitions interleaved (in a new
order each round) so that drift on a shared machine hits all of them alike; the tables show medians:

- native: the torch op, whose backward is hand-written C++;
- composite: the same primitive ops as the built-in, outside any group (``op.__wrapped__``);
- rules on: the built-in op, with its special cases (the default);
- rules off: the built-in op under ``ag.special_cases(False)``;
- compiled: the built-in op, rules on, under ``torch.compile(fullgraph=True)`` (inductor), and its
  ratio to the faster of native eager and native compiled (the native op compiled the same way);
- saved × native: the bytes of the distinct storages the built-in keeps for its backward, over the
  native op's (``common.saved_bytes``), eagerly (with its documented bound) and compiled.

The first thread count gets that whole table; each further one an eager table (inductor decides
when it compiles whether its kernels run in parallel, so the compiled columns stay at the first).
Last come issue 23's target rows, each with its figure and met/missed (``--targets`` alone).

    python benchmarks/bench_ops.py                 # 1 thread, then torch's default count; the targets
    python benchmarks/bench_ops.py --only cdist    # rows whose name contains "cdist"
    python benchmarks/bench_ops.py --threads 1     # one table, 1 thread
    python benchmarks/bench_ops.py --targets       # issue 23's target rows only
    python benchmarks/bench_ops.py --cold          # without the allocator warm-up (see _warm_allocator)
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_core import HandWrittenCdist  # noqa: E402
from common import interleaved_medians, markdown_table, saved_bytes, verdict  # noqa: E402

import autograd_groups as ag  # noqa: E402
from autograd_groups import ops  # noqa: E402


@dataclass(frozen=True)
class Bench:
    name: str
    size: str
    ours: Callable[..., torch.Tensor]
    native: Callable[..., torch.Tensor]
    make: Callable[[torch.Generator], tuple[torch.Tensor, ...]]
    kwargs: dict[str, Any]
    #: The documented bound of the eager saved bytes × native (docs/builtins.md#memory).
    saved: float


def _randn(*shape: int) -> Callable[[torch.Generator], tuple[torch.Tensor, ...]]:
    return lambda g: (torch.randn(*shape, generator=g),)


def _pair(a: tuple[int, ...], b: tuple[int, ...], low: float | None = None,
          ) -> Callable[[torch.Generator], tuple[torch.Tensor, ...]]:
    def make(g: torch.Generator) -> tuple[torch.Tensor, ...]:
        if low is None:
            return torch.randn(*a, generator=g), torch.randn(*b, generator=g)
        return torch.rand(*a, generator=g) + low, torch.rand(*b, generator=g) + low

    return make


# The direct forms (but cdist's p = inf) keep their (rows, rows, columns) differences, where the native
# kernels recompute them: the saved bounds of 26x to 60x (docs/builtins.md#memory).
BENCHES = [
    Bench("cdist p=2 (matmul form)", "1024x64, 1024x64", ops.cdist, torch.cdist,
          _pair((1024, 64), (1024, 64)), {}, 1.3),
    Bench("cdist p=2 (direct, 25 rows)", "25x64, 1024x64", ops.cdist, torch.cdist,
          _pair((25, 64), (1024, 64)), {"compute_mode": "donot_use_mm_for_euclid_dist"}, 1.0),
    *[Bench(f"cdist p={p}", "256x32, 256x32", ops.cdist, torch.cdist, _pair((256, 32), (256, 32)), {"p": p},
            saved) for p, saved in ((1.0, 26), (0.5, 52), (3.0, 52), (math.inf, 2.6))],
    Bench("pdist p=2", "512x32", ops.pdist, torch.pdist, _randn(512, 32), {}, 1.9),
    Bench("pdist p=0.5", "512x32", ops.pdist, torch.pdist, _randn(512, 32), {"p": 0.5}, 60),
    Bench("dist p=2", "1024x1024", ops.dist, torch.dist, _pair((1024, 1024), (1024, 1024)), {}, 0.51),
    Bench("dist p=3", "1024x1024", ops.dist, torch.dist, _pair((1024, 1024), (1024, 1024)), {"p": 3.0}, 1.0),
    *[Bench(f"vector_norm ord={o}", "1024x1024, dim=-1", ops.vector_norm, torch.linalg.vector_norm,
            _randn(1024, 1024), {"ord": o, "dim": -1}, saved)
      for o, saved in ((1.0, 1.0), (2.0, 1.0), (3.0, 2.0), (0.5, 2.0), (math.inf, 2.0))],
    Bench("normalize p=2", "1024x1024, dim=-1", ops.normalize, F.normalize, _randn(1024, 1024), {"dim": -1},
          1.0),
    Bench("cosine_similarity", "1024x1024, dim=-1", ops.cosine_similarity, F.cosine_similarity,
          _pair((1024, 1024), (1024, 1024)), {"dim": -1}, 1.0),
    # std, var, logsumexp: native plus at most their output (a 1024th of the input here).
    Bench("std", "1024x1024, dim=-1", ops.std, torch.std, _randn(1024, 1024), {"dim": -1}, 1.001),
    Bench("var", "1024x1024, dim=-1", ops.var, torch.var, _randn(1024, 1024), {"dim": -1}, 1.001),
    Bench("pow (tensor exponent)", "1024x1024", ops.pow, torch.pow,
          _pair((1024, 1024), (1024, 1024), 0.5), {}, 1.5),
    Bench("atan2", "1024x1024", ops.atan2, torch.atan2, _pair((1024, 1024), (1024, 1024)), {}, 2.0),
    Bench("xlogy", "1024x1024", ops.xlogy, torch.xlogy, _pair((1024, 1024), (1024, 1024), 0.5), {}, 1.7),
    Bench("logsumexp", "1024x1024, dim=-1", ops.logsumexp, torch.logsumexp, _randn(1024, 1024), {"dim": -1},
          1.001),
]

_COMPILED: dict[Callable[..., Any], Callable[..., Any]] = {}


def compiled(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` under ``torch.compile(fullgraph=True)``, one wrapper per function for the whole run."""
    if fn not in _COMPILED:
        _COMPILED[fn] = torch.compile(fn, fullgraph=True)
    return _COMPILED[fn]


Inputs = tuple[torch.Tensor, ...]


def inputs_of(bench: Bench) -> Inputs:
    return tuple(t.requires_grad_() for t in bench.make(torch.Generator().manual_seed(0)))


def stepper(bench: Bench, inputs: Inputs) -> Callable[..., Callable[[], None]]:
    """``stepper(bench, inputs)(fn, enabled)``: one forward + backward of ``fn`` on the bench's
    inputs with special cases ``enabled``, as a timed variant."""
    grad = torch.ones_like(bench.native(*inputs, **bench.kwargs))

    def step(fn: Callable[..., torch.Tensor], enabled: bool = True) -> Callable[[], None]:
        def run() -> None:
            for x in inputs:
                x.grad = None
            with ag.special_cases(enabled):
                out = fn(*inputs, **bench.kwargs)
            out.backward(grad)

        return run

    return step


def variants(bench: Bench, inputs: Inputs, eager_only: bool) -> dict[str, Callable[[], None]]:
    step = stepper(bench, inputs)
    steps = {"native": step(bench.native), "composite": step(bench.ours.__wrapped__),  # type: ignore[attr-defined]
             "rules on": step(bench.ours), "rules off": step(bench.ours, enabled=False)}
    if not eager_only:
        steps |= {"c.native": step(compiled(bench.native)), "compiled": step(compiled(bench.ours))}
    return steps


def saved_ratio(ours: Callable[..., Any], native: Callable[..., Any], inputs: Inputs,
                kwargs: dict[str, Any]) -> float:
    """Saved bytes of ``ours`` over ``native``'s, on the same inputs."""
    return saved_bytes(ours, *inputs, **kwargs) / saved_bytes(native, *inputs, **kwargs)


def row(bench: Bench, repeat: int, warmup: int, eager_only: bool) -> str:
    """The bench's table row: times in ms (× native), and with the compiled columns the saved bytes."""
    inputs = inputs_of(bench)
    medians = interleaved_medians(variants(bench, inputs, eager_only), repeat, warmup)
    base = medians["native"]
    cells = [f"{base * 1e3:.2f}"] + [f"{medians[k] * 1e3:.2f} ({medians[k] / base:.2f}x)"
                                     for k in medians if k != "native"]
    if not eager_only:
        cells.append(f"{medians['compiled'] / min(base, medians['c.native']):.2f}x")
        eager = saved_ratio(bench.ours, bench.native, inputs, bench.kwargs)
        cells.append(f"{eager:.2f} (≤ {bench.saved})")
        cells.append(f"{saved_ratio(compiled(bench.ours), compiled(bench.native), inputs, bench.kwargs):.2f}")
    return f"| {bench.name} | {bench.size} | " + " | ".join(cells) + " |"


def table(benches: list[Bench], repeat: int, warmup: int, eager_only: bool) -> None:
    header = ["op", "size", "native", "composite", "rules on", "rules off"]
    if not eager_only:
        header += ["c.native", "compiled", "compiled / best native", "saved × native", "c.saved × c.native"]
    print(markdown_table(header, []), flush=True)
    for bench in benches:
        print(row(bench, repeat, warmup, eager_only), flush=True)


class CdistFunction(HandWrittenCdist):
    """``torch.cdist`` forward, and the backward a user writes by hand (bench_core's): ``g / d``
    masked where ``d == 0``, and two matrix products."""

    @staticmethod
    def forward(ctx, x1: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        result = torch.cdist(x1, x2)
        ctx.save_for_backward(x1, x2, result)
        return result


def _bench(name: str) -> Bench:
    return next(b for b in BENCHES if b.name == name)


def _timed_target(label: str, bound: float, steps: dict[str, Callable[[], None]], over: list[str],
                  runs: int, repeat: int, warmup: int) -> list[str]:
    """A target row: ``steps["ours"]`` over the fastest of ``over``, the median of ``runs``
    interleaved runs against ``bound``, and the range over the runs."""
    ratios = []
    for _ in range(runs):
        medians = interleaved_medians(steps, repeat, warmup)
        ratios.append(medians["ours"] / min(medians[k] for k in over))
    return [label, verdict(statistics.median(ratios), bound), f"{min(ratios):.2f}–{max(ratios):.2f}"]


def targets(runs: int, repeat: int, warmup: int, threads: int) -> None:
    """Issue 23's target rows for memory (item 2), compiled formulas (item 3) and threads (item 5)."""
    rows = []
    torch.set_num_threads(1)
    for n, m, d in ((1024, 1024, 64), (4096, 4096, 16)):
        g = torch.Generator().manual_seed(0)
        x = (torch.randn(n, d, generator=g).requires_grad_(), torch.randn(m, d, generator=g).requires_grad_())
        for label, ours, native, bound in (("eager", ops.cdist, torch.cdist, 1.3),
                                           ("compiled", compiled(ops.cdist), compiled(torch.cdist), 1.05)):
            rows.append([f"saved bytes, ops.cdist / torch.cdist, {label}, ({n}, {m}, {d})",
                         verdict(saved_ratio(ours, native, x, {}), bound), "(bytes: exact)"])
    matmul = _bench("cdist p=2 (matmul form)")
    step = stepper(matmul, inputs_of(matmul))
    steps = {"ours": step(compiled(ops.cdist)), "Function": step(compiled(CdistFunction.apply))}
    rows.append(_timed_target("compiled ops.cdist / compiled hand-written Function, (1024, 1024, 64), "
                              "1 thread", 1.1, steps, ["Function"], runs, repeat, warmup))
    for name in ("pdist p=2", "pow (tensor exponent)", "cdist p=inf"):
        bench = _bench(name)
        step = stepper(bench, inputs_of(bench))
        steps = {"ours": step(compiled(bench.ours)), "native": step(bench.native),
                 "c.native": step(compiled(bench.native))}
        rows.append(_timed_target(f"compiled {name} / best native, 1 thread", 1.5, steps,
                                  ["native", "c.native"], runs, repeat, warmup))
    torch.set_num_threads(threads)
    for name in ("pdist p=2", "atan2", "cdist p=2 (direct, 25 rows)"):
        bench = _bench(name)
        step = stepper(bench, inputs_of(bench))
        rows.append(_timed_target(f"{name}, rules on / native, {threads} threads", 2.0,
                                  {"ours": step(bench.ours), "native": step(bench.native)}, ["native"],
                                  runs, repeat, warmup))
    print(f"\nIssue 23's targets: the median of {runs} runs of {repeat} interleaved repetitions each "
          f"(the range over the runs beside it)\n")
    print(markdown_table(["target", "figure", f"range over {runs} runs"], rows), flush=True)


def _warm_allocator() -> None:
    """Put glibc's allocator in the state of a process that has run a training step.

    glibc serves a block above its mmap threshold (128 KB at start) with fresh pages from the OS,
    each page a fault when first written, and raises the threshold to the size of such a block once
    one is freed (up to 32 MB). A training process has freed activations of megabytes long before;
    a fresh one page-faults on every temporary of a megabyte or more until it has too, so the rows
    of a run would depend on the rows before them. Native kernels with few temporaries barely
    notice; composites do (cdist's direct form: 3300 faults and 5x the time of a warm step here).
    """
    torch.empty(16 << 20, dtype=torch.uint8)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=25, help="timed repetitions per variant (default 25)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--only", default="", help="run the rows whose name contains this text (no targets)")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 0],
                        help="torch thread counts, 0 for torch's default (default: 1 0)")
    parser.add_argument("--runs", type=int, default=5, help="runs per target row (default 5)")
    parser.add_argument("--targets", action="store_true", help="only issue 23's target rows")
    parser.add_argument("--cold", action="store_true", help="skip the allocator warm-up")
    args = parser.parse_args()
    if not args.cold:
        _warm_allocator()
    default_threads = torch.get_num_threads()
    threads = [n or default_threads for n in args.threads]
    threads = [n for i, n in enumerate(threads) if n not in threads[:i]]
    torch._dynamo.config.cache_size_limit = 64
    print(f"torch {torch.__version__}, float32, forward + backward, median of {args.repeat} interleaved "
          f"repetitions (ms; x native in parentheses), allocator {'cold' if args.cold else 'warm'}")
    benches = [b for b in BENCHES if args.only in b.name]
    for i, count in enumerate([] if args.targets else threads):
        torch.set_num_threads(count)
        print(f"\n{count} thread{'s' if count > 1 else ''}{'' if i else ', with the compiled columns'}\n")
        table(benches, args.repeat, args.warmup, eager_only=i > 0)
    if args.targets or not args.only:
        targets(args.runs, args.repeat, args.warmup, default_threads)


if __name__ == "__main__":
    main()

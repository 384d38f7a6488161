"""Forward + backward time of each built-in op against PyTorch's native op.

For every op at a medium size, four variants run side by side, their repetitions interleaved so
that drift on a shared machine hits all of them alike; the table shows medians:

- native: the torch op, whose backward is hand-written C++;
- composite: the same primitive ops as the built-in, outside any group (``op.__wrapped__``);
- rules on: the built-in op, with its special cases (the default);
- rules off: the built-in op under ``ag.special_cases(False)``;
- compiled: the built-in op, rules on, under ``torch.compile(fullgraph=True)`` (inductor), and its
  ratio to the faster of native eager and native compiled (the native op compiled the same way).

    python benchmarks/bench_ops.py                 # every op, a Markdown table
    python benchmarks/bench_ops.py --only cdist    # rows whose name contains "cdist"
    python benchmarks/bench_ops.py --threads 1     # steadier on a shared machine
    python benchmarks/bench_ops.py --cold          # without the allocator warm-up (see _warm_allocator)
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

import autograd_groups as ag
from autograd_groups import ops


@dataclass(frozen=True)
class Bench:
    name: str
    size: str
    ours: Callable[..., torch.Tensor]
    native: Callable[..., torch.Tensor]
    make: Callable[[torch.Generator], tuple[torch.Tensor, ...]]
    kwargs: dict[str, Any]


def _randn(*shape: int) -> Callable[[torch.Generator], tuple[torch.Tensor, ...]]:
    return lambda g: (torch.randn(*shape, generator=g),)


def _pair(a: tuple[int, ...], b: tuple[int, ...], low: float | None = None,
          ) -> Callable[[torch.Generator], tuple[torch.Tensor, ...]]:
    def make(g: torch.Generator) -> tuple[torch.Tensor, ...]:
        if low is None:
            return torch.randn(*a, generator=g), torch.randn(*b, generator=g)
        return torch.rand(*a, generator=g) + low, torch.rand(*b, generator=g) + low

    return make


BENCHES = [
    Bench("cdist p=2 (matmul form)", "1024x64, 1024x64", ops.cdist, torch.cdist,
          _pair((1024, 64), (1024, 64)), {}),
    Bench("cdist p=2 (direct, 25 rows)", "25x64, 1024x64", ops.cdist, torch.cdist,
          _pair((25, 64), (1024, 64)), {"compute_mode": "donot_use_mm_for_euclid_dist"}),
    *[Bench(f"cdist p={p}", "256x32, 256x32", ops.cdist, torch.cdist, _pair((256, 32), (256, 32)), {"p": p})
      for p in (1.0, 0.5, 3.0, math.inf)],
    Bench("pdist p=2", "512x32", ops.pdist, torch.pdist, _randn(512, 32), {}),
    Bench("pdist p=0.5", "512x32", ops.pdist, torch.pdist, _randn(512, 32), {"p": 0.5}),
    Bench("dist p=2", "1024x1024", ops.dist, torch.dist, _pair((1024, 1024), (1024, 1024)), {}),
    Bench("dist p=3", "1024x1024", ops.dist, torch.dist, _pair((1024, 1024), (1024, 1024)), {"p": 3.0}),
    *[Bench(f"vector_norm ord={o}", "1024x1024, dim=-1", ops.vector_norm, torch.linalg.vector_norm,
            _randn(1024, 1024), {"ord": o, "dim": -1}) for o in (1.0, 2.0, 3.0, 0.5, math.inf)],
    Bench("normalize p=2", "1024x1024, dim=-1", ops.normalize, F.normalize, _randn(1024, 1024), {"dim": -1}),
    Bench("cosine_similarity", "1024x1024, dim=-1", ops.cosine_similarity, F.cosine_similarity,
          _pair((1024, 1024), (1024, 1024)), {"dim": -1}),
    Bench("std", "1024x1024, dim=-1", ops.std, torch.std, _randn(1024, 1024), {"dim": -1}),
    Bench("var", "1024x1024, dim=-1", ops.var, torch.var, _randn(1024, 1024), {"dim": -1}),
    Bench("pow (tensor exponent)", "1024x1024", ops.pow, torch.pow,
          _pair((1024, 1024), (1024, 1024), 0.5), {}),
    Bench("atan2", "1024x1024", ops.atan2, torch.atan2, _pair((1024, 1024), (1024, 1024)), {}),
    Bench("xlogy", "1024x1024", ops.xlogy, torch.xlogy, _pair((1024, 1024), (1024, 1024), 0.5), {}),
    Bench("logsumexp", "1024x1024, dim=-1", ops.logsumexp, torch.logsumexp, _randn(1024, 1024), {"dim": -1}),
]


def _step(fn: Callable[..., torch.Tensor], inputs: tuple[torch.Tensor, ...], kwargs: dict[str, Any],
          grad_out: torch.Tensor, enabled: bool) -> float:
    for x in inputs:
        x.grad = None
    start = time.perf_counter()
    with ag.special_cases(enabled):
        out = fn(*inputs, **kwargs)
    out.backward(grad_out)
    return time.perf_counter() - start


def run(bench: Bench, repeat: int, warmup: int) -> dict[str, float]:
    """Median seconds per forward + backward of each variant."""
    inputs = tuple(t.requires_grad_() for t in bench.make(torch.Generator().manual_seed(0)))
    grad_out = torch.ones_like(bench.native(*inputs, **bench.kwargs))
    variants = {
        "native": (bench.native, True),
        "composite": (bench.ours.__wrapped__, True),  # type: ignore[attr-defined]
        "rules on": (bench.ours, True),
        "rules off": (bench.ours, False),
        "c.native": (torch.compile(bench.native, fullgraph=True), True),
        "compiled": (torch.compile(bench.ours, fullgraph=True), True),
    }
    times: dict[str, list[float]] = {name: [] for name in variants}
    for i in range(warmup + repeat):
        for name, (fn, enabled) in variants.items():
            seconds = _step(fn, inputs, bench.kwargs, grad_out, enabled)
            if i >= warmup:
                times[name].append(seconds)
    return {name: statistics.median(t) for name, t in times.items()}


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
    parser.add_argument("--only", default="", help="run the rows whose name contains this text")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's choice)")
    parser.add_argument("--cold", action="store_true", help="skip the allocator warm-up")
    args = parser.parse_args()
    if not args.cold:
        _warm_allocator()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch._dynamo.config.cache_size_limit = 64
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, float32, forward + backward, "
          f"median of {args.repeat} interleaved repetitions (ms; x native in parentheses), "
          f"allocator {'cold' if args.cold else 'warm'}\n")
    print("| op | size | native | composite | rules on | rules off | c.native | compiled "
          "| compiled / best native |")
    print("|---|---|---|---|---|---|---|---|---|")
    for bench in BENCHES:
        if args.only not in bench.name:
            continue
        medians = run(bench, args.repeat, args.warmup)
        base = medians["native"]
        cells = [f"{base * 1e3:.2f}"] + [f"{medians[k] * 1e3:.2f} ({medians[k] / base:.2f}x)"
                                         for k in ("composite", "rules on", "rules off", "c.native",
                                                   "compiled")]
        cells.append(f"{medians['compiled'] / min(base, medians['c.native']):.2f}x")
        print(f"| {bench.name} | {bench.size} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()

"""What a group compiled as its own region (``@ag.autograd_group(name, compile=True)``) costs against
the hand-written code it replaces, eager and compiled.

    python benchmarks/bench_region.py [--repeats N] [--quick]

CPU, 1 thread, float32, forward + backward, medians of interleaved runs in one process, NaN-safe
groups with zeros in the batch (1/8 of the rotation vectors, 1/8 of the probabilities):

- the Rodrigues rotation matrix (batch 64, 4096, 65536) and the entropy of (4096, 64)
  probabilities, as a ``compile=True`` NaN-safe group, against the hand-written double ``where``
  eagerly and under a plain ``torch.compile`` called from eager code (each size compiled as its own
  static graph, as a training run with a fixed batch compiles it);
- a model calling one Rodrigues group 6 times inside an outer ``torch.compile``: the compile time
  (a fresh interpreter each, inductor's caches off) and the run time, with the group declared
  ``compile=True`` against the same group without it (both inlined at each of the 6 calls: what
  an outer compile does with a ``compile=True`` group);
- a tiny 3-op ``compile=True`` group, ``sqrt(sum(x * x))`` on (4, 3), per call against a plain
  ``torch.compile`` of the same body;
- the bytes each saves for backward (distinct storages), against the hand-written eager code:
  Rodrigues, entropy, and a group calling ``ag.ops.cdist`` against ``torch.cdist``.

``--quick`` (the test suite's run) compiles with ``aot_eager``, times little and skips the compile
time row: it checks that the rows are made, not their figures.

Before timing, every variant's gradients are checked against the hand-written code's.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_targets import (  # noqa: E402
    check,
    entropy,
    entropy_double_where,
    norm3,
    probabilities,
    rodrigues,
    rodrigues_double_where,
    rotations,
    step,
    vectors,
)
from common import TARGET_HEADER, interleaved_medians, markdown_table, saved_bytes, target_row  # noqa: E402

import autograd_groups as ag  # noqa: E402

Fn = Callable[[torch.Tensor], torch.Tensor]
BATCHES = (64, 4096, 65536)
#: The bounds: Rodrigues per batch size; entropy; over a plain compile; the outer compile's compile
#: and run time; the tiny group per call; saved bytes.
RODRIGUES_BOUNDS = (0.7, 1.0, 0.9)
ENTROPY_BOUND, PLAIN_BOUND, COMPILE_TIME_BOUND, RUN_TIME_BOUND, TINY_BOUND, BYTES_BOUND = (
    0.9, 1.15, 0.7, 1.05, 1.2, 1.0)
CALLS = 6

_names = iter(range(1_000_000))


def region(body: Fn, rule: ag.Subgradient | ag.NanSafe, options: dict[str, object]) -> Fn:
    """``body`` as a new ``compile=`` group with ``rule``: each its own region and cache."""
    name = f"bench.region{next(_names)}"
    ag.register_rule(name, rule)
    grouped: Fn = ag.autograd_group(name, compile=options)(body)
    return grouped


def compiled(body: Fn, options: dict[str, object]) -> Fn:
    """A plain ``torch.compile`` of ``body`` with the same options, called from eager code."""
    return torch.compile(lambda x: body(x), **options)  # a new code object: a cache of its own


def ratios(variants: dict[str, Fn], x: torch.Tensor, repeats: int) -> dict[str, float]:
    """Medians of forward + backward of each variant at ``x``, by name."""
    return interleaved_medians({name: step(fn, x) for name, fn in variants.items()}, repeats)


def speed_rows(options: dict[str, object], repeats: int) -> list[list[str]]:
    over_hand: list[float] = []
    over_plain: list[float] = []
    for batch in BATCHES:
        x = rotations(batch)
        grouped, plain = region(rodrigues, ag.NanSafe(), options), compiled(rodrigues_double_where, options)
        for what, fn in (("Rodrigues compile=True", grouped), ("Rodrigues plain compile", plain)):
            check(what, fn, rodrigues_double_where, x)
        # More runs where a run is short: medians of a few milliseconds' runs move most.
        times = ratios({"group": grouped, "hand": rodrigues_double_where, "plain": plain}, x,
                       repeats * 4 if batch == 64 else repeats if batch == 4096 else max(3, repeats // 2))
        over_hand.append(times["group"] / times["hand"])
        over_plain.append(times["group"] / times["plain"])
    p = probabilities(4096)
    grouped, plain = region(entropy, ag.NanSafe(), options), compiled(entropy_double_where, options)
    for what, fn in (("entropy compile=True", grouped), ("entropy plain compile", plain)):
        check(what, fn, entropy_double_where, p)
    times = ratios({"group": grouped, "hand": entropy_double_where, "plain": plain}, p, repeats)
    over_plain.append(times["group"] / times["plain"])
    rows = [target_row(f"Rodrigues, compile=True group / hand double-where eager, batch {batch}", [r], bound)
            for batch, r, bound in zip(BATCHES, over_hand, RODRIGUES_BOUNDS)]
    rows.append(target_row("entropy (4096, 64), compile=True group / hand eager",
                           [times["group"] / times["hand"]], ENTROPY_BOUND))
    rows.append(target_row("compile=True group / plain torch.compile of the hand code, Rodrigues 64 / 4096 / "
                           "65536, entropy", over_plain, PLAIN_BOUND))
    return rows


def tiny_row(options: dict[str, object], repeats: int) -> list[str]:
    x = vectors()
    grouped = region(norm3, ag.Subgradient(op="sqrt", when="result == 0", grad=0), options)
    plain = compiled(norm3, options)
    times = ratios({"group": grouped, "plain": plain}, x, repeats * 10)
    return target_row("tiny 3-op compile=True group per call / plain compiled function of the body",
                      [times["group"] / times["plain"]], TINY_BOUND)


def bytes_row(options: dict[str, object]) -> list[str]:
    cdist_group = region(lambda a: ag.ops.cdist(a, a), ag.NanSafe(), options)
    points = torch.randn(256, 8, generator=torch.Generator().manual_seed(0)).requires_grad_()
    cases = ((region(rodrigues, ag.NanSafe(), options), rodrigues_double_where, rotations(4096)),
             (region(entropy, ag.NanSafe(), options), entropy_double_where, probabilities(4096)),
             (cdist_group, lambda a: torch.cdist(a, a), points))
    figures = []
    for grouped, hand, x in cases:
        grouped(x)  # compiled before its saved tensors are counted
        figures.append(saved_bytes(grouped, x) / saved_bytes(hand, x))
    return target_row("saved bytes, compile=True group / hand eager: Rodrigues, entropy, ops.cdist", figures,
                      BYTES_BOUND)


MODEL = """
import sys, time, torch
sys.path.insert(0, {here!r})
from bench_targets import rodrigues, rotations
import autograd_groups as ag
torch.set_num_threads(1)
ag.register_rule("bench.outer", ag.NanSafe())
group = ag.autograd_group("bench.outer", compile={compile})(rodrigues)

def model(v):
    out = 0
    for k in range({calls}):
        out = out + group(v * (k + 1)).sum()
    return out

compiled = torch.compile(model, fullgraph=True)
v = rotations(4096)
start = time.perf_counter()
compiled(v).backward()
first = time.perf_counter() - start
times = []
for _ in range({repeats}):
    v.grad = None
    start = time.perf_counter()
    compiled(v).backward()
    times.append(time.perf_counter() - start)
print(first, sorted(times)[len(times) // 2])
"""


def outer_compile(as_region: bool, repeats: int) -> tuple[float, float]:
    """First call (compile) and median run time of the model, in a fresh interpreter."""
    env = {**os.environ, "TORCHINDUCTOR_FX_GRAPH_CACHE": "0", "TORCHINDUCTOR_AUTOGRAD_CACHE": "0"}
    code = MODEL.format(here=str(Path(__file__).resolve().parent), compile=as_region, calls=CALLS,
                        repeats=repeats)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    first, run = map(float, done.stdout.split()[-2:])
    return first, run


def outer_row(repeats: int) -> list[list[str]]:
    region_first, region_run = outer_compile(True, repeats)
    inlined_first, inlined_run = outer_compile(False, repeats)
    print(f"outer compile, {CALLS} calls: first call {region_first:.1f} s (region) / {inlined_first:.1f} s "
          f"(inlined); run {region_run * 1e3:.2f} / {inlined_run * 1e3:.2f} ms")
    return [target_row(f"a model calling one group {CALLS}× in an outer torch.compile: compile time, "
                       f"compile=True / inlined", [region_first / inlined_first], COMPILE_TIME_BOUND),
            target_row("the same: run time, compile=True / inlined", [region_run / inlined_run],
                       RUN_TIME_BOUND)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=60)
    parser.add_argument("--quick", action="store_true", help="aot_eager, few repeats, no compile-time row")
    args = parser.parse_args()
    torch.set_num_threads(1)
    options: dict[str, object] = {"backend": "aot_eager"} if args.quick else {}
    start = time.perf_counter()
    rows = speed_rows(options, args.repeats)
    rows.append(tiny_row(options, args.repeats))
    rows.append(bytes_row(options))
    if not args.quick:
        rows += outer_row(max(3, args.repeats // 2))
    print(f"torch {torch.__version__}, 1 thread, float32, forward + backward, medians of interleaved runs "
          f"({time.perf_counter() - start:.0f} s)")
    print(markdown_table(TARGET_HEADER, rows))


if __name__ == "__main__":
    main()

"""Issue 5's benchmark: what tracing costs per group instance, and how fast `viz` folds a long run.

    python benchmarks/bench_viz.py [--repeats N] [--steps S]

1. Tracing overhead: cdist(x1[64, 16], x2[64, 16]) forward + backward (float32, CPU, half the rows
   identical so the rule fires), the group untraced vs inside a ``trace()`` session (target <= 2x).
2. Folding: a training loop whose step makes 100 group instances (50 ``rbf`` layers, each with a
   nested ``cdist``) for S steps (default 50: 5,000 instances), traced; then the time to fold and
   write DOT, the folded vertex count, and ``autograd-groups viz LOOP.py --out loop.svg`` end to end
   as a subprocess (target < 10 s).
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))

import cdist as example  # noqa: E402
from common import interleaved_medians, markdown_table  # noqa: E402

import autograd_groups as ag  # noqa: E402
from autograd_groups import viz  # noqa: E402

LOOP = '''
import sys
import torch
import autograd_groups as ag
sys.path.insert(0, {examples!r})
import cdist as example

example.register()


@ag.autograd_group("rbf")
def rbf(x, centers):
    return torch.exp(-example.grouped_cdist(x, centers) ** 2)


torch.manual_seed(0)
layers = [torch.randn(16, 16, requires_grad=True) for _ in range(50)]
for step in range({steps}):
    h = torch.randn(8, 16)
    for centers in layers:
        h = rbf(h, centers)
    h.sum().backward()
    with torch.no_grad():
        for centers in layers:
            centers -= 0.01 * centers.grad
            centers.grad = None
'''


def _points(n: int, m: int, d: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x1 = torch.randn(n, d, generator=g)
    x2 = torch.randn(m, d, generator=g)
    x2[: min(n, m) // 2] = x1[: min(n, m) // 2]
    return x1.requires_grad_(), x2.requires_grad_()


def tracing_overhead(repeats: int) -> list[list[str]]:
    x1, x2 = _points(64, 64, 16)

    def step() -> None:
        x1.grad = x2.grad = None
        example.grouped_cdist(x1, x2).sum().backward()

    def traced() -> None:
        with ag.trace():
            step()

    times = interleaved_medians({"untraced": step, "traced": traced}, repeats)
    return [["cdist (64, 64, 16) fwd+bwd, untraced", f"{times['untraced'] * 1e6:.0f} µs", ""],
            ["cdist (64, 64, 16) fwd+bwd, traced", f"{times['traced'] * 1e6:.0f} µs",
             f"{times['traced'] / times['untraced']:.2f}x untraced (target <= 2x)"]]


def folding(steps: int) -> list[list[str]]:
    examples = str(Path(__file__).resolve().parents[1] / "examples")
    source = LOOP.format(examples=examples, steps=steps)
    with tempfile.TemporaryDirectory() as tmp:
        script = os.path.join(tmp, "loop.py")
        Path(script).write_text(source)
        start = time.perf_counter()
        with ag.trace() as session:
            exec(compile(source, script, "exec"), {"__name__": "__main__"})
        run = time.perf_counter() - start
        start = time.perf_counter()
        folded = viz.draw(session.instances, max_nodes=viz.DEFAULT_MAX_NODES)
        dot = viz.to_dot(folded)
        fold_time = time.perf_counter() - start
        plain = _seconds([sys.executable, script])
        cli = _seconds([sys.executable, "-m", "autograd_groups.cli", "viz", script, "--out",
                        os.path.join(tmp, "loop.svg")])
    n = len(session.instances)
    return [[f"training loop, {steps} steps, traced ({n} instances)", f"{run:.2f} s", ""],
            ["fold + DOT text", f"{fold_time:.2f} s",
             f"{folded.graph.number_of_nodes()} vertices, {len(folded.clusters)} clusters, "
             f"{len(dot) // 1024} KiB of DOT"],
            ["`python loop.py` (subprocess, not traced)", f"{plain:.2f} s", "the script alone, 1 thread"],
            ["`autograd-groups viz loop.py --out loop.svg` (subprocess)", f"{cli:.2f} s",
             f"{cli - plain:.2f} s more than the script alone (target: viz < 10 s)"]]


def _seconds(command: list[str]) -> float:
    start = time.perf_counter()
    # One thread, like the in-process timings: on a small shared machine, torch's thread pool spinning
    # on tiny tensors dominates otherwise.
    done = subprocess.run(command, capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr}")
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--steps", type=int, default=50)
    args = parser.parse_args()
    example.register()
    torch.set_num_threads(1)
    rows = tracing_overhead(args.repeats) + folding(args.steps)
    print(f"torch {torch.__version__}, {platform.processor() or platform.machine()}, {os.cpu_count()} "
          f"cores, load average {os.getloadavg()[0]:.1f}; in-process timings on 1 thread; µs: median "
          f"of {args.repeats} interleaved runs\n")
    print(markdown_table(["measurement", "time", "notes"], rows))


if __name__ == "__main__":
    main()

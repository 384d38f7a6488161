"""Issue 22's benchmark: ``ag.verify`` of the metric-learning demo's one traced step (target < 10 s).

    python benchmarks/bench_verify.py [--repeats N]

The step is the one the demo's statistics section traces (``examples/metric_learning.py``,
``audit``): the loss of one balanced batch of 160 digits, for the pairwise model (batch-hard
triplet loss over ``ops.cdist(emb, emb)``, whose zero diagonal fires the ``sqrt`` rule) and for the
prototype model (``ops.cdist(emb, prototypes)``, where no rule fires). Each is verified at order 1
and 2; the time is the median of N runs (default 5), one thread.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from types import ModuleType

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import markdown_table  # noqa: E402

import autograd_groups as ag  # noqa: E402

TARGET = 10.0


def _demo() -> ModuleType:
    path = Path(__file__).resolve().parents[1] / "examples" / "metric_learning.py"
    spec = importlib.util.spec_from_file_location("metric_learning", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["metric_learning"] = module
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    demo = _demo()
    data = demo.load_data(0)
    rows = []
    for name, model in (("pairwise", demo.PairwiseModel(0)), ("prototypes", demo.PrototypeModel(0))):
        x, y = demo.Batches(data, 0)()
        for order in (1, 2):
            times = []
            for _ in range(args.repeats):
                start = time.perf_counter()
                report = ag.verify(lambda x, y, model=model: model.loss(x, y)[0], x, y, order=order)
                times.append(time.perf_counter() - start)
            counts = ", ".join(f"{n} {status}" for status, n in report.counts().items() if n)
            seconds = statistics.median(times)
            rows.append([f"{name} model, order {order}", f"{seconds:.2f} s",
                         f"{counts}; {'within' if seconds < TARGET else 'OVER'} the {TARGET:.0f} s target"])
    print(f"torch {torch.__version__}, {platform.processor() or platform.machine()}, {os.cpu_count()} "
          f"cores, load average {os.getloadavg()[0]:.1f}; 1 thread; median of {args.repeats} runs\n")
    print(markdown_table(["ag.verify of one step", "time", "rows"], rows))


if __name__ == "__main__":
    main()

"""What ``autograd-groups doctor`` costs a training step of a small MLP (CPU, 1 thread, float32):
the trigger it runs after every backward (one read of whether the loss and the leaf gradients are
finite), and the step it instruments (every torch call of the forward recorded, every node of the
backward hooked). Medians of interleaved runs of a block of steps; the watch is entered once a
block, the instrumented watch once a step (``ag.doctor()`` around it)."""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import TARGET_HEADER, interleaved_medians, markdown_table, target_row  # noqa: E402

import autograd_groups as ag  # noqa: E402
from autograd_groups.doctor.session import Session  # noqa: E402
from autograd_groups.doctor.tensors import leaves_of  # noqa: E402

#: The issue's bounds: the trigger per backward, the instrumented step, over a plain step.
TRIGGER_BOUND, INSTRUMENTED_BOUND = 1.05, 4.0


def mlp_step(batch: int = 64, width: int = 256, inputs: int = 32, hidden: int = 3,
             read: str = "") -> Callable[[], None]:
    """One SGD step of an MLP (``hidden`` layers of ``width``, ReLU) with a cross-entropy loss over
    10 classes. Where ``read`` is ``"params"``, the loss and every gradient are read once after the
    backward, by the step itself: what any exact check of them costs at the least; where it is
    ``"leaves"``, the leaves are found first by the trigger's walk of the graph, as a check that is
    not told them must."""
    torch.manual_seed(0)
    layers: list[torch.nn.Module] = []
    for i in range(hidden):
        layers += [torch.nn.Linear(inputs if i == 0 else width, width), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers, torch.nn.Linear(width, 10))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, y = torch.randn(batch, inputs), torch.randint(0, 10, (batch,))

    def step() -> None:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        leaves = leaves_of([loss.grad_fn])[0] if read == "leaves" else params
        loss.backward()
        if read:
            total = sum((p.grad.sum().item() for p in leaves), loss.item())  # type: ignore[union-attr]
            if not math.isfinite(total):
                raise FloatingPointError("bench_doctor: a gradient of the MLP is not finite")
        opt.step()
    params = list(model.parameters())
    return step


#: The MLPs timed: (label, what it is, step). The first at two batch sizes; the last is the model of
#: PyTorch's own quickstart tutorial (28 x 28 inputs, two hidden layers of 512), at its batch size.
MODELS: list[tuple[str, str, Callable[..., Callable[[], None]]]] = [
    ("batch 64", "4-layer MLP 32-256-256-256-10, batch 64", lambda read="": mlp_step(64, read=read)),
    ("batch 256", "4-layer MLP 32-256-256-256-10, batch 256", lambda read="": mlp_step(256, read=read)),
    ("quickstart MLP", "quickstart MLP 784-512-512-10, batch 64",
     lambda read="": mlp_step(64, width=512, inputs=784, hidden=2, read=read)),
]


def variants(step: Callable[[], None], reading: Callable[[], None], walking: Callable[[], None],
             block: int) -> dict[str, Callable[[], object]]:
    """Each variant runs ``block`` steps: the watch is entered once per block, as the command
    enters it once per script. ``reading`` is ``step`` on a model of its own, reading its gradients;
    ``walking`` one that finds its leaves by a walk of the graph first."""
    def plain() -> None:
        for _ in range(block):
            step()

    def read() -> None:
        for _ in range(block):
            reading()

    def walk() -> None:
        for _ in range(block):
            walking()

    def triggered() -> None:
        with Session(stops=False).installed():
            for _ in range(block):
                step()

    def instrumented() -> None:
        for _ in range(block):
            with ag.doctor() as report:
                step()
            if report.status != "clean":
                raise SystemExit("bench_doctor: the instrumented step was not clean")

    return {"plain": plain, "read": read, "walk": walk, "trigger": triggered, "instrumented": instrumented}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=60)
    parser.add_argument("--block", type=int, default=10, help="steps per timed run")
    args = parser.parse_args()
    torch.set_num_threads(1)
    # The trigger reads every gradient once: its share of a step falls as the batch grows.
    ratios = []
    for _, what, make in MODELS:
        times = interleaved_medians(variants(make(), make(read="params"), make(read="leaves"), args.block),
                                    args.repeats)
        plain = times["plain"]
        ratios.append((times["trigger"] / plain, times["instrumented"] / plain, times["read"] / plain,
                       times["walk"] / plain))
        print(f"torch {torch.__version__}, 1 thread, float32, SGD step of a {what}: plain "
              f"{plain / args.block * 1e3:.2f} ms a step, medians of {args.repeats} interleaved runs of "
              f"{args.block} steps")
    label = " / ".join(label for label, _, _ in MODELS)
    print(markdown_table(TARGET_HEADER, [
        target_row(f"doctor's trigger per backward / plain step, {label}", [r[0] for r in ratios],
                   TRIGGER_BOUND),
        target_row(f"doctor's instrumented step / plain step, {label}", [r[1] for r in ratios],
                   INSTRUMENTED_BOUND)]))
    # Not targets: the floors under the trigger's bound. A check that reads less would miss a NaN.
    print(markdown_table(["the least an exact check costs", "figure"], [
        [f"reading the loss and every gradient once after the backward / plain step, {label}",
         " / ".join(f"{r[2]:.2f}×" for r in ratios)],
        [f"the same, the leaves found by a walk of the graph first / plain step, {label}",
         " / ".join(f"{r[3]:.2f}×" for r in ratios)]]))


if __name__ == "__main__":
    main()

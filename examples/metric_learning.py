"""Metric learning on scikit-learn's handwritten digits: plain autograd breaks, a group fixes it.

A small network embeds the 8x8 digits; a batch-hard triplet loss pulls each image towards the
farthest image of its class and away from the nearest image of another class. The loss reads the
pairwise distance matrix cdist(emb, emb), whose diagonal is 0 at every step, and sqrt'(0) = inf
turns the zero gradient the diagonal receives into 0 * inf = NaN.

Three runs with the same seed:

  (a) the plain composite cdist (ops.cdist with special cases off): NaN at the first step;
  (b) ops.cdist with its rules on: trains; held-out k-NN accuracy and time per step;
  (c) a prototype model, cdist(emb, prototypes), whose distances never reach 0, trained with special
      cases on and off side by side: the same accuracy, and the speed-up of turning them off.

Then the rule statistics of one traced step of each model (which one may turn special cases off)
and the group graph of the pairwise model (OUT/metric_learning.dot and, with Graphviz, .svg).

    python examples/metric_learning.py [--steps 300] [--seed 0] [--out out]
"""

from __future__ import annotations

import argparse
import math
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from rich.console import Console
from rich.progress import Progress
from rich.table import Table
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import autograd_groups as ag
from autograd_groups.ops import cdist
from autograd_groups.viz import stats

CLASSES = 10
PER_CLASS = 16
EMBEDDING = 32
MARGIN = 0.2
SCALE = 8.0
LEARNING_RATE = 1e-3


@dataclass(frozen=True)
class Digits:
    """The digits, split into a training and a held-out set (pixels scaled to [0, 1])."""

    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor


@dataclass
class RunResult:
    """What one training run did.

    ``nan_step`` is the first step (1-based) whose loss or parameter gradients were not finite and
    ``nan_in`` says which ("loss" or "gradients"); the run stops there, before the optimizer would
    write the NaN into the weights, and has no accuracy. ``min_distance`` is the smallest distance
    the loss read.
    """

    name: str
    special_cases: bool
    losses: list[float] = field(default_factory=list)
    step_seconds: list[float] = field(default_factory=list)
    nan_step: int | None = None
    nan_in: str = ""
    accuracy: float | None = None
    min_distance: float = math.inf

    @property
    def seconds_per_step(self) -> float:
        """Median wall time of one training step (forward, backward, optimizer)."""
        return statistics.median(self.step_seconds) if self.step_seconds else math.nan


@dataclass
class DemoResult:
    """The four runs, the stats audit of each model, and the files written."""

    plain: RunResult
    grouped: RunResult
    prototypes_on: RunResult
    prototypes_off: RunResult
    audit: dict[str, list[stats.GroupReport]]
    files: list[Path]

    @property
    def speedup(self) -> float:
        """Time per step of the prototype model, special cases on over off."""
        return self.prototypes_on.seconds_per_step / self.prototypes_off.seconds_per_step


def load_data(seed: int) -> Digits:
    """The 1,797 digits of scikit-learn (no download), 70 % for training, 30 % held out."""
    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
    y = torch.tensor(digits.target)
    train, test = train_test_split(torch.arange(len(y)), test_size=0.3, random_state=seed,
                                   stratify=digits.target)
    return Digits(x[train], y[train], x[test], y[test])


class Batches:
    """Balanced batches: PER_CLASS random training images of each class, the same for one seed."""

    def __init__(self, data: Digits, seed: int) -> None:
        self.pools = [(data.y_train == c).nonzero().squeeze(1) for c in range(CLASSES)]
        self.data = data
        self.generator = torch.Generator().manual_seed(seed)

    def __call__(self) -> tuple[torch.Tensor, torch.Tensor]:
        picks = [pool[torch.randperm(len(pool), generator=self.generator)[:PER_CLASS]]
                 for pool in self.pools]
        index = torch.cat(picks)
        return self.data.x_train[index], self.data.y_train[index]


def batch_hard_triplet_loss(distances: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Batch-hard triplet loss (Hermans et al., 2017) over a pairwise distance matrix.

    The hardest positive is the largest distance to the same class, self included, picked after
    multiplying by the same-class mask as common implementations do: the zero diagonal takes part
    and receives a zero gradient, which the plain composite ``sqrt`` turns into NaN.
    """
    same = (labels[:, None] == labels[None, :]).to(distances.dtype)
    hardest_positive = (distances * same).amax(1)
    hardest_negative = (distances + distances.detach().max() * same).amin(1)
    return F.relu(hardest_positive - hardest_negative + MARGIN).mean()


class EmbeddingModel(torch.nn.Module):
    """64 pixels -> a 32-dimensional embedding on the unit sphere, and a loss over distances."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.net = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(),
                                       torch.nn.Linear(128, EMBEDDING))

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        """Unit-length embeddings of the images ``x``."""
        return F.normalize(self.net(x), dim=1)

    def loss(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The loss of a batch, and the distances it read."""
        raise NotImplementedError


class PairwiseModel(EmbeddingModel):
    """Batch-hard triplet loss over cdist(emb, emb): the diagonal is a special point every step."""

    def loss(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        emb = self.embed(x)
        distances = cdist(emb, emb)
        return batch_hard_triplet_loss(distances, y), distances


class PrototypeModel(EmbeddingModel):
    """One learned prototype per class; logits are -SCALE * cdist(emb, prototypes), never at 0."""

    def __init__(self, seed: int) -> None:
        super().__init__(seed)
        self.prototypes = torch.nn.Parameter(torch.randn(CLASSES, EMBEDDING))

    def loss(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        distances = cdist(self.embed(x), self.prototypes)
        return F.cross_entropy(-SCALE * distances, y), distances


def knn_accuracy(model: EmbeddingModel, data: Digits, k: int = 5) -> float:
    """Held-out accuracy of a k-nearest-neighbour vote among the embedded training images."""
    with torch.no_grad():
        train, test = model.embed(data.x_train), model.embed(data.x_test)
        nearest = torch.cdist(test, train).topk(k, largest=False).indices
        predicted = data.y_train[nearest].mode(1).values
    return float((predicted == data.y_test).float().mean())


def _nonfinite(loss: torch.Tensor, model: torch.nn.Module) -> str:
    if not torch.isfinite(loss):
        return "loss"
    if any(p.grad is not None and not torch.isfinite(p.grad).all() for p in model.parameters()):
        return "gradients"
    return ""


def _step(result: RunResult, model: EmbeddingModel, optimizer: torch.optim.Optimizer,
          x: torch.Tensor, y: torch.Tensor, step: int) -> None:
    """One timed training step; a non-finite loss or gradient ends the run before the update."""
    start = time.perf_counter()
    with ag.special_cases(result.special_cases):
        loss, distances = model.loss(x, y)
    optimizer.zero_grad()
    loss.backward()
    problem = _nonfinite(loss, model)
    if not problem:
        optimizer.step()
    result.step_seconds.append(time.perf_counter() - start)
    result.min_distance = min(result.min_distance, float(distances.detach().min()))
    if problem:
        result.nan_step, result.nan_in = step, problem
    else:
        result.losses.append(float(loss.detach()))


def train(runs: Sequence[tuple[str, bool, EmbeddingModel]], data: Digits, steps: int, seed: int,
          advance: Callable[[], None] = lambda: None) -> list[RunResult]:
    """Train each ``(name, special_cases, model)`` for ``steps`` steps, one step of each in turn.

    Every model sees the same batches. Taking the steps in turn exposes the runs to the same
    machine load, so their times per step compare fairly. ``advance`` is called once per step.
    """
    trainees = [(RunResult(name, enabled), model, torch.optim.Adam(model.parameters(), lr=LEARNING_RATE),
                 Batches(data, seed)) for name, enabled, model in runs]
    for step in range(1, steps + 1):
        for result, model, optimizer, batches in trainees:
            if result.nan_step is None:
                _step(result, model, optimizer, *batches(), step)
        advance()
    for result, model, _, _ in trainees:
        if result.nan_step is None:
            result.accuracy = knn_accuracy(model, data)
    return [result for result, _, _, _ in trainees]


def audit(data: Digits, seed: int) -> tuple[dict[str, list[stats.GroupReport]], ag.Trace]:
    """One traced step of each model with rules on: which groups reached a special point.

    Rules count the elements they change only inside trace sessions, so the verdicts come from
    here, not from the training runs. Returns the reports and the pairwise model's trace.
    """
    found: dict[str, list[stats.GroupReport]] = {}
    sessions: dict[str, ag.Trace] = {}
    for name, model in (("pairwise", PairwiseModel(seed)), ("prototypes", PrototypeModel(seed))):
        ag.reset_stats()
        with ag.trace() as sessions[name]:
            model.loss(*Batches(data, seed)())[0].backward()
        found[name] = stats.reports(ag.stats(), {})
    return found, sessions["pairwise"]


def write_graph(session: ag.Trace, out: Path, console: Console) -> list[Path]:
    """The traced groups as OUT/metric_learning.dot and, when Graphviz is installed, .svg."""
    out.mkdir(parents=True, exist_ok=True)
    dot_path = out / "metric_learning.dot"
    dot_path.write_text(session.to_dot())
    dot = shutil.which("dot")
    if dot is None:
        console.print(f"Wrote {dot_path}, but Graphviz's `dot` is not installed, so no picture. Install "
                      f"Graphviz (apt-get install graphviz, brew install graphviz or conda install "
                      f"graphviz), then: dot -Tsvg {dot_path} -o {dot_path.with_suffix('.svg')}")
        return [dot_path]
    svg_path = dot_path.with_suffix(".svg")
    subprocess.run([dot, "-Tsvg", str(dot_path), "-o", str(svg_path)], check=True)
    return [dot_path, svg_path]


def results_table(runs: Sequence[RunResult], steps: int) -> Table:
    """The runs side by side."""
    table = Table(title=f"Batch-hard triplet loss on load_digits: {steps} steps of "
                        f"{CLASSES}x{PER_CLASS} images, same seed")
    for column in ("run", "first NaN", "final loss", "k-NN acc.", "min dist.", "ms/step"):
        table.add_column(column, justify="left" if column == "run" else "right", no_wrap=True)
    for r in runs:
        broken = r.nan_step is not None
        table.add_row(r.name, f"[red]step {r.nan_step}, {r.nan_in}[/]" if broken else "[green]none[/]",
                      f"{r.losses[-1]:.3f}" if r.losses else "-",
                      "-" if r.accuracy is None else f"{r.accuracy:.3f}", f"{r.min_distance:.3g}",
                      "-" if broken else f"{r.seconds_per_step * 1e3:.2f}")
    return table


def audit_table(found: dict[str, list[stats.GroupReport]]) -> Table:
    """The stats audit of each model, side by side: rule calls, elements changed, verdict."""
    table = Table(title="ag.stats() of one traced step per model, rules on")
    for column in ("model", "group", "rule", "calls", "changed", "verdict"):
        table.add_column(column, justify="right" if column in ("calls", "changed") else "left")
    for model, reports in found.items():
        for report in reports:
            for rule in report.rules:
                color = {stats.KEEP: "red", stats.SAFE: "green"}.get(report.verdict, "dim")
                table.add_row(model, report.name, rule.label, str(rule.calls), str(rule.changed),
                              f"[{color}]{report.verdict}[/]")
    return table


def run_demo(steps: int = 300, seed: int = 0, out: Path = Path("out"),
             console: Console | None = None) -> DemoResult:
    """Run the trainings, print the tables, write the graph; return what happened."""
    console = console or Console()
    data = load_data(seed)
    with Progress(console=console, transient=True) as progress:
        first = progress.add_task("(a) and (b): cdist(emb, emb)", total=steps)
        plain, grouped = train([("(a) plain composite", False, PairwiseModel(seed)),
                                ("(b) group, rules on", True, PairwiseModel(seed))],
                               data, steps, seed, lambda: progress.advance(first))
        second = progress.add_task("(c) cdist(emb, prototypes)", total=steps)
        on, off = train([("(c) prototypes, rules on", True, PrototypeModel(seed)),
                         ("(c) prototypes, rules off", False, PrototypeModel(seed))],
                        data, steps, seed, lambda: progress.advance(second))
    found, session = audit(data, seed)
    result = DemoResult(plain, grouped, on, off, found, write_graph(session, out, console))
    console.print(results_table([plain, grouped, on, off], steps))
    console.print(f"Special cases off, prototype model: {on.seconds_per_step * 1e3:.2f} -> "
                  f"{off.seconds_per_step * 1e3:.2f} ms per step, a speed-up of {result.speedup:.2f}x.")
    console.print(audit_table(result.audit))
    for name, reports in result.audit.items():
        line = stats.off_line(reports)
        if line:
            console.print(f"The {name} model never reaches a special point; it may run under\n  {line}")
    console.print("Group graph: " + ", ".join(map(str, result.files)))
    return result


def main(argv: list[str] | None = None) -> int:
    """Command line: ``--steps``, ``--seed``, ``--out``."""
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=300, help="training steps per run (default 300)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the split, weights and batches")
    parser.add_argument("--out", type=Path, default=Path("out"), help="folder for the graph (default out)")
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error("--steps must be at least 1")
    # The matrices are small: one thread is as fast, and times per step stay comparable when other
    # processes share the cores.
    torch.set_num_threads(1)
    run_demo(args.steps, args.seed, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

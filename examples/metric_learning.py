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
and the group graph of the pairwise model: OUT/metric_learning.dot and, drawn with pygraphviz (the
``viz`` extra) or Graphviz's ``dot``, OUT/metric_learning.svg.

With ``--compile``, (b) also trains under ``torch.compile(fullgraph=True)``, its steps taken in turn
with the eager run's: the same losses and accuracy, and the time per step of each.

The tables fit 80 columns and print the same in a terminal and in a log; the progress bar shows
only in a terminal.

    python examples/metric_learning.py [--steps 300] [--seed 0] [--out out] [--compile]
"""

from __future__ import annotations

import argparse
import math
import statistics
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
from rich.text import Text
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import autograd_groups as ag
from autograd_groups import viz
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
    """The four runs (five with ``--compile``), the stats audit of each model, and the files written."""

    plain: RunResult
    grouped: RunResult
    prototypes_on: RunResult
    prototypes_off: RunResult
    audit: dict[str, list[stats.GroupReport]]
    files: list[Path]
    compiled: RunResult | None = None

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


@dataclass(frozen=True)
class Run:
    """A training run to make: its name, the special-cases setting, the model, and whether its loss
    runs under ``torch.compile(fullgraph=True)``."""

    name: str
    special_cases: bool
    model: EmbeddingModel
    compiled: bool = False


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


LossFn = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


def _step(result: RunResult, model: EmbeddingModel, loss_fn: LossFn, optimizer: torch.optim.Optimizer,
          x: torch.Tensor, y: torch.Tensor, step: int) -> None:
    """One timed training step; a non-finite loss or gradient ends the run before the update."""
    start = time.perf_counter()
    with ag.special_cases(result.special_cases):
        loss, distances = loss_fn(x, y)
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


def train(runs: Sequence[Run], data: Digits, steps: int, seed: int,
          advance: Callable[[], None] = lambda: None) -> list[RunResult]:
    """Train each run's model for ``steps`` steps, one step of each run in turn.

    Every model sees the same batches. Taking the steps in turn exposes the runs to the same
    machine load, so their times per step compare fairly. ``advance`` is called once per step.
    A compiled run compiles at its first step, which the median time per step all but ignores.
    """
    trainees = [(RunResult(run.name, run.special_cases), run.model,
                 torch.compile(run.model.loss, fullgraph=True) if run.compiled else run.model.loss,
                 torch.optim.Adam(run.model.parameters(), lr=LEARNING_RATE), Batches(data, seed))
                for run in runs]
    for step in range(1, steps + 1):
        for result, model, loss_fn, optimizer, batches in trainees:
            if result.nan_step is None:
                _step(result, model, loss_fn, optimizer, *batches(), step)
        advance()
    for result, model, *_ in trainees:
        if result.nan_step is None:
            result.accuracy = knn_accuracy(model, data)
    return [result for result, *_ in trainees]


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
    """The traced groups as OUT/metric_learning.dot and, when a picture can be drawn, .svg."""
    out.mkdir(parents=True, exist_ok=True)
    dot_path = out / "metric_learning.dot"
    viz.write(session.instances, dot_path)
    svg_path = dot_path.with_suffix(".svg")
    try:
        viz.write(session.instances, svg_path)
    except viz.GraphvizNotFound as e:
        console.print(f"Wrote {dot_path}, but no picture: {e}.", markup=False, highlight=False)
        return [dot_path]
    return [dot_path, svg_path]


def results_table(runs: Sequence[RunResult], steps: int) -> Table:
    """The runs side by side, in 80 columns: short run names, headers on two lines."""
    table = Table(title=f"Batch-hard triplet loss on load_digits: {steps} steps of "
                        f"{CLASSES}x{PER_CLASS} images, same seed")
    for column in ("run", "first NaN", "final\nloss", "k-NN\nacc.", "min\ndist.", "ms/step"):
        table.add_column(column, justify="left" if column == "run" else "right")
    for r in runs:
        broken = r.nan_step is not None
        table.add_row(r.name, f"[red]step {r.nan_step}, {r.nan_in}[/]" if broken else "[green]none[/]",
                      f"{r.losses[-1]:.3f}" if r.losses else "-",
                      "-" if r.accuracy is None else f"{r.accuracy:.3f}", f"{r.min_distance:.3g}",
                      "-" if broken else f"{r.seconds_per_step * 1e3:.2f}")
    return table


def audit_table(found: dict[str, list[stats.GroupReport]]) -> Table:
    """The stats audit of each model, side by side: elements each rule changed, and the verdict.
    The rule stands under its group's name, so that a row fits 80 columns."""
    table = Table(title="ag.stats() of one traced step per model, rules on")
    for column in ("model", "group / rule", "changed", "verdict"):
        table.add_column(column, justify="right" if column == "changed" else "left")
    for model, reports in found.items():
        for report in reports:
            for rule in report.rules:
                color = {stats.KEEP: "red", stats.SAFE: "green"}.get(report.verdict, "dim")
                table.add_row(model, Text.assemble(report.name, "\n", (rule.label, "dim")),
                              str(rule.changed), f"[{color}]{report.verdict}[/]")
    return table


AGREE = 1e-5  # relative: float32 rounding, reordered by inductor's fused kernels


def steps_in_agreement(eager: RunResult, compiled: RunResult) -> int:
    """How many first steps of the two runs have losses equal within ``AGREE`` (relative)."""
    pairs = list(zip(eager.losses, compiled.losses))
    return next((k for k, (a, b) in enumerate(pairs) if not math.isclose(a, b, rel_tol=AGREE, abs_tol=1e-7)),
                len(pairs))


def compile_lines(eager: RunResult, compiled: RunResult) -> list[str]:
    """Eager against compiled: time per step, and how long their losses stay equal. Batch-hard mining
    and Adam amplify float rounding, so two runs that differ only in it drift apart after a while."""
    agree, steps = steps_in_agreement(eager, compiled), len(eager.losses)
    accuracy = [f"{r.accuracy:.3f}" if r.accuracy is not None else "-" for r in (compiled, eager)]
    return [f"(b) under torch.compile(fullgraph=True): {eager.seconds_per_step * 1e3:.2f} ms/step eager, "
            f"{compiled.seconds_per_step * 1e3:.2f} compiled",
            f"  first step (compiling) {compiled.step_seconds[0]:.1f} s; losses equal to eager's "
            f"(rel. {AGREE:.0e})",
            f"  for {agree} of {steps} steps" + (", then apart as float rounding grows in training;"
                                                 if agree < steps else ";"),
            f"  k-NN accuracy {accuracy[0]} compiled, {accuracy[1]} eager."]


def run_demo(steps: int = 300, seed: int = 0, out: Path = Path("out"),
             console: Console | None = None, with_compile: bool = False) -> DemoResult:
    """Run the trainings, print the tables, write the graph; return what happened. ``with_compile``
    adds a run of (b) under ``torch.compile(fullgraph=True)``."""
    console = console or Console()
    data = load_data(seed)
    pairwise = [Run("(a) plain composite", False, PairwiseModel(seed)),
                Run("(b) group, rules on", True, PairwiseModel(seed))]
    if with_compile:
        pairwise.append(Run("(b) torch.compile", True, PairwiseModel(seed), compiled=True))
    # A progress bar is for a person watching a terminal; in a log it would be noise.
    with Progress(console=console, transient=True, disable=not console.is_terminal) as progress:
        first = progress.add_task("(a) and (b): cdist(emb, emb)", total=steps)
        plain, grouped, *compiled = train(pairwise, data, steps, seed, lambda: progress.advance(first))
        second = progress.add_task("(c) cdist(emb, prototypes)", total=steps)
        on, off = train([Run("(c) prototypes, on", True, PrototypeModel(seed)),
                         Run("(c) prototypes, off", False, PrototypeModel(seed))],
                        data, steps, seed, lambda: progress.advance(second))
    found, session = audit(data, seed)
    result = DemoResult(plain, grouped, on, off, found, write_graph(session, out, console),
                        compiled[0] if compiled else None)
    console.print(results_table([plain, grouped, *compiled, on, off], steps))
    console.print(f"Prototype model, special cases off: {on.seconds_per_step * 1e3:.2f} -> "
                  f"{off.seconds_per_step * 1e3:.2f} ms/step, {result.speedup:.2f}x faster.")
    if result.compiled is not None:
        for line in compile_lines(grouped, result.compiled):
            console.print(line, markup=False, highlight=False)
    console.print(audit_table(result.audit))
    for name, reports in result.audit.items():
        line = stats.off_line(reports)
        if line:
            console.print(f"The {name} model never reaches a special point; it may run under\n  {line}")
    console.print("Group graph: " + ", ".join(map(str, result.files)))
    return result


def main(argv: list[str] | None = None) -> int:
    """Command line: ``--steps``, ``--seed``, ``--out``, ``--compile``."""
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=300, help="training steps per run (default 300)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the split, weights and batches")
    parser.add_argument("--out", type=Path, default=Path("out"), help="folder for the graph (default out)")
    parser.add_argument("--compile", action="store_true",
                        help="also train (b) under torch.compile(fullgraph=True) and compare")
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error("--steps must be at least 1")
    # The matrices are small: one thread is as fast, and times per step stay comparable when other
    # processes share the cores.
    torch.set_num_threads(1)
    run_demo(args.steps, args.seed, args.out, with_compile=args.compile)
    return 0


if __name__ == "__main__":
    sys.exit(main())

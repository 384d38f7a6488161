"""Helpers shared by the benchmarks: interleaved repetitions, medians, saved bytes, a markdown table."""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch


def interleaved_medians(variants: dict[str, Callable[[], object]], repeats: int,
                        warmup: int = 3) -> dict[str, float]:
    """Median seconds of each variant, run round-robin so that machine noise hits all alike, in a
    new (seeded) order each round so that no variant always runs after the same one."""
    for _ in range(warmup):
        for fn in variants.values():
            fn()
    times: dict[str, list[float]] = {name: [] for name in variants}
    order = list(variants.items())
    shuffle = random.Random(0).shuffle
    for _ in range(repeats):
        shuffle(order)
        for name, fn in order:
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    """A GitHub-flavoured markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def saved_bytes(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> int:
    """Bytes of the distinct storages that ``fn(*args, **kwargs)`` saves for its backward.

    A storage counts once however many saved tensors view it (``x * x`` keeps one ``x``, an
    expanded view keeps its small base); inputs count too, as native ops keep theirs."""
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
        # Detached: an op's own output, packed with its grad_fn, would hold its node in a cycle
        # through C++ that the collector cannot see, and the whole graph would outlive the call.
        return t.detach()

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(*args, **kwargs)
    return sum(storages.values())


def verdict(value: float, target: float) -> str:
    """A measured ratio against its upper bound, as the target rows print it."""
    return f"{value:.2f} (≤ {target}: {'met' if value <= target else 'MISSED'})"


#: The columns of a target table: what is measured, the figures, the target, met or missed.
TARGET_HEADER = ["target", "figure", "bound", "status"]


def target_row(what: str, figures: list[float], bound: float, unit: str = "×") -> list[str]:
    """A row of an issue's target table: met when every figure is at most ``bound``."""
    status = "met" if all(f <= bound for f in figures) else "missed"
    return [what, " / ".join(f"{f:.2f}{unit}" for f in figures), f"≤ {bound}{unit}", status]


def median_time(run: Callable[[], object], repeats: int,
                clock: Callable[[], float] = time.perf_counter) -> float:
    """Median seconds of ``repeats`` runs of ``run`` by ``clock`` (``time.process_time`` counts this
    process's CPU time alone, which a loaded machine disturbs less)."""
    times = []
    for _ in range(repeats):
        start = clock()
        run()
        times.append(clock() - start)
    return statistics.median(times)


def once_per_call_site(cases: dict[str, Callable[[], object]], forget: Callable[[], None], repeats: int,
                       clock: Callable[[], float] = time.perf_counter) -> str:
    """A table of what a check made once per call site costs: each case run as at a new call site
    (after ``forget``) and again, and the difference."""
    rows = []
    for name, run in cases.items():
        run()  # warm-up: first uses, lazy imports

        def first(run: Callable[[], object] = run) -> None:
            forget()
            run()

        new, again = median_time(first, repeats, clock), median_time(run, repeats, clock)
        rows.append([name, f"{new * 1e3:.1f} ms", f"{again * 1e3:.1f} ms", f"{(new - again) * 1e3:.1f} ms"])
    return markdown_table(["case", "first at a call site", "again", "the check"], rows)

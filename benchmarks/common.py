"""Timing helpers shared by the benchmarks: interleaved repetitions, medians, a markdown table."""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable


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


#: The columns of a target table: what is measured, the figures, the target, met or missed.
TARGET_HEADER = ["target", "figure", "bound", "status"]


def target_row(what: str, figures: list[float], bound: float, unit: str = "×") -> list[str]:
    """A row of an issue's target table: met when every figure is at most ``bound``."""
    status = "met" if all(f <= bound for f in figures) else "missed"
    return [what, " / ".join(f"{f:.2f}{unit}" for f in figures), f"≤ {bound}{unit}", status]

"""Where the time of one tiny group call goes: issue 23's per-call profile.

    python benchmarks/profile_call.py [--calls N]

The group is ``sqrt(sum(x * x))`` on a (4, 3) tensor with its ``sqrt`` rule (one row of x zero, so
the rule fires). Each phase is timed in-process, 1 thread, by wrapping the library function that
does it with a clock (about 0.1 µs per wrapper); the table gives medians over ``--calls`` calls, in
µs, beside the plain composite's forward and backward:

- forward, ops: the composite's own ops (the plain forward);
- forward, entry: the decorator until the instance opens, and after it closes (flag, registry);
- forward, open: ``open_instance``; walk: ``close_instance`` less the hooks it installs;
- forward, hook install: ``install_rules``;
- backward, engine: the backward less the rule's hook; backward, hook: the ``SiteHook`` calls.

A second table gives what the design costs before a rule does anything: forward + backward of the
group with its rule site's hook replaced by one that returns None, and with no hook installed at
all (the instance, its walk and its counts), against the group as it is and the plain composite
(interleaved, before the clocks are installed); then the least a rule site written in Python can
cost, the same group written by hand without the library (``lean_group.py``), bare and with the
library's bookkeeping, and the library's own objects driven by the shortest open, walk and install
(an express path); and last the group once ``torch._dynamo`` is imported, as it is in a process
that uses ``torch.compile``.

A third table times, in the same process, the kernels the hooks run or choose between on the CPU:
a subgradient's compare with a number, counting a bool mask against the fill it may skip
(subgradient rules), and for a NaN-safe site the sum that tells whether a gradient has anything to
zero, then zeroing a float32 gradient where the incoming gradient is 0: with ``torch.where``, with
``masked_fill_``, and as the hooks do, multiplying its bits by ``incoming.bool()``.
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_targets import norm3, vectors  # noqa: E402
from common import interleaved_medians, markdown_table  # noqa: E402
from lean_group import bare, express, kept  # noqa: E402

import autograd_groups as ag  # noqa: E402
from autograd_groups.groups import group, lifecycle  # noqa: E402
from autograd_groups.sites import hooks  # noqa: E402
from autograd_groups.sites.hooks import _keep_where  # noqa: E402

_spent: dict[str, float] = {}


def _clocked(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def run(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            _spent[name] = _spent.get(name, 0.0) + time.perf_counter() - start

    return run


def _clock_library() -> None:
    group.open_instance = _clocked("open", group.open_instance)  # type: ignore[attr-defined]
    group.close_instance = _clocked("close", group.close_instance)  # type: ignore[attr-defined]
    lifecycle.install_rules = _clocked("install", lifecycle.install_rules)  # type: ignore[assignment]
    call = hooks.SiteHook.__call__
    hooks.SiteHook.__call__ = _clocked("hook", call)  # type: ignore[method-assign]


def _phases(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> dict[str, float]:
    _spent.clear()
    start = time.perf_counter()
    out = fn(x)
    forward = time.perf_counter() - start
    grad = torch.ones_like(out)
    start = time.perf_counter()
    out.backward(grad)
    backward = time.perf_counter() - start
    x.grad = None
    return {"forward": forward, "backward": backward, **_spent}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--calls", type=int, default=3000)
    args = parser.parse_args()
    torch.set_num_threads(1)
    ag.register_rule("bench.norm3", ag.Subgradient(op="sqrt", when="result == 0", grad=0))
    grouped = ag.autograd_group("bench.norm3")(norm3)
    x = vectors()
    below = floors(grouped, x, args.calls)
    _clock_library()
    runs: dict[str, list[dict[str, float]]] = {"plain": [], "group": []}
    for i in range(args.calls + 100):
        for name, fn in (("plain", norm3), ("group", grouped))[:: 1 if i % 2 else -1]:
            phases = _phases(fn, x)
            if i >= 100:
                runs[name].append(phases)

    def median(name: str, phase: Callable[[dict[str, float]], float]) -> float:
        return statistics.median(phase(p) for p in runs[name]) * 1e6

    rows = [
        ("forward, ops", median("plain", lambda p: p["forward"]), None),
        ("forward, entry", None, median("group", lambda p: p["forward"] - p["open"] - p["close"])
         - median("plain", lambda p: p["forward"])),
        ("forward, open", None, median("group", lambda p: p["open"])),
        ("forward, walk", None, median("group", lambda p: p["close"] - p["install"])),
        ("forward, hook install", None, median("group", lambda p: p["install"])),
        ("backward, engine", median("plain", lambda p: p["backward"]),
         median("group", lambda p: p["backward"] - p.get("hook", 0.0))),
        ("backward, hook", None, median("group", lambda p: p.get("hook", 0.0))),
        ("forward + backward", median("plain", lambda p: p["forward"] + p["backward"]),
         median("group", lambda p: p["forward"] + p["backward"])),
    ]
    print(f"torch {torch.__version__}, 1 thread, medians of {args.calls} calls each, µs")
    print(markdown_table(["phase", "plain", "group"],
                         [[name, "" if a is None else f"{a:.1f}", "" if b is None else f"{b:.1f}"]
                          for name, a, b in rows]))
    print()
    print(markdown_table(["variant, forward + backward", "µs", "× plain"], below))
    print()
    print(markdown_table(["kernel", "µs"], kernels(max(20, args.calls // 20))))


def floors(grouped: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, repeats: int) -> list[list[str]]:
    """Median µs of the group as it is, with a hook that returns None, and with no hook, each run
    interleaved with the plain composite and given as a multiple of it."""
    def step(fn: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[], None]:
        def run() -> None:
            x.grad = None
            out = fn(x)
            out.backward(torch.ones_like(out))

        return run

    def variant(name: str, hook: Any, install: Any, fn: Callable[[torch.Tensor], torch.Tensor] = grouped,
                ) -> list[str]:
        hooks.SiteHook.__call__, lifecycle.install_rules = hook, install  # type: ignore[method-assign]
        try:
            m = interleaved_medians({"plain": step(norm3), "group": step(fn)}, repeats)
        finally:
            hooks.SiteHook.__call__, lifecycle.install_rules = call, install_rules  # type: ignore[method-assign]
        group, plain = m["group"], m["plain"]
        return [name, f"{group * 1e6:.1f} (plain {plain * 1e6:.1f})", f"{group / plain:.2f}"]

    call, install_rules = hooks.SiteHook.__call__, lifecycle.install_rules
    rows = [variant("group, rules on", call, install_rules),
            variant("group, hook that returns None", lambda self, *grads: None, install_rules),
            variant("group, no hook installed", call, lambda *args, **kwargs: None),
            variant("by hand (lean_group.py): walk, hook, compare, fill", call, install_rules, bare),
            variant("by hand, with the bookkeeping the library keeps", call, install_rules, kept),
            variant("the library's instance, site hook and counts, opened and hooked by hand", call,
                    install_rules, express)]
    # Last: a process that has imported Dynamo (any torch.compile) keeps it. A rule site then also
    # keeps its saved values at forward, for a backward that compiled autograd may run.
    importlib.import_module("torch._dynamo")
    return rows + [variant("group, rules on, once torch._dynamo is imported", call, install_rules)]


def _count_or_fill(n: int, repeats: int) -> list[str]:
    mask, grad = torch.zeros(n, dtype=torch.bool), torch.rand(n)
    m = interleaved_medians({"count": lambda: bool(torch.count_nonzero(mask)),
                             "fill": lambda: grad.masked_fill_(mask, 0.0)}, repeats)
    return [f"count a mask / a fill that sets nothing, {n} elements",
            f"{m['count'] * 1e6:.1f} / {m['fill'] * 1e6:.1f}"]


def _compare(repeats: int) -> list[str]:
    result, zero = torch.rand(4), torch.tensor(0.0)
    m = interleaved_medians({"eq": lambda: torch.Tensor.eq(result, zero)}, repeats)
    return ["a subgradient's compare, result == 0 (a 0-dim tensor), 4 elements", f"{m['eq'] * 1e6:.1f}"]


def _zeroing(shape: tuple[int, ...], repeats: int) -> list[str]:
    incoming, base = torch.rand(shape), torch.rand(shape)
    incoming[incoming < 0.125] = 0
    base[incoming == 0] = float("nan")
    work = base.clone()  # filled in place from base, as a hook fills the gradient it was given
    m = interleaved_medians({"look": lambda: base.sum().item(),
                             "where": lambda: torch.where(incoming == 0, 0.0, base),
                             "fill": lambda: work.copy_(base).masked_fill_(incoming == 0, 0),
                             "keep": lambda: _keep_where(work.copy_(base), incoming.bool()),
                             "copy": lambda: work.copy_(base)}, repeats)
    return [f"NaN-safe, {shape}: a gradient's sum read (the look) / zero where incoming is 0: "
            f"where(incoming == 0, 0, grad) / masked_fill_(incoming == 0) / the bits times "
            f"incoming.bool() (both in place, less a copy)",
            f"{m['look'] * 1e6:.1f} / {m['where'] * 1e6:.1f} / {(m['fill'] - m['copy']) * 1e6:.1f} / "
            f"{(m['keep'] - m['copy']) * 1e6:.1f}"]


def kernels(repeats: int) -> list[list[str]]:
    """Median µs of the kernels a CPU hook chooses between."""
    return ([_compare(repeats)] + [_count_or_fill(n, repeats) for n in (4, 1024, 4096, 16384, 262144)]
            + [_zeroing(shape, repeats) for shape in ((64,), (4096,), (256, 64), (4096, 64))])


if __name__ == "__main__":
    main()

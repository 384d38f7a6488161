"""CUDA checks for autograd-groups: the built-ins, the flag on the engine's device threads, speed.

    python scripts/gpu_check.py                 # on a machine with a CUDA device
    python scripts/gpu_check.py --device cpu    # the same checks on the CPU (tests the script)

1. Every built-in (``ag.ops.*``, each case of tests/ops_cases.py, float32 and float64): forward and
   backward on the device against the native PyTorch op, at inputs that contain the op's special
   points.
2. The special-cases flag: on CUDA the autograd engine runs the backward of CUDA nodes on its own
   device thread, not on the thread that called ``backward()``. Checked: a rule runs on that thread;
   the flag recorded at forward holds there; ``special_cases(False, during="backward")`` reaches
   it; 4 threads at once, half of them inside such a block, each get their own reference result.
3. No host synchronisation: the forward and backward of every built-in and of each rule kind
   (tests/rule_kinds.py), after a warm-up call, under ``torch.cuda.set_sync_debug_mode("error")``;
   and how many times a step synchronises under ``ag.trace()``, which may read values.
4. Autocast (bfloat16 and float16): every built-in's output dtype and precision as native's
   (scripts/autocast_check.py).
5. A speed table: forward+backward of built-ins against the native ops (median of ``--repeat``
   interleaved runs), with special cases on and off, against a hand-written ``autograd.Function``
   where there is one (cdist), and the peak memory of a forward+backward against native's.
6. NaN-safe groups (issue 30): the Rodrigues rotation (batch 64 to 4,194,304) and the entropy of
   256 columns (64 to 262,144 rows) of benchmarks/bench_targets.py, rules on and off, against the
   hand-written double ``where``; checked: the same gradients. ``--only nan-safe`` runs this alone.
7. torch.compile (the variants of benchmarks/bench_compile.py): the Euclidean cdist as the plain
   composite, the group, a hand-written autograd.Function and torch.cdist, eager and compiled with
   inductor (Triton kernels on CUDA), and with ``mode="reduce-overhead"`` (CUDA graphs) on CUDA.
   Checked: the compiled group's gradients equal the eager group's, and, under CUDA graphs, a
   compiled step runs with ``torch.cuda.set_sync_debug_mode("error")`` (a rule site that
   synchronised the device would raise) and no graph is skipped by CUDA graph trees.

8. Compiled groups: the Rodrigues rotation as a ``compile=True`` NaN-safe group (batch 64 to
   4,194,304) against the hand-written double ``where`` eagerly and under a plain ``torch.compile``
   called from eager code, each size its own static graph; on CUDA also both with
   ``mode="reduce-overhead"`` (CUDA graphs). Checked: the same gradients as the hand form's. On the
   CPU (which tests the script) they compile with ``aot_eager``. ``--only region`` runs this alone.

Without a CUDA device it prints a message and exits 0. Exit status 1 when a check fails.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

import autograd_groups as ag

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import ops_cases  # noqa: E402  (the built-ins' cases with special points, shared with the tests)
import rule_kinds  # noqa: E402  (one group per rule kind, shared with tests/test_host_sync.py)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import bench_targets  # noqa: E402  (the NaN-safe groups of issues 23 and 30 and their hand forms)
from bench_core import HandWrittenCdist, example  # noqa: E402  (the compile benchmark's variants)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from autocast_check import autocast_check  # noqa: E402  (every built-in under autocast, as native)

TOLERANCE = {torch.float32: (1e-4, 1e-5), torch.float64: (1e-7, 1e-7)}  # (rtol, atol)


def _upstream(out: torch.Tensor) -> torch.Tensor:
    """A non-uniform, nonzero upstream gradient (as tests/ops_cases.py, on ``out``'s device)."""
    return ((torch.arange(out.numel(), device=out.device) % 5 + 1).to(out.dtype) / 2).reshape(out.shape)


def _on(device: torch.device, args: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(a.detach().to(device).requires_grad_() if isinstance(a, torch.Tensor) else a for a in args)


def _forward_backward(fn: Callable[..., torch.Tensor], args: tuple[Any, ...],
                      kwargs: dict[str, Any]) -> list[torch.Tensor]:
    leaves = [a for a in args if isinstance(a, torch.Tensor)]
    out = fn(*args, **kwargs)
    return [out.detach(), *torch.autograd.grad(out, leaves, _upstream(out))]


def _worst(got: list[torch.Tensor], want: list[torch.Tensor]) -> float:
    """The largest difference between finite values; inf where one side is not finite alone."""
    worst = 0.0
    for g, w in zip(got, want):
        g, w = g.double(), w.double()
        same = (g == w) | (g.isnan() & w.isnan())
        diff = torch.where(same, 0.0, (g - w).abs()).nan_to_num(float("inf"))
        worst = max(worst, float(diff.max()) if diff.numel() else 0.0)
    return worst


def check_builtins(device: torch.device) -> int:
    """Every built-in case on ``device`` against the native op; the number of failures."""
    failures = 0
    print(f"\n## Built-ins on {device}: forward and backward against the native op\n")
    print("| case | dtype | max abs difference (value, gradients) | result |")
    print("| --- | --- | --- | --- |")
    for case in ops_cases.CASES:
        for dtype in (torch.float32, torch.float64):
            args = ops_cases.inputs(case, dtype)
            ours = _forward_backward(case.ours, _on(device, args), case.kwargs)
            native = _forward_backward(case.native, _on(device, args), case.kwargs)
            rtol, atol = TOLERANCE[dtype]
            try:
                for got, want in zip(ours, native):
                    torch.testing.assert_close(got, want, rtol=rtol, atol=atol, equal_nan=True)
                result = "ok"
            except AssertionError as e:
                failures += 1
                result = "FAIL: " + str(e).splitlines()[0]
            dtype_name = str(dtype).removeprefix("torch.")
            print(f"| {case.id} | {dtype_name} | {_worst(ours, native):.2e} | {result} |")
    return failures


def _flag_checks(device: torch.device) -> list[tuple[str, bool]]:
    ran_on: set[int] = set()

    def at_zero(result: torch.Tensor) -> torch.Tensor:
        ran_on.add(threading.get_ident())
        return result == 0

    ag.register_rule("gpu_check.norm", ag.Subgradient(op="sqrt", when=at_zero, grad=0))
    grouped = ag.autograd_group("gpu_check.norm")(lambda x: x.pow(2).sum(-1).sqrt())

    def grad(x: torch.Tensor, loss: torch.Tensor) -> torch.Tensor:
        return torch.autograd.grad(loss, x)[0]

    def point() -> torch.Tensor:
        x = torch.tensor([[0.0, 0.0], [3.0, 4.0]], device=device, requires_grad=True)
        return x

    def finite(g: torch.Tensor) -> bool:
        return bool(torch.isfinite(g).all())

    checks: list[tuple[str, bool]] = []
    x = point()
    checks.append(("rules on: finite gradient", finite(grad(x, grouped(x).sum()))))
    if device.type == "cuda":
        checks.append(("the rule ran on the engine's device thread, not the caller's",
                       bool(ran_on) and threading.get_ident() not in ran_on))
    with ag.special_cases(False):
        loss = grouped(x).sum()
    checks.append(("flag off at forward, on at backward: NaN, as the plain composite",
                   not finite(grad(x, loss))))
    loss = grouped(x).sum()
    with ag.special_cases(False):
        checks.append(("flag on at forward, off at backward: finite (the forward decides)",
                       finite(grad(x, loss))))
    loss = grouped(x).sum()
    with ag.special_cases(False, during="backward"):
        checks.append(('during="backward" off: NaN on the device thread', not finite(grad(x, loss))))

    reference = grad(x, grouped(x).sum())
    mismatches = [0] * 4
    barrier = threading.Barrier(4)

    def work(k: int) -> None:
        barrier.wait()
        for _ in range(50):
            loss = grouped(x).sum()
            if k % 2:
                with ag.special_cases(False, during="backward"):
                    mismatches[k] += finite(grad(x, loss))
            else:
                mismatches[k] += not torch.equal(grad(x, loss), reference)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    checks.append(('4 threads x 50, half in during="backward" blocks: each pass obeys its own thread',
                   mismatches == [0] * 4))
    return checks


def check_flag(device: torch.device) -> int:
    """The flag's guarantees with the backward on the engine's threads; the number of failures."""
    print(f"\n## The special-cases flag, backward on {device}\n")
    with ag.registry_scope():
        checks = _flag_checks(device)
    for label, passed in checks:
        print(f"- {'ok  ' if passed else 'FAIL'} {label}")
    return sum(not passed for _, passed in checks)


def _syncs(step: Callable[[], object], device: torch.device) -> str | None:
    """None if ``step()`` ran without synchronising the host with ``device``, else what stopped it."""
    if device.type != "cuda":
        step()
        return None
    torch.cuda.synchronize(device)
    torch.cuda.set_sync_debug_mode("error")
    try:
        step()
    except RuntimeError as e:
        return str(e).splitlines()[0]
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return None


def _sync_count(step: Callable[[], object], device: torch.device) -> int:
    """How many times ``step()`` synchronised the host with ``device`` (0 off CUDA)."""
    if device.type != "cuda":
        step()
        return 0
    torch.cuda.synchronize(device)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in seen)


def check_syncs(device: torch.device) -> int:
    """Forward and backward of every built-in and rule kind without a host sync; the failures."""
    print(f"\n## Host synchronisation on {device}: forward + backward after a warm-up call\n")
    steps: list[tuple[str, Callable[[], object]]] = []
    for case in ops_cases.CASES:
        args = _on(device, ops_cases.inputs(case, torch.float32))
        steps.append((case.id, functools.partial(_forward_backward, case.ours, args, case.kwargs)))
    for kind, build in rule_kinds.KINDS.items():
        x = rule_kinds.special_input(device).requires_grad_()
        steps.append((f"{kind} rule", functools.partial(_forward_backward, build(), (x,), {})))
    failures = 0
    for label, step in steps:
        step()  # warm-up: caches, kernels
        stopped = _syncs(step, device)
        failures += stopped is not None
        print(f"- {'ok  ' if stopped is None else 'FAIL'} {label}" + (f": {stopped}" if stopped else ""))
    traced = steps[-3][1]
    with ag.trace():
        count = _sync_count(traced, device)
    print(f"- info: one step of the subgradient rule under ag.trace() synchronised {count} time(s) "
          f"(a trace reads the counts of changed elements)")
    return failures


def _speed_cases(device: torch.device, scale: int) -> list[tuple[str, Callable[..., torch.Tensor],
                                                              Callable[..., torch.Tensor], tuple[Any, ...],
                                                              dict[str, Any]]]:
    g = torch.Generator(device=device).manual_seed(0)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g, device=device)

    n, d = 1024 // scale, 64
    rows, cols = 4096 // scale, 1024 // scale
    ops = ag.ops
    return [
        (f"cdist ({n}, {n}, {d}), p=2", ops.cdist, torch.cdist, (randn(n, d), randn(n, d)), {}),
        (f"cdist ({n // 4}, {n // 4}, {d}), p=1", ops.cdist, torch.cdist,
         (randn(n // 4, d), randn(n // 4, d)), {"p": 1.0}),
        (f"pdist ({n // 2}, {d})", ops.pdist, torch.pdist, (randn(n // 2, d),), {}),
        (f"vector_norm ({rows}, {cols}), dim=-1", ops.vector_norm, torch.linalg.vector_norm,
         (randn(rows, cols),), {"dim": -1}),
        (f"normalize ({rows}, {cols})", ops.normalize, F.normalize, (randn(rows, cols),), {}),
        (f"cosine_similarity ({rows}, {cols})", ops.cosine_similarity, F.cosine_similarity,
         (randn(rows, cols), randn(rows, cols)), {}),
        (f"std ({rows}, {cols}), dim=-1", ops.std, torch.std, (randn(rows, cols),), {"dim": -1}),
        (f"pow ({rows}, {cols})", ops.pow, torch.pow, (randn(rows, cols).abs(), randn(rows, cols)), {}),
        (f"atan2 ({rows}, {cols})", ops.atan2, torch.atan2, (randn(rows, cols), randn(rows, cols)), {}),
        (f"xlogy ({rows}, {cols})", ops.xlogy, torch.xlogy, (randn(rows, cols), randn(rows, cols).abs()), {}),
        (f"logsumexp ({rows}, {cols}), dim=-1", ops.logsumexp, torch.logsumexp, (randn(rows, cols),),
         {"dim": -1}),
    ]


def _time(fn: Callable[..., torch.Tensor], args: tuple[Any, ...], kwargs: dict[str, Any],
          enabled: bool, device: torch.device) -> float:
    leaves = [a for a in args if isinstance(a, torch.Tensor)]
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    with ag.special_cases(enabled):
        out = fn(*args, **kwargs)
    torch.autograd.grad(out, leaves, torch.ones_like(out))
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def _peak_bytes(fn: Callable[..., torch.Tensor], args: tuple[Any, ...], kwargs: dict[str, Any],
                device: torch.device) -> int:
    """The peak memory a forward+backward of ``fn`` allocates on ``device`` above what was there."""
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    _time(fn, args, kwargs, True, device)
    return torch.cuda.max_memory_allocated(device) - before


def speed_table(device: torch.device, repeat: int, scale: int) -> None:
    """Median forward+backward times of built-ins against native ops and, where there is one, a
    hand-written autograd.Function, runs interleaved; peak memory against native's on CUDA."""
    print(f"\n## Speed on {device}: forward + backward, median of {repeat} interleaved runs (float32)\n")
    print("| op (shape) | native | hand-written Function | ops, rules on | ops, special cases off | "
          "on / native | off / native | on / Function | peak memory on / native |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for label, ours, native, raw, kwargs in _speed_cases(device, scale):
        args = _on(device, raw)
        variants = {"native": (native, True), "on": (ours, True), "off": (ours, False)}
        if ours is ag.ops.cdist and not kwargs:
            variants["Function"] = (HandWrittenCdist.apply, True)
        for fn, enabled in variants.values():
            _time(fn, args, kwargs, enabled, device)  # warm-up: kernels, caches
        times: dict[str, list[float]] = {k: [] for k in variants}
        for _ in range(repeat):
            for k, (fn, enabled) in variants.items():
                times[k].append(_time(fn, args, kwargs, enabled, device))
        med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
        hand = f"{med['Function']:.3f} ms" if "Function" in med else "-"
        versus = f"{med['on'] / med['Function']:.2f}" if "Function" in med else "-"
        memory = "-"
        if device.type == "cuda":
            peaks = [_peak_bytes(fn, args, kwargs, device) for fn in (ours, native)]
            memory = f"{peaks[0] / peaks[1]:.2f}"
        print(f"| {label} | {med['native']:.3f} ms | {hand} | {med['on']:.3f} ms | {med['off']:.3f} ms | "
              f"{med['on'] / med['native']:.2f} | {med['off'] / med['native']:.2f} | {versus} | {memory} |")


#: NaN-safe table: Rodrigues batches, and entropy rows of 256 columns (divided by --scale).
RODRIGUES_BATCHES = (64, 4096, 262144, 4194304)
ENTROPY_ROWS = (64, 1024, 16384, 262144)


Case = tuple[str, Callable[..., torch.Tensor], Callable[..., torch.Tensor], torch.Tensor]


def _nan_safe_cases(device: torch.device, scale: int) -> list[Case]:
    """(label, NaN-safe group, hand double where, input on ``device``) per workload and size."""
    grouped = bench_targets.register()
    cases: list[Case] = []
    for batch in RODRIGUES_BATCHES:
        v = bench_targets.rotations(max(8, batch // scale)).detach().to(device)
        cases.append((f"Rodrigues, batch {v.shape[0]}", grouped["rodrigues"],
                      bench_targets.rodrigues_double_where, v))
    for rows in ENTROPY_ROWS:
        g = torch.Generator().manual_seed(0)
        p = torch.rand(max(8, rows // scale), 256, generator=g)
        p[p < 0.125] = 0
        cases.append((f"entropy, ({p.shape[0]}, 256)", grouped["entropy"],
                      bench_targets.entropy_double_where, (p / p.sum(-1, keepdim=True)).to(device)))
    return cases


def nan_safe_table(device: torch.device, repeat: int, scale: int) -> int:
    """Issue 30's table: NaN-safe Rodrigues and entropy against the hand-written double where,
    rules on and off, from small batches to the millions; the number of cases whose gradients
    differ from the hand form's."""
    print(f"\n## NaN-safe groups vs the hand double where on {device}: forward + backward, median of "
          f"{repeat} interleaved runs (float32)\n")
    print("| workload | hand | rules on | rules off | on / hand | off / hand |")
    print("| --- | --- | --- | --- | --- | --- |")
    failures = 0
    for label, grouped, hand, x in _nan_safe_cases(device, scale):
        leaf = x.requires_grad_()
        got = _forward_backward(grouped, (leaf,), {})
        want = _forward_backward(hand, (leaf,), {})
        if not all(torch.allclose(g, w, rtol=1e-4, atol=1e-4) for g, w in zip(got, want)):
            failures += 1
            print(f"| {label} | FAIL: other gradients than the hand form's | | | | |")
            continue
        variants = {"hand": (hand, True), "on": (grouped, True), "off": (grouped, False)}
        for fn, enabled in variants.values():
            _time(fn, (leaf,), {}, enabled, device)
        times: dict[str, list[float]] = {k: [] for k in variants}
        for _ in range(repeat):
            for k, (fn, enabled) in variants.items():
                times[k].append(_time(fn, (leaf,), {}, enabled, device))
        med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
        print(f"| {label} | {med['hand']:.3f} ms | {med['on']:.3f} ms | {med['off']:.3f} ms | "
              f"{med['on'] / med['hand']:.2f} | {med['off'] / med['hand']:.2f} |")
    return failures


def _cdist_points(device: torch.device, n: int, d: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator(device=device).manual_seed(0)
    x1 = torch.randn(n, d, generator=g, device=device)
    x2 = torch.randn(n, d, generator=g, device=device)
    x2[: max(1, n // 8)] = x1[: max(1, n // 8)]  # 1/8 of the rows coincide: the rule fires
    return x1.requires_grad_(), x2.requires_grad_()


def _step(fn: Callable[..., torch.Tensor], x1: torch.Tensor, x2: torch.Tensor,
          device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    torch.autograd.grad(fn(x1, x2).sum(), (x1, x2))
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def check_compiled(device: torch.device, repeat: int, scale: int) -> int:
    """The compile benchmark's variants on ``device``; the number of failed checks."""
    from torch._dynamo.utils import counters

    example.register()
    torch._dynamo.config.cache_size_limit = 64
    modes = ["default", *(["reduce-overhead"] if device.type == "cuda" else [])]
    print(f"\n## torch.compile on {device}: cdist forward + backward, float32, 1/8 of rows coincident, "
          f"median of {repeat} interleaved runs (ms)\n")
    eager = {"plain": example.euclidean_cdist, "group": example.grouped_cdist,
             "Function": HandWrittenCdist.apply, "torch.cdist": torch.cdist}
    names = [f"e.{k}" for k in eager] + [f"{m[0]}.{k}" for m in modes for k in eager]
    print("| (N, M, D) | " + " | ".join(names) + " | c.group / c.Function | c.group / c.plain |")
    print("|" + " --- |" * (len(names) + 3))
    failures = 0
    for n, d in ((4, 3), (64, 16), (1024 // scale, 64)):
        x1, x2 = _cdist_points(device, n, d)
        variants: dict[str, Callable[..., torch.Tensor]] = {f"e.{k}": fn for k, fn in eager.items()}
        for mode in modes:
            variants |= {f"{mode[0]}.{k}": torch.compile(fn, fullgraph=True, dynamic=False, mode=mode)
                         for k, fn in eager.items()}
        want = torch.autograd.grad(example.grouped_cdist(x1, x2).sum(), (x1, x2))
        for mode in modes:
            counters.clear()
            compiled = variants[f"{mode[0]}.group"]
            for _ in range(3):  # compile, then (CUDA graphs) record, then replay
                _step(compiled, x1, x2, device)
            if device.type == "cuda" and mode == "reduce-overhead":
                torch.cuda.set_sync_debug_mode("error")
                try:
                    _step(compiled, x1, x2, device)
                    synced = False
                except RuntimeError:
                    synced = True
                finally:
                    torch.cuda.set_sync_debug_mode("default")
                skipped = counters["inductor"]["cudagraph_skips"]
                if synced or skipped:
                    failures += 1
                    print(f"- FAIL ({n}, {n}, {d}) {mode}: synchronised {synced}, "
                          f"CUDA graphs skipped {skipped}")
            got = torch.autograd.grad(compiled(x1, x2).sum(), (x1, x2))
            for g, w in zip(got, want):
                if not torch.allclose(g, w, rtol=1e-3, atol=1e-4):
                    failures += 1
                    print(f"- FAIL ({n}, {n}, {d}) {mode}: compiled group gradients differ from eager")
        for fn in variants.values():
            _step(fn, x1, x2, device)  # warm-up
        times: dict[str, list[float]] = {k: [] for k in variants}
        for _ in range(repeat):
            for k, fn in variants.items():
                times[k].append(_step(fn, x1, x2, device))
        med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
        print(f"| ({n}, {n}, {d}) | " + " | ".join(f"{med[k]:.3f}" for k in names)
              + f" | {med['d.group'] / med['d.Function']:.2f} | {med['d.group'] / med['d.plain']:.2f} |")
    return failures


def region_table(device: torch.device, repeat: int, scale: int) -> int:
    """Compiled groups: Rodrigues as a ``compile=True`` group against the hand double where, eager
    and compiled; the number of cases whose gradients differ from the hand form's."""
    modes = ["default", *(["reduce-overhead"] if device.type == "cuda" else [])]
    backend = "inductor" if device.type == "cuda" else "aot_eager"
    print(f"\n## Compiled groups vs the hand double where on {device} ({backend}): forward + backward, "
          f"median of {repeat} interleaved runs (float32, ms)\n")
    names = ["hand"] + [f"{kind}, {mode}" for mode in modes for kind in ("plain compile", "compile=True")]
    ratios = [f"group / {'hand' if k == 0 else 'plain'}, {mode}" for mode in modes for k in (0, 1)]
    print("| workload | " + " | ".join(names + ratios) + " |")
    print("|" + " --- |" * (1 + len(names) + len(ratios)))
    failures = 0
    for batch in RODRIGUES_BATCHES:
        v = bench_targets.rotations(max(8, batch // scale)).detach().to(device).requires_grad_()
        variants: dict[str, Callable[..., torch.Tensor]] = {"hand": bench_targets.rodrigues_double_where}
        for mode in modes:
            options = {"backend": backend, "dynamic": False, **({"mode": mode} if mode != "default" else {})}
            name = f"gpu_check.region.{batch}.{mode}"
            ag.register_rule(name, ag.NanSafe())
            variants[f"plain compile, {mode}"] = torch.compile(
                lambda x: bench_targets.rodrigues_double_where(x), fullgraph=True, **options)
            grouped = ag.autograd_group(name, compile=options)(bench_targets.rodrigues)
            variants[f"compile=True, {mode}"] = grouped
        want = _forward_backward(bench_targets.rodrigues_double_where, (v,), {})
        label = f"Rodrigues, batch {v.shape[0]}"
        bad = [k for k, fn in variants.items() for _ in range(3)  # compile, record, replay
               if not all(torch.allclose(g, w, rtol=1e-4, atol=1e-4)
                          for g, w in zip(_forward_backward(fn, (v,), {}), want))]
        if bad:
            failures += 1
            print(f"| {label} | FAIL: other gradients than the hand form's: "
                  f"{', '.join(dict.fromkeys(bad))} |")
            continue
        times: dict[str, list[float]] = {k: [] for k in variants}
        for _ in range(repeat):
            for k, fn in variants.items():
                times[k].append(_time(fn, (v,), {}, True, device))
        med = {k: statistics.median(t) * 1e3 for k, t in times.items()}
        cells = [med[k] for k in names]
        cells += [med[f"compile=True, {mode}"] / med["hand" if k == 0 else f"plain compile, {mode}"]
                  for mode in modes for k in (0, 1)]
        print(f"| {label} | " + " | ".join(f"{c:.3f}" if i < len(names) else f"{c:.2f}"
                                             for i, c in enumerate(cells)) + " |")
    return failures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu (to test the script)")
    parser.add_argument("--repeat", type=int, default=25, help="timed runs per variant (default 25)")
    parser.add_argument("--scale", type=int, default=1, help="divide the speed table's sizes by this")
    parser.add_argument("--only", choices=["nan-safe", "region"], default=None,
                        help="nan-safe: only the NaN-safe table; region: only the compiled groups' table "
                             "(for a short device run)")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("gpu_check: no CUDA device here (torch.cuda.is_available() is False): nothing checked.")
        return 0
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"# gpu_check: {name}, torch {torch.__version__}, CUDA {torch.version.cuda}")
    if args.only is not None:
        table = nan_safe_table if args.only == "nan-safe" else region_table
        with ag.registry_scope():
            failures = table(device, args.repeat, args.scale)
        print(f"\n{failures} check(s) failed." if failures else "\nAll checks passed.")
        return 1 if failures else 0
    failures = check_builtins(device) + check_flag(device)
    with ag.registry_scope():
        failures += check_syncs(device)
    print(f"\n## Autocast on {device}: every built-in against native (scripts/autocast_check.py)\n")
    print("```")
    failures += sum(autocast_check(device, dtype) for dtype in (torch.bfloat16, torch.float16))
    print("```")
    speed_table(device, args.repeat, args.scale)
    failures += nan_safe_table(device, args.repeat, args.scale)
    failures += check_compiled(device, args.repeat, args.scale)
    with ag.registry_scope():
        failures += region_table(device, args.repeat, args.scale)
    print(f"\n{failures} check(s) failed." if failures else "\nAll checks passed.")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

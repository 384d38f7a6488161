"""How far a NaN-safe group's cost is from the least a Python rule site can cost (issue 30).

    python benchmarks/nan_safe_floor.py [--repeats N]

The Rodrigues rotation and the entropy of ``bench_targets.py`` (1 thread, float32, forward +
backward, ``torch._dynamo`` imported, medians of interleaved runs, each as a ratio to the hand
double ``where``):

- group: the NaN-safe group as it is;
- least zeroing: the same group, each rule site's hook replaced by the least that zeroes its
  gradients (the CPU's two kernels, no flag, compiler, ``torch.func`` or count check): what the
  walk, the hooks' registration and the kernels cost with no bookkeeping at backward;
- hooks doing nothing: each hook returns None at once: the walk, the registration and the engine's
  calls into Python, no zeroing;
- no library: the body alone, its nodes found by a bare walk that writes the structure down as
  the library's does, the library's decision for that structure (``finiteness.plan``) and its CPU
  value read (as often as the plan asks for it), and the least zeroing hooked at the sites: no
  instance, flag, count, claim or check of any kind. The least any Python rule site design costs
  for the same hooks;
- plain composite: the function without its group (the special cases off), NaN where the double
  ``where`` is not: what its ops cost against the hand-written ones (``log(0)`` is slow on the CPU).

The gaps between the rows are what each layer costs; the issue's targets are in bench_nan_safe.py.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_targets as bt  # noqa: E402
from common import interleaved_medians, markdown_table  # noqa: E402

import autograd_groups as ag  # noqa: E402
from autograd_groups import finiteness, nodes  # noqa: E402
from autograd_groups.sites import hooks  # noqa: E402
from autograd_groups.zero_passing import passing_now  # noqa: E402

Fn = Callable[[torch.Tensor], torch.Tensor]
_real = hooks.SiteHook.__call__
_mode = ["group"]


def _least(site: hooks.SiteHook, grad_inputs: Sequence[torch.Tensor | None],
           grad_outputs: Sequence[torch.Tensor | None]) -> tuple[torch.Tensor | None, ...]:
    nonzero = grad_outputs[0].bool()  # type: ignore[union-attr]
    grads = list(grad_inputs)
    for i, grad in enumerate(grads):
        if grad is not None and (site.zeroed is None or i in site.zeroed) and grad.shape == nonzero.shape:
            grad.view(torch.int32).mul_(nonzero)
    return tuple(grads)


def _switched(site: hooks.SiteHook, grad_inputs: Sequence[torch.Tensor | None],
              grad_outputs: Sequence[torch.Tensor | None]) -> Any:
    mode = _mode[0]
    if mode == "least zeroing":
        return _least(site, grad_inputs, grad_outputs)
    if mode == "hooks doing nothing":
        return None
    return _real(site, grad_inputs, grad_outputs)


def _zeroing(zeroed: tuple[int, ...] | None) -> Callable[..., tuple[torch.Tensor | None, ...]]:
    def hook(grad_inputs: Sequence[torch.Tensor | None],
             grad_outputs: Sequence[torch.Tensor | None]) -> tuple[torch.Tensor | None, ...]:
        nonzero = grad_outputs[0].bool()  # type: ignore[union-attr]
        for i, grad in enumerate(grad_inputs):
            if grad is not None and (zeroed is None or i in zeroed):
                grad.view(torch.int32).mul_(nonzero)
        return tuple(grad_inputs)
    return hook


def no_library(body: Fn) -> Fn:
    """``body`` with NaN-safe hooks at the sites the library chooses, and nothing else (see above)."""
    def run(x: torch.Tensor) -> torch.Tensor:
        start = torch._C._autograd._get_sequence_nr()
        out = body(x)
        members: list[Any] = []
        # Held, as the library holds them: a node's id holds only while its Python object lives, and
        # torch 2.11 keeps none alive (a freed one's id comes back as another node's).
        boundary: list[Any] = []
        tokens: list[Any] = []
        index: dict[int, int] = {}
        stack: list[tuple[Any, int]] = [(out.grad_fn, 0)]
        while stack:
            node, nr = stack.pop()
            if node is None:
                tokens.append(None)
                continue
            seen = index.get(id(node))
            if seen is None and (type(node) is nodes.ACCUMULATE_GRAD or node._sequence_nr() < start):
                seen = index[id(node)] = -1 - len(boundary)
                boundary.append(node)
            if seen is not None:
                tokens.append((seen, nr))
                continue
            index[id(node)] = len(members)
            members.append(node)
            read = finiteness.reader(type(node))
            tokens.append((type(node), None if read is None else read(node), len(node.next_functions), nr))
            stack.extend(reversed(node.next_functions))
        plan = finiteness.plan(tokens, 1)
        quiet: set[int] = set()
        if plan.worth_reading():
            quiet = passing_now([(members[i], zeroed) for i, zeroed in plan.sites])
            plan.read(spared=bool(quiet))
        sites = plan.sites
        for i, zeroed in sites:
            if id(members[i]) not in quiet:
                members[i].register_hook(_zeroing(zeroed))
        return out
    return run


def _step(fn: Fn, x: torch.Tensor, mode: str) -> Callable[[], None]:
    def run() -> None:
        _mode[0] = mode
        if mode == "plain composite":
            with ag.special_cases(False):
                out = fn(x)
        else:
            out = fn(x)
        out.backward(torch.ones_like(out))
    return run


MODES = ("group", "least zeroing", "hooks doing nothing", "no library", "plain composite")


def _checked(name: str, fns: dict[str, Fn], hand: Fn, x: torch.Tensor) -> None:
    """Exit unless the group, its least zeroing and the design without the library give the hand
    double where's gradients at ``x``: the rows compare ways to compute the same thing."""
    want = torch.autograd.grad(hand(x).sum(), x)[0]
    for mode in ("group", "least zeroing", "no library"):
        _mode[0] = mode
        got = torch.autograd.grad(fns[mode](x).sum(), x)[0]
        if not (got.isfinite().all() and torch.allclose(got, want, rtol=1e-4, atol=1e-4)):
            raise SystemExit(f"nan_safe_floor: {name} with {mode} computes other gradients than by hand")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--repeats", type=int, default=0, help="default: 1000 small, 100 large")
    args = parser.parse_args()
    torch.set_num_threads(1)
    importlib.import_module("torch._dynamo")
    grouped = bt.register()
    hooks.SiteHook.__call__ = _switched  # type: ignore[method-assign]
    rows = []
    workloads = (
        ("rodrigues", bt.rodrigues, bt.rodrigues_double_where, (bt.rotations(64), bt.rotations(4096))),
        ("entropy", bt.entropy, bt.entropy_double_where, (bt.probabilities(256), bt.probabilities(4096))))
    for name, body, hand, inputs in workloads:
        fns = {mode: no_library(body) if mode == "no library" else grouped[name] for mode in MODES}
        for x in inputs:
            _checked(name, fns, hand, x)
            variants = {"hand": _step(hand, x, "group"),
                        **{mode: _step(fns[mode], x, mode) for mode in MODES}}
            medians = interleaved_medians(variants, args.repeats or (1000 if x.shape[0] <= 256 else 100))
            rows.append([f"{name} {tuple(x.shape)}", f"{medians['hand'] * 1e6:.0f} µs",
                         *(f"{medians[mode] / medians['hand']:.2f}×" for mode in MODES)])
    print(f"torch {torch.__version__}, 1 thread, float32, forward + backward, torch._dynamo imported")
    print(markdown_table(["workload", "hand double where", *MODES], rows))


if __name__ == "__main__":
    main()

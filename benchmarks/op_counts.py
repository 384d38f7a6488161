"""What one forward + backward dispatches: ATen ops (on a GPU each one not a view is a kernel
launch) and the rule-site hooks a group installs. Deterministic, so tests pin their bounds
(tests/test_op_counts.py) and ``bench_nan_safe.py`` prints them.

The counts are taken with the CPU's value reads on (as a CPU runs) and off (as a GPU runs, where
reading a value would make the host wait: :func:`autograd_groups.host_reads.off`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from autograd_groups import host_reads
from autograd_groups.groups import lifecycle
from autograd_groups.sites.hooks import SiteHook


@dataclass
class Counts:
    """ATen ops dispatched (views among them) and rule-site hooks installed."""

    ops: int = 0
    views: int = 0
    hooks: int = 0


class _Dispatched(TorchDispatchMode):
    def __init__(self, counts: Counts) -> None:
        super().__init__()
        self.counts = counts

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.counts.ops += 1
        self.counts.views += func.is_view
        if func is torch.ops.aten._local_scalar_dense.default and not isinstance(args[0], torch.Tensor):
            # A wrapped number (the 6 of x / 6, read on the host) reaches a Python mode as a number.
            return args[0]
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def _hooks_counted(counts: Counts) -> Iterator[None]:
    class Counted(SiteHook):
        __slots__ = ()

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            counts.hooks += 1
            super().__init__(*args, **kwargs)

    lifecycle.SiteHook = Counted  # type: ignore[misc]
    try:
        yield
    finally:
        lifecycle.SiteHook = SiteHook  # type: ignore[misc]


def count(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, reads: bool = True) -> Counts:
    """The ops and hooks of one forward + backward of ``fn`` at ``x`` (a leaf), with the CPU value
    reads on or off."""
    counts = Counts()
    x = x.detach().requires_grad_()

    def call() -> torch.Tensor:
        # One call site for every call: the one-time work per call site (the first-order check of a
        # rule that fired there) is the first call's.
        return fn(x)

    call().sum().backward()  # a first call: the structures cached, the ops' one-time work done
    with contextlib.ExitStack() as stack:
        if not reads:
            stack.enter_context(host_reads.off())
        grad = torch.ones_like(call())
        stack.enter_context(_hooks_counted(counts))
        with _Dispatched(counts):
            out = call()
            out.backward(grad)
    return counts

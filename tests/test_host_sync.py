"""No rule kind and no built-in reads a tensor's value on the host in its forward or backward: on an
accelerator such a read makes the host wait for the device (docs/performance.md, "On a GPU").

On the CPU the library reads values where that spares work (:mod:`autograd_groups.host_reads`);
with those reads switched off, the ops that read a value on the host (``item``, ``bool()``,
``nonzero``, ``equal``) must not run at all. A ``TorchDispatchMode`` sees every ATen op, so it sees
them. scripts/gpu_check.py checks the same on a GPU under ``torch.cuda.set_sync_debug_mode``.
"""

from __future__ import annotations

from typing import Any

import ops_cases
import pytest
import rule_kinds
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import autograd_groups as ag
from autograd_groups import host_reads

#: ATen ops that copy a value to the host (``is_nonzero`` is ``bool()`` of a one-element tensor).
READS = {"_local_scalar_dense", "is_nonzero", "nonzero", "item", "equal"}


class ReadRecorder(TorchDispatchMode):
    """Records the ATen ops in :data:`READS` dispatched inside it."""

    def __init__(self) -> None:
        super().__init__()
        self.reads: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = func.overloadpacket.__name__
        if name in READS:
            self.reads.append(name)
        return func(*args, **(kwargs or {}))


def reads_of(step: Any) -> list[str]:
    """The host reads that ``step()`` (a forward and backward) makes, with the CPU reads off."""
    with host_reads.off(), ReadRecorder() as recorder:
        step()
    return recorder.reads


def _forward_backward(fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    leaves = [a.detach().requires_grad_() if isinstance(a, torch.Tensor) and a.is_floating_point() else a
              for a in args]
    out = fn(*leaves, **kwargs)
    torch.autograd.backward(out, ops_cases.upstream(out))


@pytest.mark.parametrize("case", ops_cases.CASES, ids=[c.id for c in ops_cases.CASES])
def test_builtin_reads_no_value(case: ops_cases.Case) -> None:
    args = ops_cases.inputs(case, torch.float32)
    assert reads_of(lambda: _forward_backward(case.ours, args, case.kwargs)) == []


@pytest.mark.parametrize("kind", sorted(rule_kinds.KINDS))
def test_rule_kind_reads_no_value(kind: str) -> None:
    fn = rule_kinds.KINDS[kind]()
    assert reads_of(lambda: _forward_backward(fn, (rule_kinds.special_input(),), {})) == []
    (group,) = ag.stats()
    assert ag.stats()[group]["backward_passes"] == 1  # counted without a read


def test_the_recorder_sees_the_cpu_reads() -> None:
    """With the CPU reads on, a NaN-safe group reads its gradients' values (the check above can
    fail)."""
    fn = rule_kinds.nan_safe()
    x = rule_kinds.special_input().requires_grad_()
    with ReadRecorder() as recorder:
        fn(x).sum().backward()
    assert "_local_scalar_dense" in recorder.reads

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


def _subgradient_group() -> Any:
    @ag.autograd_group("sync_norm")
    def norm(x: torch.Tensor) -> torch.Tensor:
        return (x * x).sum(-1).sqrt()

    ag.register_rule("sync_norm", ag.Subgradient(op="sqrt", when="result == 0", grad=0))
    return norm


def _nan_safe_group() -> Any:
    @ag.autograd_group("sync_entropy")
    def entropy(p: torch.Tensor) -> torch.Tensor:
        return -torch.where(p > 0, p * p.log(), 0).sum(-1)

    ag.register_rule("sync_entropy", ag.NanSafe())
    return entropy


def _override_group() -> Any:
    @ag.autograd_group("sync_safe_norm")
    def norm(x: torch.Tensor) -> torch.Tensor:
        return (x * x).sum(-1).sqrt()

    @ag.special_case("sync_safe_norm")
    def at_zero(ctx: ag.OverrideContext) -> torch.Tensor:  # a tensor answer: no host read
        return (ctx.outputs[0] == 0).any()

    @at_zero.backward
    def zero_grad(ctx: ag.OverrideContext, grad: torch.Tensor) -> tuple[torch.Tensor]:
        return (torch.zeros_like(ctx.inputs[0]),)

    return norm


GROUPS = {"subgradient": _subgradient_group, "nan_safe": _nan_safe_group, "override": _override_group}


@pytest.mark.parametrize("kind", sorted(GROUPS))
@pytest.mark.parametrize("traced_stats", [False, True], ids=["plain", "counted"])
def test_rule_kind_reads_no_value(kind: str, traced_stats: bool) -> None:
    fn = GROUPS[kind]()
    x = torch.tensor([[0.0, 0.0, 0.0], [0.5, 0.25, 1.0], [0.0, 0.3, 0.7]])
    assert reads_of(lambda: _forward_backward(fn, (x,), {})) == []
    if traced_stats:
        ag.stats()  # reading the counts may read values: after the step, outside it

"""FSDP2 (``torch.distributed.fsdp.fully_shard``): 2 processes (gloo, loopback only) whose model's
loss uses ``ag.ops.cdist`` and ``ag.ops.vector_norm`` at their special points (the norm inside a group
compiled as its own region) end a step with the gradients of one process on the global batch,
eagerly and under ``torch.compile``.

Each sample is a bag of points: their pairwise distances include a zero diagonal, and one point of
each bag is embedded at the origin, where the norm's gradient needs its rule.
"""

from __future__ import annotations

import datetime
import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from ranks import assert_ranks_equal_single

import autograd_groups as ag

pytestmark = pytest.mark.slow

WORLD = 2
GLOBAL_BATCH = 4
POINTS, DIM = 4, 3


@ag.autograd_group("fsdp.lengths", compile={"backend": "aot_eager"})
def lengths(z: torch.Tensor) -> torch.Tensor:
    """``ops.vector_norm`` inside a group compiled as its own region."""
    return ag.ops.vector_norm(z, dim=-1)


class BagModel(torch.nn.Module):
    """Per sample: embed a bag of points (the last one at 0), penalise their pairwise distances'
    distance from 1 and their norms."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(DIM, DIM, bias=False, dtype=torch.float64)

    def forward(self, bags: torch.Tensor) -> torch.Tensor:
        z = self.lin(bags)
        return (ag.ops.cdist(z, z) - 1.0).pow(2).mean(dim=(-2, -1)) + lengths(z).mean(-1)


def _model() -> BagModel:
    torch.manual_seed(0)
    return BagModel()


def _data() -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    bags = torch.randn(GLOBAL_BATCH, POINTS, DIM, generator=g, dtype=torch.float64)
    bags[:, -1] = 0  # embedded at the origin: |z| = 0
    return bags


def _gradients(model: torch.nn.Module, batch: torch.Tensor, compiled: bool) -> dict[str, torch.Tensor]:
    loss = (torch.compile(model, fullgraph=True) if compiled else model)(batch).mean()
    loss.backward()
    return {name: (p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad).detach().clone()
            for name, p in model.named_parameters()}


def _rank(rank: int, rendezvous: str, out: str, compiled: bool) -> None:
    from torch.distributed.fsdp import fully_shard

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=WORLD,
                            timeout=datetime.timedelta(seconds=300))
    try:
        share = GLOBAL_BATCH // WORLD
        model = fully_shard(_model())
        grads = _gradients(model, _data()[rank * share:(rank + 1) * share], compiled)
        torch.save(grads, os.path.join(out, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_fsdp2_two_ranks_equal_single_process_on_the_global_batch(
        compiled: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")  # loopback only; the ranks inherit it
    mp.spawn(_rank, args=(str(tmp_path / "rendezvous"), str(tmp_path), compiled), nprocs=WORLD, join=True)
    assert_ranks_equal_single(tmp_path, WORLD, _gradients(_model(), _data(), compiled=False))


def test_the_model_needs_its_rules() -> None:
    model = _model()
    with ag.special_cases(False):
        model(_data()).mean().backward()
    assert model.lin.weight.grad is not None and model.lin.weight.grad.isnan().any()

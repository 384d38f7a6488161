"""DistributedDataParallel: 2 processes (gloo, loopback only) training a model built on
``ag.ops.cdist`` end with the parameters and gradients of one process trained on the global batch.

Each sample is a bag of points whose pairwise distances include a zero diagonal, where the plain
composite's gradient is NaN: every step goes through the rule.
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
from torch.nn.parallel import DistributedDataParallel

import autograd_groups as ag

pytestmark = pytest.mark.slow

WORLD = 2
STEPS = 5
GLOBAL_BATCH = 8
POINTS, DIM = 4, 3


@ag.autograd_group("ddp.pairwise", compile={"backend": "aot_eager"})
def pairwise(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``ops.cdist`` inside a group compiled as its own region."""
    return ag.ops.cdist(a, b)


#: The distances each variant of the model uses.
PAIRWISE = {"builtin": ag.ops.cdist, "compiled group": pairwise}


class BagModel(torch.nn.Module):
    """Per sample: embed a bag of points, penalise their pairwise distances' distance from 1."""

    def __init__(self, variant: str = "builtin") -> None:
        super().__init__()
        self.lin = torch.nn.Linear(DIM, DIM, dtype=torch.float64)
        self.cdist = PAIRWISE[variant]

    def forward(self, bags: torch.Tensor) -> torch.Tensor:
        z = torch.tanh(self.lin(bags))
        return (self.cdist(z, z) - 1.0).pow(2).mean(dim=(-2, -1))


def _model(variant: str = "builtin") -> BagModel:
    torch.manual_seed(0)
    return BagModel(variant)


def _data() -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    return torch.randn(STEPS, GLOBAL_BATCH, POINTS, DIM, generator=g, dtype=torch.float64)


def _train(model: torch.nn.Module, batches: torch.Tensor) -> dict[str, torch.Tensor]:
    """SGD on the mean per-sample loss; the parameters and the last step's gradients."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    for batch in batches:
        optimizer.zero_grad(set_to_none=True)
        model(batch).mean().backward()
        optimizer.step()
    named = dict(model.named_parameters())
    result = {f"param.{n.removeprefix('module.')}": p.detach().clone() for n, p in named.items()}
    result.update({f"grad.{n.removeprefix('module.')}": p.grad.clone()  # type: ignore[union-attr]
                   for n, p in named.items()})
    return result


def _rank(rank: int, rendezvous: str, out: str, variant: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=WORLD,
                            timeout=datetime.timedelta(seconds=120))
    try:
        share = GLOBAL_BATCH // WORLD
        batches = _data()[:, rank * share:(rank + 1) * share]
        torch.save(_train(DistributedDataParallel(_model(variant)), batches),
                   os.path.join(out, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("variant", PAIRWISE)
def test_ddp_two_ranks_equal_single_process_on_the_global_batch(variant: str, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")  # loopback only; the ranks inherit it
    mp.spawn(_rank, args=(str(tmp_path / "rendezvous"), str(tmp_path), variant), nprocs=WORLD, join=True)
    assert_ranks_equal_single(tmp_path, WORLD, _train(_model(variant), _data()))


def test_the_model_needs_the_rule() -> None:
    model = _model()
    model.cdist = ag.ops.cdist.__wrapped__  # the plain composite
    model(_data()[0]).mean().backward()
    assert model.lin.weight.grad is not None and model.lin.weight.grad.isnan().any()

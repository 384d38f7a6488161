"""What the multi-process tests (DDP, FSDP2) compare: each rank's saved tensors against one process."""

from __future__ import annotations

from pathlib import Path

import torch


def assert_ranks_equal_single(folder: Path, world: int, single: dict[str, torch.Tensor]) -> None:
    """Every ``folder/rank{r}.pt`` holds the same finite tensors, by name, as ``single``."""
    assert all(torch.isfinite(t).all() for t in single.values())
    for rank in range(world):
        got = torch.load(folder / f"rank{rank}.pt")
        assert got.keys() == single.keys()
        for name, value in single.items():
            torch.testing.assert_close(got[name], value, msg=f"rank {rank}: {name}")

"""The demo's NaN as a user meets it: the batch-hard triplet loss of metric_learning.py over a
pairwise distance written by hand, from primitive ops. The zero diagonal gets a zero gradient, and
sqrt'(0) = inf makes it 0 * inf = NaN: every weight's gradient is NaN at the first step.

Run it under the doctor to see where the NaN is born and which fixes pass a replay of that step:

    autograd-groups doctor examples/triplet_nan.py

    python examples/triplet_nan.py [--steps 20] [--seed 0]
"""

from __future__ import annotations

import argparse

import torch
from metric_learning import LEARNING_RATE, Batches, EmbeddingModel, batch_hard_triplet_loss, load_data


def pairwise_distance(emb: torch.Tensor) -> torch.Tensor:
    """Euclidean distances between the rows of ``emb``, from primitive ops."""
    return (emb[:, None] - emb[None, :]).pow(2).sum(-1).sqrt()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    data = load_data(args.seed)
    batches = Batches(data, args.seed)
    model = EmbeddingModel(args.seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=LEARNING_RATE)
    for step in range(1, args.steps + 1):
        x, y = batches()
        loss = batch_hard_triplet_loss(pairwise_distance(model.embed(x)), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"step {step}: loss {loss.item():.4f}")


if __name__ == "__main__":
    main()

"""torch.func: per-sample gradients with vmap(grad) of a loss with a distance to an anchor; a
sample that sits on the anchor has distance 0, and sqrt'(0) = inf (notes on anomaly mode under
vmap(grad), which blames PowBackward0)."""
import torch
from dump import dump

torch.manual_seed(0)
anchor = torch.zeros(2)
w = torch.eye(2)
batch = torch.tensor([[1.0, 2.0], [0.0, 0.0], [3.0, -1.0]])


def distance(p, x):
    return ((x @ p - anchor) ** 2).sum().sqrt()  # born


for step in range(1, 3):
    per_sample = torch.func.vmap(torch.func.grad(distance), in_dims=(None, 0))(w, batch)
    g = per_sample.mean(0)
    dump(step, {"w": g})
    w = w - 0.1 * g

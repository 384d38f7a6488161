"""Class A: a log-partition over candidate sets, one of which is empty (all its scores masked to
-inf) and left out of the loss. log(sum(exp(-inf))) = log(0) = -inf is discarded, but log's backward
meets 0 / 0 there (the masked-softmax reports: pytorch#41508, jax#1052)."""
import torch
from dump import dump

torch.manual_seed(0)
scores = torch.nn.Parameter(torch.randn(3, 4))
allowed = torch.tensor([[1, 1, 0, 1], [0, 0, 0, 0], [1, 0, 1, 1]], dtype=torch.bool)
has_candidates = allowed.any(-1)
opt = torch.optim.SGD([scores], lr=0.1)


def log_partition(s, mask):
    masked = s + torch.where(mask, 0.0, float("-inf"))  # an additive mask, as attention masks are
    return torch.log(torch.exp(masked).sum(-1))  # born


for step in range(1, 3):
    z = log_partition(scores, allowed)
    loss = torch.where(has_candidates, z, 0.0).sum()
    opt.zero_grad()
    loss.backward()
    dump(step, {"scores": scores.grad})
    opt.step()

"""Class A: unit vectors of a padded batch, the padding masked out after the division (pytorch#4132:
torch.where gives NaN gradients for the branch it discards). A padded row is all 0, its norm 0, and
0 / 0 in the forward is discarded by the where, yet the division's backward gives NaN."""
import torch
from dump import dump

torch.manual_seed(0)
vectors = torch.nn.Parameter(torch.tensor([[3.0, 4.0], [1.0, -1.0], [0.0, 0.0]]))
real = torch.tensor([True, True, False])
opt = torch.optim.SGD([vectors], lr=0.1)


def directions(x, keep):
    u = x / x.norm(dim=-1, keepdim=True)  # born
    return torch.where(keep[:, None], u, torch.zeros_like(u))


for step in range(1, 3):
    loss = (directions(vectors, real) * torch.tensor([1.0, 2.0])).sum()
    opt.zero_grad()
    loss.backward()
    dump(step, {"vectors": vectors.grad})
    opt.step()

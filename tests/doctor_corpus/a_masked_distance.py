"""Class A: a masked element still gets a NaN gradient (pytorch#4132, open since 2017). The zero
diagonal of a distance matrix is masked out by a multiply, but sqrt's backward at 0 gets 0 * inf."""
import torch
from dump import dump

torch.manual_seed(0)
emb = torch.nn.Embedding(5, 3)
opt = torch.optim.SGD(emb.parameters(), lr=0.1)
ids = torch.arange(5)


def pairwise(x):
    return (x[:, None] - x[None, :]).pow(2).sum(-1).sqrt()  # born


off_diagonal = 1 - torch.eye(5)
for step in range(1, 4):
    e = emb(ids)
    loss = -(pairwise(e) * off_diagonal).mean()
    opt.zero_grad()
    loss.backward()
    dump(step, {"weight": emb.weight.grad})
    opt.step()

"""A compiled step: the distance of b_pairwise_distance.py under torch.compile (the aot_eager backend:
AOTAutograd's compiled backward without inductor's code generation). The doctor replays it eagerly."""
import torch
from dump import dump

torch.manual_seed(0)
points = torch.nn.Parameter(torch.randn(4, 2))
opt = torch.optim.SGD([points], lr=0.05)


def spread(x):
    d = (x[:, None] - x[None, :]).pow(2).sum(-1).sqrt()  # born
    return d.mean()


compiled = torch.compile(spread, backend="aot_eager", fullgraph=True)
for step in range(1, 3):
    loss = -compiled(points)
    opt.zero_grad()
    loss.backward()
    dump(step, {"points": points.grad})
    opt.step()

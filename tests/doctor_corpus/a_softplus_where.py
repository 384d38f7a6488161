"""Class A: the branch a `where` does not take overflows (pytorch#68425, #156212: "terrible to
debug"). exp(100) is inf in float32; the where selects x there, so exp's backward gets 0 and makes
0 * inf = NaN."""
import torch
from dump import dump

torch.manual_seed(0)
x = torch.tensor([[0.5], [3.0], [100.0]])
y = torch.tensor([[1.0], [3.5], [100.0]])
w = torch.ones(1, 1, requires_grad=True)
opt = torch.optim.SGD([w], lr=0.01)


def softplus(z):
    return torch.where(z < 20, torch.log1p(torch.exp(z)), z)  # born


for step in range(1, 4):
    loss = (softplus(x @ w) - y).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    dump(step, {"w": w.grad})
    opt.step()

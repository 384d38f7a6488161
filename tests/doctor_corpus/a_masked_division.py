"""Class A: x / 0 in the forward, then the element is replaced (pytorch#4132, #52248: "torch.where
leads to unexpected gradients"). The where discards inf, yet the division's backward gives NaN."""
import torch
from dump import dump

torch.manual_seed(0)
counts = torch.tensor([4.0, 0.0, 2.0, 0.0])
totals = torch.nn.Parameter(torch.tensor([2.0, 1.0, 3.0, 5.0]))
opt = torch.optim.SGD([totals], lr=0.1)


def mean_per_bin(total, count):
    return torch.where(count > 0, total / count, torch.zeros_like(total))  # born


for step in range(1, 3):
    loss = mean_per_bin(totals, counts).pow(2).sum()
    opt.zero_grad()
    loss.backward()
    dump(step, {"totals": totals.grad})
    opt.step()

"""Clean, though anomaly mode raises: an intermediate gradient is NaN (pow's backward at 0 with 0
arriving) and masked_fill's backward erases it; every parameter gradient is finite."""
import torch

torch.manual_seed(0)
x = torch.nn.Parameter(torch.tensor([0.0, 4.0, 9.0]))
mask = x.detach() == 0
opt = torch.optim.SGD([x], lr=0.1)
for _ in range(2):
    y = x.masked_fill(mask, 0.0)
    loss = (y.pow(0.5) * (~mask)).sum()
    opt.zero_grad()
    loss.backward()
    opt.step()

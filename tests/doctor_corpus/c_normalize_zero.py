"""Class C: x / |x| of a zero vector is 0/0 = NaN in the forward (pytorch#2421 "Gradient of zero norm
is nan"); anomaly mode reports it as DivBackward0 returning NaN, a backward fault."""
import torch

torch.manual_seed(0)
v = torch.nn.Parameter(torch.tensor([[1.0, 2.0], [0.0, 0.0]]))
target = torch.tensor([[0.6, 0.8], [1.0, 0.0]])


def unit(x):
    return x / x.pow(2).sum(-1, keepdim=True).sqrt()  # born


loss = (unit(v) - target).pow(2).sum()
loss.backward()

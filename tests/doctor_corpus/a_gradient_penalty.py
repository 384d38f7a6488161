"""Double backward: a gradient penalty on an energy with padding atoms at 0 (masked out). The
first-order gradient is finite (1.5 * 0 ** 0.5 * 0 = 0); its own derivative 0.75 * 0 ** -0.5 = inf
meets the mask's 0 in the penalty's backward: born in the double backward, reported against the
forward's pow."""
import torch
from dump import dump

torch.manual_seed(0)
x = torch.tensor([0.0, 1.0, 4.0], requires_grad=True)
real = torch.tensor([0.0, 1.0, 1.0])
scale = torch.nn.Parameter(torch.tensor(1.0))
opt = torch.optim.SGD([scale], lr=0.01)


def energy(z, s, mask):
    return (s * z.pow(1.5) * mask).sum()  # born


for step in range(1, 3):
    e = energy(x, scale, real)
    (g,) = torch.autograd.grad(e, x, create_graph=True)
    loss = e + g.pow(2).sum()
    opt.zero_grad()
    loss.backward()
    dump(step, {"scale": scale.grad, "x": x.grad})
    opt.step()

"""Double backward: a WGAN-GP gradient penalty, (|grad D(x)| - 1)^2, with the gradient's norm written
by hand. A sample where the critic is flat (a dead ReLU: its input gradient is 0) has a norm of 0,
whose sqrt'(0) = inf meets the penalty's nonzero gradient -2 (the "gradient penalty gives NaN"
reports)."""
import torch
from dump import dump

torch.manual_seed(0)
critic = torch.nn.Sequential(torch.nn.Linear(2, 1), torch.nn.ReLU())
with torch.no_grad():
    critic[0].weight.copy_(torch.tensor([[1.0, 1.0]]))
    critic[0].bias.zero_()
opt = torch.optim.SGD(critic.parameters(), lr=0.01)
x = torch.tensor([[1.0, 2.0], [-3.0, -1.0]], requires_grad=True)  # the second is in the dead region


def gradient_norm(g):
    return g.pow(2).sum(1).sqrt()  # born


for step in range(1, 3):
    out = critic(x).sum()
    (g,) = torch.autograd.grad(out, x, create_graph=True)
    loss = -out + 10 * (gradient_norm(g) - 1).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    dump(step, {"weight": critic[0].weight.grad, "bias": critic[0].bias.grad})
    opt.step()

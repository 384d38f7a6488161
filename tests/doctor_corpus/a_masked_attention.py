"""Class A: attention written by hand, with the padded keys' scores filled with -inf (the masked-
softmax reports: pytorch#41508, jax#1052). The second sequence is empty: its softmax row is 0/0, NaN,
and although the loss leaves that sequence out, the product with the values passes the NaN on to
their gradient (0 * NaN). The birth is in that product's backward; the fix is the fill value."""
import torch
from dump import dump

torch.manual_seed(0)
proj = torch.nn.Linear(4, 4)
opt = torch.optim.SGD(proj.parameters(), lr=0.1)
tokens = torch.randn(2, 3, 4)
keep = torch.tensor([[True, True, False], [False, False, False]])


def attend(x, keep):
    q = proj(x)
    scores = q @ x.transpose(1, 2)
    scores = scores.masked_fill(~keep[:, None, :], float("-inf"))
    weights = scores.softmax(-1)
    return weights @ q  # born


for step in range(1, 3):
    out = attend(tokens, keep)
    loss = out[0].pow(2).sum()
    opt.zero_grad()
    loss.backward()
    dump(step, {name: p.grad for name, p in proj.named_parameters()})
    opt.step()

"""Class C: log of a softmax that underflows to 0 (TensorFlow Debugger V2's tutorial, whose printed
fix, a clip of the log, zeroes the gradient everywhere). log(0) = -inf reaches the loss."""
import torch
from dump import dump

torch.manual_seed(0)
logits = torch.nn.Parameter(torch.tensor([[0.0, 200.0, 1.0], [2.0, 1.0, 0.0]]))
labels = torch.tensor([0, 1])
opt = torch.optim.SGD([logits], lr=0.1)


def cross_entropy(z, y):
    p = torch.softmax(z, dim=-1)
    return -torch.log(p)[torch.arange(len(y)), y].mean()  # born


for step in range(1, 3):
    loss = cross_entropy(logits, labels)
    opt.zero_grad()
    loss.backward()
    dump(step, {"logits": logits.grad})
    opt.step()

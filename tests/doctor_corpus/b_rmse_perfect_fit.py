"""Class B: sqrt at 0 where the value is used (discuss.pytorch.org "Function 'MseLossBackward'
returned nan values in its 0th output": anomaly mode blames the MSE, the birth is the sqrt). A
model that fits its batch exactly has an RMSE of 0, and sqrt'(0) = inf."""
import torch
from dump import dump

torch.manual_seed(0)
model = torch.nn.Linear(2, 1)
with torch.no_grad():
    model.weight.copy_(torch.tensor([[1.0, -1.0]]))
    model.bias.zero_()
x = torch.tensor([[1.0, 2.0], [3.0, 1.0]])
y = x[:, :1] - x[:, 1:]
opt = torch.optim.SGD(model.parameters(), lr=0.1)


def rmse(pred, target):
    return torch.nn.functional.mse_loss(pred, target).sqrt()  # born


for step in range(1, 3):
    loss = rmse(model(x), y)
    opt.zero_grad()
    loss.backward()
    dump(step, {"weight": model.weight.grad, "bias": model.bias.grad})
    opt.step()

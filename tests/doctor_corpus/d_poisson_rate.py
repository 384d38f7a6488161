"""Class D: a Poisson regression with an exponential link on unscaled features (a diverging run in
the NaN-at-step-N reports): exp of a large linear predictor overflows float32."""
import torch

torch.manual_seed(0)
x = torch.tensor([[120.0, 3.0], [80.0, 1.0], [95.0, 2.0]])
counts = torch.tensor([3.0, 1.0, 2.0])
model = torch.nn.Linear(2, 1)
with torch.no_grad():
    model.weight.fill_(1.0)
    model.bias.zero_()
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
for _ in range(2):
    rate = torch.exp(model(x)).squeeze(-1)  # born
    loss = (rate - counts * torch.log(rate)).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()

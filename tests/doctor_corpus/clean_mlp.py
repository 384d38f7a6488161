"""Clean: an MLP trained for a few steps; every loss and gradient is finite."""
import torch

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
x, y = torch.randn(16, 4), torch.randn(16, 1)
for _ in range(5):
    loss = torch.nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
print(f"final loss {loss.item():.4f}")

"""Class E: parameters already non-finite when the step starts (a checkpoint saved after a bad
step, then loaded): the first forward carries the infinity on."""
import torch

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
state = model.state_dict()
state["2.weight"][0, 2] = float("inf")
model.load_state_dict(state)
x, y = torch.randn(6, 3), torch.randn(6, 1)
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
for _ in range(2):
    loss = torch.nn.functional.mse_loss(model(x), y)  # born
    opt.zero_grad()
    loss.backward()
    opt.step()

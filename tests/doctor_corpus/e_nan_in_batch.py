"""Class E: a NaN in the data (a missing value read as NaN), batched by a DataLoader: the NaN enters
the step from outside, and no op is at fault."""
import torch
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
features = torch.randn(8, 3)
features[5, 1] = float("nan")
targets = torch.randn(8, 1)
loader = DataLoader(TensorDataset(features, targets), batch_size=4, shuffle=False)
model = torch.nn.Linear(3, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for xb, yb in loader:
    loss = torch.nn.functional.mse_loss(model(xb), yb)  # born
    opt.zero_grad()
    loss.backward()
    opt.step()

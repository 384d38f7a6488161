"""Class A inside a library call: nn.MultiheadAttention with a fully padded sequence (pytorch#41508,
open): every key of that row is masked, its softmax is 0/0, and although the loss leaves the padded
sequence out, its gradient is NaN. The birth is inside PyTorch; the line to fix is the call."""
import torch
from dump import dump

torch.manual_seed(0)
attention = torch.nn.MultiheadAttention(embed_dim=4, num_heads=1, batch_first=True)
opt = torch.optim.SGD(attention.parameters(), lr=0.1)
tokens = torch.randn(2, 3, 4)
padding = torch.tensor([[False, False, True], [True, True, True]])  # the second sequence is empty


def encode(x, pad):
    out, _ = attention(x, x, x, key_padding_mask=pad)  # born
    return out


for step in range(1, 3):
    out = encode(tokens, padding)
    loss = out[0].pow(2).sum()
    opt.zero_grad()
    loss.backward()
    dump(step, {name: p.grad for name, p in attention.named_parameters()})
    opt.step()

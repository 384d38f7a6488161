"""Sites: where a rule is realised at backward time -- post-hooks on a group's autograd nodes, the
autograd.Function of an override group, and the plumbing both need (torch.func levels, saved values)."""

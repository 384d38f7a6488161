"""The built-in group library: composite ops whose gradients equal PyTorch's hand-written ones.

Each op is written from primitive PyTorch ops, marked as a group named ``ops.<op>``, and its special
cases are declared in ``builtin.yaml`` beside this file, loaded once, when this package is imported
(``import autograd_groups`` alone does not import it).
Signatures follow PyTorch's; the documentation's "Built-in ops" page lists every special point and
the rule for it.

>>> import torch, autograd_groups as ag
>>> x1 = torch.tensor([[0.0, 1.0], [2.0, 3.0]], requires_grad=True)
>>> ag.ops.cdist(x1, x1.detach()).sum().backward()
>>> bool(torch.isfinite(x1.grad).all())
True
"""

from importlib import resources

from ..rules.registry import keep
from ..spec import load_spec
from .distance import cdist, dist, pdist
from .elementwise import atan2, pow, xlogy
from .moments import std, var
from .norms import cosine_similarity, normalize, vector_norm
from .reductions import logsumexp

#: What loading ``builtin.yaml`` registered (``SPEC.groups``: the groups and their rules).
SPEC = load_spec(resources.files(__name__) / "builtin.yaml")
keep(group.name for group in SPEC.groups)

__all__ = ["SPEC", "atan2", "cdist", "cosine_similarity", "dist", "logsumexp", "normalize", "pdist", "pow",
           "std", "var", "vector_norm", "xlogy"]

"""Reading tensors the doctor did not make: through ``torch.func``'s wrappers, and many finiteness
checks in one host read."""

from __future__ import annotations

import cmath
import math
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from .. import compat
from ..nodes import ACCUMULATE_GRAD


def plain(value: torch.Tensor) -> torch.Tensor:
    """``value`` without its ``torch.func`` wrappers: under ``vmap`` the whole batch, so that it can
    be read on the host.

    >>> import torch
    >>> seen = []
    >>> _ = torch.func.vmap(lambda x: seen.append(plain(x)) or x)(torch.ones(3, 2))
    >>> seen[0].shape
    torch.Size([3, 2])
    """
    while compat.is_functorch_wrapped_tensor(value):
        value = compat.get_unwrapped(value)
    return value


def floating(values: Iterable[Any]) -> list[torch.Tensor]:
    """The floating-point (or complex) tensors among ``values``, unwrapped."""
    return [plain(v) for v in values
            if isinstance(v, torch.Tensor) and (v.is_floating_point() or v.is_complex())]


def finite_flags(tensors: Sequence[torch.Tensor]) -> list[bool]:
    """For each tensor, whether all of it is finite: one host read for all of them.

    >>> import torch
    >>> finite_flags([torch.ones(2), torch.tensor([1.0, float("inf")])])
    [True, False]
    """
    if not tensors:
        return []
    flags = torch.stack([torch.isfinite(stored(t)).all().to("cpu", non_blocking=True) for t in tensors])
    return [bool(f) for f in flags.tolist()]


def all_finite(tensors: Sequence[torch.Tensor]) -> bool:
    """Whether every tensor is finite everywhere, read once."""
    if not tensors:
        return True
    return bool(torch.stack([torch.isfinite(stored(t)).all().cpu() for t in tensors]).all())


def stored(tensor: torch.Tensor) -> torch.Tensor:
    """The elements ``tensor`` stores: a sparse tensor's values (an embedding's sparse gradient),
    on which ``isfinite`` works, where it does not on the sparse tensor itself.

    >>> stored(torch.tensor([[0.0, 2.0], [0.0, 0.0]]).to_sparse())
    tensor([2.])
    """
    if tensor.layout == torch.strided:
        return tensor
    return tensor.coalesce().values() if tensor.layout == torch.sparse_coo else tensor.values()


def dense(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` with its every element, sparse or not (an embedding's sparse gradient made dense,
    to be compared or masked element by element).

    >>> dense(torch.tensor([[0.0, 2.0]]).to_sparse())
    tensor([[0., 2.]])
    """
    return tensor if tensor.layout == torch.strided else tensor.to_dense()


_CPU = torch.device("cpu")


def finite_groups(groups: Sequence[Sequence[torch.Tensor]]) -> list[bool]:
    """For each group of tensors, whether all of it is finite: the trigger after each backward.
    Where all are, that is a sum of each tensor (on a device, with one host read of them all);
    otherwise (or where a sum overflows though every element is finite) each group is looked at
    exactly.

    >>> big, nan = torch.tensor([3e38, 3e38]), torch.tensor([0.0, float("nan")])
    >>> finite_groups([[torch.ones(2)], [torch.ones(2), big, torch.arange(3)], [nan]])
    [True, True, False]
    """
    flat = [t for group in groups for t in group]
    # A sum is finite where every element is (an infinity or a NaN makes it inf or NaN), and it
    # reads each element once; of a detached tensor, so that autograd records nothing.
    if all([t.is_cpu for t in flat]):
        # On the CPU a read waits for nothing: each sum is read as it is made, one element as it is.
        total: complex = sum([(t if t.numel() == 1 else (t.detach() if t.requires_grad else t).sum()).item()
                              for t in flat])
    elif len({t.device for t in flat}) == 1:
        # One host read, so that the host waits for the device once.
        total = torch.stack([(t.detach() if t.requires_grad else t).sum() for t in flat]).sum().item()
    else:
        total = math.nan
    if cmath.isfinite(total):
        return [True for _ in groups]
    return [all_finite(floating(group)) for group in groups]


def leaves_of(roots: Sequence[Any]) -> tuple[list[torch.Tensor], bool]:
    """The leaves reachable from the autograd nodes ``roots`` (the tensors their accumulators write
    into), and whether a compiled graph (a ``CompiledFunction`` node) is among the nodes reached.

    >>> x = torch.ones(2, requires_grad=True)
    >>> leaves, compiled = leaves_of([(x * 2).exp().grad_fn])
    >>> leaves[0] is x, compiled
    (True, False)
    """
    # The same walk as nodes.reachable, kept to what the trigger needs: it runs after every
    # backward of a training run.
    leaves: list[torch.Tensor] = []
    compiled = False
    seen: set[Any] = {None}
    stack = list(roots)
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        if type(node) is ACCUMULATE_GRAD:
            leaves.append(node.variable)  # type: ignore[attr-defined]
            continue
        compiled = compiled or "CompiledFunction" in type(node).__name__
        stack += [edge[0] for edge in node.next_functions]
    return leaves, compiled

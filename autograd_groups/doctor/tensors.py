"""Reading tensors the doctor did not make: through ``torch.func``'s wrappers, and many finiteness
checks in one host read."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from .. import compat


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
    flags = torch.stack([torch.isfinite(t).all().to("cpu", non_blocking=True) for t in tensors])
    return [bool(f) for f in flags.tolist()]


def all_finite(tensors: Sequence[torch.Tensor]) -> bool:
    """Whether every tensor is finite everywhere, read once."""
    if not tensors:
        return True
    return bool(torch.stack([torch.isfinite(t).all().cpu() for t in tensors]).all())


def finite_groups(groups: Sequence[Sequence[torch.Tensor]]) -> list[bool]:
    """For each group of tensors, whether all of it is finite: the trigger after each backward.
    Where all are, that is one fused norm of every tensor and one host read; otherwise (or where
    the norms overflow though every element is finite) each group is looked at exactly.

    >>> big, nan = torch.tensor([1e30, 1e30]), torch.tensor([0.0, float("nan")])
    >>> finite_groups([[torch.ones(2)], [torch.ones(2), big], [nan]])
    [True, True, False]
    """
    flat = [t for group in groups for t in group]
    kinds = {(t.dtype, t.device) for t in flat}
    # One kind (dtype and device) of tensor, as a model's usually are: else each is looked at alone.
    if len(kinds) == 1 and compat.foreach_norm is not None:
        with torch.no_grad():
            if math.isfinite(torch.stack(compat.foreach_norm(flat)).sum().item()):
                return [True for _ in groups]
    return [all_finite(group) for group in groups]


def nodes_of(roots: Sequence[Any]) -> list[Any]:
    """Every autograd node reachable from ``roots`` (leaf accumulators included)."""
    found: list[Any] = []
    seen: set[Any] = {None}
    stack = list(roots)
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        found.append(node)
        for child, _ in node.next_functions:
            stack.append(child)
    return found

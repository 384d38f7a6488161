"""Reading tensors the doctor did not make: through ``torch.func``'s wrappers, and many finiteness
checks in one host read."""

from __future__ import annotations

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
    return bool(torch.stack([torch.isfinite(t).all() for t in tensors]).all())


def finite_groups(groups: Sequence[Sequence[torch.Tensor]]) -> list[bool]:
    """For each group of tensors, whether all of it is finite: the trigger after each backward, one
    fused norm of every tensor and one host read. A norm that overflows where every element is finite
    is told apart by a second, exact look at that group.

    >>> import torch
    >>> big, nan = torch.tensor([1e30, 1e30]), torch.tensor([0.0, float("nan")])
    >>> finite_groups([[torch.ones(2)], [torch.ones(2), big], [nan]])
    [True, True, False]
    """
    flat = [t for group in groups for t in group]
    if not flat:
        return [True for _ in groups]
    if compat.foreach_norm is None:
        return [all_finite(group) for group in groups]
    ok = torch.stack(compat.foreach_norm(flat)).isfinite().tolist()
    found, at = [], 0
    for group in groups:
        fine = all(ok[at:at + len(group)])
        found.append(fine or all_finite(group))
        at += len(group)
    return found


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

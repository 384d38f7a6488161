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
    """Whether every tensor is finite everywhere, read once: the trigger after each backward."""
    if not tensors:
        return True
    return bool(torch.stack([torch.isfinite(t).all() for t in tensors]).all())


def nodes_of(roots: Sequence[Any]) -> list[Any]:
    """Every autograd node reachable from ``roots`` (leaf accumulators included)."""
    found: list[Any] = []
    seen: set[int] = set()
    stack = [r for r in roots if r is not None]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        found.append(node)
        stack.extend(c for c, _ in node.next_functions if c is not None and id(c) not in seen)
    return found

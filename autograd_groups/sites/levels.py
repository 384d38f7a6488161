"""Autograd graphs under torch.func: one per grad transform level.

Inside torch.func transforms a tensor is a stack of wrappers, one per transform level, the
innermost transform's outermost. Each grad transform (``grad``, ``vjp``, ``jacrev``) records its own
autograd graph on its own wrapper, and plain autograd on the unwrapped tensor (level -1): the nodes
Python sees through ``tensor.grad_fn`` are those of the innermost level only. A group hooks its
rules onto every level's graph, and a rule site protects the derivative formula in the graphs that
will differentiate it.
"""

from __future__ import annotations

from typing import Any

import torch

from ..compat import (
    TransformType,
    get_unwrapped,
    is_batchedtensor,
    is_functorch_wrapped_tensor,
    maybe_get_bdim,
    maybe_get_level,
    peek_interpreter_stack,
    retrieve_all_functorch_interpreters,
)

PLAIN = -1


def graph_roots(tensors: list[torch.Tensor]) -> list[Any]:
    """The autograd nodes that produced ``tensors``, in every graph that records them.

    >>> import torch
    >>> x = torch.ones(2, requires_grad=True)
    >>> [type(n).__name__ for n in graph_roots([x.exp()])]
    ['ExpBackward0']
    """
    roots = [t.grad_fn for t in tensors if t.grad_fn is not None]
    if peek_interpreter_stack() is None:
        return roots
    for level in reversed([PLAIN, *_grad_levels(retrieve_all_functorch_interpreters())]):
        for t in tensors:
            tracked = at_level(t, level)
            if tracked is not None and tracked is not t and tracked.grad_fn is not None:
                roots.append(tracked.grad_fn)
    return roots


def differentiating_levels() -> list[int]:
    """The levels whose graphs will differentiate the backward pass running now.

    Outside torch.func that is plain autograd (under ``create_graph``). Inside, it is also every
    grad transform around the one running this backward (reverse-over-reverse, ``jacrev(jacrev)``).
    """
    if peek_interpreter_stack() is None:
        return [PLAIN]
    return [PLAIN, *_grad_levels(retrieve_all_functorch_interpreters())]


def differentiated(value: torch.Tensor, besides: frozenset[int] = frozenset()) -> bool:
    """Whether a graph that will differentiate the backward running now records ``value``, at a
    level but those ``besides``.

    >>> import torch
    >>> differentiated(torch.ones(2))
    False
    """
    return any((tracked := at_level(value, level)) is not None and tracked.grad_fn is not None
               for level in differentiating_levels() if level not in besides)


def anywhere(mask: torch.Tensor) -> torch.Tensor:
    """A bool ``mask`` as a plain tensor that Python may read: true where it is true for some entry
    of any vmap batch around it.

    >>> import torch
    >>> seen = []
    >>> rows = torch.tensor([[True, False, False], [False, False, True]])
    >>> _ = torch.func.vmap(lambda row: seen.append(anywhere(row).tolist()) or row)(rows)
    >>> seen
    [[True, False, True]]
    """
    while is_functorch_wrapped_tensor(mask):
        if is_batchedtensor(mask):
            mask = get_unwrapped(mask).any(maybe_get_bdim(mask))
        else:
            mask = get_unwrapped(mask)
    return mask


def at_level(value: Any, level: int) -> torch.Tensor | None:
    """``value`` as the graph at ``level`` records it, or None if that level does not hold it."""
    if not isinstance(value, torch.Tensor):
        return None
    while (found := maybe_get_level(value)) > level:
        value = get_unwrapped(value)
    return value if found == level else None


def _grad_levels(interpreters: list[Any]) -> list[int]:
    return [i.level() for i in interpreters if i.key() == TransformType.Grad]

"""Autograd graphs under torch.func: one per grad transform level.

Inside torch.func transforms a tensor is a stack of wrappers, one per transform level, the
innermost transform's outermost. Each grad transform (``grad``, ``vjp``, ``jacrev``) records its own
autograd graph on its own wrapper, and plain autograd on the unwrapped tensor (level -1): the nodes
Python sees through ``tensor.grad_fn`` are those of the innermost level only. A group hooks its
rules onto every level's graph, and a rule site protects the derivative formula in the graphs that
will differentiate it.
"""

from __future__ import annotations

import contextlib
import inspect
import sys
import types
from collections.abc import Iterator
from typing import Any

import torch
import torch.autograd.forward_ad as forward_ad

from .compat import (
    TransformType,
    dual_level,
    get_unwrapped,
    grad_transform_codes,
    is_batchedtensor,
    is_functorch_wrapped_tensor,
    maybe_get_bdim,
    maybe_get_level,
    peek_interpreter_stack,
    retrieve_all_functorch_interpreters,
    temporarily_clear_interpreter_stack,
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
    levels = _grad_levels(retrieve_all_functorch_interpreters())
    if levels and _grad_transform_backward():
        # ``torch.func.grad``'s own backward: it runs inside its level with ``create_graph`` only
        # so that an outer transform can differentiate it; its level ends right after.
        levels = levels[:-1]
    return [PLAIN, *levels]


#: The public entries of a backward pass, as the frames of the thread that started it show them.
_ENTRIES = frozenset(inspect.unwrap(f).__code__ for f in (torch.autograd.grad, torch.autograd.backward))
#: Code of wrappers around ``torch.autograd.grad`` (the doctor's watch) that stand between functorch
#: and the real entry without changing which backward it is.
_PASSING: set[types.CodeType] = set()


def passes_through(*codes: types.CodeType) -> None:
    """Let frames running ``codes`` stand between ``torch.func.grad`` and ``torch.autograd.grad``:
    a wrapper that watches the call is still ``grad``'s own backward."""
    _PASSING.update(codes)


def _grad_transform_backward() -> bool:
    """Whether the backward running now is the one ``torch.func.grad`` (``grad_and_value``) takes of
    the function it transforms, rather than one that code inside the transform started.

    Read from Python's frames: ``torch.autograd.grad`` called by functorch's ``_autograd_grad``
    called by ``grad_and_value_impl``, matched by their code objects (see
    :func:`~autograd_groups.compat.grad_transform_codes`). Where the backward runs on another thread
    than the one that started it (an accelerator's autograd thread), the frames of the threads
    waiting in a backward are read instead: it is recognised where every one of them is such a
    backward.

    On a release whose functorch no longer has those two functions, this raises
    :class:`~autograd_groups.errors.UnsupportedRelease` rather than answer False: False would
    take ``grad``'s own backward for a differentiated one, and a first derivative would then run
    the second-order check of every rule that fired and warn of second derivatives that are not
    there.
    """
    codes = grad_transform_codes()
    own = _launched(sys._getframe(1), codes)
    if own is not None:
        return own
    waiting = [found for frame in sys._current_frames().values()
               if (found := _launched(frame, codes)) is not None]
    return bool(waiting) and all(waiting)


def _launched(frame: Any, codes: tuple[types.CodeType, types.CodeType]) -> bool | None:
    """Whether the backward that ``frame``'s thread started is ``grad``'s own, given the ``codes``
    of ``grad_and_value_impl`` and ``_autograd_grad`` (None: the thread started no backward)."""
    while frame is not None and frame.f_code not in _ENTRIES:
        frame = frame.f_back
    if frame is None:
        return None
    caller = frame.f_back
    while caller is not None and caller.f_code in _PASSING:
        caller = caller.f_back
    outer = caller.f_back if caller is not None else None
    return (caller is not None and caller.f_code is codes[1]
            and outer is not None and outer.f_code is codes[0])


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


@contextlib.contextmanager
def outside_transforms() -> Iterator[None]:
    """Run the block as if no torch.func transform were active (a check that re-runs a group on
    plain copies of its inputs, from inside a transformed backward).

    >>> import torch
    >>> def f(x):
    ...     with outside_transforms():
    ...         assert peek_interpreter_stack() is None
    ...     return x.sum()
    >>> torch.func.grad(f)(torch.ones(2))
    tensor([1., 1.])
    """
    if peek_interpreter_stack() is None:
        yield
        return
    with temporarily_clear_interpreter_stack():
        yield


def forward_mode_around(inner: bool = False) -> bool:
    """Whether a forward-mode level (a ``torch.func`` jvp transform, a ``forward_ad`` dual level)
    will differentiate what this thread computes now; but the innermost jvp transform, whose jvp
    is running, where ``inner``.

    >>> import torch
    >>> found = []
    >>> one = (torch.ones(1),)
    >>> _ = torch.func.jvp(lambda x: found.append(forward_mode_around()) or x, one, one)
    >>> found, forward_mode_around()
    ([True], False)
    """
    if not inner and dual_level() >= 0:  # torch.func's jvp opens a dual level too
        return True
    top = peek_interpreter_stack()
    if top is None:
        return False
    jvps = sum(i.key() == TransformType.Jvp for i in retrieve_all_functorch_interpreters())
    return jvps > (1 if inner and top.key() == TransformType.Jvp else 0)


def nested_derivatives() -> bool:
    """Whether two or more torch.func transforms that differentiate (``grad``, ``vjp``, ``jacrev``,
    ``jvp``, ``jacfwd``) are open: inside them a second derivative can be taken.

    >>> import torch
    >>> found = []
    >>> _ = torch.func.jacrev(lambda x: found.append(nested_derivatives()) or x)(torch.ones(1))
    >>> _ = torch.func.hessian(lambda x: found.append(nested_derivatives()) or x.sum())(torch.ones(1))
    >>> found
    [False, True]
    """
    if peek_interpreter_stack() is None:
        return False
    kinds = (TransformType.Grad, TransformType.Jvp)
    return sum(i.key() in kinds for i in retrieve_all_functorch_interpreters()) >= 2


def _grad_levels(interpreters: list[Any]) -> list[int]:
    return [i.level() for i in interpreters if i.key() == TransformType.Grad]


def unwrapped(value: torch.Tensor) -> tuple[torch.Tensor | None, bool]:
    """``value`` without its torch.func wrappers, and whether some level differentiates it: it
    requires grad at a grad level, or it is lifted into a forward-mode level (``jvp``, ``jacfwd``)
    with a tangent; None for the tensor where a wrapper is a vmap batch (its entries are not one
    value).

    A tangent is seen at the innermost level only: at an outer forward-mode level every tensor
    lifted into it counts, one detached there included.

    >>> import torch
    >>> seen = []
    >>> _ = torch.func.grad(lambda x: seen.append(unwrapped(x)) or x.sum())(torch.ones(2))
    >>> seen[0][0].requires_grad, seen[0][1]
    (False, True)
    >>> _ = torch.func.jacfwd(lambda x: seen.append(unwrapped(x)) or x.sum())(torch.ones(2))
    >>> seen[1][1]
    True
    """
    wanted = value.requires_grad
    forward: dict[int, bool] | None = None
    while is_functorch_wrapped_tensor(value):
        if is_batchedtensor(value):
            return None, wanted
        if not wanted:
            forward = _forward_levels() if forward is None else forward
            level = maybe_get_level(value)
            wanted = level in forward and (not forward[level] or forward_ad.unpack_dual(value).tangent
                                           is not None)
        value = get_unwrapped(value)
        wanted = wanted or value.requires_grad
    return value, wanted


def _forward_levels() -> dict[int, bool]:
    """The forward-mode levels open now, each with whether it is the innermost level (where a
    wrapper's tangent can be read)."""
    interpreters = retrieve_all_functorch_interpreters()
    innermost = interpreters[-1].level() if interpreters else None
    return {i.level(): i.level() == innermost for i in interpreters if i.key() == TransformType.Jvp}

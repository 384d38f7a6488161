"""Which autograd nodes pass an exactly zero gradient on as exactly zero, whatever their inputs were:
the nodes a NaN-safe group need not hook.

A ``0 · ∞`` can only arise where a node's backward multiplies the incoming gradient by a value of
the forward pass (a saved tensor) or by a local derivative that can be singular. A node whose class
saves no tensor computes a linear function of the gradient whose coefficients are fixed by shapes,
dims and constants: a sum, a view, an expand, a negation, ``x + y``. Masks and indices
(``condition``, ``mask``, ``index``, ``indices``) only select or place gradient elements, so
``where``, ``masked_fill``, ``index`` and ``sort``'s backward pass zeros on too, and so do the ops
whose backward is a select on a comparison of saved values (``relu``, ``clamp``, ``threshold``,
``hardtanh``). A saved scalar that scales the gradient (``alpha`` of ``add``, the constant of
``lerp``) is read from the node: it must be finite and non-zero.

The verdict is computed once per node class, from the class's saved-value slots and the op's ATen
schema; only the scalars are read per node.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from . import nodes

#: Ops whose backward is ``where(comparison of saved values, grad, 0)``: a select, for any values.
_SELECTS = frozenset(nodes.op_key(op) for op in (
    "relu", "threshold", "clamp", "clamp_min", "clamp_max", "hardtanh"))
#: Saved tensors that only select or place gradient elements.
_PLACING = frozenset({"condition", "mask", "index", "indices"})

# Per node class: None where the backward may turn a zero into NaN, else the names of the saved
# scalars that scale the gradient.
_verdicts: dict[type, tuple[str, ...] | None] = {}


def _numbers(op: str) -> set[str]:
    """The arguments of ATen op ``op`` that are Scalars in one of its overloads."""
    try:
        packet = getattr(torch.ops.aten, op)
    except (AttributeError, RuntimeError):
        return set()
    return {a.name for o in packet.overloads() for a in getattr(packet, o)._schema.arguments
            if str(a.type) in ("number", "Optional[number]")}


def _verdict(cls: type) -> tuple[str, ...] | None:
    if not nodes.is_generated_class(cls):
        return None  # a custom autograd.Function, or a node autograd does not generate
    op = nodes.op_name_of_class(cls.__name__)
    if nodes.op_key(op) in _SELECTS:
        return ()
    slots = [a[len("_saved_"):] for a in dir(cls) if a.startswith("_saved_")]
    tensors = {name for name in slots if hasattr(cls, "_raw_saved_" + name)}
    if tensors - _PLACING:
        return None
    numbers = _numbers(op)
    return tuple(name for name in slots if name not in tensors and name in numbers)


def _scales_safely(value: Any) -> bool:
    return isinstance(value, (int, float, complex)) and value != 0 and math.isfinite(abs(value))


def passes_zeros(node: Any) -> bool:
    """Whether ``node``'s backward can only pass an exactly zero incoming gradient on as exactly
    zero (elementwise for elementwise ops, as a whole for the others).

    >>> import torch
    >>> x = torch.ones(3, requires_grad=True)
    >>> passes_zeros((x + 1).sum().grad_fn), passes_zeros(torch.where(x > 0, x, 0).grad_fn)
    (True, True)
    >>> passes_zeros(x.log().grad_fn), passes_zeros((x * x).grad_fn)
    (False, False)
    """
    cls = type(node)
    if cls not in _verdicts:
        _verdicts[cls] = _verdict(cls)
    scalars = _verdicts[cls]
    if scalars is None:
        return False
    return all(_scales_safely(getattr(node, "_saved_" + name)) for name in scalars)

"""Which autograd nodes pass an exactly zero gradient on as exactly zero, whatever their inputs were
or for the values they saved in one call: the nodes a NaN-safe group need not hook.

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

Many other nodes pass zeros on where the values they saved are finite: a product's backward
multiplies the gradient by finite functions of its saved tensors (``mul``, ``sin``, ``bmm``:
``0 · x = 0`` wherever they are finite). Which saved values are finite follows from the graph's
structure (:mod:`autograd_groups.finiteness`); where it cannot tell and the forward may read values
-- eagerly, on the CPU -- one sum over them per call (:func:`passing_now`) spares a NaN-safe group
the hooks of the products it still had to hook (documentation: "Groups and rules", "Where the hooks go").
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from . import compat, host_reads, nodes

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
    return {a.name for o in packet.overloads() for a in compat.op_schema(getattr(packet, o)).arguments
            if str(a.type) in ("number", "Optional[number]")}


def _verdict(cls: type) -> tuple[str, ...] | None:
    if not nodes.is_generated_class(cls):
        return None  # a custom autograd.Function, or a node autograd does not generate
    op = nodes.op_name_of_class(cls.__name__)
    if nodes.op_key(op) in _SELECTS:
        return ()
    slots = compat.saved_names_of_class(cls)
    tensors = {name for name in slots if compat.saves_as_tensor(cls, name)}
    if tensors - _PLACING:
        return None
    numbers = _numbers(op)
    return tuple(name for name in slots if name not in tensors and name in numbers)


def _scales_safely(value: Any) -> bool:
    return isinstance(value, (int, float, complex)) and value != 0 and math.isfinite(abs(value))


#: Products: node classes whose backward multiplies each input's gradient by finite functions of
#: their saved tensors wherever those are finite, and per input gradient the saved values it is
#: multiplied by (derivatives.yaml: ``grad * other``, ``grad * self.cos()``,
#: ``grad.bmm(mat2.transpose(1, 2))``, ``grad * result`` for exp, ...; ``result`` is the node's own
#: output).
MULTIPLIERS: dict[str, tuple[tuple[str, ...], ...]] = {
    "MulBackward0": (("other",), ("self",)),
    "MmBackward0": (("mat2",), ("self",)),
    "BmmBackward0": (("mat2",), ("self",)),
    "ExpBackward0": (("result",),),
    "SinBackward0": (("self",),),
    "CosBackward0": (("self",),),
    "TanhBackward0": (("result",),),
    "SigmoidBackward0": (("result",),),
    "LinalgCrossBackward0": (("other",), ("self",)),
}


#: Products with a factor that may be exactly zero where another is infinite: per node class, the
#: input gradients (by index) and the saved value that multiplies each (derivatives.yaml: xlogy's
#: ``other: grad * self / other``, xlog1py's ``other: grad * self / (other + 1)``). A NaN-safe group
#: makes such a gradient 0 where that factor is exactly 0, whatever the others are (``0 · ∞ = 0``),
#: as its forward mode does. A quotient's divisor (``-grad * self / other²``) is left out: every
#: NaN-safe division would pay a compare and a select for the 0 / 0 case.
ZERO_FACTORS: dict[str, tuple[tuple[int, str], ...]] = {
    "XlogyBackward0": ((1, "self"),),
    "SpecialXlog1PyBackward0": ((1, "self"),),
}


#: The most elements of saved tensors read per product spared: a successful read costs a pass over
#: them, less than the hook it spares spends on the gradient they multiply; a read that finds a
#: non-finite value spares nothing, and this bounds what it wastes.
CHECKED = 16384


def passing_now(sites: Sequence[tuple[Any, tuple[int, ...] | None]]) -> set[int]:
    """The ids of the products among the nodes of ``sites`` (:data:`MULTIPLIERS`) that pass an
    exactly zero gradient on as zero in this call, each for the input gradients it names (None:
    all of them): those whose saved tensors multiplying these gradients are all finite, read at
    once.

    The caller makes sure that the values may be read: an eager CPU forward, no compiler, no
    ``torch.func`` transform, and no saved-tensor hooks (which would unpack, or recompute, them);
    and passes only the products the structure could not clear (:mod:`autograd_groups.finiteness`),
    with the gradients it could not clear.

    One sum tells for all of them: a single non-finite value clears none.

    >>> import torch
    >>> x = torch.tensor([0.0, 2.0], requires_grad=True)
    >>> product, root = x * x, torch.sqrt(x)
    >>> sites = [(product.grad_fn, None), (root.grad_fn, None)]  # ids hold while these live
    >>> found = passing_now(sites)
    >>> [id(node) in found for node, _ in sites]
    [True, False]
    >>> y = torch.tensor([0.0, 2.0])
    >>> log_times = x.log() * y.requires_grad_()      # log(0) = -inf multiplies y's gradient only
    >>> passing_now([(log_times.grad_fn, None)]), len(passing_now([(log_times.grad_fn, (0,))]))
    (set(), 1)
    """
    products: list[Any] = []
    saved: dict[int, torch.Tensor] = {}  # by id: a tensor several products saved is read once
    for node, zeroed in sites:
        uses = MULTIPLIERS.get(type(node).__name__)
        if uses is None:
            continue
        products.append(node)
        for j, names in enumerate(uses):
            if zeroed is None or j in zeroed:
                for n in names:
                    value = compat.saved_value(node, n)
                    if isinstance(value, torch.Tensor):
                        saved[id(value)] = value
    elements = sum(t.numel() for t in saved.values())
    if saved and elements <= CHECKED * len(products) and all(host_reads.allowed(t) for t in saved.values()):
        # One sum over all of them: finite only if each is (an overflow errs on the safe side).
        with torch.no_grad():
            values = list(saved.values())
            joined = values[0] if len(values) == 1 else torch.cat([t.reshape(-1) for t in values])
            total = joined.sum().item()
        if math.isfinite(abs(total)):
            return {id(node) for node in products}
    return set()


def _class_verdict(cls: type) -> tuple[str, ...] | None:
    if cls not in _verdicts:
        _verdicts[cls] = _verdict(cls)
    return _verdicts[cls]


def reads_scalars(cls: type) -> bool:
    """Whether nodes of class ``cls`` pass zeros on depending on the scalars they saved."""
    return bool(_class_verdict(cls))


def passes_zeros_class(cls: type) -> bool:
    """Whether every node of class ``cls`` passes zeros on, whatever its values and scalars."""
    return _class_verdict(cls) == ()


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
    scalars = _class_verdict(type(node))
    if not scalars:
        return scalars is not None
    return all(_scales_safely(compat.saved_value(node, name)) for name in scalars)

"""Where a NaN-safe group needs its zeroing, decided from the graph's structure alone: which values
of the group's forward can be non-finite, and so which nodes' backward can meet a ``0 · ∞``.

No value is read (no host sync, on any device): only node classes, their edges and the numbers
autograd keeps on a node (``x / 6``'s divisor, ``x ** 2``'s exponent, ``add``'s ``alpha``), which
live on the host. What it assumes (docs/groups.md, "Where the hooks go"):

- the group's inputs are finite, and so are the tensors and numbers its ops use that need no
  gradient (constants, masks, a ``where``'s or ``masked_fill``'s fill value);
- sums, products and integer powers of finite values do not overflow; ``exp`` can (``exp(89)`` is
  ``inf`` in float32), so its result counts as possibly infinite.

A value made only by ops that keep finite inputs finite is then finite: linear ops and selects
(:func:`~autograd_groups.zero_passing.passes_zeros`), products, bounded functions (``sin``,
``tanh``, ...), a quotient by a nonzero number, and ``sqrt`` of a value that is a square or a sum of
squares. Everything else -- ``log``, ``div`` by a tensor, ``reciprocal``, ``rsqrt``, ``pow`` with an
exponent below 1, ``acos``, a custom ``autograd.Function``, an op this module does not know -- may
make ``inf`` or NaN, and its own backward may too, so it is hooked. A product is hooked only where a
value it saved may be non-finite, and zeroes only the gradients that value multiplies.

The decision is cached per structure: the sequence of node classes, their edges and those numbers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from . import zero_passing

#: One edge of a member node: the index of the node it leads to (a member's, or below 0 a node
#: outside the instance: a group input) and which of that node's outputs; None where the input
#: needs no gradient (a constant).
Edge = tuple[int, int] | None
#: Per member: its edges, in ``next_functions`` order.
Edges = Sequence[tuple[Edge, ...]]
#: Per hooked member: the indices of the gradients to zero, or None for all of them.
Sites = dict[int, tuple[int, ...] | None]

#: Products: per input gradient, the saved values it is multiplied by (finite functions of them,
#: derivatives.yaml's ``grad * other``, ``grad * self.cos()``, ``grad.bmm(mat2.transpose(1, 2))``).
_PRODUCTS: dict[str, tuple[tuple[str, ...], ...]] = {
    "MulBackward0": (("other",), ("self",)),
    "MmBackward0": (("mat2",), ("self",)),
    "BmmBackward0": (("mat2",), ("self",)),
    "ExpBackward0": (("result",),),
    "SinBackward0": (("self",),),
    "CosBackward0": (("self",),),
    "TanhBackward0": (("result",),),
    "SigmoidBackward0": (("result",),),
}
#: Which input a saved value is; ``result`` is the node's own output.
_INPUT = {"self": 0, "other": 1, "mat2": 1}
#: Products whose result can be infinite for finite inputs of ordinary size.
_OVERFLOWING = frozenset({"ExpBackward0"})
#: Ops whose result is non-negative (or NaN) whatever their input.
_NONNEGATIVE = frozenset({"AbsBackward0", "ExpBackward0", "SqrtBackward0", "ReluBackward0", "SigmoidBackward0"})
#: Ops whose result is non-negative where all their inputs are: sums, means, views, joins.
_KEEPS_SIGN = frozenset({
    "SumBackward0", "SumBackward1", "MeanBackward0", "MeanBackward1", "ViewBackward0",
    "UnsafeViewBackward0", "ExpandBackward0", "UnsqueezeBackward0", "SqueezeBackward0", "SqueezeBackward1",
    "SqueezeBackward2", "CloneBackward0", "PermuteBackward0", "TransposeBackward0", "SelectBackward0",
    "SliceBackward0", "CatBackward0", "StackBackward0"})
#: Roots whose result is finite where their input is finite and non-negative.
_ROOTS = frozenset({"SqrtBackward0"})

_plans: dict[tuple[Any, ...], tuple[tuple[int, tuple[int, ...] | None], ...]] = {}
#: The most structures kept: a program makes few, but one that builds graphs of changing shape
#: must not grow the cache without bound.
_KEPT = 1024


def _exponent(node: Any) -> float | None:
    value = getattr(node, "_saved_exponent", None)
    return float(value) if isinstance(value, (int, float)) else None


def _divides_safely(node: Any) -> bool:
    """Whether a ``div`` node divides by a nonzero, finite number (``x / 6``: autograd keeps the
    Python number as a 0-dim tensor on the host, so reading it syncs no device): its backward is
    then ``grad / other``. Not where the divisor needs a gradient: its own, ``-grad * self / other
    / other``, can overflow."""
    if node.next_functions[1][0] is not None:
        return False
    value = node._saved_other
    return (isinstance(value, torch.Tensor) and value.dim() == 0 and value.is_cpu
            and 0 < abs(value.item()) < math.inf)


def _fact(node: Any) -> Any:
    """The numbers on ``node`` the decision depends on, as part of the cache key."""
    name = type(node).__name__
    if name == "DivBackward0":
        return _divides_safely(node)
    if name == "PowBackward0":
        return _exponent(node)
    return zero_passing.passes_zeros(node) if zero_passing.reads_scalars(type(node)) else None


def key(members: Sequence[Any], edges: Edges) -> tuple[Any, ...]:
    """The structure of an instance: its members' classes, edges and numbers."""
    return tuple((type(node), e, _fact(node)) for node, e in zip(members, edges))


def sites(members: Sequence[Any], edges: Edges) -> Sites:
    """The members (by index) that need NaN-safe zeroing, and which of their gradients.

    >>> import torch
    >>> x = torch.ones(3, requires_grad=True)
    >>> out = torch.sqrt((x * x).sum())          # a square's sum is finite and non-negative
    >>> root, total = out.grad_fn, out.grad_fn.next_functions[0][0]
    >>> square = total.next_functions[0][0]
    >>> sites([root, total, square], [((1, 0),), ((2, 0),), ((-1, 0), (-1, 0))])
    {0: None}
    """
    structure = key(members, edges)
    plan = _plans.get(structure)
    if plan is None:
        if len(_plans) >= _KEPT:
            _plans.clear()
        plan = _plans[structure] = _decide([s[0] for s in structure], [s[2] for s in structure], edges)
    return dict(plan)


def _order(edges: Edges) -> list[int]:
    """The member indices with every node after the nodes it leads to (its inputs)."""
    order: list[int] = []
    state = [False] * len(edges)
    for root in range(len(edges)):
        stack: list[tuple[int, bool]] = [(root, False)]
        while stack:
            i, done = stack.pop()
            if done:
                order.append(i)
                continue
            if state[i]:
                continue
            state[i] = True
            stack.append((i, True))
            stack.extend((e[0], False) for e in edges[i] if e is not None and e[0] >= 0 and not state[e[0]])
    return order


def _kind(cls: type, fact: Any) -> str:
    """``passes`` (a linear op or a select), ``product``, ``root``, or ``other``."""
    name = cls.__name__
    if name == "DivBackward0":
        return "passes" if fact else "other"
    if name == "PowBackward0":
        if fact is not None and fact >= 1 and fact == int(fact):
            return "product"  # grad * n * x ** (n - 1): finite where x is
        return "root" if fact is not None and 0 < fact < 1 else "other"
    if name in _PRODUCTS:
        return "product"
    if name in _ROOTS:
        return "root"
    if fact is not None:
        return "passes" if fact else "other"
    return "passes" if zero_passing.passes_zeros_class(cls) else "other"


def _decide(classes: list[type], facts: list[Any], edges: Edges) -> tuple[tuple[int, tuple[int, ...] | None], ...]:
    finite = [False] * len(classes)
    nonnegative = [False] * len(classes)

    def is_finite(e: Edge) -> bool:
        return e is None or e[0] < 0 or finite[e[0]]

    def is_nonnegative(e: Edge) -> bool:
        return e is not None and e[0] >= 0 and nonnegative[e[0]]

    found: list[tuple[int, tuple[int, ...] | None]] = []
    for i in _order(edges):
        cls, fact, inputs = classes[i], facts[i], edges[i]
        name, kind = cls.__name__, _kind(classes[i], facts[i])
        if kind == "passes" or (kind == "product" and name not in _OVERFLOWING):
            finite[i] = all(is_finite(e) for e in inputs)
        elif kind == "root":
            finite[i] = bool(inputs) and is_finite(inputs[0]) and is_nonnegative(inputs[0])
        if name == "MulBackward0":
            nonnegative[i] = len(inputs) == 2 and inputs[0] is not None and inputs[0] == inputs[1]
        elif name == "PowBackward0":
            nonnegative[i] = fact is not None and fact == int(fact) and int(fact) % 2 == 0
        else:
            nonnegative[i] = name in _NONNEGATIVE or (
                name in _KEEPS_SIGN and bool(inputs) and all(is_nonnegative(e) for e in inputs))
        if kind == "passes":
            continue
        if kind != "product":
            found.append((i, None))
            continue
        uses = _PRODUCTS.get(name, (("self",),))
        zeroed = tuple(j for j, names in enumerate(uses[:len(inputs)])
                       if not all(finite[i] if n == "result" else is_finite(inputs[_INPUT[n]])
                                  for n in names))
        if zeroed:
            found.append((i, zeroed))
    return tuple(sorted(found))

"""Where a NaN-safe group needs its zeroing, decided from the graph's structure alone: which values
of the group's forward can be non-finite, and so which nodes' backward can meet a ``0 · ∞``.

No value is read (no host sync, on any device): only node classes, their edges and the numbers
autograd keeps on a node (``x / 6``'s divisor, ``x ** 2``'s exponent, ``add``'s ``alpha``), which
live on the host. What it assumes (documentation: "Groups and rules", "Where the hooks go"):

- the group's inputs are finite, and so are the tensors and numbers its linear ops and selects use
  that need no gradient (masks, a ``where``'s or ``masked_fill``'s fill value, stacked zeros). A
  product's factor that needs no gradient is not assumed finite (a value made inside the group
  without autograd, ``log`` of an input that needs none, can be ``-inf``): the product is hooked,
  and on the CPU its values are read;
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
from collections.abc import Callable, Sequence
from typing import Any

import torch

from . import compat, zero_passing
from .claims import CLAIM
from .sites import saved

#: One edge of a member node: the index of the node it leads to (a member's, or below 0 a node
#: outside the instance: a group input) and which of that node's outputs; None where the input
#: needs no gradient (a constant).
Edge = tuple[int, int] | None
#: Per member: its edges, in ``next_functions`` order.
Edges = Sequence[tuple[Edge, ...]]
#: Per hooked member: the indices of the gradients to zero, or None for all of them.
Sites = dict[int, tuple[int, ...] | None]
#: A structure's sites as its plan keeps them: (member, gradients to zero) pairs, by member.
Found = tuple[tuple[int, tuple[int, ...] | None], ...]

#: Which input a saved value is; ``result`` is the node's own output.
_INPUT = {"self": 0, "other": 1, "mat2": 1}
#: Products whose result can be infinite for finite inputs of ordinary size.
_OVERFLOWING = frozenset({"ExpBackward0"})
#: Ops whose result is non-negative (or NaN) whatever their input.
_NONNEGATIVE = frozenset({"AbsBackward0", "ExpBackward0", "SqrtBackward0", "ReluBackward0",
                          "SigmoidBackward0"})
#: Ops whose result is non-negative where all their inputs are: sums, means, views, joins.
_KEEPS_SIGN = frozenset({
    "SumBackward0", "SumBackward1", "MeanBackward0", "MeanBackward1", "ViewBackward0",
    "UnsafeViewBackward0", "ExpandBackward0", "UnsqueezeBackward0", "SqueezeBackward0", "SqueezeBackward1",
    "SqueezeBackward2", "CloneBackward0", "PermuteBackward0", "TransposeBackward0", "SelectBackward0",
    "SliceBackward0", "CatBackward0", "StackBackward0"})
#: Roots whose result is finite where their input is finite and non-negative.
_ROOTS = frozenset({"SqrtBackward0"})
#: The class of an override group's node (groups/override.py).
_OVERRIDE = "_OverrideFunctionBackward"
#: The class of a torch.compile'd graph's node.
_COMPILED = "CompiledFunctionBackward"
#: Built-in groups whose override node passes zeros on and keeps finite inputs finite, whichever
#: backward runs: ``ops.atan2``'s replacement is ``grad * (x, -y) / (x² + y²)``, 0 at the origin,
#: and its own chain runs only where ``x`` is far from 0 (``near_the_y_axis``); its result is an
#: angle.
_PASSING_OVERRIDES = frozenset({"ops.atan2"})

_plans: dict[tuple[Any, ...], Plan] = {}
#: The most structures kept: a program makes few, but one that builds graphs of changing shape
#: must not grow the cache without bound.
_KEPT = 1024


def _exponent(node: Any) -> float | None:
    value = compat.saved_value(node, "exponent", None)
    return float(value) if isinstance(value, (int, float)) else None


def _divides_safely(node: Any) -> bool:
    """Whether a ``div`` node divides by a nonzero, finite number (``x / 6``: autograd keeps the
    Python number as a 0-dim tensor on the host, so reading it syncs no device): its backward is
    then ``grad / other``. Not where the divisor needs a gradient: its own, ``-grad * self / other
    / other``, can overflow; nor where the forward may not read saved values (``saved.readable``:
    a compiler or a ``torch.func`` transform tracing it, saved-tensor hooks): the node is then
    hooked."""
    if node.next_functions[1][0] is not None or not saved.readable():
        # A compiler's tensors are fake, and saved-tensor hooks would unpack (checkpoint: recompute).
        return False
    value = compat.saved_value(node, "other")
    # A Python number divisor is saved as a 0-dim CPU tensor beside tensors on any device: reading
    # it makes no device wait, so it is read with host reads off too (what a GPU runs).
    return (type(value) is torch.Tensor and value.dim() == 0 and value.is_cpu
            and 0 < abs(value.item()) < math.inf)


def _cured(node: Any) -> bool:
    claim = node.metadata.get(CLAIM)
    return claim is not None and claim.cured


def _override_group(node: Any) -> str | None:
    run = getattr(node, "run", None)
    return getattr(getattr(run, "instance", None), "name", None)


Reader = Callable[[Any], Any]
#: Per node class, what :func:`reader` gives.
READERS: dict[type, Reader | None] = {}
#: Not in :data:`READERS` yet.
UNKNOWN: Any = object()


def _reader_of(cls: type) -> Reader | None:
    name = cls.__name__
    if name == "DivBackward0":
        return _divides_safely
    if name == "PowBackward0":
        return _exponent
    if name in _ROOTS:
        return _cured
    if name == _OVERRIDE:
        return _override_group
    return zero_passing.passes_zeros if zero_passing.reads_scalars(cls) else None


def reader(cls: type) -> Reader | None:
    """What reads, of a node of class ``cls``, what the decision depends on beyond its class and
    edges (part of the cache key): its numbers (``x / 6``'s divisor, ``x ** 2``'s exponent,
    ``add``'s ``alpha``), whether a nested group's rule cures a root, which group an override node
    runs. None for the classes that have nothing to read."""
    if cls not in READERS:
        READERS[cls] = _reader_of(cls)
    return READERS[cls]


def tokens_of(roots: Sequence[Any]) -> list[Any]:
    """The structure of the graph behind ``roots`` (every node a member), as an instance's walk
    writes it down: for the tests and the docs.

    Walking depth first from the roots, pushing each node's ``next_functions`` in reverse, one
    token per entry popped: None for an input that needs no gradient, ``(index, nr)`` for a node
    seen before (its member index, or below 0 one outside the instance) and ``(class, fact,
    inputs, nr)`` for a new member, ``fact`` what :func:`reader` reads of it.
    """
    tokens: list[Any] = []
    index: dict[int, int] = {}
    held: list[Any] = []  # a node's id holds only while it lives (torch 2.11 keeps none alive)
    stack: list[tuple[Any, int]] = [(root, 0) for root in reversed(roots)]
    while stack:
        node, nr = stack.pop()
        if node is None:
            tokens.append(None)
        elif id(node) in index:
            tokens.append((index[id(node)], nr))
        elif not node.next_functions and type(node).__name__ == "AccumulateGrad":
            held.append(node)
            index[id(node)] = -1 - sum(1 for i in index.values() if i < 0)
            tokens.append((index[id(node)], nr))
        else:
            held.append(node)
            index[id(node)] = sum(1 for i in index.values() if i >= 0)
            read = reader(type(node))
            tokens.append((type(node), None if read is None else read(node), len(node.next_functions), nr))
            stack.extend(reversed(node.next_functions))
    return tokens


class Plan:
    """What the NaN-safe rule needs on one structure: its :data:`Sites`, whether a node of it is a
    torch.compile'd graph (which no rule can reach, lifecycle.py refuses it), and how the CPU's value
    read (:func:`~autograd_groups.zero_passing.passing_now`) has fared on it.

    A read that finds a non-finite value spares no hook and costs its pass for nothing; on a
    structure where that keeps happening (an entropy's ``log p`` at its exact zeros is ``-inf`` at
    every call) the read is skipped for the next 1, 3, 7, ... 63 calls after each miss in a row, and
    tried again after them. Skipping it only leaves hooks in place, which give the same gradients.

    >>> plan = Plan(((0, None),), compiled=False)
    >>> plan.worth_reading(), plan.read(spared=False), plan.worth_reading(), plan.worth_reading()
    (True, None, False, True)
    """

    __slots__ = ("sites", "compiled", "_misses", "_skip")

    #: The most misses in a row counted: a structure is read again at least every 64 calls.
    MISSES = 6

    def __init__(self, sites: Found, compiled: bool) -> None:
        self.sites: Found = sites
        self.compiled: bool = compiled
        self._misses = 0
        self._skip = 0

    def worth_reading(self) -> bool:
        """Whether this call should read the values (a call skipped counts towards the next read)."""
        if self._skip:
            self._skip -= 1  # a race between threads only moves the next read by a call
            return False
        return True

    def read(self, spared: bool) -> None:
        """What a read found: whether it spared the hooks of the products it read."""
        self._misses = 0 if spared else min(self._misses + 1, self.MISSES)
        self._skip = 2 ** self._misses - 1


def plan(tokens: Sequence[Any], roots: int) -> Plan:
    """The :class:`Plan` of the structure an instance's walk wrote down (:func:`tokens_of`) from its
    ``roots`` output nodes, decided once per structure."""
    structure = (roots, *tokens)
    found = _plans.get(structure)
    if found is None:
        if len(_plans) >= _KEPT:
            _plans.clear()
        classes, facts, edges = _decode(tokens, roots)
        compiled = any(cls.__name__ == _COMPILED for cls in classes)
        found = _plans[structure] = Plan(_decide(classes, facts, edges), compiled)
    return found


def sites(tokens: Sequence[Any], roots: int) -> Sites:
    """The members (by index) that need NaN-safe zeroing, and which of their gradients, from the
    structure an instance's walk wrote down (:func:`tokens_of`) from its ``roots`` output nodes.

    >>> import torch
    >>> x = torch.ones(3, requires_grad=True)
    >>> out = torch.sqrt((x * x).sum())          # a square's sum is finite and non-negative
    >>> sites(tokens_of([out.grad_fn]), 1)       # only the root, for its derivative at 0
    {0: None}
    """
    return dict(plan(tokens, roots).sites)


def _decode(tokens: Sequence[Any], roots: int) -> tuple[list[type], list[Any], list[tuple[Edge, ...]]]:
    """Each member's class, fact and edges, replaying the walk that wrote ``tokens``."""
    classes: list[type] = []
    facts: list[Any] = []
    edges: list[list[Edge]] = []
    slots: list[tuple[int, int]] = [(-1, 0)] * roots  # (member, input) each popped entry fills
    for token in tokens:
        parent, position = slots.pop()
        edge: Edge
        if token is None:
            edge = None
        elif len(token) == 2:
            edge = token
        else:
            cls, fact, inputs, nr = token
            edge = (len(classes), nr)
            classes.append(cls)
            facts.append(fact)
            edges.append([None] * inputs)
            slots.extend((edge[0], k) for k in reversed(range(inputs)))
        if parent >= 0:
            edges[parent][position] = edge
    return classes, facts, [tuple(e) for e in edges]


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
    if name in zero_passing.MULTIPLIERS:
        return "product"
    if name in _ROOTS:
        return "root"
    if name == _OVERRIDE:
        return "passes" if fact in _PASSING_OVERRIDES else "other"
    if fact is not None:
        return "passes" if fact else "other"
    return "passes" if zero_passing.passes_zeros_class(cls) else "other"


def _decide(classes: list[type], facts: list[Any], edges: Edges) -> Found:
    finite = [False] * len(classes)
    nonnegative = [False] * len(classes)

    def is_finite(e: Edge) -> bool:
        return e is None or e[0] < 0 or finite[e[0]]

    def is_finite_factor(e: Edge) -> bool:
        # A factor that needs no gradient has no node to tell what made it: a constant, or a value
        # made inside the group without autograd (``log`` of an input that needs none, which is
        # -inf at 0). Not assumed: the product is hooked, and on the CPU its values are read.
        return e is not None and (e[0] < 0 or finite[e[0]])

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
        if kind == "passes" or (kind == "root" and fact is True and finite[i]):
            continue  # a root whose nested group's rule sets its gradient where its input is 0
        if kind != "product":
            found.append((i, None))
            continue
        uses = zero_passing.MULTIPLIERS.get(name, (("self",),))
        unsafe = {n for names in uses for n in names if not (
            finite[i] if n == "result" else _INPUT[n] >= len(inputs) or is_finite_factor(inputs[_INPUT[n]]))}
        zeroed = tuple(j for j, names in enumerate(uses[:len(inputs)])
                       if inputs[j] is not None and unsafe.intersection(names))
        if zeroed:
            found.append((i, zeroed))
    return tuple(sorted(found))

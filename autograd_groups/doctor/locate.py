"""Where a non-finite value is born: the first node whose inputs were all finite and whose output is
not (``inf`` counted as well as NaN), in the forward and in the backward of the bad step.

A forward value that a ``where`` or a mask discards is no finding by itself: a forward birth counts
only where its value reaches the loss, and in the backward only the gradients matter.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from .. import compat, nodes
from .calls import Call
from .frames import Frame
from .instruments import Ran, memory_of
from .provenance import Provenance
from .tensors import dense, plain, stored

#: How many indices and values a report shows.
SHOWN = 5


@dataclass
class Born:
    """Where a non-finite value was born (the report's ``born``)."""

    phase: str
    node: str | None
    op: str
    file: str | None
    line: int | None
    function: str | None
    elements: int
    indices: list[list[int]]
    values: dict[str, Any]
    incoming: str | None
    order: int = 1
    total: int = 0
    #: Where on the line the call that made it is (first and last column), where Python says.
    columns: tuple[int, int] | None = None

    def to_json(self) -> dict[str, Any]:
        return {"phase": self.phase, "node": self.node, "op": self.op, "file": self.file,
                "line": self.line, "function": self.function, "elements": self.elements,
                "indices": self.indices, "values": self.values, "incoming": self.incoming,
                "order": self.order, "total": self.total}


@dataclass
class Entered:
    """A non-finite value the step did not make: in a parameter (a leaf that requires grad) or in
    the data."""

    name: str
    parameter: bool
    tensor: torch.Tensor
    call: Call


@dataclass
class ForwardFinding:
    """What the forward of the bad step made: births in order, which one reached the loss, and
    what entered from outside."""

    births: list[tuple[Call, torch.Tensor]] = field(default_factory=list)
    reached: tuple[Call, torch.Tensor] | None = None
    entered: list[Entered] = field(default_factory=list)


def _flags(tensors: Sequence[torch.Tensor]) -> tuple[list[bool], list[bool]]:
    """Per tensor, whether it is all finite and whether it holds a NaN: one host read."""
    if not tensors:
        return [], []
    values = [stored(t) for t in tensors]  # a sparse gradient's values: isfinite has no sparse kernel
    both = torch.stack([torch.stack([torch.isfinite(v).all(), torch.isnan(v).any()]).cpu()
                        for v in values]).tolist()
    return [bool(a) for a, _ in both], [bool(b) for _, b in both]


def forward(calls: Sequence[Call], roots: Sequence[torch.Tensor], data: Provenance) -> ForwardFinding:
    """Follow non-finite values through the forward's torch calls (inputs made before the step count
    as from outside) to the births and to what reached the loss ``roots``. A call is a birth where
    it makes a non-finite value from inputs that were finite or held only a meant infinity (an
    additive ``-inf`` mask, which needs no gradient). ``data``: where the step's data came from; a
    non-finite input that a call of the watched run computed of finite data is born there, and one
    detached from what the step made carries that birth: neither entered."""
    tensors: list[torch.Tensor] = []
    for call in calls:
        if call.finite_now is None:
            tensors.extend(call.inputs)
            tensors.extend(call.outputs)
    finite_of, _ = _flags(tensors)
    read = iter(finite_of)
    found = ForwardFinding()
    made: dict[int, int | None] = {}  # id of a tensor the step made -> the birth it carries
    entered: dict[int, int] = {}
    held: list[torch.Tensor] = []  # ids stay unique while the tensors live
    for call in calls:
        flags = call.finite_now or [next(read) for _ in range(len(call.inputs) + len(call.outputs))]
        ins, outs = flags[:len(call.inputs)], flags[len(call.inputs):]
        carried: int | None = None
        inherited = False  # a non-finite input made by the step or entering it (not a meant -inf)
        for tensor, finite in zip(call.inputs, ins):
            if finite:
                continue
            if id(tensor) in made:
                inherited = True
                carried = carried if carried is not None else made[id(tensor)]
            elif _counts_as_entering(tensor, call.op):
                inherited = True
                origin = data.origin(tensor)
                if isinstance(origin, tuple):
                    made[id(tensor)] = len(found.births)
                    found.births.append(origin)
                    carried = carried if carried is not None else made[id(tensor)]
                    continue
                if origin is not None and made.get(id(origin)) is not None:
                    carried = carried if carried is not None else made[id(origin)]
                    continue
                if id(tensor) not in entered:
                    entered[id(tensor)] = len(found.entered)
                    found.entered.append(Entered(_describe(tensor), tensor.requires_grad, tensor, call))
                    held.append(tensor)
                carried = carried if carried is not None else -1 - entered[id(tensor)]
        born_here = not inherited and not all(outs)
        for tensor, finite in zip(call.outputs, outs):
            if finite:
                made[id(tensor)] = None
                continue
            if born_here:
                made[id(tensor)] = len(found.births)
                found.births.append((call, tensor))
            else:
                made[id(tensor)] = carried
            held.append(tensor)
        held.extend(call.outputs)
    for root in roots:
        birth = made.get(id(plain(root)))
        if birth is not None and birth >= 0 and found.reached is None:
            found.reached = found.births[birth]
    return found


#: Ops that multiply their inputs (a layer's data), subtractions (a label taken from a prediction:
#: a mask is added) and losses (their targets): an infinity entering one is data gone bad.
_TAKING_DATA = frozenset({
    "linear", "bilinear", "matmul", "mm", "bmm", "mv", "einsum", "mul", "rmul", "imul", "multiply",
    "sub", "rsub", "isub", "subtract",
    "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d",
    "layer_norm", "batch_norm", "group_norm", "instance_norm",
    "mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "cross_entropy", "nll_loss", "kl_div",
    "binary_cross_entropy", "binary_cross_entropy_with_logits", "poisson_nll_loss", "gaussian_nll_loss"})


def _counts_as_entering(tensor: torch.Tensor, op: str) -> bool:
    """A non-finite tensor from outside the step: a parameter with any; data with a NaN or a
    ``+inf``, or with a ``-inf`` that a layer multiplies, a subtraction takes or a loss takes as its
    target (``op``, ``__mul__`` as ``mul``). Elsewhere a ``-inf`` in a tensor that needs no
    gradient is taken as meant (an additive mask)."""
    return (tensor.requires_grad or op.strip("_") in _TAKING_DATA or bool(torch.isnan(tensor).any())
            or bool((tensor == math.inf).any()))


def _describe(tensor: torch.Tensor) -> str:
    kind = "parameter" if tensor.requires_grad else "input"
    return f"{kind} of shape {tuple(tensor.shape)}"


def born_forward(call: Call, tensor: torch.Tensor) -> Born:
    """The report of a forward birth: the call, its line, the elements and the inputs there (not
    an in-place call's input, which holds its output by now)."""
    bad = ~torch.isfinite(tensor)
    values: dict[str, Any] = {}
    output = memory_of(tensor)
    for i, value in enumerate(call.inputs):
        if output is not None and memory_of(value) == output:
            continue
        try:
            there = torch.broadcast_to(value, tensor.shape)[bad]
        except RuntimeError:
            continue
        values[f"input{i}"] = _shown(there)
    node = tensor.grad_fn
    return _born("forward", None if node is None else type(node).__name__, call.op, call.frame, bad, values,
                 None)


def overflowed(call: Call, tensor: torch.Tensor) -> bool:
    """Whether a forward birth looks like an overflow: infinities (not NaN) where no input is 0 or
    non-finite, rather than a pole (``log(0)``, ``1 / 0``, ``x / 0``), an undefined value (``sqrt(-1)``) or
    an infinity the step was given (a ``-inf`` fill, an infinite target). An in-place call's input
    holds its output by now: with nothing else to judge by, it is no overflow."""
    bad = ~torch.isfinite(tensor)
    if call.given_nonfinite or call.by_zero or bool(torch.isnan(tensor[bad]).any()):
        return False
    output = memory_of(tensor)
    others = [value for value in call.inputs if output is None or memory_of(value) != output]
    for value in others:
        try:
            there = torch.broadcast_to(value, tensor.shape)[bad]
        except RuntimeError:  # a reduction (a mean whose sum overflows): no element to compare
            continue
        if bool((there == 0).any()) or not bool(torch.isfinite(there).all()):
            return False
    return bool(others)


@dataclass
class BackwardFinding:
    """What the backward of the bad step made: the birth, and where a NaN first shows (the node
    anomaly mode names)."""

    born: Ran | None = None
    appears: Ran | None = None


def backward(ran: Sequence[Ran]) -> BackwardFinding:
    """The first node that received finite gradients and passed on a non-finite one, and the first
    node that passed on a NaN."""
    tensors: list[torch.Tensor] = []
    for r in ran:
        tensors.extend(plain(g) for g in (*r.grad_outputs, *r.grad_inputs) if g is not None)
    finite_of, nan_of = _flags(tensors)
    position = 0
    found = BackwardFinding()
    for r in ran:
        outs = sum(g is not None for g in r.grad_outputs)
        ins = sum(g is not None for g in r.grad_inputs)
        received = finite_of[position:position + outs]
        passed = finite_of[position + outs:position + outs + ins]
        nan = nan_of[position + outs:position + outs + ins]
        position += outs + ins
        if found.born is None and all(received) and not all(passed):
            found.born = r
        if found.appears is None and any(nan):
            found.appears = r
    return found


def born_backward(r: Ran, frames: dict[Any, Frame]) -> Born:
    """The report of a backward birth: the node, the user's line that made it (for a node made by a
    double backward, the first-order node's), the elements, the saved values and the gradient that
    arrived there."""
    bad = born_mask(r)
    node, order = r.node, 1
    frame = frames.get(node)
    while frame is None:
        parent = compat.formula_parent(node)
        if parent is None:
            break
        node, order = parent, order + 1
        frame = frames.get(node)
    values: dict[str, Any] = {name: _shown(_at(value, bad)) for name, value in r.saved.items()
                              if _at(value, bad) is not None}
    values.update({name: _signed(value) for name, value in r.saved.items()
                   if isinstance(value, (int, float, bool))})
    return _born("backward", type(r.node).__name__, nodes.node_op(node), frame, bad, values,
                 incoming(r, bad), order)


def _signed(value: int | float | bool) -> int | float | bool:
    """A saved int as the op took it: some nodes give a negative ``dim`` as an unsigned 64-bit int.

    >>> _signed(2 ** 64 - 1), _signed(3), _signed(0.5)
    (-1, 3, 0.5)
    """
    return value - 2 ** 64 if type(value) is int and value >= 2 ** 63 else value


def _at(value: Any, bad: torch.Tensor) -> torch.Tensor | None:
    if not isinstance(value, torch.Tensor):
        return None
    try:
        return torch.broadcast_to(value, bad.shape)[bad]
    except RuntimeError:
        return None


def incoming(r: Ran, bad: torch.Tensor) -> str | None:
    """Whether the gradient that arrived at the node is 0 at the born elements: "zero", "nonzero",
    or None where the node mixes elements and some of what arrived is not 0."""
    arrived = [plain(g) for g in r.grad_outputs if g is not None]
    if not arrived:
        return None
    there = [_at(g, bad) for g in arrived]
    if all(t is not None for t in there):
        return "zero" if all(bool((t == 0).all()) for t in there if t is not None) else "nonzero"
    return "zero" if all(bool((g == 0).all()) for g in arrived) else None


def _shown(values: torch.Tensor | None) -> list[float]:
    if values is None:
        return []
    return [float(v) if math.isfinite(float(v)) else _spelled(float(v)) for v in values[:SHOWN].tolist()]


def _spelled(value: float) -> Any:
    # JSON has no inf or NaN: say them as strings.
    return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")


def _born(phase: str, node: str | None, op: str, frame: Frame | None, bad: torch.Tensor,
          values: dict[str, Any], came: str | None, order: int = 1) -> Born:
    indices = [list(map(int, i)) for i in bad.nonzero()[:SHOWN].tolist()]
    return Born(phase, node, op, None if frame is None else frame.file, None if frame is None else frame.line,
                None if frame is None else frame.function, int(bad.sum()), indices, values, came, order,
                bad.numel(), None if frame is None else frame.columns())


def born_mask(r: Ran) -> torch.Tensor:
    """Where the first non-finite gradient a node passed on is not finite."""
    grads = [dense(plain(g)) for g in r.grad_inputs if g is not None]
    return ~torch.isfinite(next(g for g in grads if not bool(torch.isfinite(g).all())))


def saved_tensors(r: Ran) -> list[torch.Tensor]:
    """The tensors a node saved."""
    return [v for v in r.saved.values() if isinstance(v, torch.Tensor)]


def born_entered(entered: Entered) -> Born:
    """The report of a value that entered the step non-finite: the first call that used it."""
    tensor = plain(entered.tensor)
    bad = ~torch.isfinite(tensor)
    return _born("forward", None, entered.call.op, entered.call.frame, bad,
                 {entered.name: _shown(tensor[bad])}, None)

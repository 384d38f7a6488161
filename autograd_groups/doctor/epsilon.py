"""The fix people reach for first, an epsilon (``sqrt(x + 1e-12)``) or a clamp, shown only as not
recommended, with what it does: the bad step replayed with it, and the slope it gives near the point
against the op's own, measured at a value of :data:`NEAR` for each of :data:`EPSILONS`.

An epsilon makes the gradient finite at the point by moving the function everywhere: near the
point it is wrong by orders of magnitude, and a clamp's slope is 0 below its bound.
"""

from __future__ import annotations

import ast
from collections.abc import Callable

import torch

from .edits import Edit, Source, is_module

#: The epsilons people write, smallest first.
EPSILONS = (1e-12, 1e-8)
#: Near the point: the size of sqrt's result, log's argument, or a division's denominator there.
NEAR = 1e-7

#: Per op: the argument at which its result, or the value that matters, is NEAR.
_AT = {"sqrt": NEAR ** 2, "log": NEAR, "div": NEAR}
#: Per op: the function of the argument the epsilon goes into (a division's of its denominator).
OPS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "sqrt": torch.sqrt, "log": torch.log, "div": torch.reciprocal}


def edit(source: Source, line: int, op: str, columns: tuple[int, int] | None) -> tuple[Edit, str] | None:
    """``source`` with :data:`EPSILONS`' first added to the argument of the ``op`` on ``line`` (a
    division's denominator) that made the value (at ``columns``, where known), and the sum
    written; None where the line has no such op."""
    for node in source.calls_on(line, columns):
        argument = _argument(node, op)
        if argument is None:
            continue
        changed = Edit(source)
        text = f"{source.segment(argument)} + {EPSILONS[0]:g}"
        # Where the argument is a receiver (x.sqrt()) or a denominator, the sum needs parentheses.
        bare = isinstance(node, ast.Call) and argument in node.args
        changed.replace(argument, text if bare else f"({text})")
        return changed, text
    return None


def _argument(node: ast.expr, op: str) -> ast.expr | None:
    """The operand of ``op`` at ``node``: ``torch.op(x)`` or ``x.op()``'s x, or ``a / b``'s b."""
    if op == "div":
        return node.right if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div) else None
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute) or node.func.attr != op:
        return None
    base = node.func.value
    if is_module(base):
        return node.args[0] if len(node.args) == 1 and not node.keywords else None
    return None if node.args or node.keywords else base


def near_the_point(op: str) -> str:
    r"""What each epsilon, and a clamp at the first, does to ``op``'s slope near the point, measured
    in float64 against the op's own slope there.

    >>> print(near_the_point("sqrt").replace(", with", ",\nwith").replace("; ", ";\n"))
    where sqrt's result is 1e-07, its slope with an epsilon of 1e-12 is 10× too small,
    with 1e-08 is 1,000× too small;
    with a clamp_min(1e-12) it is 0 below 1e-12
    """
    fn, at = OPS[op], _AT[op]
    exact = _slope(fn, at, 0.0)
    said = ", with ".join(f"{eps:g} is {_off(_slope(fn, at, eps) / exact)}" for eps in EPSILONS)
    where = {"sqrt": "sqrt's result", "log": "log's argument", "div": "the denominator"}[op]
    clamped = _slope(lambda v: fn(v.clamp_min(EPSILONS[0])), EPSILONS[0] / 100, 0.0)
    return (f"where {where} is {NEAR:g}, its slope with an epsilon of {said}; with a "
            f"clamp_min({EPSILONS[0]:g}) it is {clamped:g} below {EPSILONS[0]:g}")


def _off(ratio: float) -> str:
    """How far a slope ``ratio`` times the true one is from it."""
    if ratio < 0.5:
        factor = 1 / ratio
        return f"{factor:,.0f}× too small" if factor >= 10 else f"{factor:.2g}× too small"
    return f"{100 * (1 - ratio):.2g}% too small"


def _slope(fn: Callable[[torch.Tensor], torch.Tensor], at: float, eps: float) -> float:
    v = torch.tensor(at, dtype=torch.float64, requires_grad=True)
    (grad,) = torch.autograd.grad(fn(v + eps), v)
    return float(grad)

"""Whether a subgradient's ``grad`` is linear in ``grad``, the one condition under which the rule
has a forward-mode counterpart (its transpose; see :mod:`autograd_groups.sites.tangents`).

Read from the expression's syntax, so that the answer is known at registration and costs nothing
at backward: ``0``, ``grad``, ``-grad``, ``grad * e``, ``e * grad``, ``grad / e``, sums of those, and
``where(c, a, b)`` of those, where ``e`` and ``c`` do not read ``grad``. (A non-zero constant, which
would set the gradient whatever flows in, is refused when a rule is made.)
"""

from __future__ import annotations

import ast
from enum import Enum


class _Kind(Enum):
    ZERO = "zero"      # the constant 0
    FREE = "free"      # does not read grad
    LINEAR = "linear"  # linear in grad
    OTHER = "other"


_ZERO, _FREE, _LINEAR, _OTHER = _Kind.ZERO, _Kind.FREE, _Kind.LINEAR, _Kind.OTHER
_SCALING = {_ZERO, _LINEAR}


def is_linear(source: str) -> bool:
    """Whether the ``grad`` expression ``source`` (already valid, see ``rules.expr``) is linear in
    ``grad``.

    >>> is_linear("grad * sign(self)"), is_linear("grad + 1"), is_linear("0")
    (True, False, True)
    """
    return _kind(ast.parse(source.strip(), mode="eval").body) in _SCALING


def _kind(root: ast.AST) -> _Kind:
    # Post-order over an explicit stack: each node's kind from its children's kinds.
    kinds: dict[int, _Kind] = {}
    stack: list[tuple[ast.AST, bool]] = [(root, False)]
    while stack:
        node, ready = stack.pop()
        children = _children(node)
        if not ready and children:
            stack.append((node, True))
            stack.extend((c, False) for c in children)
            continue
        kinds[id(node)] = _combine(node, [kinds[id(c)] for c in children])
    return kinds[id(root)]


def _children(node: ast.AST) -> list[ast.AST]:
    if isinstance(node, ast.BinOp):
        return [node.left, node.right]
    if isinstance(node, ast.UnaryOp):
        return [node.operand]
    if isinstance(node, ast.Compare):
        return [node.left, *node.comparators]
    if isinstance(node, ast.Call):
        return list(node.args)
    return []


def _combine(node: ast.AST, kids: list[_Kind]) -> _Kind:
    if isinstance(node, ast.Constant):
        return _ZERO if node.value == 0 and not isinstance(node.value, bool) else _FREE
    if isinstance(node, ast.Name):
        return _LINEAR if node.id == "grad" else _FREE
    if (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult) and _ZERO in kids) or (
            isinstance(node, ast.Call) and _zeros(node)):
        return _ZERO
    if all(k is _FREE or k is _ZERO for k in kids):
        return _FREE if kids else _OTHER
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        return kids[0]
    if isinstance(node, ast.BinOp):
        left, right = kids
        if isinstance(node.op, ast.Mult):
            return _LINEAR if {left, right} == {_LINEAR, _FREE} else _OTHER
        if isinstance(node.op, ast.Div):
            return left if left in _SCALING and right is _FREE else _OTHER
        if isinstance(node.op, (ast.Add, ast.Sub)):
            return _LINEAR if left in _SCALING and right in _SCALING else _OTHER
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "where" \
            and len(kids) == 3 and kids[0] is _FREE and kids[1] in _SCALING and kids[2] in _SCALING:
        return _LINEAR
    return _OTHER


def _zeros(node: ast.Call) -> bool:
    return isinstance(node.func, ast.Name) and node.func.id == "zeros_like"

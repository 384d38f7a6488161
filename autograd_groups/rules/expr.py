"""The small expression language of ``when`` and ``grad``, parsed without ``eval``.

An expression is parsed with :mod:`ast` and every node is checked against a whitelist, then turned
into nested Python closures once; evaluating it at backward time runs only those closures. Names are
the op's saved values (as in ``derivatives.yaml``) and ``grad``; the functions are :data:`FUNCTIONS`.
"""

from __future__ import annotations

import ast
import math
import operator
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from ..errors import ExpressionError

MAX_LENGTH = 2_000
MAX_DEPTH = 40

Env = Mapping[str, Any]
Evaluator = Callable[[Env], Any]


def _finfo_eps(x: torch.Tensor) -> float:
    return torch.finfo(x.dtype).eps


def _pow(base: Any, exponent: Any) -> Any:
    # Python ints have no size limit: `9**9**9**9` would run for hours; as floats it overflows at once.
    if isinstance(base, int) and isinstance(exponent, int):
        return float(base) ** float(exponent)
    return base ** exponent


#: The functions an expression may call, each a thin alias of the torch function of that name.
FUNCTIONS: dict[str, Callable[..., Any]] = {
    "abs": torch.abs,
    "sign": torch.sign,
    "sqrt": torch.sqrt,
    "exp": torch.exp,
    "log": torch.log,
    "where": torch.where,
    "zeros_like": torch.zeros_like,
    "ones_like": torch.ones_like,
    "isfinite": torch.isfinite,
    "isnan": torch.isnan,
    "isinf": torch.isinf,
    "minimum": torch.minimum,
    "maximum": torch.maximum,
    "finfo_eps": _finfo_eps,
}

#: Named constants.
CONSTANTS: dict[str, float] = {"inf": math.inf, "nan": math.nan, "pi": math.pi}

_BINARY: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
    ast.Div: operator.truediv, ast.Pow: _pow,
    ast.BitAnd: operator.and_, ast.BitOr: operator.or_,
}
_COMPARE: dict[type, Callable[[Any, Any], Any]] = {
    ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt,
    ast.LtE: operator.le, ast.Gt: operator.gt, ast.GtE: operator.ge,
}
_UNARY: dict[type, Callable[[Any], Any]] = {
    ast.USub: operator.neg, ast.UAdd: operator.pos, ast.Invert: operator.invert,
}
_REFUSED = {
    ast.Attribute: "attribute access", ast.Subscript: "subscripts", ast.Lambda: "lambdas",
    ast.ListComp: "comprehensions", ast.SetComp: "comprehensions",
    ast.DictComp: "comprehensions", ast.GeneratorExp: "comprehensions",
    ast.BoolOp: "'and'/'or' (use & and |)", ast.IfExp: "'x if c else y' (use where(c, x, y))",
    ast.NamedExpr: "assignment", ast.Starred: "starred arguments",
}


@dataclass(frozen=True)
class Expression:
    """A parsed expression: its source, the names it reads, and its evaluator."""

    source: str
    names: frozenset[str]
    evaluate: Evaluator

    def __call__(self, env: Env) -> Any:
        return self.evaluate(env)


def parse(source: str | int | float | bool) -> Expression:
    """Parse an expression; raise :class:`ExpressionError` with the column of the first problem.

    >>> import torch
    >>> e = parse("where(result == 0, zeros_like(grad), grad)")
    >>> sorted(e.names)
    ['grad', 'result']
    >>> e({"result": torch.tensor([0.0, 2.0]), "grad": torch.tensor([5.0, 5.0])})
    tensor([0., 5.])
    """
    if isinstance(source, (bool, int, float)):
        value = source
        return Expression(repr(source), frozenset(), lambda env: value)
    if not isinstance(source, str):
        raise ExpressionError(f"an expression must be a string or a number, not {type(source).__name__}")
    if len(source) > MAX_LENGTH:
        raise ExpressionError(f"expression is {len(source)} characters long; the limit is {MAX_LENGTH}")
    if not source.strip():
        raise ExpressionError("expression is empty")
    try:
        with warnings.catch_warnings():
            # "1if x else y" only warns; as an error it is reported like any other syntax error.
            warnings.simplefilter("error")
            tree = ast.parse(source.strip(), mode="eval")
    except SyntaxError as e:
        raise ExpressionError(f"syntax error in expression {source!r}: {e.msg}", e.offset or 1) from None
    except (RecursionError, MemoryError, ValueError):
        raise ExpressionError(f"expression is nested too deeply (limit {MAX_DEPTH} levels)") from None
    names: set[str] = set()
    evaluate = _compile(tree.body, names, 0)
    return Expression(source, frozenset(names), evaluate)


def _fail(node: ast.AST, message: str) -> ExpressionError:
    return ExpressionError(message, getattr(node, "col_offset", 0) + 1)


def _compile(node: ast.AST, names: set[str], depth: int) -> Evaluator:
    if depth > MAX_DEPTH:
        raise _fail(node, f"expression is nested too deeply (limit {MAX_DEPTH} levels)")
    depth += 1
    if isinstance(node, ast.Constant):
        value = node.value
        if isinstance(value, (bool, int, float)):
            return lambda env: value
        raise _fail(node, f"only numbers and booleans are allowed as literals, not {value!r}")
    if isinstance(node, ast.Name):
        if node.id.startswith("_"):
            raise _fail(node, f"names starting with '_' are not allowed: {node.id!r}")
        if node.id in CONSTANTS:
            constant = CONSTANTS[node.id]
            return lambda env: constant
        if node.id in ("True", "False"):
            flag = node.id == "True"
            return lambda env: flag
        name = node.id
        names.add(name)
        return lambda env: env[name]
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        op2 = _BINARY[type(node.op)]
        left, right = _compile(node.left, names, depth), _compile(node.right, names, depth)
        return lambda env: op2(left(env), right(env))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        op1 = _UNARY[type(node.op)]
        operand = _compile(node.operand, names, depth)
        return lambda env: op1(operand(env))
    if isinstance(node, ast.Compare):
        if len(node.ops) != 1 or type(node.ops[0]) not in _COMPARE:
            raise _fail(node, "use one comparison (==, !=, <, <=, >, >=) at a time; "
                              "combine them with & and |")
        cmp = _COMPARE[type(node.ops[0])]
        left, right = _compile(node.left, names, depth), _compile(node.comparators[0], names, depth)
        return lambda env: cmp(left(env), right(env))
    if isinstance(node, ast.Call):
        if not isinstance(node.func, ast.Name) or node.func.id not in FUNCTIONS:
            called = node.func.id if isinstance(node.func, ast.Name) else ast.unparse(node.func)
            raise _fail(node, f"unknown function {called!r}; the functions are "
                              f"{', '.join(sorted(FUNCTIONS))}")
        if node.keywords:
            raise _fail(node, f"{node.func.id}() takes positional arguments only")
        fn = FUNCTIONS[node.func.id]
        args = [_compile(a, names, depth) for a in node.args]
        return lambda env: fn(*[a(env) for a in args])
    refused = next((what for kind, what in _REFUSED.items() if isinstance(node, kind)), None)
    raise _fail(node, f"{refused or type(node).__name__ + ' expressions'} not allowed in an expression")

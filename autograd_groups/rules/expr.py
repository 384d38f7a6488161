"""The small expression language of ``when`` and ``grad``, parsed without ``eval``.

An expression is parsed with :mod:`ast` and every node is checked against a whitelist, then turned
into nested Python closures once; evaluating it at backward time runs only those closures. Names are
the op's saved values (as in ``derivatives.yaml``) and ``grad``; the functions are :data:`FUNCTIONS`.

Two expressions that differ only in spelling have the same :attr:`Expression.key`: the operands of
``== != & | + *`` in either order (``&`` and ``|`` chains in any order), ``a > b`` and ``b < a``,
redundant parentheses, spacing, and ``0`` against ``0.0``. Rules are compared on that key.
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

from .. import compat
from ..errors import ExpressionError, internal_error

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
#: ``a op b`` is ``b mirrored(op) a``.
_MIRRORED: dict[Callable[[Any, Any], Any], Callable[[Any, Any], Any]] = {
    operator.eq: operator.eq, operator.ne: operator.ne, operator.lt: operator.gt,
    operator.le: operator.ge, operator.gt: operator.lt, operator.ge: operator.le,
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


#: What an expression gives, as far as its form tells: a condition, a number, or a bare value.
BOOL, NUMBER, VALUE = "a condition", "a number", "a saved value"
_COMMUTATIVE = (ast.Eq, ast.NotEq, ast.BitAnd, ast.BitOr, ast.Add, ast.Mult)
_FLIPPED: dict[type, type] = {ast.Gt: ast.Lt, ast.GtE: ast.LtE}
_CONDITIONS = {"isfinite", "isnan", "isinf"}


@dataclass(frozen=True)
class Expression:
    """A parsed expression: its source, the names it reads, its evaluator, its spelling-free
    ``key`` and its ``kind`` (:data:`BOOL`, :data:`NUMBER` or :data:`VALUE`)."""

    source: str
    names: frozenset[str]
    evaluate: Evaluator
    key: str
    kind: str
    tree: ast.AST | None = None  # None for a literal number or bool

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
    >>> parse("(0 == result)").key == parse("result==0.0").key
    True
    """
    if isinstance(source, (bool, int, float)):
        value = source
        key, kind = _literal(value)
        return Expression(repr(source), frozenset(), lambda env: value, key, kind)
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
    key, kind = _describe(tree.body)
    return Expression(source, frozenset(names), evaluate, key, kind, tree.body)


#: Saved values that are bool tensors in PyTorch (``where``'s ``condition``, ``masked_fill``'s
#: ``mask``): a ``when`` may be one of them alone.
BOOL_VALUES = frozenset({"condition", "mask"})


def condition_problem(expression: Expression) -> str | None:
    """What keeps ``expression`` from being an elementwise condition (a ``when``) that can hold
    somewhere, or None: a constant, a value that is not a condition, or a condition that no value
    satisfies -- a comparison with ``nan`` (NaN equals and orders against nothing), one that no
    number and no infinity satisfies (``x > inf``), or a conjunction of two different equalities of
    one value.

    >>> condition_problem(parse("result > 0")) is None
    True
    >>> print(condition_problem(parse("1")).split(":")[0])
    is the constant 1
    >>> print(condition_problem(parse("result == nan"))[:61])
    can never hold: it compares with nan ('result == nan'): NaN e
    """
    if not expression.names:
        return (f"is the constant {expression.source}: it reads none of the op's values, so it would "
                f"hold everywhere or nowhere; compare a saved value elementwise, as in 'result == 0' "
                f"(for a condition on the whole group, use an override rule)")
    if expression.kind != BOOL:
        return (f"must be an elementwise condition (a comparison such as 'result == 0', combined with "
                f"&, | and ~), not {expression.kind} ({expression.source!r})")
    never = None if expression.tree is None else _never(expression.tree)
    return f"can never hold: it {never}" if never else None


def constant_problem(expression: Expression) -> str | None:
    """Why ``expression``, as a subgradient's ``grad``, may not be the constant it is, or None: any
    constant but 0 passes its value on whatever gradient flows in.

    >>> constant_problem(parse("grad * 0.5")) is None
    True
    >>> print(constant_problem(parse(0.5)).split(":")[0])
    is the constant 0.5
    >>> print(constant_problem(parse("0 / 0")))
    is 0 / 0, which has no value (ZeroDivisionError): write the number it should be
    """
    if expression.names:
        return None
    try:
        value = expression.evaluate({})
    except ArithmeticError as e:
        return (f"is {expression.source}, which has no value ({type(e).__name__}): write the number it "
                f"should be")
    if value == 0:
        return None
    factor = expression.source if expression.tree is None or isinstance(expression.tree, ast.Constant) \
        else f"({expression.source})"
    return (f"is the constant {expression.source}: it would pass {expression.source} on whatever gradient "
            f"flows in (an element whose loss weight is 0 would still get it). For a local derivative "
            f"of {expression.source} there, write 'grad * {factor}'; for a group-level replacement of "
            f"the gradient, use an override rule (@ag.special_case); 0 (the default) is the constant "
            f"a rule may give")


def _number(node: ast.AST) -> float | None:
    """The value of a constant operand (``2``, ``-0.5``, ``inf``, ``-inf``, ``nan``), or None."""
    negate = isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub)
    inner = node.operand if isinstance(node, ast.UnaryOp) and negate else node
    if isinstance(inner, ast.Constant) and isinstance(inner.value, (int, float)) and not isinstance(
            inner.value, bool):
        value = float(inner.value)
    elif isinstance(inner, ast.Name) and inner.id in CONSTANTS:
        value = CONSTANTS[inner.id]
    else:
        return None
    return -value if negate else value


def _never(node: ast.AST) -> str | None:
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        reasons = [_never(n) for n in _operands(node, ast.BitOr)]
        return reasons[0] if all(reasons) else None
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitAnd):
        operands = _operands(node, ast.BitAnd)
        found = next((r for r in map(_never, operands) if r), None)
        if found:
            return found
        equal: dict[str, tuple[float, ast.AST]] = {}
        for operand in operands:
            pinned = _equality(operand)
            if pinned is None:
                continue
            name, value = pinned
            if name in equal and equal[name][0] != value:
                both = f"'{ast.unparse(equal[name][1])}' and '{ast.unparse(operand)}'"
                return (f"asks {both} at once: no value equals two numbers, so this is false "
                        f"everywhere; to accept either, join them with | instead of &")
            equal.setdefault(name, (value, operand))
        return None
    if not isinstance(node, ast.Compare) or len(node.ops) != 1:
        return None
    op, left, right = type(node.ops[0]), node.left, node.comparators[0]
    written = ast.unparse(node)
    for side, other in ((left, right), (right, left)):
        number = _number(side)
        if number is not None and math.isnan(number) and op is not ast.NotEq:
            return (f"compares with nan ({written!r}): NaN equals nothing and orders against nothing, "
                    f"so this is false everywhere; to find NaNs, write 'isnan({ast.unparse(other)})'")
    if op in _FLIPPED:
        op, left, right = _FLIPPED[op], right, left
    # Now op is ==, !=, < or <=: `left op right`.
    if op is not ast.Lt:
        return None
    if _number(right) == -math.inf:
        bound, what, other = "-inf", "below -inf", left
    elif _number(left) == math.inf:
        bound, what, other = "inf", "above inf", right
    else:
        return None
    shown = ast.unparse(other)
    return (f"compares with {bound} ({written!r}): no number and no infinity is {what}, so this is "
            f"false everywhere; to find infinities, write '{shown} == {bound}' or 'isinf({shown})'")


def _equality(node: ast.AST) -> tuple[str, float] | None:
    """``(name, value)`` where ``node`` is ``name == value`` (either way round) with a finite value."""
    if not isinstance(node, ast.Compare) or len(node.ops) != 1 or not isinstance(node.ops[0], ast.Eq):
        return None
    for side, other in ((node.left, node.comparators[0]), (node.comparators[0], node.left)):
        value = _number(other)
        if (isinstance(side, ast.Name) and side.id not in CONSTANTS and value is not None
                and math.isfinite(value)):
            return side.id, value
    return None


def _literal(value: bool | int | float) -> tuple[str, str]:
    if isinstance(value, bool):
        return repr(value), BOOL
    return repr(float(value)), NUMBER


def _describe(node: ast.AST) -> tuple[str, str]:
    """The key and kind of an expression that :func:`_compile` accepted (so at most
    :data:`MAX_DEPTH` levels deep)."""
    if isinstance(node, ast.Constant):
        return _literal(node.value)  # type: ignore[arg-type]  # _compile allows numbers only
    if isinstance(node, ast.Name):
        if node.id in ("True", "False") or node.id in BOOL_VALUES:
            return node.id, BOOL
        return node.id, NUMBER if node.id in CONSTANTS else VALUE
    if isinstance(node, ast.UnaryOp):
        if isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant):
            return _literal(-node.operand.value)  # type: ignore[operator, arg-type]
        key, kind = _describe(node.operand)
        bool_op = isinstance(node.op, ast.Invert) and kind == BOOL
        return f"({type(node.op).__name__} {key})", BOOL if bool_op else NUMBER
    if isinstance(node, ast.BinOp):
        op = type(node.op)
        chain = _operands(node, op) if op in (ast.BitAnd, ast.BitOr) else [node.left, node.right]
        operands = [_describe(n) for n in chain]
        keys = sorted(k for k, _ in operands) if op in _COMMUTATIVE else [k for k, _ in operands]
        bool_op = op in (ast.BitAnd, ast.BitOr) and all(kind == BOOL for _, kind in operands)
        return f"({op.__name__} {' '.join(keys)})", BOOL if bool_op else NUMBER
    if isinstance(node, ast.Compare):
        compare, left, right = type(node.ops[0]), node.left, node.comparators[0]
        if compare in _FLIPPED:
            compare, left, right = _FLIPPED[compare], right, left
        keys = [_describe(left)[0], _describe(right)[0]]
        return f"({compare.__name__} {' '.join(sorted(keys) if compare in _COMMUTATIVE else keys)})", BOOL
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):  # the parser allows no other
        raise internal_error(f"a validated expression holds a {type(node).__name__} node")
    args = [_describe(a) for a in node.args]
    name = node.func.id
    if name in _CONDITIONS or (name == "where" and len(args) == 3 and args[1][1] == args[2][1] == BOOL):
        kind = BOOL
    else:
        like_a_condition = name in ("zeros_like", "ones_like") and bool(args) and args[0][1] == BOOL
        kind = BOOL if like_a_condition else NUMBER
    return f"({name} {' '.join(k for k, _ in args)})", kind


def _operands(node: ast.BinOp, op: type) -> list[ast.AST]:
    """The operands of a chain of ``op`` (``a & (b & c)``), so that their grouping does not matter."""
    found: list[ast.AST] = []
    stack: list[ast.AST] = [node]
    while stack:
        current = stack.pop()
        if isinstance(current, ast.BinOp) and type(current.op) is op:
            stack += [current.right, current.left]
        else:
            found.append(current)
    return found


def _against(cmp: Callable[[Any, Any], Any], operand: Evaluator, value: float) -> Evaluator:
    """``operand cmp value`` for a number ``value``. A plain tensor is compared with ``value`` as a
    0-dim tensor of the dtype the comparison promotes to, made once per dtype and device: eagerly,
    a comparison with a Python number costs two and a half times one with a 0-dim tensor (4.2 µs
    against 1.6 µs on 4 elements, the size of a tiny group's rule site). Anything else -- a
    number, a compiler's fake tensor, a tensor of a torch.func transform -- is compared with the
    number itself."""
    made: dict[object, torch.Tensor] = {}

    def evaluate(env: Env) -> Any:
        x = operand(env)
        # Not while Dynamo traces (its tensors pass for plain ones), nor for AOTAutograd's (fake,
        # functional: subclasses), nor under a torch.func transform, whose levels a tensor made in
        # one call must not outlive.
        if (type(x) is not torch.Tensor or compat.peek_interpreter_stack() is not None
                or torch.compiler.is_dynamo_compiling()):
            return cmp(x, value)
        key = x.dtype if x.is_cpu else (x.dtype, x.device)  # a device object costs more than the key
        other = made.get(key)
        if other is None:
            # Filled on the device: torch.tensor would copy from the host, which waits for the device.
            other = made[key] = torch.full((), value, dtype=torch.result_type(x, value), device=x.device)
        return cmp(x, other)

    return evaluate


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
        number = _number(node.comparators[0])
        if number is not None:
            return _against(cmp, left, number)
        number = _number(node.left)
        if number is not None:  # `0 == result`: the same as `result == 0`
            return _against(_MIRRORED[cmp], right, number)
        return lambda env: cmp(left(env), right(env))
    if isinstance(node, ast.Call):
        if isinstance(node.func, ast.Attribute):
            raise _fail(node, f"method calls such as .{node.func.attr}() are not allowed in an "
                              f"expression: it is computed elementwise, and a condition on the whole "
                              f"group belongs in an override rule")
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

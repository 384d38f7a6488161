"""Fixes for a finding, smallest first, each written as a change to the user's file and checked by
replaying the bad step with it (:mod:`.check`):

1. a native op with a hand-written backward, where the expression that made the born node is one
   (:data:`_REPLACEABLE`: ``torch.linalg.vector_norm``, ``logsumexp``, ``log_softmax``, ``xlogy``,
   ``atan2``, ``F.normalize``), kept only where the check finds the running release's backward
   finite there;
2. the matching ``ag.ops`` built-in;
3. a group on the smallest enclosing function of the user's (a ``with`` block around a statement
   at module level) with its rule: ``NanSafe()`` for class A, a ``Subgradient`` whose condition
   holds exactly at the born elements for class B; for a forward birth of class A where the born
   line passes a ``key_padding_mask`` (a fully padded sequence), first the rewrite that unmasks
   such a sequence, and where the step's first non-finite value is a ``masked_fill`` of ``-inf``,
   the rewrite that fills the dtype's lowest finite number;
4. for a forward birth (class C), 1 and 2 (a native op's forward makes no NaN: ``log_softmax``),
   then the forward rewrite, as advice.

A change is only proposed to a file of the user's own (in the script's folder), never to PyTorch's
or a package's: a NaN born inside a library call is fixed by wrapping the call.
"""

from __future__ import annotations

import ast
import math
import os
from dataclasses import dataclass

import torch

from . import epsilon
from .check import STILL_NOT_FINITE, Baseline, check
from .classify import CLASSES
from .edits import Edit, Source, indentation, is_module
from .frames import is_users
from .instruments import Ran
from .locate import Born
from .replay import RandomState
from .report import Diagnosis, Proposal
from .tensors import dense


@dataclass
class Candidate:
    """A proposal before its check, with the changed file."""

    kind: str
    summary: str
    edit: Edit
    rule: bool = False


#: Why the in-process form checks no proposal.
NOT_REPLAYED = ("inside a running program the step cannot be replayed; run the script under "
                "`autograd-groups doctor` to check it")


def propose(script: str, args: list[str], report: Diagnosis, born_ran: Ran | None, baseline: Baseline,
            start: RandomState, check_them: bool = True, unchecked: str = "",
            upstream: Born | None = None) -> list[Proposal]:
    """The proposals for ``report``'s finding, each checked against ``baseline`` (the replayed
    step's gradients) by running ``script`` changed, unless ``check_them`` is False (then its check
    says ``unchecked``). ``script`` "" is a program that is no script: any file of the user's may be
    changed. ``upstream``: the forward call that first made a non-finite value in the step."""
    cls = report.cls or "G"
    advice = Proposal("advice", CLASSES[cls][1], check="advice: nothing to apply")
    born = report.born
    if cls not in ("A", "B", "C") or born is None or born.file is None or born.line is None:
        return [advice]
    if not _owned(born.file, script):
        return [advice]
    source = Source.read(born.file)
    if source is None:
        return [advice]
    candidates = _natives(source, born)
    last = [advice]
    if cls == "C":
        # A native op whose forward makes no NaN is a forward rewrite, checked like the others.
        last.insert(0, Proposal("rewrite", f"mask the argument of `{born.op}` before the op, at "
                                f"{os.path.basename(born.file)}:{born.line} (e.g. torch.where(ok, x, 1) "
                                "inside a log or a division), so that the forward makes no NaN or "
                                "infinity", check="not applied: what the masked values should be is "
                                                  "yours to say"))
    else:
        if cls == "A" and born.phase == "forward":
            candidates.extend(_unpadded(source, born))
        if cls == "A" and upstream is not None and _owned(upstream.file or "", script):
            candidates.extend(_finite_fill(upstream))
        rule = _rule(source, born, born_ran, cls)
        if rule is not None:
            candidates.append(rule)
    proposals = []
    for c in candidates:
        proposal = Proposal(c.kind, c.summary, c.edit.diff())
        if check_them:
            proposal.checked, proposal.check = check(script, args, c.edit.source.path, c.edit.text, baseline,
                                                     start, c.rule)
            if c.kind == "native" and proposal.check.startswith(STILL_NOT_FINITE):
                continue  # the running release's own backward is not finite there either
        else:
            proposal.check = unchecked
        proposals.append(proposal)
    if born.op in epsilon.OPS:
        found = epsilon.edit(source, born.line, born.op, born.columns)
        if found is not None:
            proposals.append(_not_recommended(script, args, born, found, baseline, start,
                                              check_them, unchecked))
    return [*proposals, *last]


def _not_recommended(script: str, args: list[str], born: Born, found: tuple[Edit, str], baseline: Baseline,
                     start: RandomState, check_them: bool, unchecked: str) -> Proposal:
    """The epsilon, never called checked: the replay says what it does at the bad step, and the
    slope near the point what it does elsewhere."""
    edit, text = found
    near = f"near the point, {epsilon.near_the_point(born.op)}"
    if not check_them:
        at_step = unchecked
    else:
        passed, said = check(script, args, edit.source.path, edit.text, baseline, start, rule=False)
        at_step = "at the bad step it passes the check" if passed else f"at the bad step: {said}"
    return Proposal("rewrite", f"not recommended: an epsilon, `{text}` (or a clamp), moves the function "
                    f"everywhere to make its gradient finite at one point", edit.diff(), False,
                    f"{at_step}; but {near}")


def _owned(path: str, script: str) -> bool:
    if not script:
        return is_users(path)
    folder = os.path.dirname(os.path.abspath(script))
    path = os.path.abspath(path)
    return is_users(path) and os.path.commonpath([folder, path]) == folder


def _natives(source: Source, born: Born) -> list[Candidate]:
    """A native op and the built-in for the expression on the born line, where it is one they
    replace (:data:`_REPLACEABLE`)."""
    if born.line is None:
        return []
    for call in source.calls_on(born.line, born.columns):
        for op, recognise, native, builtin, what in _REPLACEABLE:
            found = recognise(call, source) if born.op in op else None
            if found is None:
                continue
            x, options = found
            candidates = []
            for kind, fn in (("native", native), ("builtin", builtin)):
                if fn is None:
                    continue
                edit = Edit(source)
                if kind == "builtin":
                    fn = f"{edit.import_library()}.ops.{builtin}"
                else:
                    edit.import_torch()
                text = f"{fn}({source.segment(x)}{options})"
                edit.replace(call, text)
                candidates.append(Candidate(kind, f"{text}: {what[kind]}", edit))
            return candidates
    return []


def _unpadded(source: Source, born: Born) -> list[Candidate]:
    """For a sequence whose keys are all padded (its attention's softmax is 0/0, NaN, and its
    output unused: class A), the forward rewrite: such a sequence attends to all its keys instead.
    Where the born line passes a ``key_padding_mask`` that is a name or an attribute (evaluated
    twice in the rewrite)."""
    for call in source.calls_on(born.line or 0, born.columns):
        if not isinstance(call, ast.Call):
            continue
        for keyword in call.keywords:
            mask = keyword.value
            if keyword.arg != "key_padding_mask" or not isinstance(mask, (ast.Name, ast.Attribute)):
                continue
            edit = Edit(source)
            text = source.segment(mask)
            edit.replace(mask, f"{text} & ~{text}.all(-1, keepdim=True)")
            return [Candidate("rewrite", f"a sequence whose keys are all padded attends to all of them "
                                         f"instead (`{text} & ~{text}.all(-1, keepdim=True)`): its softmax "
                                         f"is then no 0/0, and its output, which the loss does not use, "
                                         f"is finite", edit)]
    return []


def _through(node: ast.expr | None, source: Source, line: int) -> ast.expr | None:
    """``node``, or where it is a variable, the value it was assigned earlier (:meth:`Source.value_of`)."""
    return source.value_of(node, line) if isinstance(node, ast.Name) else node


def _finite_fill(upstream: Born) -> list[Candidate]:
    """For a softmax over a row that a ``masked_fill`` or a ``where`` filled with ``-inf``
    everywhere (0/0, NaN, where the row is left out of the loss: class A), the forward rewrite: the
    fill value written as the dtype's lowest finite number. A row that keeps an element gets the
    same softmax (the filled elements' exponentials are 0 either way); a row that keeps none gets a
    finite one."""
    source = Source.read(upstream.file or "")
    if source is None or upstream.op not in ("masked_fill", "masked_fill_", "where") or upstream.line is None:
        return []
    for call in source.calls_on(upstream.line, upstream.columns):
        filled = _filled_with_minus_infinity(call)
        if filled is None:
            continue
        tensor, value = filled
        edit = Edit(source)
        edit.import_torch()
        scores = source.segment(tensor)
        if not isinstance(tensor, (ast.Name, ast.Attribute, ast.Call, ast.Subscript)):
            scores = f"({scores})"  # (q @ k).dtype, not q @ k.dtype
        text = f"torch.finfo({scores}.dtype).min"
        edit.replace(value, text)
        return [Candidate("rewrite", f"fill with `{text}` rather than -inf: a row whose every element is "
                                     f"filled then has a finite softmax, which the loss does not use, and "
                                     f"every other row the same", edit)]
    return []


def _filled_with_minus_infinity(call: ast.expr) -> tuple[ast.expr, ast.expr] | None:
    """``(tensor, value)`` where ``call`` fills ``tensor`` with minus infinity, ``value``:
    ``tensor.masked_fill(mask, value)`` (or ``torch.``'s), in place or not,
    ``torch.where(keep, tensor, value)`` (either way round)."""
    if not isinstance(call, ast.Call) or not isinstance(call.func, ast.Attribute):
        return None
    if call.func.attr == "where" and is_module(call.func.value) and len(call.args) == 3:
        first, second = call.args[1:]
        if _minus_infinity(second):
            return first, second
        return (second, first) if _minus_infinity(first) else None
    if call.func.attr not in ("masked_fill", "masked_fill_"):
        return None
    if is_module(call.func.value):
        tensor, rest = (call.args[0], call.args[1:]) if call.args else (None, [])
    else:
        tensor, rest = call.func.value, call.args
    value = rest[1] if len(rest) > 1 else next((k.value for k in call.keywords if k.arg == "value"), None)
    return (tensor, value) if tensor is not None and value is not None and _minus_infinity(value) else None


def _minus_infinity(node: ast.expr) -> bool:
    """``float("-inf")``, ``-float("inf")``, ``-math.inf``, ``-torch.inf``, ``-np.inf``."""
    return _number(node) == -math.inf


def _number(node: ast.expr) -> float | None:
    """The value of a number written as ``float("...")``, ``<module>.inf`` or their negation."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        value = _number(node.operand)
        return None if value is None else -value
    if isinstance(node, ast.Attribute) and node.attr == "inf":
        return math.inf
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "float" \
            and len(node.args) == 1 and isinstance(node.args[0], ast.Constant) \
            and isinstance(node.args[0].value, str):
        try:
            return float(node.args[0].value)
        except ValueError:
            return None
    return None


def _norm_of(call: ast.expr, source: Source) -> tuple[ast.expr, str] | None:
    """``(x, ", dim=..., keepdim=...")`` where ``call`` is the square root of a sum of squares of x
    (the sum written in the call, or assigned to the variable it takes)."""
    if not isinstance(call, ast.Call):
        return None
    inner = _through(_unary(call, "sqrt"), source, call.lineno)
    if not isinstance(inner, ast.Call):
        return None
    summed = _unary(inner, "sum", extra=True)
    if summed is None:
        return None
    x = _square_of(summed)
    if x is None:
        return None
    return x, _reduction(inner, keyword="dim")


def _log_sum_exp_of(call: ast.expr, source: Source) -> tuple[ast.expr, str] | None:
    """``(x, ", dim")`` where ``call`` is the log of a sum of exps of x (the sum in the call, or
    assigned to the variable it takes)."""
    if not isinstance(call, ast.Call):
        return None
    inner = _through(_unary(call, "log"), source, call.lineno)
    if not isinstance(inner, ast.Call):
        return None
    summed = _unary(inner, "sum", extra=True)
    if not isinstance(summed, ast.Call):
        return None
    x = _unary(summed, "exp")
    if x is None:
        return None
    options = _reduction(inner, keyword=None)
    return (x, options) if options else None


def _normalized(node: ast.expr, source: Source) -> tuple[ast.expr, str] | None:
    """``(x, ", dim=...")`` where ``node`` is ``x`` divided by its Euclidean norm along a dimension
    (a square root of a sum of squares, or ``x.norm(dim=...)``, ``torch.linalg.vector_norm(x, dim=...)``)."""
    if not isinstance(node, ast.BinOp) or not isinstance(node.op, ast.Div):
        return None
    x, norm = node.left, node.right
    found = _norm_of(norm, source)
    if found is None and isinstance(norm, ast.Call) and isinstance(norm.func, ast.Attribute) \
            and norm.func.attr in ("norm", "vector_norm") and _euclidean(norm):
        operand = _unary(norm, norm.func.attr, extra=True)
        dims = [k.value for k in norm.keywords if k.arg == "dim"]
        if operand is not None and dims:
            found = operand, f", dim={ast.unparse(dims[0])}"
    if found is None or ast.dump(found[0]) != ast.dump(x):
        return None
    # The norm's options as a call's keywords: a dim may be a tuple, with commas of its own.
    options = ast.parse(f"f(_{found[1]})", mode="eval").body
    dims = [k.value for k in options.keywords if k.arg == "dim"]  # type: ignore[attr-defined]
    return (x, f", dim={ast.unparse(dims[0])}") if dims else None


def _log_softmax_of(call: ast.expr, source: Source) -> tuple[ast.expr, str] | None:
    """``(x, ", dim=...")`` where ``call`` is the log of a softmax of x along a dimension, the
    softmax written in the call or assigned to the variable it takes."""
    if not isinstance(call, ast.Call):
        return None
    softmax = _through(_unary(call, "log"), source, call.lineno)
    if not isinstance(softmax, ast.Call) or not isinstance(softmax.func, ast.Attribute) \
            or softmax.func.attr != "softmax":
        return None
    x = _unary(softmax, "softmax", extra=True)
    if x is None:
        return None
    options = _reduction(softmax, keyword="dim", names=("dim", "dtype"))
    return (x, options) if "dim=" in options else None


def _x_log_y(node: ast.expr, source: Source) -> tuple[ast.expr, str] | None:
    """``(x, ", y")`` where ``node`` is ``x * log(y)`` or ``log(y) * x``."""
    if not isinstance(node, ast.BinOp) or not isinstance(node.op, ast.Mult):
        return None
    for x, log in ((node.left, node.right), (node.right, node.left)):
        y = _unary(log, "log") if isinstance(log, ast.Call) else None
        if y is not None:
            return x, f", {source.segment(y)}"
    return None


def _atan_of_ratio(call: ast.expr, source: Source) -> tuple[ast.expr, str] | None:
    """``(y, ", x")`` where ``call`` is ``atan(y / x)``."""
    ratio = _unary(call, "atan") if isinstance(call, ast.Call) else None
    if not isinstance(ratio, ast.BinOp) or not isinstance(ratio.op, ast.Div):
        return None
    return ratio.left, f", {source.segment(ratio.right)}"


def _euclidean(call: ast.Call) -> bool:
    """Whether a norm call's order is 2 (given or by default), by keyword or position."""
    orders = call.args[1:2] if is_module(call.func.value) else call.args[:1]  # type: ignore[attr-defined]
    orders += [k.value for k in call.keywords if k.arg in ("p", "ord")]
    return all(_is_two(o) for o in orders)


def _reduction(call: ast.Call, keyword: str | None, names: tuple[str, str] = ("dim", "keepdim")) -> str:
    """A call's dimension and its second option (a sum's ``keepdim``, a softmax's ``dtype``: the
    ``names`` of its first two arguments), as arguments to pass on: the dimension named by
    ``keyword`` (positional where None), the other by its name, given either way."""
    args = call.args if isinstance(call.func, ast.Attribute) and not is_module(call.func.value) \
        else call.args[1:]
    options = ""
    if args:
        options += f", {keyword}={ast.unparse(args[0])}" if keyword else f", {ast.unparse(args[0])}"
    if len(args) > 1:
        options += f", {names[1]}={ast.unparse(args[1])}"
    for k in call.keywords:
        if k.arg in names:
            options += f", {k.arg}={ast.unparse(k.value)}"
    return options


#: The expressions a native op replaces: the born ops where they apply, the recogniser, the native
#: op, the built-in (None: there is none), and what each one's backward does there.
_REPLACEABLE = (
    (("sqrt",), _norm_of, "torch.linalg.vector_norm", "vector_norm",
     {"native": "a native op with a hand-written backward (0 where the norm is 0)",
      "builtin": "the built-in group, whose rule gives 0 where the norm is 0"}),
    (("log",), _log_sum_exp_of, "torch.logsumexp", "logsumexp",
     {"native": "a native op with a hand-written backward",
      "builtin": "the built-in group, whose gradient is 0 for a slice that is all -inf"}),
    (("log",), _log_softmax_of, "torch.log_softmax", None,
     {"native": "a native op that never takes the log of an underflowed 0, with a hand-written "
                "backward"}),
    (("log", "mul"), _x_log_y, "torch.xlogy", "xlogy",
     {"native": "a native op that is 0 where x is 0, with a hand-written backward",
      "builtin": "the built-in group, with torch.xlogy's gradient where x is 0"}),
    (("div", "atan"), _atan_of_ratio, "torch.atan2", "atan2",
     {"native": "a native op with a hand-written backward, finite where x is 0; the same angle "
                "where x > 0 only (pi apart where x < 0)",
      "builtin": "the built-in group, with torch.atan2's gradient where x is 0; the same angle "
                 "where x > 0 only (pi apart where x < 0)"}),
    (("div",), _normalized, "torch.nn.functional.normalize", "normalize",
     {"native": "a native op that divides by max(norm, eps): finite at a zero vector",
      "builtin": "the built-in group, with the native op's gradient at a zero vector"}),
)


def _unary(call: ast.Call, name: str, extra: bool = False) -> ast.expr | None:
    """The operand of ``x.name(...)`` or ``torch.name(x, ...)`` (``extra``: other arguments allowed)."""
    f = call.func
    if not isinstance(f, ast.Attribute) or f.attr != name:
        return None
    if is_module(f.value):
        return call.args[0] if call.args and (extra or len(call.args) == 1) else None
    return f.value if extra or not call.args else None


def _square_of(node: ast.expr) -> ast.expr | None:
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow) and _is_two(node.right):
        return node.left
    # ``v * v``: one value twice, where naming it once computes the same (no call, which may draw
    # anew or have effects).
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult) and \
            ast.dump(node.left) == ast.dump(node.right) and \
            not any(isinstance(n, ast.Call) for n in ast.walk(node.left)):
        return node.left
    if isinstance(node, ast.Call):
        f = node.func
        if isinstance(f, ast.Attribute) and f.attr == "pow":
            if is_module(f.value) and len(node.args) == 2 and _is_two(node.args[1]):
                return node.args[0]
            if not is_module(f.value) and len(node.args) == 1 and _is_two(node.args[0]):
                return f.value
        if isinstance(f, ast.Attribute) and f.attr == "square":
            return node.args[0] if is_module(f.value) and node.args else (None if node.args else f.value)
    return None


def _is_two(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and node.value in (2, 2.0)


def _rule(source: Source, born: Born, ran: Ran | None, cls: str) -> Candidate | None:
    """A group around the born line's smallest enclosing function (or its statement), with the rule
    for the class."""
    if born.line is None:
        return None
    edit = Edit(source)
    ag = edit.import_library()
    if cls == "A":
        rule = f"{ag}.NanSafe()"
        what = "NaN-safe: where the gradient arriving is 0, the gradient passed on is 0"
    else:
        when = _condition(ran)
        if when is None:
            return None
        rule = f'{ag}.Subgradient(op="{born.op}", when="{when}", grad=0)'
        what = f"at {born.op}, where {when}, the gradient is 0"
    function = source.innermost_function(born.line)
    lam = source.lambda_on(born.line)
    if lam is not None:
        # A group around the lambda's definition would hold nothing: the lambda itself is wrapped.
        statement, top = source.simple_statement(born.line), source.top_statement(born.line)
        if statement is None or top is None:
            return None
        name = _statement_name(statement, born.line)
        edit.insert(top.lineno, [f'{ag}.register_rule("{name}", {rule})'])
        edit.replace(lam, f'{ag}.autograd_group("{name}")({source.segment(lam)})')
        summary = f"group {name!r} on the lambda at line {born.line} with {rule}: {what}"
    elif function is not None and _computes(function):
        name = _qualified(source, function)
        first = min([function.lineno, *(d.lineno for d in function.decorator_list)])
        edit.insert(function.lineno, [f'{indentation(source, first)}@{ag}.autograd_group("{name}")'])
        where = source.top_statement(function.lineno)
        register = [f'{ag}.register_rule("{name}", {rule})']
        if where is None or isinstance(where, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            last = where or function
            edit.insert((last.end_lineno or last.lineno) + 1, register)
        else:
            # A definition inside a block that runs (``if __name__ == "__main__":``), which may
            # train before it ends: the rule goes before the block.
            edit.insert(where.lineno, register)
        summary = f"group {name!r} on {function.name}() with {rule}: {what}"
    else:
        statement, top = source.simple_statement(born.line), source.top_statement(born.line)
        if statement is None or top is None:
            return None
        loss = _backward_of(statement)
        name = _fresh(source, "loss") if loss is not None else _statement_name(statement, born.line)
        edit.insert(top.lineno, [f'{ag}.register_rule("{name}", {rule})'])
        indent = indentation(source, statement.lineno)
        edit.insert(statement.lineno, [f'{indent}with {ag}.autograd_group("{name}"):'])
        if loss is not None:
            # The group must end before the backward runs: its rules are set when the block ends.
            edit.insert(statement.lineno, [f"{indent}    {name} = {source.segment(loss)}"])
            edit.replace(loss, name)
        else:
            edit.indent(statement.lineno, statement.end_lineno or statement.lineno)
        summary = f"group {name!r} around line {statement.lineno} with {rule}: {what}"
    return Candidate("rule", summary, edit, rule=True)


def _computes(function: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """Whether ``function`` is a computation a group can hold: it returns a value (a group's
    outputs are what its function returns) and runs no backward or optimizer step (a training
    loop, ``main()``: there the statement gets the group)."""
    returns = any(isinstance(n, ast.Return) and n.value is not None for n in ast.walk(function))
    steps = any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                and n.func.attr in ("backward", "step") for n in ast.walk(function))
    return returns and not steps


def _qualified(source: Source, function: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
    for node in ast.walk(source.tree):
        if isinstance(node, ast.ClassDef) and function in node.body:
            return f"{node.name}.{function.name}"
    return function.name


def _backward_of(statement: ast.stmt) -> ast.expr | None:
    """``E`` where ``statement`` is ``E.backward(...)`` on one line."""
    call = statement.value if isinstance(statement, ast.Expr) else None
    if not isinstance(call, ast.Call) or not isinstance(call.func, ast.Attribute) \
            or call.func.attr != "backward":
        return None
    loss = call.func.value
    return loss if loss.lineno == loss.end_lineno == statement.lineno else None


def _fresh(source: Source, name: str) -> str:
    """``name``, or with a number after it, that the file does not use."""
    names = source.names()
    return next(f"{name}{i or ''}" for i in range(len(names) + 1) if f"{name}{i or ''}" not in names)


def _statement_name(statement: ast.stmt, line: int) -> str:
    if isinstance(statement, ast.Assign) and isinstance(statement.targets[0], ast.Name):
        return statement.targets[0].id
    return f"line{line}"


def _condition(ran: Ran | None) -> str | None:
    """A condition over the born node's saved values that holds exactly where the gradient was
    born: ``result == 0``, ``self == 0``, ``abs(self) == 1``; None where none does."""
    if ran is None:
        return None
    grads = [dense(g) for g in ran.grad_inputs if g is not None]
    grad = next((g for g in grads if not bool(torch.isfinite(g).all())), None)
    if grad is None:
        return None
    bad = ~torch.isfinite(grad)
    for name in sorted(ran.saved, key=lambda n: (n != "result", n != "self", n)):
        value = ran.saved[name]
        if not isinstance(value, torch.Tensor) or not value.is_floating_point():
            continue
        try:
            value = torch.broadcast_to(value, bad.shape)
        except RuntimeError:
            continue
        for when, holds in ((f"{name} == 0", value == 0), (f"abs({name}) == 1", value.abs() == 1)):
            if bool((holds == bad).all()):
                return when
    return None

"""The three kinds of rule: :class:`Subgradient`, :class:`NanSafe` and :class:`Override`."""

from __future__ import annotations

import functools
import inspect
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from .. import compat, nodes
from ..errors import ExpressionError, RuleError
from . import expr, linearity

#: A ``when``/``grad``: an expression string, a number, or a callable over saved values and ``grad``.
Value = str | int | float | bool | Callable[..., Any]


@dataclass(frozen=True)
class _Compiled:
    names: frozenset[str]
    evaluate: Callable[[dict[str, Any]], Any]
    #: What two rules compare: an expression's spelling-free key, or a callable itself (by identity).
    key: object


def _compile(value: Value, what: str, op: str, condition: bool = False) -> _Compiled:
    if callable(value):
        try:
            params = list(inspect.signature(value).parameters)
        except (TypeError, ValueError) as e:
            raise RuleError(f"{what} of the {op} rule: cannot read the callable's signature ({e})") from None
        fn = value
        return _Compiled(frozenset(params), lambda env: fn(**{p: env[p] for p in params}), fn)
    try:
        parsed = expr.parse(value)
    except ExpressionError as e:
        raise ExpressionError(f"{what} of the {op} rule: {e.message}", e.col) from None
    problem = expr.condition_problem(parsed) if condition else expr.constant_problem(parsed)
    if problem:
        raise RuleError(f"{what} of the {op} rule {problem}")
    return _Compiled(parsed.names, parsed.evaluate, parsed.key)


def input_problem(info: nodes.OpInfo, index: int) -> str | None:
    """Why ``index`` cannot be an input of the op ``info``, or None (also when its inputs are not known).

    >>> input_problem(nodes.resolve_op("sqrt"), 3)
    'input 3 is out of range: sqrt has 1 input (position 0, in the order of next_functions)'
    """
    count = info.inputs
    if count is None or index < count:
        return None
    positions = "position 0" if count == 1 else f"positions 0 to {count - 1}"
    return (f"input {index} is out of range: {info.name} has {count} input{'s' if count > 1 else ''} "
            f"({positions}, in the order of next_functions)")


def _source(value: Value) -> str:
    return getattr(value, "__name__", None) or str(value)


@dataclass(frozen=True, eq=False)
class Subgradient:
    """At every node of ``op`` inside the group, where ``when`` holds, the input gradient is ``grad``.

    ``when`` and ``grad`` are expressions (see :mod:`autograd_groups.rules.expr`) or callables whose
    parameters are named after the op's saved values (``self``, ``other``, ``result``, ...) and
    ``grad`` (the gradient flowing into the op). ``input`` picks one input of the op by position
    (the order of ``next_functions``); by default every input gets ``grad``.

    >>> import autograd_groups as ag
    >>> ag.Subgradient(op="sqrt", when="result == 0", grad=0).label
    'subgradient(sqrt: result == 0 -> 0)'
    """

    op: str
    when: Value
    grad: Value = 0
    input: int | None = None
    doc: str = ""
    kind: ClassVar[str] = "subgradient"
    op_key: str = field(init=False)
    #: The rule's meaning: op, condition, value and input, each spelling-free (see :meth:`same`).
    key: tuple[object, ...] = field(init=False)
    saved: frozenset[str] = field(init=False)
    #: ``(name, attribute)`` of each saved value read, the attribute as autograd nodes name it.
    saved_attributes: tuple[tuple[str, str], ...] = field(init=False)
    constant: float | None = field(init=False)
    when_fn: _Compiled = field(init=False)
    grad_fn: _Compiled = field(init=False)

    def __post_init__(self) -> None:
        if not isinstance(self.op, str):
            name = getattr(self.op, "__name__", None)
            fix = f"op={name!r}" if isinstance(name, str) else "the op's name, as in derivatives.yaml"
            raise RuleError(f"a subgradient's op is the op's name, a string, not {self.op!r}: write {fix}")
        info = nodes.resolve_op(self.op)
        when_fn = _compile(self.when, "'when'", self.op, condition=True)
        grad_fn = _compile(self.grad, "'grad'", self.op)
        known = info.saved | {"grad"}
        for what, compiled in (("when", when_fn), ("grad", grad_fn)):
            unknown = sorted(compiled.names - known)
            if unknown:
                raise RuleError(
                    f"{what} of the {self.op} rule names {', '.join(map(repr, unknown))}, which "
                    f"{self.op} does not save; it saves {', '.join(sorted(info.saved)) or 'nothing'} "
                    f"(and every rule sees 'grad')")
        if self.input is not None and (isinstance(self.input, bool) or not isinstance(self.input, int)
                                       or self.input < 0):
            raise RuleError(f"input of the {self.op} rule must be a non-negative int, not {self.input!r}")
        out_of_range = None if self.input is None else input_problem(info, self.input)
        if out_of_range:
            raise RuleError(f"the {self.op} rule: {out_of_range}")
        is_number = isinstance(self.grad, (int, float)) and not isinstance(self.grad, bool)
        object.__setattr__(self, "op_key", nodes.op_key(self.op))
        object.__setattr__(self, "key", (self.op_key, when_fn.key, grad_fn.key, self.input))
        object.__setattr__(self, "saved", (when_fn.names | grad_fn.names) - {"grad"})
        object.__setattr__(self, "saved_attributes",
                           tuple((n, compat.saved_attribute(n)) for n in sorted(self.saved)))
        object.__setattr__(self, "constant", float(self.grad) if is_number else None)  # type: ignore[arg-type]
        object.__setattr__(self, "when_fn", when_fn)
        object.__setattr__(self, "grad_fn", grad_fn)

    @functools.cached_property
    def transposable(self) -> bool:
        """Whether the rule has a forward-mode counterpart: ``grad`` linear in ``grad``
        (:mod:`~autograd_groups.rules.linearity`); a callable that reads ``grad`` is trusted to be."""
        if callable(self.grad):
            return "grad" in self.grad_fn.names
        if isinstance(self.grad, str):
            return linearity.is_linear(self.grad)
        return self.constant == 0

    @functools.cached_property
    def label(self) -> str:
        """A short description used in errors, traces and statistics."""
        target = "" if self.input is None else f" [input {self.input}]"
        return f"subgradient({self.op}{target}: {_source(self.when)} -> {_source(self.grad)})"


@dataclass(frozen=True, eq=False)
class NanSafe:
    """Inside the group, where an op's incoming gradient is exactly zero, it passes on zero.

    ``0 * inf = 0``, as in ForwardDiff.jl's NaN-safe mode. Exact for elementwise ops; for other ops
    an outgoing gradient is zeroed only where every incoming gradient is zero.

    >>> import autograd_groups as ag
    >>> ag.NanSafe().label
    'nan_safe'
    """

    doc: str = ""
    kind: ClassVar[str] = "nan_safe"
    #: A short description used in errors, traces and statistics.
    label: ClassVar[str] = "nan_safe"


@dataclass
class OverrideContext:
    """What an override's checker and backward see: the group's tensor inputs and its outputs
    (detached, except under ``create_graph``), and every argument of the call by parameter name
    (its tensors the same objects as in ``inputs``)."""

    group: str
    inputs: tuple[torch.Tensor, ...]
    outputs: tuple[torch.Tensor, ...]
    arguments: dict[str, Any] = field(default_factory=dict)


def _grad_names(count: int) -> str:
    return "grad" if count == 1 else ", ".join(f"grad_{k}" for k in range(count))


def _returns_tensor(fn: Callable[..., Any]) -> bool:
    try:
        return typing.get_type_hints(fn).get("return") is torch.Tensor
    except Exception:  # unresolvable annotations: no declaration to rely on
        return False


class Override:
    """A group-level rule: when ``check(ctx)`` is true, ``backward(ctx, *grads)`` replaces the group.

    The group's own backward subgraph is then skipped; otherwise it runs as usual. ``backward``
    returns one gradient (or None) per tensor input of the group. Usually made with
    :func:`~autograd_groups.rules.registry.special_case`.

    >>> import torch, autograd_groups as ag
    >>> rule = ag.Override(check=lambda ctx: bool((ctx.outputs[0] == 0).any()),
    ...                    backward=lambda ctx, grad: torch.zeros_like(ctx.inputs[0]))
    >>> rule.label
    'override(<lambda>)'
    """

    kind: ClassVar[str] = "override"

    def __init__(self, check: Callable[[OverrideContext], Any],
                 backward: Callable[..., Any] | None = None, doc: str = "") -> None:
        if not callable(check):
            raise RuleError(f"an override's check must be callable, not {check!r}")
        self.check = check
        self.backward_fn = backward
        self.doc: str = doc or (inspect.getdoc(check) or "")
        #: Whether the check declares (``-> torch.Tensor``) that it answers with a bool tensor, which
        #: a compiled graph can select on; any other check runs eagerly (documentation: "torch.compile").
        self.traceable: bool = _returns_tensor(check)

    @property
    def label(self) -> str:
        """A short description used in errors, traces and statistics."""
        return f"override({_source(self.check)})"

    def run_replacement(self, ctx: OverrideContext, grads: Sequence[torch.Tensor], where: str,
                ) -> list[torch.Tensor | None]:
        """Run the replacement backward for ``grads`` (one per output of the group) and check what
        it gives: one gradient or None per tensor input, of that input's shape. ``where`` names the
        group and rule in the errors.

        >>> import torch
        >>> rule = Override(check=lambda ctx: True, backward=lambda ctx, g: g * 2)
        >>> ctx = OverrideContext("g", (torch.ones(2),), (torch.ones(2),))
        >>> rule.run_replacement(ctx, [torch.ones(2)], "group 'g'")
        [tensor([2., 2.])]
        """
        fn = self.backward_fn
        name = _source(fn)  # type: ignore[arg-type]
        try:
            inspect.signature(fn).bind(ctx, *grads)  # type: ignore[arg-type]
        except TypeError:
            outputs = len(grads)
            raise RuleError(
                f"{where}: the replacement backward {name} does not take (ctx, {_grad_names(outputs)}): "
                f"it needs one gradient parameter per group output, and the group has {outputs} "
                f"output{'s' if outputs != 1 else ''}") from None
        except ValueError:  # a builtin without a signature: called as it is
            pass
        try:
            result = fn(ctx, *grads)  # type: ignore[misc]
        except Exception as e:
            raise RuleError(f"{where}: the replacement backward raised {e!r}") from e
        results = list(result) if isinstance(result, (tuple, list)) else [result]
        if len(results) != len(ctx.inputs):
            raise RuleError(f"{where}: the replacement backward returned {len(results)} gradients "
                            f"for {len(ctx.inputs)} tensor inputs")
        for i, (g, x) in enumerate(zip(results, ctx.inputs)):
            if g is not None and not isinstance(g, torch.Tensor):
                raise RuleError(f"{where}: the replacement backward returned {type(g).__name__} "
                                f"{g!r} as gradient {i}: return tensors (torch.zeros_like(ctx.inputs[{i}]) "
                                f"for a zero gradient), or None for no gradient")
            if g is not None and g.shape != x.shape:
                raise RuleError(f"{where}: gradient {i} has shape {tuple(g.shape)}, but input {i} "
                                f"has shape {tuple(x.shape)}")
        return results

    def backward(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """Decorator: set the replacement backward."""
        if self.backward_fn is not None:
            raise RuleError(f"{self.label} already has a backward ({_source(self.backward_fn)})")
        self.backward_fn = fn
        return fn


Rule = Subgradient | NanSafe | Override

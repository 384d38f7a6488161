"""Forward mode (``jvp``, ``jacfwd``, ``forward_ad``): tangents as the transpose of rule-corrected
reverse mode, for one rule-site call of a group (:mod:`~autograd_groups.sites.forward_sites`) or for
a whole group (a NaN-safe one, an override that fires, a group that nests another with rules).

A forward-mode pass computes ``J·t`` op by op while the forward runs, long before any backward hook
could act, and a tangent that crosses a singular op is already NaN. Instead of a second realisation
of every rule on tangents, such a call runs under forward mode as one ``autograd.Function`` whose
``jvp`` is the transpose of its own vjp, rules and all::

    J·t = ∇_u ⟨vjp(u), t⟩        (the vjp with the group's rules, taken at u = 1)

``vjp`` is linear in ``u``, so the gradient is the same at every ``u``; ``u = 1`` is the piece where
no output's cotangent is zero, which a NaN-safe rule would otherwise treat as "nothing flows". So
``jacfwd`` equals ``jacrev`` wherever the double backward of the call's ops is defined, and an
exactly zero tangent stays zero wherever it is NaN-safe. A rule whose ``grad`` is not linear in ``grad``
has no transpose: :mod:`~autograd_groups.sites.hooks` refuses it while a group is transposed. An
override's vjp is ``where(check, replacement(u), automatic(u))``, built here from the rule's two
functions, since the override's own ``autograd.Function`` cannot run under ``torch.func``: for that
reason an override group runs as this op under the reverse-mode transforms of ``torch.func`` too
(``grad``, ``vjp``, ``jacrev``, ``vmap``), where only its vjp is used.

Nested forward mode (``jvp`` of ``jvp``, ``jacfwd(jacfwd)``, ``hessian``) needs the tangents of a
derivative: of the vjp, or of the tangents. Such a derivative, computed inside the op where an
enclosing forward-mode level will differentiate it, runs as an op of the same kind
(:class:`_Derivative`), so its tangents too come from reverse mode through the rules, never from
forward AD through the group's plain ops; and the op's jvp turns forward AD back on, which autograd
switches off for every level while a Function's jvp runs.

The price is a backward and a double backward of the group per forward-mode call, doubled by each
enclosing forward-mode level; reverse mode pays one attribute read (:func:`active`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.autograd.forward_ad as forward_ad

from ..compat import (
    TransformType,
    dual_level,
    get_unwrapped,
    is_batchedtensor,
    maybe_get_bdim,
    maybe_get_level,
    peek_interpreter_stack,
    retrieve_all_functorch_interpreters,
    set_fwd_grad_enabled,
    tree_flatten,
    tree_unflatten,
)
from ..compat import add_batch_dim as _add_batch_dim
from ..errors import GroupError
from ..levels import forward_mode_around
from ..observe import counters
from ..rules.kinds import Override, OverrideContext
from . import overriding


class _Local(threading.local):
    inside = 0  # how many _Transposed ops this thread is running (their function, vjp or jvp)
    depth = 0  # how many of those are transposing (in their jvp), where rules must be linear
    #: The torch.func grad levels that differentiate a vjp in its cotangent alone, to transpose it:
    #: a derivative that is linear, not a second derivative.
    linear: frozenset[int] = frozenset()
    sites = 0  # how many groups this thread runs by their sites (sites/forward_sites.py)


_local = _Local()


def active(args: tuple[Any, ...] | None = None, kwargs: dict[str, Any] | None = None) -> bool:
    """Whether a forward-mode pass runs through a call with ``args`` and ``kwargs``: a ``torch.func``
    jvp transform (``jvp``, ``jacfwd``, ``hessian``), or a ``forward_ad`` dual level with a dual
    tensor among the arguments (any dual level when there are no arguments to look at).

    >>> import torch
    >>> active((torch.ones(2),))
    False
    """
    if dual_level() >= 0 and (args is None or any(
            isinstance(t, torch.Tensor) and _dual(t) for t in (*args, *(kwargs or {}).values()))):
        return True
    if peek_interpreter_stack() is None:
        return False
    return any(i.key() == TransformType.Jvp for i in retrieve_all_functorch_interpreters())


#: What an override's check must do where the group's inputs are batched.
_BATCHED_CHECK = (" Under vmap over the group's inputs (vmap(grad(f)), jacrev of a batched call) the values "
                  "it reads are batched, so it must return its answer as a bool tensor, without bool() or "
                  ".item(): declare the check `-> torch.Tensor` and return, for example, "
                  "(ctx.outputs[0] == 0).any() (documentation: 'Groups and rules', 'Override')")


def _decided(answer: Any) -> bool | torch.Tensor:
    """An override check's answer as a Python bool where it can be one: the path not taken then
    stays out of the double backward, whose ``0 * inf`` it would otherwise meet. A tensor batched
    by vmap (over the group's inputs) cannot be: it stays a tensor, for ``torch.where``."""
    if not isinstance(answer, torch.Tensor):
        return bool(answer)
    try:
        return bool(answer)
    except RuntimeError:  # vmap refuses data-dependent control flow
        return answer


def declined(name: str, where: tuple[str, int], rule: Override, context: Context, args: tuple[Any, ...],
             kwargs: dict[str, Any], out: Any) -> bool:
    """Whether override ``rule`` of a call of group ``name`` certainly does not fire on its values
    ``out``: its check answers False as a Python bool (counted as a check that did not fire). Not
    where it fires, answers with a vmap batch, raises (the transposed route says why) or the group
    returns something else than tensors."""
    outputs = (out,) if isinstance(out, torch.Tensor) else out
    if not isinstance(outputs, tuple) or not all(isinstance(o, torch.Tensor) for o in outputs):
        return False
    try:
        answer = rule.check(context(args, kwargs, tuple(o.detach() for o in outputs)))
    except Exception:
        return False
    if _decided(answer) is not False:
        return False
    counters.count_rule(name, where, rule.label, rule.kind, fired=False)
    return True


def wanted(args: tuple[Any, ...], kwargs: dict[str, Any], override: bool) -> bool:
    """Whether a call of a group with rules runs as one ``_Transposed`` op: under forward mode, or,
    for a group with an override, under any ``torch.func`` transform, where the override's own
    ``autograd.Function`` cannot run. Groups called while one runs (in its function, vjp or jvp)
    run as they are: an override group there is refused (groups/override.py).

    >>> wanted((torch.ones(2),), {}, override=False)
    False
    """
    if dual_level() < 0 and peek_interpreter_stack() is None:  # the usual call
        return False
    if running():
        return False
    if _local.sites:  # its tangents are its own: the enclosing group's whole vjp is transposed
        raise Nested()
    return (override and peek_interpreter_stack() is not None) or active(args, kwargs)


class Nested(GroupError):
    """A group with rules (or a ``with`` block or ``tag()`` with rules) was called inside a group
    that runs by its rule sites: that group must run as the transpose of its whole vjp instead."""


@contextmanager
def by_sites() -> Iterator[None]:
    """The block runs a group by its rule sites (sites/forward_sites.py)."""
    _local.sites += 1
    try:
        yield
    finally:
        _local.sites -= 1


def running() -> bool:
    """Whether this thread is inside a group's ``_Transposed`` op (its function, vjp or jvp), where
    the groups it calls run as they are."""
    return _local.inside > 0


def linear_levels() -> frozenset[int]:
    """The grad levels open on this thread that differentiate a vjp only in its cotangent (the
    transposition of :class:`_Transposed`'s jvp): derivatives through them are not second order."""
    return _local.linear


@contextmanager
def _linear(level: int) -> Iterator[None]:
    outer = _local.linear
    _local.linear = outer | {level}
    try:
        yield
    finally:
        _local.linear = outer


@contextmanager
def apart() -> Iterator[None]:
    """Run the block as if this thread computed no group's tangents: a check that runs the user's
    whole function again, from inside a backward that computes them (sites/second_order.py)."""
    saved = (_local.inside, _local.depth, _local.linear, _local.sites)
    _local.inside, _local.depth, _local.linear, _local.sites = 0, 0, frozenset(), 0
    try:
        yield
    finally:
        _local.inside, _local.depth, _local.linear, _local.sites = saved


def transposing() -> bool:
    """Whether this thread is computing a group's tangents from its reverse mode: groups opened now
    run as in reverse mode, and their rules must be linear in ``grad``."""
    return _local.depth > 0


@contextmanager
def _inside(transposing: bool = False) -> Iterator[None]:
    _local.inside += 1
    _local.depth += transposing
    sites, _local.sites = _local.sites, 0
    try:
        yield
    finally:
        _local.inside -= 1
        _local.depth -= transposing
        _local.sites = sites


#: ``(args, kwargs, outputs) -> OverrideContext``: what an override sees of a call.
Context = Callable[[tuple[Any, ...], dict[str, Any], tuple[torch.Tensor, ...]], OverrideContext]


class _Call:
    """A group's call with its tensors taken out: ``plain`` runs the bare function (the forward
    values), ``ruled`` the group with its rules but its override (for the vjp); ``override`` and
    ``context`` give the override's part."""

    def __init__(self, name: str, where: tuple[str, int], plain: Callable[..., Any],
                 ruled: Callable[..., Any],
                 flat: list[Any], spec: Any, positions: list[int], override: Override | None,
                 context: Context) -> None:
        self.name = name
        self.site = where
        self.where = _at(where)
        self._plain = plain
        self._ruled = ruled
        self._flat = flat
        self._spec = spec
        self._positions = positions
        self._override = override
        self._context = context

    def _arguments(self, tensors: tuple[torch.Tensor, ...]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        values = list(self._flat)
        for i, t in zip(self._positions, tensors):
            values[i] = t
        args, kwargs = tree_unflatten(values, self._spec)
        return args, kwargs

    def plain(self, *tensors: torch.Tensor) -> Any:
        args, kwargs = self._arguments(tensors)
        with _inside():
            out = self._plain(*args, **kwargs)
        if isinstance(out, torch.Tensor) or (
                isinstance(out, tuple) and out and all(isinstance(t, torch.Tensor) for t in out)):
            return out
        raise GroupError(
            f"group {self.name!r} (created at {self.where}) runs under forward-mode AD (jvp, jacfwd, "
            f"forward_ad), where a group with rules must return a tensor or a tuple of tensors, not "
            f"{type(out).__name__}: return the tensors and build the rest outside the group")

    def ruled(self, *tensors: torch.Tensor) -> Any:
        args, kwargs = self._arguments(tensors)
        return self._ruled(args, kwargs)

    def vjp(self, inputs: tuple[torch.Tensor, ...], cotangents: tuple[torch.Tensor, ...]) -> tuple[Any, ...]:
        """The group's gradients of ``inputs`` for output ``cotangents``, its rules applied."""
        out, automatic = _reverse(self.ruled, inputs, cotangents)
        if self._override is None:
            return automatic
        outputs = (out,) if isinstance(out, torch.Tensor) else tuple(out)
        return self._overridden(self._override, inputs, outputs, cotangents, automatic)

    def _overridden(self, rule: Override, inputs: tuple[torch.Tensor, ...], outputs: tuple[torch.Tensor, ...],
                    cotangents: tuple[torch.Tensor, ...], automatic: tuple[Any, ...]) -> tuple[Any, ...]:
        args, kwargs = self._arguments(inputs)
        view = self._context(args, kwargs, tuple(o.detach() for o in outputs))
        where = f"group {self.name!r} (created at {self.where}), rule {rule.label}"
        answer = overriding.ask(rule, view, where, _BATCHED_CHECK)
        fired = _decided(answer)
        if isinstance(fired, bool):  # a batched answer is not one firing to count
            counters.count_rule(self.name, self.site, rule.label, rule.kind, fired=fired)
        if fired is False:
            return automatic
        if any(varies(x) for x in inputs):
            # What differentiates the replacement must see the outputs differentiable through the
            # override, as a custom Function's saved outputs are, not through the chain it avoids
            # (one more forward, only where the override fired).
            again = _Transposed.apply(self, *inputs)
            view = self._context(args, kwargs, (again,) if isinstance(again, torch.Tensor) else tuple(again))
        replaced = rule.run_replacement(view, cotangents, where)
        by_input = {id(x): g for x, g in zip(view.inputs, replaced)}
        if fired is True:
            return tuple(by_input.get(id(x)) for x in inputs)
        # Under vmap both are computed and the check's tensor picks: the automatic gradient must
        # then be finite where the check fires (a NaN-safe rule in the group sees to that).
        return tuple(overriding.choose(fired, [by_input.get(id(x)) for x in inputs], automatic))


class _Derivative:
    """A derivative of an op -- its vjp, or its tangents -- as an op of its own: ``fn`` of the
    tensors it varies with. Run as a :class:`_Transposed` op where an enclosing forward-mode level
    differentiates it, its own tangents are then the transpose of its reverse mode: reverse over
    reverse through the group's rules, not forward AD through the group's plain ops, which would
    meet their singular derivatives (``jvp`` of ``jvp`` at a special point)."""

    def __init__(self, op: _Call | _Derivative, fn: Callable[..., Any]) -> None:
        self.name: str = op.name
        self.where: str = op.where
        self._fn = fn

    def plain(self, *tensors: torch.Tensor) -> Any:
        with _inside():
            return self._fn(*tensors)

    def vjp(self, inputs: tuple[torch.Tensor, ...], cotangents: tuple[torch.Tensor, ...]) -> tuple[Any, ...]:
        return _reverse(self._fn, inputs, cotangents)[1]


def _reverse(fn: Callable[..., Any], inputs: tuple[torch.Tensor, ...],
             cotangents: tuple[torch.Tensor, ...]) -> tuple[Any, tuple[Any, ...]]:
    """``fn(*inputs)`` and its vjp for output ``cotangents``, by torch.func (None for an input that
    is not floating: a rule site's condition, passed in only because it is a torch.func tensor)."""
    picked = [i for i, x in enumerate(inputs) if differentiable(x)]

    def of_picked(*xs: torch.Tensor) -> Any:
        values = list(inputs)
        for i, x in zip(picked, xs):
            values[i] = x
        return fn(*values)

    out, vjp_fn = torch.func.vjp(of_picked, *(inputs[i] for i in picked))[:2]
    found = iter(vjp_fn(cotangents[0] if isinstance(out, torch.Tensor) else cotangents))
    return out, tuple(next(found) if differentiable(x) else None for x in inputs)


def differentiable(t: torch.Tensor) -> bool:
    """Whether ``t`` can carry a gradient or a tangent: a floating or complex tensor."""
    return t.is_floating_point() or t.is_complex()


def _derivative(op: _Call | _Derivative, fn: Callable[..., Any], tensors: tuple[torch.Tensor | None, ...],
                differentiated: bool) -> Any:
    """``fn(*tensors)``, a derivative of ``op``; as a :class:`_Transposed` op of its own where a
    forward-mode level will ``differentiate`` it, with the tensors that vary as its inputs."""
    if not differentiated:
        return fn(*tensors)
    varying = [i for i, t in enumerate(tensors) if t is not None and varies(t)]

    def of_varying(*picked: torch.Tensor) -> Any:
        values = list(tensors)
        for i, t in zip(varying, picked):
            values[i] = t
        return fn(*values)

    return _Transposed.apply(_Derivative(op, of_varying), *(tensors[i] for i in varying))


def _primal(t: torch.Tensor) -> torch.Tensor:
    """``t`` without its tangent of the innermost forward-mode level: a vmap-batched tensor (a
    jvp that ``generate_vmap_rule`` runs under vmap) is unbatched for ``unpack_dual``, which has
    no batching rule, and batched again."""
    if is_batchedtensor(t):
        return _add_batch_dim(_primal(get_unwrapped(t)), maybe_get_bdim(t), maybe_get_level(t))
    return forward_ad.unpack_dual(t).primal


class _Transposed(torch.autograd.Function):
    """An op -- a group, or a derivative of one -- whose forward gives its values, whose vjp is the
    group's with rules, and whose jvp is the transpose of that vjp."""

    generate_vmap_rule = True

    @staticmethod
    def forward(call: _Call | _Derivative, *inputs: torch.Tensor) -> Any:
        return call.plain(*inputs)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        ctx.call = inputs[0]
        # An input without a tangent gets None, not zeros: a zero tangent would meet the op's
        # infinite partial derivatives in the transpose's pairing (0 * inf).
        ctx.set_materialize_grads(False)
        outputs = (output,) if isinstance(output, torch.Tensor) else output
        ctx.outputs = [torch.empty_like(t) for t in outputs]
        ctx.save_for_forward(*inputs[1:])
        ctx.save_for_backward(*inputs[1:])

    @staticmethod
    def jvp(ctx: Any, _: None, *tangents: torch.Tensor | None) -> Any:
        call: _Call | _Derivative = ctx.call
        count, given = len(ctx.outputs), len(ctx.saved_tensors)

        def tangent(*values: Any) -> Any:
            inputs, directions, units = values[:given], values[given:2 * given], values[2 * given:]

            def pairing(*cotangents: torch.Tensor) -> torch.Tensor:
                total = cotangents[0].new_zeros(())
                with _linear(maybe_get_level(cotangents[0])):
                    for grad, t in zip(call.vjp(inputs, cotangents), directions):
                        if grad is not None and t is not None:
                            total = total + (grad * t).sum()
                return total

            out = torch.func.grad(pairing, argnums=tuple(range(count)))(*units)
            return out[0] if count == 1 else out

        # Autograd runs a Function's jvp with forward AD off at every level, so an enclosing
        # forward-mode transform would see the tangents as constants (pytorch/pytorch#197867).
        # Turned back on, it differentiates them; the inputs' primals carry no tangent of this
        # level, so this level records nothing of its own.
        with set_fwd_grad_enabled(True), _inside(transposing=True):
            primals = tuple(_primal(x) for x in ctx.saved_tensors)
            units = tuple(torch.ones_like(t) for t in ctx.outputs)
            return _derivative(call, tangent, (*primals, *tangents, *units), forward_mode_around(inner=True))

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor | None) -> tuple[Any, ...]:
        call: _Call | _Derivative = ctx.call
        inputs = ctx.saved_tensors
        cotangents = tuple(torch.zeros_like(o) if g is None else g for g, o in zip(grads, ctx.outputs))

        def gradients(*values: torch.Tensor) -> tuple[torch.Tensor, ...]:
            found = call.vjp(values[:len(inputs)], values[len(inputs):])
            return tuple(torch.zeros_like(x) if g is None else g for g, x in zip(found, inputs)
                         if differentiable(x))

        with _inside():
            found = iter(_derivative(call, gradients, (*inputs, *cotangents), forward_mode_around()))
        return (None, *(next(found) if differentiable(x) else None for x in inputs))


def _at(where: tuple[str, int]) -> str:
    return f"{where[0]}:{where[1]}"


def run(name: str, where: tuple[str, int], plain: Callable[..., Any], ruled: Callable[..., Any],
        args: tuple[Any, ...], kwargs: dict[str, Any], override: Override | None, context: Context) -> Any:
    """Call group ``name`` under forward mode: ``plain(*args, **kwargs)`` gives its values,
    ``ruled(args, kwargs)`` runs it with its rules but ``override``, whose check and replacement
    see ``context(args, kwargs, outputs)``; tangents and gradients flow through the group's rules
    (see the module's docstring)."""
    flat, spec = tree_flatten((args, kwargs))
    # A tensor that cannot carry a tangent (a mask, indices) is an input too, without one: vmap's
    # rule for the op's forward crashes on one it did not pass in (masked_fill, torch 2.13).
    positions = [i for i, v in enumerate(flat)
                 if isinstance(v, torch.Tensor) and (varies(v) or not differentiable(v))]
    call = _Call(name, where, plain, ruled, flat, spec, positions, override, context)
    return _Transposed.apply(call, *(flat[i] for i in positions))


def varies(t: torch.Tensor) -> bool:
    """Whether derivatives may flow through ``t``: a tensor of a ``torch.func`` transform, a dual
    tensor, or one that requires grad. Any other is a constant of the call: as an input of the
    Function, functorch would give it a zero tangent, and ``0 * inf`` (``x / y`` of xlogy at
    ``x = y = 0``) would turn the rows it meets into NaN."""
    return t.requires_grad or maybe_get_level(t) != -1 or (dual_level() >= 0 and _dual(t))


def _dual(t: torch.Tensor) -> bool:
    """Whether ``t`` carries a tangent at the current ``forward_ad`` dual level."""
    return forward_ad.unpack_dual(t).tangent is not None


def refuse_block(name: str, where: tuple[str, int], form: str) -> GroupError:
    """The error for a ``with`` block or ``tag()`` of a group with rules under forward mode: there
    is no function boundary to transpose (inside a group that runs by its rule sites, that group's
    whole vjp is transposed instead)."""
    if _local.sites:
        return Nested()
    return GroupError(
        f"group {name!r} (at {_at(where)}) has rules and runs under forward-mode AD (jvp, jacfwd, "
        f"hessian, forward_ad), whose tangents it can only correct for a whole function: {form} has "
        f"no function boundary. Move the code into a function decorated with "
        f"@autograd_group({name!r}), or turn its special cases off for this pass "
        f"(`ag.special_cases(False, groups=[{name!r}])`) if it never reaches a special point")

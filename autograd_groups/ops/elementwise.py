"""Elementwise ops: ``pow`` as ``exp(y * log|x|)``, ``atan2`` from ``atan``, ``xlogy`` from ``log``.

Each composite defines its value at its special points itself (``0 ** 0 = 1`` and ``0 * log 0 = 0``
selected by ``torch.where``, the origin's ``atan2`` by a quotient set to 0), so only the gradient is
left to the rules: the branch that ``where`` does not select still runs backward, with a zero
gradient times an infinite slope, and on the y axis ``atan2``'s chain multiplies ``atan'`` at
``y / 0`` (0) by ``div``'s slope ``1 / 0``.
"""

from __future__ import annotations

import math

import torch

from .. import compat, host_reads
from ..groups.group import autograd_group
from ..rules.kinds import OverrideContext
from .autocast import autocast_policy

Operand = torch.Tensor | float


def _tensors(a: Operand, b: Operand) -> tuple[torch.Tensor, torch.Tensor]:
    """Both operands as tensors of the dtype the native op computes in (:func:`_promoted`), a
    Python number filled on the other's device (``torch.as_tensor`` would copy it from the host,
    which waits for an accelerator)."""
    if not isinstance(a, torch.Tensor):
        if not isinstance(b, torch.Tensor):
            raise TypeError(f"expected at least one tensor, got {type(a).__name__} and {type(b).__name__}")
        a = torch.full((), a, dtype=torch.result_type(b, a), device=b.device)
    if not isinstance(b, torch.Tensor):
        b = torch.full((), b, dtype=torch.result_type(a, b), device=a.device)
    return _promoted(a, b)


def _promoted(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Both tensors in ``torch.result_type(a, b)``: a native binary op computes in that dtype, so
    a bfloat16 operand beside a float32 one must not take a ``log`` or meet a constant in bfloat16
    first. The casts' backward hands each operand its gradient in its own dtype, as native's."""
    dtype = torch.result_type(a, b)
    return a.to(dtype), b.to(dtype)


def _may_read(x: torch.Tensor) -> bool:
    """Whether an op may read ``x``'s values to skip work it does not need: an eager CPU tensor.

    Compiled code and ``torch.func`` transforms cannot branch on data, and on an accelerator the
    read would make the host wait for the device; there the work is always done. On the CPU a
    reduction is a fraction of the passes it spares (``pow``'s sign, ``atan2``'s origin fill).
    """
    return host_reads.allowed(x) and not (compat.is_compiling()
                                          or compat.peek_interpreter_stack() is not None)


def _pow_sign(x: torch.Tensor, y: torch.Tensor, unsign: torch.Tensor) -> torch.Tensor:
    """The sign of ``x ** y`` as torch.pow has it: -1 for a negative base (``-0.0`` included) and an
    odd integer exponent, NaN for a finite negative base and an exponent that is not an integer.

    ``unsign`` is ``x``'s sign, ``copysign(1, x)``. Each comparison is against a number: compiled,
    the backward needs the sign, and the partitioner never recomputes a comparison of two tensors
    there (its ``bool`` is under a quarter of its inputs' bytes, which it takes for a reduction),
    so it saved that mask from the forward, and a ``bool`` store is a slow kernel on the CPU
    (``ops.pow`` compiled: 2.7x the best native with ``y != trunc(y)``, 1.1x without). Nor
    ``signbit`` or ``remainder``, which compile to a scalar loop and a floor division.
    """
    half = y * 0.5
    odd = (half - half.trunc()).abs() == 0.5  # y/2 is k + 1/2 exactly for the odd integers only
    sign = torch.where(odd, unsign, 1.0)
    fraction = (y - y.trunc()).abs() > 0  # not at y = +-inf, where inf - inf is NaN
    return sign.masked_fill_((x < 0) & (x > -math.inf) & fraction, math.nan)


@autocast_policy(cpu="fallthrough", cuda="fp32")
@autograd_group("ops.pow")
def pow(input: Operand, exponent: Operand) -> torch.Tensor:
    """``torch.pow``, as ``sign * exp(exponent * log|input|)``.

    Negative bases take integer exponents (NaN otherwise), as ``torch.pow``; ``-0.0`` keeps its
    sign (``pow(-0.0, -1) = -inf``). The documentation's "Built-in ops" page gives the gradient at
    ``input = 0`` and the exponent's gradient at a negative base.

    >>> import torch, autograd_groups as ag
    >>> x = torch.tensor([0.0, 0.0, 2.0, -2.0], requires_grad=True)
    >>> ag.ops.pow(x, torch.tensor([3.0, 1.0, 3.0, 3.0])).sum().backward()
    >>> x.grad
    tensor([ 0.,  1., 12., 12.])
    """
    x, y = _tensors(input, exponent)
    # Bases without a sign bit (the usual case, checked where the data may be read) skip the sign's
    # passes over the data.
    signed = not _may_read(x) or bool(torch.signbit(x).any())
    if signed:
        with torch.no_grad():
            # |x| as x times its sign: a slope of +-1 at +-0, where abs' subgradient would be 0.
            unsign = torch.copysign(torch.ones((), dtype=x.dtype, device=x.device), x)
            sign = _pow_sign(x, y, unsign)
        x = x * unsign
    power = torch.exp(y * torch.where((x == 0) & (y == 0), 0.0, torch.log(x)))  # 0 ** 0 = 1
    return power * sign if signed else power


def zero_base(ctx: OverrideContext) -> torch.Tensor:
    """The check of ``ops.pow``'s override: a zero base (``-0.0`` included), the one special point.

    There the slope ``y * x ** (y - 1)`` is the limit of ``0 * inf``: ``exp`` has already multiplied
    the gradient by ``x ** y = 0`` before ``log`` divides by ``x``, so no op of the chain sees both
    factors, and no subgradient rule can give ``torch.pow``'s answer (``inf`` for ``0 < y < 1``, 1 at
    ``y = 1``, 0 above, and a second derivative of 2 at ``y = 2``).
    """
    x, _ = _tensors(ctx.arguments["input"], ctx.arguments["exponent"])
    return (x == 0).any()


def pow_gradients(ctx: OverrideContext, grad: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """``ops.pow``'s replacement backward when :func:`zero_base` fires: the gradients
    of ``x ** y`` for its tensor operands as ``torch.pow`` defines them at ``x = 0``
    (``pow_backward_self`` and ``pow_backward_exponent`` of PyTorch's ``FunctionsManual.cpp``)."""
    (result,) = ctx.outputs
    x, y = _tensors(ctx.arguments["input"], ctx.arguments["exponent"])
    # At x = 0 with y = 0 or 1 the slope is 0 or 1 nearby too, but torch.pow's derivatives of
    # x ** -1 or x ** 0 there are infinite or NaN, and a select does not stop them from the second
    # order on: those elements take the base 1.
    flat = (x == 0) & ((y == 0) | (y == 1))
    slope = torch.where(y == 0, 0.0, y * torch.pow(torch.where(flat, 1.0, x), y - 1))
    # log|x| is selected away at x = 0 where y >= 0, and 1 there keeps its derivative finite for the
    # graphs that differentiate this replacement (jacrev of jacfwd): 0 * inf would be NaN. |x| as x
    # times its sign has slope +-1 at +-0, as log's own 1 / x, where abs' subgradient 0 would make
    # the derivative at a zero base with y < 0 inf * 0.
    zero = (x == 0) & (y >= 0)
    magnitude = x * torch.copysign(torch.ones((), dtype=x.dtype, device=x.device), x)
    log_x = torch.where(zero, 0.0, torch.log(torch.where(zero, 1.0, magnitude)))
    grads = {"input": (grad * slope).sum_to_size(x.shape),
             "exponent": (grad * result * log_x).sum_to_size(y.shape)}
    return tuple(g for name, g in grads.items() if isinstance(ctx.arguments[name], torch.Tensor))


@autocast_policy(cpu="fallthrough", cuda="promote")
@autograd_group("ops.atan2")
def atan2(input: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    """``torch.atan2(input, other)``: the angle of the point ``(other, input)``, in ``[-pi, pi]``.

    ``atan(y / x)``, plus ``pi * sign(y)`` where ``x`` is negative (signed zeros included, as in
    torch.atan2). On the y axis (``x = 0``) the quotient is infinite and the angle ``+-pi/2``; at the
    origin the quotient ``0 / 0`` is set to 0, so the angle is ``+-0`` or ``+-pi`` as torch.atan2's.
    Both coordinates infinite is outside the domain (documentation: "Built-in ops").

    >>> import torch, autograd_groups as ag
    >>> y = torch.tensor([0.0, 1.0], requires_grad=True)
    >>> x = torch.tensor([0.0, 0.0], requires_grad=True)
    >>> ag.ops.atan2(y, x).sum().backward()
    >>> y.grad, x.grad
    (tensor([0., 0.]), tensor([-0., -1.]))
    """
    y, x = _promoted(input, other)
    quotient = y / x
    with torch.no_grad():
        # pi * sign(y) where x < 0, as pi/2 * sign(y) * (1 - sign(x)): factors, not a select or a
        # bool mask, which cost more than the whole formula on the CPU.
        half = torch.copysign(torch.full((), math.pi / 2, dtype=quotient.dtype, device=quotient.device), y)
        sign = torch.copysign(torch.ones((), dtype=quotient.dtype, device=quotient.device), x)
        offset = torch.addcmul(half, half, sign, value=-1)
        if not _may_read(x) or (x.numel() > 0 and not bool(x.abs().amin() > 0)):  # NaN fills too
            quotient.masked_fill_((x == 0) & (y == 0), 0.0)
    # In place: atan keeps its input for the backward, not its result.
    return torch.atan(quotient).add_(offset)


def near_the_y_axis(ctx: OverrideContext) -> torch.Tensor:
    """The check of ``ops.atan2``'s override: some ``x`` is 0, or tiny against some ``|y|``.

    There ``y / x`` is infinite, or so large that its square overflows or ``(y / x) / x`` does: the
    chain's slope is ``0 * inf`` (``atan'`` has made the gradient 0 before ``div`` divides it by
    ``x``), where ``atan2``'s is ``-1 / y``. No op of the chain sees both factors, so no subgradient
    rule can give it. The check reads two extremes, not a mask, so it fires for the whole call when
    the smallest ``|x|`` is below ``max |y| / 2**(e/4)`` or ``2**(-e/2)`` (``e`` the dtype's largest
    exponent; float32: ``max |y| / 2**32``, ``2**-64``), which leaves the chain's slopes far from
    overflow; a NaN makes it fire too, and the replacement propagates it as torch.atan2.
    """
    y, x = ctx.arguments["input"], ctx.arguments["other"]
    (result,) = ctx.outputs
    if result.numel() == 0:
        return torch.zeros((), dtype=torch.bool, device=result.device)
    exponent = math.frexp(torch.finfo(result.dtype).max)[1]
    low, high = torch.aminmax(y)  # max |y| without a tensor of |y|
    nearest, farthest = x.abs().amin(), torch.maximum(high, -low)
    return ~(nearest > torch.clamp_min(farthest * 2.0 ** -(exponent // 4), 2.0 ** -(exponent // 2)))


def atan2_gradients(ctx: OverrideContext, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``ops.atan2``'s replacement backward when :func:`near_the_y_axis` fires: ``atan2_backward``
    of PyTorch's ``FunctionsManual.cpp``, ``grad * (x, -y) / (x**2 + y**2)``, 0 where that
    denominator is 0 (the origin, and points so close to it that the squares underflow)."""
    y, x = _promoted(ctx.arguments["input"], ctx.arguments["other"])
    squares = x * x + y * y
    zero = squares == 0
    # A double where: 1 / 0 in the unselected branch would be NaN in the next derivative. The
    # gradient multiplies a coordinate before the reciprocal, as ATen's: 1 / x**2 of a tiny x is
    # near float32's largest value, and grad / x**2 would overflow where grad * x / x**2 does not.
    recip = torch.where(zero, 0.0, torch.where(zero, 1.0, squares).reciprocal())
    return (grad * x * recip).sum_to_size(y.shape), (grad * -y * recip).sum_to_size(x.shape)


@autocast_policy(cpu="fallthrough", cuda="fallthrough")
@autograd_group("ops.xlogy")
def xlogy(input: Operand, other: Operand) -> torch.Tensor:
    """``torch.xlogy``: ``input * log(other)``, and 0 where ``input == 0`` (unless ``other`` is NaN).

    Since ``xlogy(0, other)`` is 0 for every ``other``, ``other``'s gradient is 0 where ``input == 0``,
    ``other == 0`` included, where ``torch.xlogy``'s is ``0 / 0`` (documentation: "Built-in ops").

    >>> import torch, autograd_groups as ag
    >>> x = torch.tensor([0.0, 2.0], requires_grad=True)
    >>> y = torch.tensor([0.0, 2.0], requires_grad=True)
    >>> ag.ops.xlogy(x, y).sum().backward()
    >>> x.grad, y.grad
    (tensor([0.0000, 0.6931]), tensor([0., 1.]))
    """
    x, y = _tensors(input, other)
    if x.shape != y.shape:
        # The rule reads the product's incoming gradient, which must have the shape of x's.
        x, y = torch.broadcast_tensors(x, y)
    undefined = (x == 0) & ((y <= 0) | (y == math.inf))  # where 0 * log(y) is NaN
    if y.requires_grad:
        # y's gradient, x / y, is itself differentiated in x (grad / y at x = 0): the product keeps
        # its gradient behind the select (the where rule), and the mul rule, reading the x the
        # product saves for y's gradient, sets x's gradient there to 0. At y = 0 the log rule
        # sets y's gradient, grad * x / y = 0 / 0 where x = 0, to 0.
        return torch.where(undefined, 0.0, x * torch.log(y))
    # Autograd keeps no x when y needs no gradient, but no rule is needed: the select before the
    # product gives x's gradient, log(y) or 0. The mul rule's input 0 is log(y), which needs none.
    return torch.where(undefined, 0.0, torch.log(y)) * x

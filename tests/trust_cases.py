"""Functions from issue 28 whose derivatives are known exactly: each in a group with a rule that fires
at the point given, for the trust-signal tests (test_trust_second_order.py, test_trust_verify.py)."""

from __future__ import annotations

from collections.abc import Callable

import torch

import autograd_groups as ag

F64 = torch.float64


def so3_exp(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """The SO(3) exponential map with ``where``-guarded ``sin θ / θ`` and ``(1 − cos θ) / θ²`` and
    their series at 0, in a NaN-safe group: its Hessian at 0 is ``torch.linalg.matrix_exp``'s."""
    ag.register_rule(name, ag.NanSafe())

    @ag.autograd_group(name)
    def exp_map(v: torch.Tensor) -> torch.Tensor:
        theta2 = (v * v).sum()
        theta = theta2.sqrt()
        small = theta2 < 1e-8
        safe = torch.where(small, torch.ones_like(theta), theta)
        a = torch.where(small, 1 - theta2 / 6, torch.sin(safe) / safe)
        b = torch.where(small, 0.5 - theta2 / 24, (1 - torch.cos(safe)) / safe**2)
        k = hat(v)
        return torch.eye(3, dtype=v.dtype) + a * k + b * (k @ k)

    return exp_map


def hat(v: torch.Tensor) -> torch.Tensor:
    """The skew-symmetric matrix of ``v``: ``hat(v) @ w == cross(v, w)``."""
    zero = torch.zeros((), dtype=v.dtype)
    return torch.stack([torch.stack([zero, -v[2], v[1]]), torch.stack([v[2], zero, -v[0]]),
                        torch.stack([-v[1], v[0], zero])])


def matrix_exp_of(v: torch.Tensor) -> torch.Tensor:
    return torch.linalg.matrix_exp(hat(v))


def softplus(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """The tutorial's softplus (§8): its Hessian at ``[0, 1000]`` is ``diag(0.25, 0)``."""
    ag.register_rule(name, ag.NanSafe())
    return ag.autograd_group(name)(lambda x: torch.where(x < 20, torch.log1p(torch.exp(x)), x))


def guarded_division(name: str) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """``where(x != 0, y / x, y)``: at ``x = 0`` it is ``y``, exactly, in ``y``."""
    ag.register_rule(name, ag.NanSafe())
    return ag.autograd_group(name)(lambda x, y: torch.where(x != 0, y / x, y))


def pow_composite(name: str) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """``exp(y · log x)`` in a NaN-safe group: exact in ``y`` at ``x = 0`` (0), wrong in ``x``
    (``d/dx x¹ = 0`` where it is 1, ``d²/dx² x² = 0`` where it is 2)."""
    ag.register_rule(name, ag.NanSafe())
    return ag.autograd_group(name)(lambda x, y: torch.exp(y * torch.log(x)))


def cos_of_length(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """``cos(|v|)`` with ``|v|`` a group whose sqrt has the subgradient 0 at 0: right at first order,
    its Hessian at 0 is 0 through the rule where the function's is ``-I``."""
    ag.register_rule(name, ag.Subgradient(op="sqrt", when="result == 0", grad=0))
    length = ag.autograd_group(name)(lambda v: (v * v).sum().sqrt())
    return lambda v: torch.cos(length(v))


def sinc(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """``sin(x) / x`` with 1 at 0, in a group whose override gives the exact derivative, ``-x / 3``
    near 0, differentiably: its second derivative at 0 is ``-1/3``."""

    @ag.special_case(name)
    def at_zero(ctx: ag.OverrideContext) -> torch.Tensor:
        return (ctx.inputs[0] == 0).any()

    @at_zero.backward
    def derivative(ctx: ag.OverrideContext, g: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.inputs
        s = torch.where(x == 0, torch.ones_like(x), x)
        return g * torch.where(x == 0, -x / 3, (torch.cos(x) * s - torch.sin(s)) / s**2)

    return ag.autograd_group(name)(
        lambda x: torch.where(x == 0, torch.ones_like(x), torch.sin(x) / torch.where(x == 0, 1, x)))


def entropy(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """The docs' NaN-safe entropy ``-(where(p > 0, p · log p, 0)).sum(-1)``."""
    ag.register_rule(name, ag.NanSafe())
    return ag.autograd_group(name)(
        lambda p: -(torch.where(p > 0, p * torch.log(p), torch.zeros_like(p))).sum(-1))


def masked_softmax(generator: torch.Generator, rows: int = 4, columns: int = 6) -> torch.Tensor:
    """Probabilities with exact zeros: a softmax with about a third of each row masked out."""
    logits = torch.randn(rows, columns, generator=generator, dtype=F64)
    mask = torch.rand(rows, columns, generator=generator) < 1 / 3
    mask[:, 0] = False
    return torch.softmax(logits.masked_fill(mask, -torch.inf), -1)


def rbf(x: torch.Tensor, y: torch.Tensor, length: float = 0.7) -> torch.Tensor:
    """The RBF kernel of ``ag.ops.cdist``: ``d²k/dx dx'`` at ``x = x'`` is ``I / ℓ²``."""
    return torch.exp(-ag.ops.cdist(x, y) ** 2 / (2 * length**2))


def matern52(x: torch.Tensor, y: torch.Tensor, length: float = 0.7) -> torch.Tensor:
    """The Matérn-5/2 kernel of ``ag.ops.cdist``: ``d²k/dx dx'`` at ``x = x'`` is ``5 / (3ℓ²) · I``."""
    r = 5**0.5 * ag.ops.cdist(x, y) / length
    return (1 + r + r**2 / 3) * torch.exp(-r)


def cross_derivative(kernel: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                     x: torch.Tensor) -> torch.Tensor:
    """``d²k(x, x')/dx dx'`` at ``x' = x`` (one point of dimension d), by ``jacrev(jacrev)``."""
    def k(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return kernel(a[None], b[None])[0, 0]
    return torch.func.jacrev(torch.func.jacrev(k, argnums=0), argnums=1)(x, x.clone())

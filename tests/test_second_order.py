"""Second order through a rule (DESIGN.md §7): where a second derivative flows through elements at
which a subgradient or NaN-safe rule fired, it is the rule's own derivative, and the library says so
once per group and rule, in every mode that takes second derivatives."""

from __future__ import annotations

import warnings
from collections.abc import Callable

import pytest
import torch
from torch.func import hessian, jacfwd, jacrev, jvp

import autograd_groups as ag

F64 = torch.float64


def _create_graph(f: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[torch.Tensor], torch.Tensor]:
    return lambda x: torch.autograd.functional.hessian(f, x, create_graph=True)


SECOND_ORDER = {"create_graph": _create_graph, "jacrev(jacrev)": lambda f: jacrev(jacrev(f)),
                "hessian": hessian, "jacrev(jacfwd)": lambda f: jacrev(jacfwd(f)),
                "jacfwd(jacfwd)": lambda f: jacfwd(jacfwd(f))}
FIRST_ORDER = {"backward": lambda f: (lambda x: torch.autograd.grad(f(x.requires_grad_()), x)[0]),
               "jacrev": jacrev, "jacfwd": jacfwd,
               "jvp": lambda f: (lambda x: jvp(f, (x,), (torch.ones_like(x),))[1])}


def _cos_of_length(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """cos(|v|) with |v| a group whose sqrt has the subgradient 0 at 0: right at first order, but its
    Hessian at 0 is 0 through the rule, where cos(|v|)'s is -I."""
    ag.register_rule(name, ag.Subgradient(op="sqrt", when="result == 0", grad=0))
    length = ag.autograd_group(name)(lambda v: (v * v).sum().sqrt())
    return lambda v: torch.cos(length(v))


def _second_order_warnings(run: Callable[[], object]) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run()
    return [str(w.message) for w in caught if issubclass(w.category, ag.SecondOrderWarning)]


@pytest.mark.parametrize("mode", SECOND_ORDER)
def test_a_second_derivative_through_a_fired_subgradient_warns_by_name(mode: str) -> None:
    name = f"so.length.{mode}"
    with ag.registry_scope():
        f = _cos_of_length(name)
        zero = torch.zeros(3, dtype=F64)
        found = _second_order_warnings(lambda: SECOND_ORDER[mode](f)(zero))
        assert len(found) == 1
        assert (f"group {name!r}" in found[0] and "rule subgradient(sqrt: result == 0 -> 0), at op sqrt"
                in found[0] and "through 1 element(s)" in found[0] and "ag.verify(fn, *args, order=2)"
                in found[0] and "override" in found[0])
        # The value it warns about: the rule's 0, where cos(|v|)'s Hessian at 0 is -I.
        torch.testing.assert_close(SECOND_ORDER[mode](f)(zero), torch.zeros(3, 3, dtype=F64))
        # Once per group and rule.
        assert _second_order_warnings(lambda: SECOND_ORDER[mode](f)(zero)) == []


@pytest.mark.parametrize("mode", FIRST_ORDER)
def test_first_order_through_a_fired_rule_does_not_warn(mode: str) -> None:
    # jacfwd and jvp differentiate the group's vjp in its cotangent to transpose it: linear, not a
    # second derivative.
    with ag.registry_scope():
        f = _cos_of_length(f"so.first.{mode}")
        assert _second_order_warnings(lambda: FIRST_ORDER[mode](f)(torch.zeros(3, dtype=F64))) == []


def test_a_second_derivative_where_no_rule_fired_does_not_warn() -> None:
    with ag.registry_scope():
        f = _cos_of_length("so.ordinary")
        v = torch.tensor([0.3, -0.4, 1.2], dtype=F64)
        assert _second_order_warnings(lambda: jacrev(jacrev(f))(v)) == []
        torch.testing.assert_close(jacrev(jacrev(f))(v), hessian(lambda a: torch.cos(a.norm()))(v))


def test_a_second_derivative_through_a_fired_nan_safe_rule_warns() -> None:
    # Rodrigues' rotation of e1 with the norm inside a NaN-safe group, at v = 0.
    with ag.registry_scope():
        ag.register_rule("so.rodrigues", ag.NanSafe())

        @ag.autograd_group("so.rodrigues")
        def rotate(v: torch.Tensor) -> torch.Tensor:
            theta = (v * v).sum().sqrt()
            small = theta < 1e-6
            safe = torch.where(small, 1.0, theta)
            a = torch.where(small, 1.0, torch.sin(safe) / safe)
            b = torch.where(small, 0.5, (1 - torch.cos(safe)) / safe**2)
            e1 = torch.tensor([1.0, 0.0, 0.0], dtype=v.dtype)
            cross = torch.linalg.cross(v, e1)
            return e1 + a * cross + b * torch.linalg.cross(v, cross)

        zero = torch.zeros(3, dtype=F64)
        found = _second_order_warnings(lambda: jacrev(jacrev(lambda v: rotate(v)[1]))(zero))
        assert len(found) == 1 and "group 'so.rodrigues'" in found[0] and "rule nan_safe" in found[0]
        assert "NaN-safe passes exactly 0 there" in found[0]


def test_an_override_defines_its_own_second_derivative_and_does_not_warn() -> None:
    with ag.registry_scope():
        @ag.special_case("so.override")
        def at_zero(ctx: ag.OverrideContext) -> torch.Tensor:
            return (ctx.outputs[0] == 0).any()

        @at_zero.backward
        def length_subgradient(ctx: ag.OverrideContext, grad: torch.Tensor) -> torch.Tensor:
            (v,), (n,) = ctx.inputs, ctx.outputs
            return grad * torch.where(n == 0, 0.0, v / torch.where(n == 0, 1.0, n))

        length = ag.autograd_group("so.override")(lambda v: (v * v).sum().sqrt())
        f = lambda v: torch.cos(length(v))  # noqa: E731
        assert _second_order_warnings(lambda: jacrev(jacrev(f))(torch.zeros(3, dtype=F64))) == []


def test_ag_verify_takes_second_derivatives_without_telling_or_using_up_the_warning() -> None:
    with ag.registry_scope():
        f = _cos_of_length("so.verify")
        zero = torch.zeros(3, dtype=F64)
        assert _second_order_warnings(lambda: ag.verify(f, zero, order=2)) == []
        assert len(_second_order_warnings(lambda: jacrev(jacrev(f))(zero))) == 1

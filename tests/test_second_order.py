"""Second order through a rule (docs/guarantees.md): where a second derivative flows through elements at
which a subgradient or NaN-safe rule fired, it is the rule's own derivative; the first time at a call
site the library checks it there, and warns, naming group, rule and call site, if it is not the
function's or cannot be checked; never in first-order code. The cases of issue 28 are in
test_trust_second_order.py."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch.func import grad, hessian, jacfwd, jacrev, jvp, vmap
from trust_cases import cos_of_length

import autograd_groups as ag

F64 = torch.float64


def _create_graph(f: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[torch.Tensor], torch.Tensor]:
    return lambda x: torch.autograd.functional.hessian(f, x, create_graph=True)


SECOND_ORDER = {"create_graph": _create_graph, "jacrev(jacrev)": lambda f: jacrev(jacrev(f)),
                "hessian": hessian, "jacrev(jacfwd)": lambda f: jacrev(jacfwd(f)),
                "jacfwd(jacfwd)": lambda f: jacfwd(jacfwd(f))}
FIRST_ORDER = {"backward": lambda f: (lambda x: torch.autograd.grad(f(x.requires_grad_()), x)[0]),
               "jacrev": jacrev, "jacfwd": jacfwd, "grad": grad,
               "vmap(grad)": lambda f: (lambda x: vmap(grad(f))(x[None].expand(2, *x.shape))),
               "jvp": lambda f: (lambda x: jvp(f, (x,), (torch.ones_like(x),))[1])}


def _second_order_warnings(run: Callable[[], object]) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run()
    return [str(w.message) for w in caught if issubclass(w.category, ag.SecondOrderWarning)]


@pytest.mark.parametrize("mode", SECOND_ORDER)
def test_a_wrong_second_derivative_through_a_subgradient_warns_by_name_at_every_call(mode: str) -> None:
    name = f"so.length.{mode}"
    with ag.registry_scope():
        f = cos_of_length(name)
        zero = torch.zeros(3, dtype=F64)
        found = _second_order_warnings(lambda: SECOND_ORDER[mode](f)(zero))
        assert found
        assert all(f"group {name!r}" in m and "rule subgradient(sqrt: result == 0 -> 0), at op sqrt" in m
                   and "ag.verify(fn, *args, order=2)" in m and f"Give group {name!r} an override" in m
                   for m in found)
        # No bookkeeping of its own: under "always" every call is told again. The value it warns
        # about: the rule's 0, where cos(|v|)'s Hessian at 0 is -I.
        values: list[torch.Tensor] = []
        assert _second_order_warnings(lambda: values.append(SECOND_ORDER[mode](f)(zero)))
        torch.testing.assert_close(values[0], torch.zeros(3, 3, dtype=F64))


def test_the_default_filter_shows_a_call_site_once_and_points_at_it() -> None:
    with ag.registry_scope():
        f = cos_of_length("so.default")
        zero = torch.zeros(3, dtype=F64)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("default")
            for _ in range(3):
                jacrev(jacrev(f))(zero)
        shown = [w for w in caught if issubclass(w.category, ag.SecondOrderWarning)]
        assert len(shown) == 1
        assert shown[0].filename.endswith("trust_cases.py")  # the line that called the group
        assert "length(v)" in Path(shown[0].filename).read_text().splitlines()[shown[0].lineno - 1]


@pytest.mark.parametrize("mode", FIRST_ORDER)
def test_first_order_through_a_fired_rule_does_not_warn(mode: str) -> None:
    # torch.func.grad differentiates with create_graph so that an outer level may differentiate
    # it; jacfwd and jvp differentiate the group's vjp in its cotangent to transpose it: linear.
    with ag.registry_scope():
        f = cos_of_length(f"so.first.{mode}")
        with warnings.catch_warnings():
            warnings.simplefilter("error", ag.RuleWarning)
            out = FIRST_ORDER[mode](f)(torch.zeros(3, dtype=F64))
        assert torch.equal(out, torch.zeros_like(out))


def test_a_second_derivative_where_no_rule_fired_does_not_warn() -> None:
    with ag.registry_scope():
        f = cos_of_length("so.ordinary")
        v = torch.tensor([0.3, -0.4, 1.2], dtype=F64)
        with warnings.catch_warnings():
            warnings.simplefilter("error", ag.RuleWarning)
            found = jacrev(jacrev(f))(v)
        torch.testing.assert_close(found, hessian(lambda a: torch.cos(a.norm()))(v))


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
        with warnings.catch_warnings():
            warnings.simplefilter("error", ag.RuleWarning)
            jacrev(jacrev(lambda v: torch.cos(length(v))))(torch.zeros(3, dtype=F64))


def test_ag_verify_takes_second_derivatives_without_telling_or_using_up_the_check() -> None:
    with ag.registry_scope():
        f = cos_of_length("so.verify")
        zero = torch.zeros(3, dtype=F64)
        assert _second_order_warnings(lambda: ag.verify(f, zero, order=2)) == []
        assert _second_order_warnings(lambda: jacrev(jacrev(f))(zero))


def test_a_with_block_says_its_second_derivative_was_not_checked_and_names_verify() -> None:
    with ag.registry_scope():
        ag.register_rule("so.block", ag.Subgradient(op="sqrt", when="result == 0", grad=0))

        def f(v: torch.Tensor) -> torch.Tensor:
            with ag.autograd_group("so.block"):
                length = (v * v).sum().sqrt()
            return torch.cos(length)

        found = _second_order_warnings(lambda: jacrev(jacrev(f))(torch.zeros(3, dtype=F64)))
        assert found and "which was not checked: a `with` block or tag() cannot be run again" in found[0]
        assert "ag.verify(fn, *args, order=2) on the function that contains the group" in found[0]

"""Issue 28 §1: ``SecondOrderWarning`` is absent where the result is exact and present where it is
wrong, in eager ``create_graph``, every composition of ``jacfwd`` and ``jacrev`` (``hessian`` is
``jacfwd(jacrev)``) and ``jvp`` of ``jvp``; never in first-order code. Exact values are analytic or
``torch.linalg.matrix_exp``'s; the library's warnings are errors where a result is exact."""

from __future__ import annotations

import warnings
from collections.abc import Callable

import pytest
import torch
import trust_cases as tc
from torch.func import grad, hessian, jacfwd, jacrev, jvp, vmap

import autograd_groups as ag

F64 = torch.float64
Fn = Callable[[torch.Tensor], torch.Tensor]


def _create_graph(f: Fn) -> Fn:
    """The Hessian by eager autograd: two ``torch.autograd.grad`` calls, the first with
    ``create_graph``."""
    def run(x: torch.Tensor) -> torch.Tensor:
        x = x.detach().requires_grad_()
        (g,) = torch.autograd.grad(f(x), x, create_graph=True)
        rows = [torch.autograd.grad(g.reshape(-1)[i], x, retain_graph=True, allow_unused=True)[0]
                for i in range(x.numel())]
        return torch.stack([torch.zeros_like(x) if r is None else r for r in rows]).reshape(
            *x.shape, *x.shape)
    return run


def _jvp_of_jvp(f: Fn) -> Fn:
    """The Hessian of a scalar ``f``, entry by entry: ``jvp`` of ``jvp`` along two basis vectors."""
    def run(x: torch.Tensor) -> torch.Tensor:
        basis = torch.eye(x.numel(), dtype=x.dtype).reshape(-1, *x.shape)
        rows = [torch.stack([jvp(lambda y, e=e: jvp(f, (y,), (e,))[1], (x,), (d,))[1] for e in basis])
                for d in basis]
        return torch.stack(rows).reshape(*x.shape, *x.shape)
    return run


MODES: dict[str, Callable[[Fn], Fn]] = {"create_graph": _create_graph, "hessian": hessian,
                                        "jacrev(jacrev)": lambda f: jacrev(jacrev(f)),
                                        "jacrev(jacfwd)": lambda f: jacrev(jacfwd(f)),
                                        "jacfwd(jacfwd)": lambda f: jacfwd(jacfwd(f)),
                                        "jvp(jvp)": _jvp_of_jvp}


def exact(run: Callable[[], torch.Tensor]) -> torch.Tensor:
    """``run()`` with the library's warnings raised as errors."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", ag.RuleWarning)
        return run()


def told(run: Callable[[], torch.Tensor]) -> tuple[torch.Tensor, list[warnings.WarningMessage]]:
    """``run()`` and the ``SecondOrderWarning``s it gave."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        value = run()
    return value, [w for w in caught if issubclass(w.category, ag.SecondOrderWarning)]


# -- first-order code ----------------------------------------------------------------------------

FIRST_ORDER: dict[str, Callable[[Fn, torch.Tensor], torch.Tensor]] = {
    "grad": lambda f, x: grad(f)(x),
    "vmap(grad)": lambda f, x: vmap(grad(f))(torch.stack([x, x])),
}


@pytest.mark.parametrize("mode", FIRST_ORDER)
def test_first_order_code_never_warns_for_a_builtin_or_a_user_group(mode: str) -> None:
    """torch.func.grad differentiates with create_graph (for nesting): no second derivative."""
    points = torch.tensor([[0.0, 1.0], [0.0, 1.0], [2.0, -1.0]], dtype=F64)
    run = FIRST_ORDER[mode]
    found = exact(lambda: run(lambda x: ag.ops.cdist(x, x).sum(), points))
    native = run(lambda x: torch.cdist(x, x).sum(), points)
    torch.testing.assert_close(found, native)
    with ag.registry_scope():
        length = tc.cos_of_length(f"trust.first.sub.{mode}")
        assert torch.equal(exact(lambda: run(length, torch.zeros(3, dtype=F64))), torch.zeros(
            (3,) if mode == "grad" else (2, 3), dtype=F64))
        softplus = tc.softplus(f"trust.first.nan.{mode}")
        x = torch.tensor([0.0, 1000.0], dtype=F64)
        torch.testing.assert_close(exact(lambda: run(lambda v: softplus(v).sum(), x)),
                                   run(lambda v: torch.nn.functional.softplus(v).sum(), x))


# -- exact Hessians ------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", MODES)
def test_exact_hessians_through_nan_safe_rules_do_not_warn(mode: str) -> None:
    take = MODES[mode]
    with ag.registry_scope():
        exp_map = tc.so3_exp(f"trust.so3.{mode}")
        weights = torch.randn(3, 3, generator=torch.Generator().manual_seed(0), dtype=F64)
        zero = torch.zeros(3, dtype=F64)
        torch.testing.assert_close(exact(lambda: take(lambda v: (exp_map(v) * weights).sum())(zero)),
                                   hessian(lambda v: (tc.matrix_exp_of(v) * weights).sum())(zero))

        softplus = tc.softplus(f"trust.softplus.{mode}")
        at = torch.tensor([0.0, 1000.0], dtype=F64)
        torch.testing.assert_close(exact(lambda: take(lambda x: softplus(x).sum())(at)),
                                   torch.diag(torch.tensor([0.25, 0.0], dtype=F64)))

        divide = tc.guarded_division(f"trust.divide.{mode}")
        y = torch.tensor([1.0, -2.0], dtype=F64)
        zeros = torch.zeros(2, dtype=F64)
        assert torch.equal(exact(lambda: take(lambda b: (divide(zeros, b) ** 2).sum())(y)),
                           2 * torch.eye(2, dtype=F64))  # (y / x at x = 0 is y)² in y

        power = tc.pow_composite(f"trust.pow.{mode}")
        assert torch.equal(exact(lambda: take(lambda b: power(zeros, b).sum())(y.abs())),
                           torch.zeros(2, 2, dtype=F64))  # 0 ** y = 0 for y > 0


@pytest.mark.parametrize("mode", MODES)
def test_a_wrong_hessian_through_nan_safe_warns_with_the_numbers(mode: str) -> None:
    """exp(2 · log x) at x = 0 under NaN-safe: the second derivative is 0 where x²'s is 2."""
    with ag.registry_scope():
        power = tc.pow_composite(f"trust.wrong.{mode}")
        two = torch.full((1,), 2.0, dtype=F64)
        value, found = told(lambda: MODES[mode](lambda x: power(x, two).sum())(torch.zeros(1, dtype=F64)))
        assert torch.equal(value, torch.zeros(1, 1, dtype=F64))
        message = str(found[0].message) if found else ""
        assert "which is not the function's: at x[0] the rules give 0 where" in message
        assert f"Give group 'trust.wrong.{mode}' an override" in message


# -- no once-per-process bookkeeping -------------------------------------------------------------

@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("line", ["other lines", "the same line"])
def test_a_harmless_call_does_not_hide_a_wrong_hessian_in_the_same_group(mode: str, line: str) -> None:
    take = MODES[mode]
    with ag.registry_scope():
        power = tc.pow_composite(f"trust.hide.{mode}.{line}")
        zeros, two = torch.zeros(1, dtype=F64), torch.full((1,), 2.0, dtype=F64)

        def one_line(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return power(x, y).sum()  # the call site of both Hessians

        if line == "the same line":
            harmless, wrong = lambda b: one_line(zeros, b), lambda x: one_line(x, two)
        else:
            harmless, wrong = lambda b: power(zeros, b).sum(), lambda x: power(x, two).sum()
        assert torch.equal(exact(lambda: take(harmless)(two)), torch.zeros(1, 1, dtype=F64))
        value, found = told(lambda: take(wrong)(zeros))
        assert torch.equal(value, torch.zeros(1, 1, dtype=F64))  # x²'s is 2
        assert found and "which is not the function's: at x[0]" in str(found[0].message)


def test_an_argument_that_requires_grad_but_is_not_differentiated_is_not_checked() -> None:
    """d²/dy² of exp(y · log x) at x = 0, y = 2 is 0 = d²/dy² 0 ** y, exact; d²/dx² there (0 for
    x²'s 2) is wrong, and is not what this backward takes."""
    with ag.registry_scope():
        power = tc.pow_composite("trust.partial")
        x = torch.zeros(1, dtype=F64, requires_grad=True)
        y = torch.full((1,), 2.0, dtype=F64, requires_grad=True)

        def second(wrt: torch.Tensor) -> torch.Tensor:
            (g,) = torch.autograd.grad(power(x, y).sum(), wrt, create_graph=True)  # one call site
            return torch.autograd.grad(g.sum(), wrt)[0]

        assert torch.equal(exact(lambda: second(y)), torch.zeros(1, dtype=F64))
        value, found = told(lambda: second(x))
        assert torch.equal(value, torch.zeros(1, dtype=F64))
        assert found and "which is not the function's: at x[0]" in str(found[0].message)


def test_two_call_sites_with_wrong_hessians_in_one_group_both_warn() -> None:
    with ag.registry_scope():
        power = tc.pow_composite("trust.two")
        two = torch.full((1,), 2.0, dtype=F64)

        def f(x: torch.Tensor) -> torch.Tensor:
            first = power(x, two).sum()
            second = power(x, two).sum()
            return first + second

        _, found = told(lambda: jacrev(jacrev(f))(torch.zeros(1, dtype=F64)))
        assert len({w.lineno for w in found}) == 2
        assert all(w.filename == __file__ for w in found)


# -- a built-in inside a smooth function ---------------------------------------------------------

KERNELS = {"rbf": (tc.rbf, 1.0), "matern52": (tc.matern52, 5 / 3)}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kernel", KERNELS)
def test_a_builtin_inside_a_smooth_kernel_warns_with_what_the_user_can_do(mode: str, kernel: str) -> None:
    """d²k/dx dx' at x = x' is c · I / ℓ² (c = 1 for RBF, 5/3 for Matérn-5/2); through cdist's rule it
    is 0, and the warning says what to do: not to give ops.cdist an override."""
    k, c = KERNELS[kernel]
    length, d = 0.7, 3
    x = torch.randn(d, generator=torch.Generator().manual_seed(1), dtype=F64)

    def of_both(z: torch.Tensor) -> torch.Tensor:
        return k(z[:d][None], z[d:][None], length)[0, 0]

    value, found = told(lambda: MODES[mode](of_both)(torch.cat([x, x])))
    cross = value[:d, d:]
    assert torch.equal(cross, torch.zeros(d, d, dtype=F64))
    # The exact value, from the same kernel written in the squared distance (smooth at 0).
    smooth = {"rbf": lambda a, b: torch.exp(-((a - b) ** 2).sum() / (2 * length**2)),
              "matern52": lambda a, b: _matern_squared(((a - b) ** 2).sum(), length)}[kernel]
    reference = jacrev(jacrev(smooth, argnums=0), argnums=1)(x, x.clone())
    torch.testing.assert_close(reference, c / length**2 * torch.eye(d, dtype=F64))
    assert found
    message = str(found[0].message)
    assert "group 'ops.cdist'" in message and "ops.cdist is a built-in" in message
    assert "squared distance" in message and "wrap the whole function in a group of your own" in message
    assert "Give group 'ops.cdist' an override" not in message


def _matern_squared(d2: torch.Tensor, length: float) -> torch.Tensor:
    """Matérn-5/2 written so that its Hessian at d2 = 0 is finite: r = √5 · √d2 / ℓ, with r's odd
    powers through a series-safe √ (its derivative at 0 never enters: exp(-r)(1 + r) = 1 - r²/2 + ...)."""
    r2 = 5 * d2 / length**2
    r = torch.where(r2 > 0, r2.clamp_min(1e-300).sqrt(), torch.zeros_like(r2))
    return torch.where(r2 > 0, (1 + r + r2 / 3) * torch.exp(-r), 1 - r2 / 6)


def test_a_hessian_with_respect_to_empty_inputs_does_not_warn_and_verify_says_not_checked() -> None:
    """logsumexp over an empty dimension is ``-inf``, where the built-in's log rule fires; the
    Hessian with respect to a (0, 3) input has no element to be wrong (an OpInfo sample)."""
    x = torch.zeros(0, 3, dtype=F64, requires_grad=True)
    (g,) = torch.autograd.grad(exact(lambda: ag.ops.logsumexp(x, 0)).sum(), x, create_graph=True)
    assert exact(lambda: torch.autograd.grad(g.sum(), x)[0]).shape == (0, 3)
    report = ag.verify(lambda a: ag.ops.logsumexp(a, 0).sum(), x, order=2)
    assert [(row.status, row.reason) for row in report.rows] == [
        ("not checked", "the elements it changed reach no input gradient")]

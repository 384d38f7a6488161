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


# -- a kink that the function around it smooths --------------------------------------------------

#: The modes where the function differentiated is a function that a torch.func transform was given.
TRANSFORMS = {mode: MODES[mode] for mode in ("hessian", "jacrev(jacrev)", "jacrev(jacfwd)", "jacfwd(jacfwd)")}


def _sinc(x: torch.Tensor) -> torch.Tensor:
    """sin(x) / x with a finite double backward at 0: a Taylor branch behind a double ``where``."""
    small = x.abs() < 1e-3
    safe = torch.where(small, torch.ones_like(x), x)
    return torch.where(small, 1 - x * x / 6 + x**4 / 120, torch.sin(safe) / safe)


def _user_length(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """|v| over the last dimension in a group of the user's, with ops.vector_norm's rule."""
    ag.register_rule(name, ag.Subgradient(op="sqrt", when="result == 0", grad=0))
    return ag.autograd_group(name)(lambda v: v.pow(2).sum(-1, keepdim=True).sqrt())


def _quaternion(length: Fn) -> tuple[Fn, Fn]:
    """Half the rotation angle of a quaternion ``q = (w, v)``, atan2(|v|, w), with ``length`` for
    |v|, called at one line by both functions of it: the axis-angle vector 2 v atan2(|v|, w) / |v|
    (smooth at the identity: 2 v / w - 2/3 |v|² v / w³ + ...) and the squared angle (4 |v|² / w² + ...)."""
    def half_angle(q: torch.Tensor) -> torch.Tensor:
        return ag.ops.atan2(length(q[..., 1:]), q[..., :1])

    def axis_angle(q: torch.Tensor) -> torch.Tensor:
        half = half_angle(q)
        return q[..., 1:] * 2 * torch.cos(half) / (q[..., :1] * _sinc(half))

    def angle_squared(q: torch.Tensor) -> torch.Tensor:
        return (2 * half_angle(q)).pow(2).sum()

    return axis_angle, angle_squared


def _native_axis_angle(q: torch.Tensor) -> torch.Tensor:
    n = torch.linalg.vector_norm(q[1:], dim=-1, keepdim=True)
    return q[1:] * 2 * torch.atan2(n, q[:1]) / n


LENGTHS = ["ops.vector_norm", "a group of the user's"]


@pytest.mark.parametrize("mode", TRANSFORMS)
@pytest.mark.parametrize("length", LENGTHS)
def test_a_kink_the_function_differentiated_smooths_is_checked_through_it(mode: str, length: str) -> None:
    """At the identity the rule of |v| fires and the group's own second derivative diverges (its
    own inputs cannot decide). The axis-angle vector is smooth there and its Hessian is exact:
    no warning. The squared angle's Hessian is 8 I / w² in v, and 0 through the rule: it warns, at
    the same call site of the group, through the function differentiated."""
    take = TRANSFORMS[mode]
    identity = torch.tensor([1.0, 0.0, 0.0, 0.0], dtype=F64)
    with ag.registry_scope():
        norm = (lambda v: ag.ops.vector_norm(v, dim=-1, keepdim=True)) if length == "ops.vector_norm" \
            else _user_length(f"trust.length.{mode}")
        axis_angle, angle_squared = _quaternion(norm)
        # d²(2 v_i / w) / dw dv_i = -2 / w²; every other entry is 0 (the rest is of order |v|³).
        expected = torch.zeros(3, 4, 4, dtype=F64)
        for i in range(3):
            expected[i, 0, i + 1] = expected[i, i + 1, 0] = -2.0
        # The analytic value, against PyTorch's own Hessian at a nearby point (off the kink).
        nearby = torch.tensor([1.0, 1e-6, -2e-6, 3e-6], dtype=F64)
        torch.testing.assert_close(hessian(_native_axis_angle)(nearby), expected, atol=2e-5, rtol=0)
        assert torch.equal(exact(lambda: take(axis_angle)(identity)), expected)

        value, found = told(lambda: take(angle_squared)(identity))
        assert torch.equal(value, torch.zeros(4, 4, dtype=F64))
        assert len(found) == 1
        message = str(found[0].message)
        assert "which is not the function's: through the function differentiated, " \
               "_quaternion.<locals>.angle_squared" in message
        assert found[0].filename == __file__
        fix = "ops.vector_norm is a built-in" if length == "ops.vector_norm" \
            else f"Give group 'trust.length.{mode}' an override"
        assert fix in message


def test_where_the_function_differentiated_cannot_be_run_again_the_warning_says_what_decides() -> None:
    """|v|³ is twice differentiable at 0 with Hessian 0, the rule's: exact. torch.func.hessian of it
    (or of a method) is checked through the function and does not warn; eager create_graph has no
    function to run, and neither has a function that changed its parameter before the group's call
    (run again on its parameter's value then, it would call the group elsewhere): those warn that
    it could not be checked, without saying that it is wrong, and name what decides."""
    with ag.registry_scope():
        ag.register_rule("trust.cube", ag.Subgradient(op="sqrt", when="result == 0", grad=0))
        norm = ag.autograd_group("trust.cube")(lambda v: (v * v).sum().sqrt())
        shift = torch.tensor([0.5, -1.0, 2.0], dtype=F64)

        def cube(v: torch.Tensor) -> torch.Tensor:
            return norm(v) ** 3

        def shifted_cube(v: torch.Tensor) -> torch.Tensor:
            v = v - shift
            return norm(v) ** 3

        class Cube:
            def of(self, v: torch.Tensor) -> torch.Tensor:
                return norm(v) ** 3

        zero = torch.zeros(3, dtype=F64)
        assert torch.equal(exact(lambda: hessian(cube)(zero)), torch.zeros(3, 3, dtype=F64))
        assert torch.equal(exact(lambda: hessian(Cube().of)(zero)), torch.zeros(3, 3, dtype=F64))
        for value, found in (told(lambda: _create_graph(cube)(zero)),
                             told(lambda: hessian(shifted_cube)(shift))):
            assert torch.equal(value, torch.zeros(3, 3, dtype=F64))
            assert len(found) == 1
            message = str(found[0].message)
            assert "whether that is the function's could not be checked at the group's own inputs" in message
            assert "ag.verify(fn, *args, order=2) on the function you differentiate decides" in message
            assert "which is not the function's" not in message

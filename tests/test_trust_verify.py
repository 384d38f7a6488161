"""Issue 28 §2: ``ag.verify`` says "inconsistent" only where a rule is wrong, "not checked" with the
true reason where a derivative diverges or only the plain composite's is non-finite, checks the
user's whole function end to end, and leaves no trace in the user's session, counts or warnings."""

from __future__ import annotations

import warnings
from collections.abc import Callable

import pytest
import torch
import trust_cases as tc
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from torch.func import jacrev

import autograd_groups as ag
from autograd_groups.verify.verdict import CONSISTENT, DIFFERENCES, END_TO_END, INCONSISTENT, NOT_CHECKED

F64 = torch.float64


def quiet_verify(fn: Callable[..., torch.Tensor], *args: torch.Tensor, order: int = 1) -> ag.Report:
    """``ag.verify``, with every warning an error: its own code emits none."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return ag.verify(fn, *args, order=order)


def test_the_entropy_at_50_random_masked_batches_is_never_inconsistent() -> None:
    """-(log p + 1) diverges as p -> 0+: no limit to compare the NaN-safe 0 with."""
    entropy = tc.entropy("trust.entropy")
    generator = torch.Generator().manual_seed(28)
    statuses: set[str] = set()
    for _ in range(50):
        report = quiet_verify(entropy, tc.masked_softmax(generator, 8, 10))
        assert report.ok, str(report)
        statuses |= {row.status for row in report.rows}
        assert all("grows without bound" in row.reason or "no limit" in row.reason
                   for row in report.rows if row.status == NOT_CHECKED)
    assert NOT_CHECKED in statuses


@pytest.mark.parametrize("order", [1, 2])
def test_the_sinc_override_is_consistent_at_orders_1_and_2(order: int) -> None:
    sinc = tc.sinc("trust.sinc")
    x = torch.tensor([0.0, 0.5, -2.0], dtype=F64)
    # Its derivatives at 0, by autograd through the override: 0 and -1/3, exactly.
    leaf = x.clone().requires_grad_()
    (first,) = torch.autograd.grad(sinc(leaf).sum(), leaf, create_graph=True)
    (second,) = torch.autograd.grad(first[0], leaf)
    assert float(first[0].detach()) == 0.0 and float(second[0]) == pytest.approx(-1 / 3, rel=1e-15)
    rows = quiet_verify(sinc, x, order=order).rows
    assert [(row.status, row.point) for row in rows] == [(CONSISTENT, "smooth")]


@pytest.mark.parametrize("kernel", [tc.rbf, tc.matern52])
def test_a_gp_kernel_of_ops_cdist_is_flagged_end_to_end(kernel: Callable[..., torch.Tensor]) -> None:
    """cdist alone has no second derivative at a zero distance ("not checked"), but the kernel
    k(x, x') does: through the rule its d²k/dx dx' is 0 where it is c · I / ℓ²."""
    x = torch.randn(1, 3, generator=torch.Generator().manual_seed(2), dtype=F64)
    report = quiet_verify(lambda a, b: kernel(a, b).sum(), x, x.clone(), order=2)
    assert not report.ok
    fired = [row for row in report.rows if row.instance]
    own = [row for row in fired if not row.scope]
    whole = [row for row in fired if row.scope == END_TO_END]
    assert [row.status for row in own] == [NOT_CHECKED]
    assert [row.status for row in whole] == [INCONSISTENT] and whole[0].rule_value == 0.0
    # The verdict lines wrap at 80 columns wherever the file path in them ends: read them flat.
    assert "end to end (through the function given to ag.verify)" in " ".join(str(report).split())


def test_where_only_the_plain_composites_derivative_is_not_finite_the_values_differences_check_it() -> None:
    divide = tc.guarded_division("trust.wording")
    zeros = torch.zeros(2, dtype=F64)
    (row,) = quiet_verify(lambda y: divide(zeros, y), torch.tensor([1.0, 2.0], dtype=F64)).rows
    # d/dy y = 1 at every element, and the projection's weight is the derivative checked.
    assert (row.status, row.point, row.reference, row.differences) == (CONSISTENT, "smooth", DIFFERENCES, 2)
    assert "checked against finite differences of the function's value" in row.reason
    assert "domain" not in row.reason
    # At order 2 it is checked: d²/dy² y = 0.
    (row,) = quiet_verify(lambda y: divide(zeros, y), torch.tensor([1.0, 2.0], dtype=F64), order=2).rows
    assert row.status == CONSISTENT
    # Where the function does leave its domain (log of a negative number), it says so.
    root = tc.pow_composite("trust.domain")
    (row,) = quiet_verify(lambda x: root(x, torch.full((2,), 0.5, dtype=F64)), zeros).rows
    assert row.status != INCONSISTENT


def test_verify_leaves_the_users_trace_session_and_stats_alone() -> None:
    entropy = tc.entropy("trust.side")
    p = tc.masked_softmax(torch.Generator().manual_seed(3))
    ag.reset_stats()
    with ag.trace() as session:
        entropy(p.clone().requires_grad_()).sum().backward()
        counted = ag.stats()
        quiet_verify(entropy, p, order=2)
    assert [i.name for i in session.instances] == ["trust.side"]
    assert ag.stats() == counted


# -- random compositions -------------------------------------------------------------------------

UNARY: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "sin": torch.sin,
    "exp": lambda x: torch.exp(x.clamp(-5, 5)),
    "square": lambda x: x * x,
    "abs": lambda x: (x * x).sqrt(),
    "cube": lambda x: x * x * x,
    "log1p_square": lambda x: torch.log1p(x * x),
    "tanh": torch.tanh,
    "softplus": lambda x: torch.where(x < 20, torch.log1p(torch.exp(x)), x),
    "reciprocal_square": lambda x: 1 / (1 + x * x),
}
# Not a sinc or an x log x guarded by a where with a constant branch at 0: autograd's derivative of
# such a form at the guard is the constant's (0), not the function's, so jacrev(jacrev) of the plain
# composition is no exact reference there.
# Rules that fire at a zero of their op's input: where the plain composite's derivative is finite
# too (tanh, sin: right with "grad", wrong with "2 * grad"), and where it is not (sqrt, NaN-safe).
RULES: dict[str, list[ag.Subgradient | ag.NanSafe]] = {
    "nan_safe": [ag.NanSafe()],
    "sqrt": [ag.Subgradient(op="sqrt", when="result == 0", grad=0)],
    "tanh_right": [ag.Subgradient(op="tanh", when="result == 0", grad="grad"), ag.NanSafe()],
    "tanh_wrong": [ag.Subgradient(op="tanh", when="result == 0", grad="2 * grad")],
    "sin_right": [ag.Subgradient(op="sin", when="self == 0", grad="grad")],
    "sin_wrong": [ag.Subgradient(op="sin", when="self == 0", grad="-grad"), ag.NanSafe()],
}
POINTS = st.lists(st.sampled_from([0.0, 0.0, 0.5, -0.5, 1.3, -2.0, 1e-3]), min_size=3, max_size=3)


@settings(max_examples=60, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@example(ops=["tanh", "cube", "sin"], rule="tanh_wrong", point=[0.0, 0.5, 0.0])
@example(ops=["sin", "square", "tanh"], rule="sin_right", point=[0.0, -0.5, 0.0])
@example(ops=["square", "sin", "exp"], rule="sin_wrong", point=[0.0, 1.3, 0.0])
@given(ops=st.lists(st.sampled_from(sorted(UNARY)), min_size=2, max_size=5),
       rule=st.sampled_from(sorted(RULES)), point=POINTS)
def test_verify_never_contradicts_an_exact_float64_second_derivative(ops: list[str], rule: str,
                                                                      point: list[float]) -> None:
    """Where jacrev(jacrev) of the plain composition is finite, it is the exact second derivative:
    "inconsistent" must mean the library's Hessian differs from it, and all-consistent that it
    does not."""
    def plain(x: torch.Tensor) -> torch.Tensor:
        for op in ops:
            x = UNARY[op](x)
        return x

    x = torch.tensor(point, dtype=F64)
    exact = jacrev(jacrev(plain))(x)
    if not bool(torch.isfinite(exact).all()):
        return
    name = f"trust.random.{rule}"
    with ag.registry_scope():
        for each in RULES[rule]:
            ag.register_rule(name, each)
        grouped = ag.autograd_group(name)(plain)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ag.SecondOrderWarning)
            ours = jacrev(jacrev(grouped))(x)
        report = quiet_verify(grouped, x, order=2)
    statuses = {row.status for row in report.rows if row.instance}
    right = torch.allclose(ours, exact, rtol=1e-6, atol=1e-9)
    if INCONSISTENT in statuses:
        assert not right, str(report)
    elif statuses == {CONSISTENT}:
        assert right, str(report)


@pytest.mark.parametrize("stiffness", [1e6, 1e12])
@pytest.mark.parametrize("grad, status", [("0", CONSISTENT), ("5 * grad", INCONSISTENT)])
def test_a_kink_beside_a_stiff_smooth_term_is_judged_by_the_samples_near_it(
        stiffness: float, grad: str, status: str) -> None:
    """|x| + c x² at 0: the slopes at the largest steps reach 2e10, and a window of them can
    extrapolate exactly; the tolerance is measured by the samples near the kink, whose one-sided
    limits are -1 and 1, so that 5 is outside them and 0 inside."""
    with ag.registry_scope():
        ag.register_rule("trust.stiff", ag.Subgradient(op="abs", when="self == 0", grad=grad))
        fn = ag.autograd_group("trust.stiff")(lambda x: (x.abs() + stiffness * x * x).sum())
        (row,) = quiet_verify(fn, torch.tensor([0.0], dtype=F64)).rows
    assert (row.status, row.point, row.low, row.high) == (status, "kink", -1.0, 1.0)
    assert row.tolerance < 1e-4

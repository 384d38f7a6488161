"""``ag.verify``: each rule that fired, checked against the limits of the automatic gradient at
nearby points. Expected values are analytic: the limits of ``d / |d|`` at a kink, ``-1`` for the
exact gradient of the rotation's ``R[0, 1]`` at 0, ``-w`` and ``-w / 3`` for Hessian-vector
products with the Hessians ``-I`` and ``sinc''(0) = -1/3``."""

from __future__ import annotations

import gc
import json
import math

import pytest
import torch
import trust_cases as tc

import autograd_groups as ag
from autograd_groups.errors import GroupError
from autograd_groups.instance import GroupInstance
from autograd_groups.sites.hooks import SiteHook
from autograd_groups.verify import limits, points
from conftest import assert_fits


@ag.autograd_group("norm")
def norm(v):
    return v.pow(2).sum().sqrt()


@ag.autograd_group("abs_sqrt")
def abs_sqrt(x):
    return (x * x).sqrt()


@ag.autograd_group("abs_five")
def abs_five(x):
    return (x * x).sqrt()


@ag.autograd_group("cos_norm")
def cos_norm(v):
    return torch.cos(v.pow(2).sum().sqrt())


def _sinc(x):
    return torch.where(x == 0, torch.ones_like(x), torch.sin(x) / x)


sinc = ag.autograd_group("sinc")(_sinc)
sinc_flat = ag.autograd_group("sinc_flat")(_sinc)


@ag.autograd_group("pow_composite")
def pow_composite(x, y):
    return torch.exp(y * torch.log(x))


def rotation(v):
    """Rodrigues' formula with the axis normalised as roma does: v / |v|.clamp_min(tiny)."""
    theta = v.pow(2).sum().sqrt()
    x, y, z = (v / theta.clamp_min(1e-30)).unbind()
    zero = torch.zeros_like(x)
    k = torch.stack([zero, -z, y, z, zero, -x, -y, x, zero]).reshape(3, 3)
    return torch.eye(3, dtype=v.dtype) + torch.sin(theta) * k + (1 - torch.cos(theta)) * (k @ k)


rodrigues = ag.autograd_group("rodrigues")(rotation)
SQRT_AT_ZERO = ag.Subgradient(op="sqrt", when="result == 0", grad=0)


def _sinc_override(group, small_branch):
    @ag.special_case(group)
    def has_zero(ctx):
        return bool((ctx.inputs[0] == 0).any())

    @has_zero.backward
    def backward(ctx, grad):
        # From ctx.inputs only: the replacement is differentiated again at order 2.
        (x,) = ctx.inputs
        small = x.abs() < 1e-3
        safe = torch.where(small, torch.ones_like(x), x)
        exact = (safe * torch.cos(safe) - torch.sin(safe)) / (safe * safe)
        return grad * torch.where(small, small_branch(x), exact)


def _draws(*sizes):
    """Verify's fixed random numbers, in the order it draws them: the vector of its Hessian-vector
    products (one element per input element), then the projection of the outputs (unless the
    output is one number, weighted 1)."""
    generator = points.generator()
    return [torch.randn(n, generator=generator, dtype=torch.float64) for n in sizes]


def _only(report):
    (row,) = report.rows
    return row


def test_a_norm_at_zero_is_a_kink_where_the_subgradient_0_is_consistent() -> None:
    ag.register_rule("norm", SQRT_AT_ZERO)
    row = _only(ag.verify(norm, torch.zeros(3)))
    assert (row.status, row.point, row.rule_value, row.changed) == ("consistent", "kink", 0.0, 1)
    # The limits along d are the components of d / |d|: opposite for d and -d, within [-1, 1].
    assert -1 <= row.low < -0.05 and row.high == pytest.approx(-row.low, abs=1e-9)
    assert row.checked == 3 and row.input.startswith("v[")


def test_a_modules_forward_on_data_is_checked_at_the_modules_parameters() -> None:
    """A group on ``forward`` whose input is data: autograd differentiates the module's parameters,
    and the check takes them as its inputs, leaving the module's state as it was. Consistent where
    the rule is right (a distance's subgradient 0 at its centre), inconsistent where it is wrong (a
    rotation by a parameter at 0, whose gradient there is not 0)."""
    ag.register_rule("centred", SQRT_AT_ZERO)
    ag.register_rule("turned", SQRT_AT_ZERO)

    class Centred(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.centre = torch.nn.Parameter(torch.zeros(3, dtype=torch.float64))
            self.register_buffer("calls", torch.zeros(()))  # state a forward changes, as a batch norm's

        @ag.autograd_group("centred")
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.calls.add_(1)
            return ((x - self.centre) ** 2).sum().sqrt()

    class Turned(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.v = torch.nn.Parameter(torch.zeros(3, dtype=torch.float64))
            self.inner = torch.nn.Module()
            self.inner.v = self.v  # tied: read under its second name

        @ag.autograd_group("turned")
        def forward(self, weights: torch.Tensor) -> torch.Tensor:
            v = self.inner.v
            theta = (v * v).sum().sqrt()
            k = tc.hat(v / theta.clamp_min(1e-12))
            turn = torch.eye(3, dtype=weights.dtype) + torch.sin(theta) * k + (1 - torch.cos(theta)) * (k @ k)
            return (turn * weights).sum()

    # The data is no argument of ag.verify's function (whose arguments it differentiates too).
    centred, data = Centred(), torch.zeros(3, dtype=torch.float64)
    right = _only(ag.verify(lambda: centred(data)))
    assert (right.status, right.point, right.rule_value) == ("consistent", "kink", 0.0)
    assert right.input.startswith("self.centre[")
    assert float(centred.calls) == 1  # ag.verify's own call of the function: the check's runs leave it
    turned = Turned()
    weights = torch.randn(3, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    wrong = _only(ag.verify(lambda: turned(weights)))
    assert wrong.status == "inconsistent" and wrong.input.startswith("self.v[")


def test_a_group_that_reaches_a_modules_float32_weights_is_checked_in_float64() -> None:
    """The copies are float64; the weights the function closes over stay float32 and a matmul
    refuses the two: it is made again in float64 (a write into a float32 tensor is left alone)."""
    linear = torch.nn.Linear(3, 2)
    with torch.no_grad():
        linear.weight.zero_()
        linear.bias.zero_()

    @ag.autograd_group("norm_of_layer")
    def norm_of_layer(x):
        out = torch.zeros(2)
        out[:] = linear(x).pow(2).sum(0)
        return out.sum().sqrt()

    ag.register_rule("norm_of_layer", SQRT_AT_ZERO)
    row = _only(ag.verify(norm_of_layer, torch.ones(4, 3)))
    assert row.status == "consistent", row.reason
    assert linear.weight.dtype == torch.float32


def test_abs_as_sqrt_of_a_square_subgradient_0_is_consistent_and_an_override_giving_5_is_not() -> None:
    ag.register_rule("abs_sqrt", SQRT_AT_ZERO)
    row = _only(ag.verify(abs_sqrt, torch.zeros(1)))
    assert (row.status, row.point, row.rule_value) == ("consistent", "kink", 0.0)
    assert (row.low, row.high) == (pytest.approx(-1.0, abs=1e-9), pytest.approx(1.0, abs=1e-9))

    @ag.special_case("abs_five")
    def at_zero(ctx):
        return bool((ctx.inputs[0] == 0).any())

    @at_zero.backward
    def five(ctx, grad):
        (x,) = ctx.inputs
        return grad * torch.where(x == 0, 5.0, torch.sign(x))

    report = ag.verify(abs_five, torch.zeros(1))
    row = _only(report)
    assert not report.ok
    assert (row.status, row.point, row.rule, row.input, row.input_value) == (
        "inconsistent", "kink", "override(at_zero)", "x[0]", 0.0)
    assert (row.rule_value, row.high, row.difference) == (5.0, pytest.approx(1.0), pytest.approx(4.0))
    assert "abs_five#0" in str(report) and "inconsistent at a kink: at x[0] = 0, the rules give 5" in \
        " ".join(str(report).split())


def test_cos_of_a_norm_at_zero_is_consistent_at_order_1_and_not_at_order_2() -> None:
    ag.register_rule("cos_norm", SQRT_AT_ZERO)
    first = _only(ag.verify(cos_norm, torch.zeros(3)))
    assert (first.status, first.point, first.rule_value) == ("consistent", "smooth", 0.0)
    assert first.low == pytest.approx(0.0, abs=1e-9)
    second = _only(ag.verify(cos_norm, torch.zeros(3), order=2))
    # The Hessian of cos(|v|) is -I near 0; the rule's constant 0 has the second derivative 0.
    (k,) = second.index
    assert (second.status, second.point, second.order, second.rule_value) == (
        "inconsistent", "smooth", 2, 0.0)
    (vector,) = _draws(3)
    assert second.low == pytest.approx(-float(vector[k]), rel=1e-6)


def test_sinc_with_a_correct_override_is_consistent_at_orders_1_and_2() -> None:
    _sinc_override("sinc", lambda x: x * (x * x / 30 - 1 / 3))
    x = torch.tensor([0.0, 0.5, -2.0])
    first = _only(ag.verify(sinc, x))
    assert (first.status, first.point, first.input, first.rule_value) == ("consistent", "smooth", "x[0]", 0.0)
    second = _only(ag.verify(sinc, x, order=2))
    assert (second.status, second.point, second.input) == ("consistent", "smooth", "x[0]")
    vector, projection = _draws(3, 3)  # sinc''(0) = -1/3, and sinc acts elementwise
    assert second.rule_value == pytest.approx(-float(vector[0] * projection[0]) / 3, rel=1e-9)
    assert second.low == pytest.approx(second.rule_value, rel=1e-6)


def test_an_override_right_at_order_1_and_wrong_at_order_2_is_found_at_order_2() -> None:
    _sinc_override("sinc_flat", torch.zeros_like)  # slope 0 at 0, as sinc's, but no curvature
    x = torch.tensor([0.0, 0.5, -2.0])
    assert _only(ag.verify(sinc_flat, x)).status == "consistent"
    row = _only(ag.verify(sinc_flat, x, order=2))
    assert (row.status, row.input, row.rule_value) == ("inconsistent", "x[0]", 0.0)
    vector, projection = _draws(3, 3)
    assert row.low == pytest.approx(-float(vector[0] * projection[0]) / 3, rel=1e-6)


def test_rodrigues_with_the_axis_normalised_is_inconsistent_and_the_report_names_the_group() -> None:
    ag.register_rule("rodrigues", SQRT_AT_ZERO)
    report = ag.verify(lambda v: rodrigues(v)[0, 1], torch.zeros(3))
    row = _only(report)
    assert (report.ok, row.group, row.instance, row.status, row.point) == (
        False, "rodrigues", "rodrigues#0", "inconsistent", "smooth")
    assert "rodrigues#0" in str(report)


def test_a_with_block_is_checked_through_fn_with_the_exact_gradient_of_r01() -> None:
    ag.register_rule("rotation_block", SQRT_AT_ZERO)

    def r01(v):
        with ag.autograd_group("rotation_block"):
            out = rotation(v)
        return out[0, 1]

    row = _only(ag.verify(r01, torch.zeros(3)))
    # R[0, 1] = -v_z + O(|v|^2): the gradient at 0 is (0, 0, -1); the rule gives (0, 0, 0).
    assert (row.group, row.status, row.point, row.input, row.rule_value) == (
        "rotation_block", "inconsistent", "smooth", "v[2]", 0.0)
    assert row.low == pytest.approx(-1.0, abs=1e-6) and row.difference == pytest.approx(1.0, abs=1e-6)


def test_a_nan_safe_rule_is_checked_at_the_ops_it_fired_at() -> None:
    ag.register_rule("pow_composite", ag.NanSafe())
    row = _only(ag.verify(pow_composite, torch.tensor([0.0, 1.5]), torch.tensor([2.0, 3.0])))
    # x ** y at x = 0 (y > 1): both partial derivatives tend to 0; x < 0 leaves the domain.
    assert (row.rule, row.status, row.rule_value) == ("nan_safe", "consistent", 0.0)
    assert set(row.op.split(", ")) <= {"exp", "mul", "log"} and row.op


def test_verify_leaves_the_users_tensors_grads_random_generator_and_stats_alone() -> None:
    ag.register_rule("norm", SQRT_AT_ZERO)
    weight = torch.nn.Parameter(torch.zeros(3))
    x = torch.zeros(3, requires_grad=True)
    state = torch.get_rng_state()

    def fn(x):
        return norm(torch.nn.functional.dropout(x + weight, 0.5)) + norm(weight)

    report = ag.verify(fn, x)
    assert report.ok and [row.status for row in report.rows] == ["consistent", "consistent"]
    assert x.grad is None and weight.grad is None and x.eq(0).all() and weight.eq(0).all()
    assert torch.equal(torch.get_rng_state(), state)
    assert ag.stats() == {}  # its many runs of the groups are not counted


def test_max_instances_bounds_the_checks_and_rules_that_never_fired_get_a_row() -> None:
    ag.register_rule("norm", SQRT_AT_ZERO)
    ag.register_rule("norm", ag.NanSafe())

    def fn(v):
        return norm(v) + norm(2 * v) + norm(3 * v) + norm(v + 1)

    report = ag.verify(fn, torch.zeros(3), max_instances=2)
    rows = [(row.instance, row.rule, row.status, row.reason) for row in report.rows]
    assert rows == [
        ("norm#0", SQRT_AT_ZERO.label, "consistent", ""),
        ("norm#1", SQRT_AT_ZERO.label, "consistent", ""),
        ("", "nan_safe", "not checked", "no rule fired in its 4 instance(s)"),
        ("", SQRT_AT_ZERO.label, "not checked", "1 more instance(s) where it fired (max_instances=2)"),
    ]


def test_with_and_tag_groups_need_tensor_arguments_to_be_checked_through_fn() -> None:
    ag.register_rule("tagged", SQRT_AT_ZERO)
    v = torch.zeros(3, requires_grad=True)
    row = _only(ag.verify(lambda: ag.tag(ag.tag(v * v, "tagged").sum().sqrt(), "tagged")))
    assert row.status == "not checked" and "has no floating-point tensor argument" in row.reason
    row = _only(ag.verify(lambda v: ag.tag(ag.tag(v * v, "tagged").sum().sqrt(), "tagged"), v))
    assert (row.group, row.status, row.point) == ("tagged", "consistent", "kink")


def test_verify_refuses_what_it_cannot_check() -> None:
    with pytest.raises(GroupError, match="order must be 1 .gradients. or 2"):
        ag.verify(norm, torch.zeros(3), order=3)
    with pytest.raises(GroupError, match="max_instances must be a positive int"):
        ag.verify(norm, torch.zeros(3), max_instances=0)
    with pytest.raises(GroupError, match="returned no floating-point tensor that requires grad"):
        ag.verify(lambda x: 1.0, torch.zeros(3))

    def trains(x):
        loss = norm(x + 1)
        loss.backward()
        return loss

    with pytest.raises(GroupError, match="without calling backward"):
        ag.verify(trains, torch.zeros(3))


def test_the_table_fits_80_columns_and_the_report_converts_to_json() -> None:
    ag.register_rule("abs_sqrt", SQRT_AT_ZERO)
    ag.register_rule("norm", ag.NanSafe())
    report = ag.verify(lambda x: abs_sqrt(x).sum() + norm(x), torch.zeros(2))
    text = str(report)
    assert_fits(text, 80, ["abs_sqrt#0", "consistent", "norm (all instances)",
                           "1 consistent, 0 inconsistent, 1 not checked"])
    data = json.loads(json.dumps(report.to_json()))
    assert (data["ok"], data["order"], data["counts"]) == (
        True, 1, {"consistent": 1, "inconsistent": 0, "not checked": 1})
    assert data["rows"][0]["group"] == "abs_sqrt" and data["rows"][0]["point"] == "kink"


def test_verify_leaves_no_instance_or_rule_site_behind() -> None:
    # Rule sites hold nodes whose hooks hold the instances, and those the recorder: a cycle through
    # autograd's C++ graph that the cycle collector cannot free, unless verify cuts it.
    ag.register_rule("norm", SQRT_AT_ZERO)
    ag.register_rule("norm_block", SQRT_AT_ZERO)

    def fn(v):
        with ag.autograd_group("norm_block"):
            n = v.pow(2).sum().sqrt()
        return norm(v) + n

    def alive() -> int:
        gc.collect()
        return sum(isinstance(o, (GroupInstance, SiteHook)) for o in gc.get_objects())

    before = alive()
    for order, status in ((1, "consistent"), (2, "not checked")):  # a norm's curvature at 0: unbounded
        assert [row.status for row in ag.verify(fn, torch.zeros(3), order=order).rows] == [status] * 2
    assert alive() == before


def test_instances_carry_a_recorder_only_inside_verify() -> None:
    ag.register_rule("norm", SQRT_AT_ZERO)
    with ag.trace() as session:
        norm(torch.zeros(3, requires_grad=True)).backward()
    assert [i.recorder for i in session.instances] == [None]


T = torch.tensor(limits.STEPS, dtype=torch.float64)


@pytest.mark.parametrize(("sequence", "limit", "state"), [
    (1 + 3 * T, 1.0, limits.CONVERGED),
    (-2 + T * T, -2.0, limits.CONVERGED),
    (T.sqrt(), 0.0, limits.CONVERGED),  # a cusp's power law, Aitken's case
    (1 / T, math.inf, limits.DIVERGED),
    (-1 / T.sqrt(), -math.inf, limits.DIVERGED),
    (torch.sin(1 / T), None, limits.NO_LIMIT),
    (T.log(), None, limits.NO_LIMIT),  # grows, but too slowly to call infinite
    (torch.full_like(T, math.nan), None, limits.OUTSIDE),
], ids=["linear", "quadratic", "sqrt", "1/t", "-1/sqrt(t)", "sin(1/t)", "log t", "nan"])
def test_limits_of_known_sequences(sequence: torch.Tensor, limit: float | None, state: int) -> None:
    found = limits.estimate(sequence.view(1, -1, 1))
    assert int(found.state) == state
    if limit is not None:
        assert float(found.value) == pytest.approx(limit, abs=1e-9)


def _limits(values: list[list[float]], states: list[list[int]]) -> limits.Limits:
    value = torch.tensor(values, dtype=torch.float64)
    return limits.Limits(value, torch.zeros_like(value), torch.tensor(states, dtype=torch.int8),
                         torch.ones_like(value))


def test_compare_puts_a_rule_inside_the_range_of_the_limits_and_infinities_at_their_ends() -> None:
    c, d = limits.CONVERGED, limits.DIVERGED
    found = _limits([[1.0, math.inf, math.inf, math.inf, 2.0], [-1.0, -math.inf, 3.0, math.inf, 2.0]],
                    [[c, d, d, d, c], [c, d, c, d, c]])
    rule = torch.tensor([0.5, 7.0, 7.0, math.inf, math.nan])
    compared = limits.compare(rule, found, torch.ones(5, dtype=torch.bool))
    # inside [-1, 1]; anything finite between -inf and inf; a finite value where the limits are
    # 3 and +inf along the directions is not judged; inf equals the limit inf; NaN never agrees.
    assert compared.checked.tolist() == [True, True, False, True, True]
    assert compared.unbounded.tolist() == [False, False, True, False, False]
    assert compared.inconsistent.tolist() == [False, False, False, False, True]
    assert compared.kind == "cusp"

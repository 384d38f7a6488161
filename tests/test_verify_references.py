"""``ag.verify`` where the automatic gradient has no usable limit: against finite differences of the
function's value where the plain composite's gradient is NaN on a whole neighbourhood (a NaN-safe
Lennard-Jones energy with padding atoms at one point, a cross-entropy against a masked softmax), and
at a kink whose nearby points are themselves special along some directions (the angle between
parallel vectors). A right rule is consistent, a wrong one in the same setting inconsistent.

The expected gradients are analytic: the Lennard-Jones forces, ``p - t`` for the cross-entropy."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import autograd_groups as ag
from autograd_groups.verify.points import point_of, same_values
from autograd_groups.verify.verdict import CONSISTENT, DIFFERENCES, FLOAT64, INCONSISTENT, LIMITS, explain
from autograd_groups.verify.verify import ROUNDING, Fired, _in_float64

F64 = torch.float64


def lennard_jones(pos: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """4 (r^-12 - r^-6) over the pairs of real atoms: the self pairs and the padding atoms (all at
    one point) masked out with a ``where``, so that every distance they have is 0."""
    r = (pos[:, None, :] - pos[None, :, :]).pow(2).sum(-1).sqrt()
    keep = real[:, None] & real[None, :] & ~torch.eye(len(pos), dtype=torch.bool)
    energy = 4 * ((1 / r).pow(12) - (1 / r).pow(6))
    return torch.where(keep, energy, torch.zeros_like(energy)).sum() / 2


def cross_entropy(z: torch.Tensor, t: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """-sum t log softmax(z), the masked classes at -inf: ``xlogy(0, 0)`` there."""
    return -torch.xlogy(t, torch.softmax(z.masked_fill(mask, -torch.inf), -1)).sum()


def angle(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.acos(F.cosine_similarity(a, b, dim=-1))


ATOMS = torch.tensor([[0.0, 0.0, 0.0], [1.1, 0.0, 0.0], [0.0, 1.2, 0.0], [0.1, 0.3, 1.15],
                      [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]], dtype=F64)
REAL = torch.tensor([True, True, True, True, False, False])
LOGITS = torch.tensor([[0.5, -1.0, 2.0, 0.3], [1.0, 0.2, -0.4, 0.0]], dtype=F64)
TARGET = torch.tensor([[0.7, 0.0, 0.3, 0.0], [0.0, 1.0, 0.0, 0.0]], dtype=F64)
MASK = torch.tensor([[False, True, False, False], [False, False, True, True]])


@pytest.fixture(autouse=True)
def one_thread():
    """Each check runs these small functions hundreds of times: on a shared machine, torch's
    intra-op threads only wait for each other (the softmax of 8 numbers took 20 ms)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _fired(report: ag.Report) -> ag.Row:
    (row,) = [row for row in report.rows if row.instance and not row.scope]
    return row


def _forces(pos: torch.Tensor) -> torch.Tensor:
    """-dE/dpos of the real atoms' Lennard-Jones energy, analytically."""
    d = pos[:, None, :] - pos[None, :, :]
    r = d.norm(dim=-1).fill_diagonal_(1.0)
    du = 4 * (-12 * r ** -13 + 6 * r ** -7)
    keep = (REAL[:, None] & REAL[None, :]).fill_diagonal_(False)
    return -(torch.where(keep, du / r, 0.0)[..., None] * d).sum(1)


def test_the_plain_lennard_jones_gradient_is_nan_on_a_whole_neighbourhood() -> None:
    """The premise: every nearby point has the self pairs, so no limit of the automatic gradient."""
    nearby = (ATOMS + 1e-3 * torch.randn(ATOMS.shape, generator=torch.Generator().manual_seed(0),
                                         dtype=F64)).requires_grad_()
    (grad,) = torch.autograd.grad(lennard_jones(nearby, REAL), nearby)
    assert bool(grad.isnan().all())


def test_a_nan_safe_lennard_jones_energy_is_consistent_against_finite_differences() -> None:
    with ag.registry_scope():
        ag.register_rule("lj", ag.NanSafe())
        energy = ag.autograd_group("lj")(lennard_jones)
        pos = ATOMS.clone().requires_grad_()
        (grad,) = torch.autograd.grad(energy(pos, REAL), pos)
        torch.testing.assert_close(grad, -_forces(ATOMS), rtol=1e-12, atol=1e-12)
        row = _fired(ag.verify(energy, ATOMS, REAL))
    assert (row.status, row.point, row.reference) == (CONSISTENT, "smooth", DIFFERENCES)
    assert row.differences == row.checked == ATOMS.numel()
    assert "checked against finite differences of the function's value" in row.reason
    json_row = ag.Report([row], 1).to_json()["rows"][0]
    assert (json_row["reference"], json_row["differences"]) == (DIFFERENCES, ATOMS.numel())


def test_a_wrong_rule_on_the_same_lennard_jones_energy_is_inconsistent() -> None:
    """A subgradient that fires at every distance below 1.2 zeroes real forces too."""
    with ag.registry_scope():
        ag.register_rule("lj_wrong", ag.Subgradient(op="sqrt", when="result < 1.2", grad=0))
        row = _fired(ag.verify(ag.autograd_group("lj_wrong")(lennard_jones), ATOMS, REAL))
    assert (row.status, row.reference) == (INCONSISTENT, DIFFERENCES)
    assert row.difference is not None and row.difference > 0.1
    # The reference it gives is the exact derivative of the projection; here it is an atom's force
    # component weighted by the one output's weight 1.
    flat = row.index[0] * 3 + row.index[1]
    assert row.low == pytest.approx(float(-_forces(ATOMS).reshape(-1)[flat]), rel=1e-6)


def test_an_xlogy_subgradient_is_checked_against_finite_differences_both_ways() -> None:
    with ag.registry_scope():
        ag.register_rule("ce", ag.Subgradient(op="xlogy", when="self == 0", grad=0, input=1))
        right = ag.autograd_group("ce")(cross_entropy)
        z = LOGITS.clone().requires_grad_()
        (grad,) = torch.autograd.grad(right(z, TARGET, MASK), z)
        p = torch.softmax(LOGITS.masked_fill(MASK, -torch.inf), -1)
        torch.testing.assert_close(grad, p - TARGET, rtol=1e-12, atol=1e-12)
        # In the logits alone (the target a constant), as a training step differentiates it.
        row = _fired(ag.verify(lambda z: right(z, TARGET, MASK), LOGITS))
        assert (row.status, row.point, row.reference) == (CONSISTENT, "smooth", DIFFERENCES)
        # Wrong: five times the incoming gradient where the target is 0 (p > 0 there too).
        ag.register_rule("ce_five", ag.Subgradient(op="xlogy", when="self == 0", grad="5 * grad", input=1))
        five = ag.autograd_group("ce_five")(cross_entropy)
        row = _fired(ag.verify(lambda z: five(z, TARGET, MASK), LOGITS))
        assert (row.status, row.reference) == (INCONSISTENT, DIFFERENCES)
        # Wrong too, in the target: 0 to it as well, where d/dt is -log p.
        ag.register_rule("ce_both", ag.Subgradient(op="xlogy", when="self == 0", grad=0))
        row = _fired(ag.verify(ag.autograd_group("ce_both")(cross_entropy), LOGITS, TARGET, MASK))
    assert (row.status, row.reference, row.input[:1]) == (INCONSISTENT, DIFFERENCES, "t")
    assert row.rule_value == 0.0 and row.low is not None and abs(row.low) > 0.1


def _parallel_rows(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    a = torch.randint(-3, 4, (4, 3), generator=g).to(F64)
    b = torch.randint(-3, 4, (4, 3), generator=g).to(F64)
    b[0], b[1] = 2 * a[0], -a[1]  # parallel, antiparallel
    return a, b


def test_the_angle_at_parallel_and_antiparallel_rows_is_a_consistent_kink() -> None:
    """Seeds 2 and 5 have rows whose nearby cosines round to exactly +-1 at small steps along some
    directions: those samples are the special point's rounding, and are left out."""
    with ag.registry_scope():
        ag.register_rule("angle", ag.Subgradient(op="acos", when="abs(self) == 1", grad=0))
        grouped = ag.autograd_group("angle")(angle)
        for seed in (2, 5):
            a, b = _parallel_rows(seed)
            special = F.cosine_similarity(a, b, dim=-1).abs() == 1
            assert bool(special[1]) and not bool(special[2:].any())
            row = _fired(ag.verify(grouped, a, b))
            assert (row.status, row.point, row.reference) == (CONSISTENT, "kink", LIMITS), row.reason
            assert row.checked == 6 * int(special.sum())  # each special row of a and of b


def test_a_wrong_acos_rule_at_the_same_rows_is_inconsistent() -> None:
    """Any value at the acos of exactly parallel rows meets d cos / da = 0 there, so a wrong rule
    shows where it also fires away from them: abs(self) > 0.2 zeroes a smooth row's gradient."""
    with ag.registry_scope():
        ag.register_rule("angle_wrong", ag.Subgradient(op="acos", when="abs(self) > 0.2", grad=0))
        a, b = _parallel_rows(5)
        row = _fired(ag.verify(ag.autograd_group("angle_wrong")(angle), a, b))
    assert (row.status, row.reference) == (INCONSISTENT, LIMITS)
    assert row.index[0] >= 2 and row.rule_value == 0.0


def _masked_ce(z: torch.Tensor, t: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return -torch.xlogy(t, torch.softmax(z.masked_fill(mask, float("-inf")), -1)).sum()


_CE_POINT = (torch.tensor([[0.3, -1.0, 2.0, 0.5]], dtype=torch.float64),
             torch.tensor([[0.2, 0.8, 0.0, 0.0]], dtype=torch.float64),
             torch.tensor([[False, False, False, True]]))


def test_a_nan_safe_rule_whose_values_a_zero_factor_takes_is_checked_where_it_made_it_finite() -> None:
    """A NaN-safe cross-entropy against a masked softmax: the rule's 0 at the masked class meets
    that class's probability, exactly 0, on the way to the logits, so no value it sets reaches an
    input gradient; the input gradient it made finite (the plain composite's is NaN) is compared."""
    with ag.registry_scope():
        ag.register_rule("ref.masked_ce", ag.NanSafe())
        (row,) = [r for r in ag.verify(ag.autograd_group("ref.masked_ce")(_masked_ce), *_CE_POINT).rows
                  if r.instance]
    # The plain composite's gradient is NaN at the three unmasked logits, and nearby too: they are
    # compared with finite differences of the value.
    assert (row.status, row.checked, row.reference) == (CONSISTENT, 3, DIFFERENCES)
    assert row.reason.endswith("an exact zero factor on the way takes what the rule set (0 · x = 0)")
    z, t, mask = _CE_POINT
    p = torch.softmax(z.masked_fill(mask, float("-inf")), -1)
    assert row.rule_value == pytest.approx(float((p - t)[tuple(row.index)]))


def test_a_wrong_gradient_where_a_nan_safe_rule_made_it_finite_is_inconsistent() -> None:
    """The same cross-entropy with a wrong rule beside the NaN-safe one (softmax's gradient zeroed
    wherever a probability is positive): the input gradient the NaN-safe rule made finite is wrong
    there, and its row says so."""
    with ag.registry_scope():
        ag.register_rule("ref.masked_ce_wrong", ag.NanSafe())
        ag.register_rule("ref.masked_ce_wrong", ag.Subgradient(op="softmax", when="result > 0", grad=0))
        rows = [r for r in ag.verify(ag.autograd_group("ref.masked_ce_wrong")(_masked_ce), *_CE_POINT).rows
                if r.instance and r.kind == "nan_safe"]
    assert [r.status for r in rows] == [INCONSISTENT]


def _masked_ce_beside(z: torch.Tensor, w: torch.Tensor, big: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The masked cross-entropy and, beside it, a large output that ``z`` does not move."""
    t = torch.tensor([[0.2, 0.8, 0.0, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[False, False, False, True]])
    return -torch.xlogy(t, torch.softmax(z.masked_fill(mask, float("-inf")), -1)).sum(), w * big


@pytest.mark.parametrize("grad, big, status", [
    ("0", 1e9, CONSISTENT), ("5 * grad", 1e9, INCONSISTENT),
    ("0", 1e12, "not checked"), ("5 * grad", 1e12, "not checked")])
def test_a_large_output_beside_the_loss_neither_hides_nor_fakes_a_finite_difference(
        grad: str, big: float, status: str) -> None:
    """Finite differences take each output's change on its own: an output the logits do not move
    adds no rounding to theirs. Where one is so large that even the slope it could hide below half
    an ulp is not small beside the change, the elements are not checked, rather than called
    consistent within that rounding whatever the rule gives."""
    z = torch.tensor([[0.3, -1.0, 2.0, 0.5]], dtype=torch.float64)
    with ag.registry_scope():
        ag.register_rule("ref.ce_beside", ag.Subgradient(op="xlogy", when="self == 0", grad=grad, input=1))
        fn = ag.autograd_group("ref.ce_beside")(_masked_ce_beside)
        (row,) = ag.verify(fn, z, torch.tensor(1.0, dtype=torch.float64), big).rows
    assert row.status == status, row.reason
    if status != "not checked":
        assert row.reference == DIFFERENCES
    else:
        assert row.reason.endswith("finite differences of the function's value are lost in its "
                                   "rounding (an output far larger than its change)")


def _softplus(z: torch.Tensor) -> torch.Tensor:
    return torch.where(z < 20, torch.log1p(torch.exp(z)), z)


_OVERFLOWS = torch.tensor([0.5, 3.0, 100.0])  # exp(100) is inf in float32 only


def test_a_rule_at_a_point_special_only_in_float32_is_checked_against_float64() -> None:
    """A NaN-safe softplus whose untaken branch overflows float32: in float64 the plain composite is
    finite there and the rule changes nothing; in float32 the rule's gradient must be float64's."""
    with ag.registry_scope():
        ag.register_rule("ref.softplus", ag.NanSafe())
        fn = ag.autograd_group("ref.softplus")(lambda z: _softplus(z).sum())
        (row,) = ag.verify(fn, _OVERFLOWS).rows
    # The untaken branch's slope is 1 at z = 100: the rule's value in float32, and float64's.
    assert (row.status, row.reference, row.checked, row.index) == (CONSISTENT, FLOAT64, 1, [2])
    assert (row.low, row.rule_value) == (1.0, 1.0)
    assert "of float64 copies, where the point is not special" in explain(row)


def test_a_rule_that_float64_never_needs_is_checked_against_float64() -> None:
    """An untaken branch that overflows float32 and whose product with the branch's zero gradient
    is all there is: in float64 the NaN-safe group has no node to guard at all, and in float32 the
    rule's gradient must be float64's (0 at z = 100)."""
    with ag.registry_scope():
        ag.register_rule("ref.cut_exp", ag.NanSafe())
        fn = ag.autograd_group("ref.cut_exp")(
            lambda z: torch.where(z < 80, torch.exp(z), torch.zeros_like(z)).sum())
        (row,) = ag.verify(fn, torch.tensor([1.0, 100.0])).rows
    assert (row.status, row.reference, row.checked, row.index) == (CONSISTENT, FLOAT64, 1, [1])
    assert (row.low, row.rule_value) == (0.0, 0.0)


def test_a_rule_value_other_than_float64s_is_inconsistent() -> None:
    """The comparison itself, given a float64 derivative that is not the rule's: the NaN-safe
    softplus's slope 1 at z = 100 against a float64 value of 0.5 there."""
    with ag.registry_scope():
        ag.register_rule("ref.softplus_cmp", ag.NanSafe())
        fn = ag.autograd_group("ref.softplus_cmp")(lambda z: _softplus(z).sum())
        with ag.trace() as session:
            fn(_OVERFLOWS.clone().requires_grad_()).backward()
        (instance,) = session.instances
        rule = instance.rules.rules[0]
        fired = Fired(instance, rule, 1, "exp", instance.where)
        wide = point_of(fn, [_OVERFLOWS], {}, lambda t: True)
        recorded = point_of(fn, [_OVERFLOWS], {}, lambda t: True, dtype=None)
        right = _in_float64(fired, 1, wide, recorded, torch.tensor([0.62, 0.95, 1.0], dtype=torch.float64))
        wrong = _in_float64(fired, 1, wide, recorded, torch.tensor([0.62, 0.95, 0.5], dtype=torch.float64))
        # An infinite slope elsewhere (a sqrt at 0 beside it) widens nothing.
        beside = _in_float64(fired, 1, wide, recorded,
                             torch.tensor([0.62, math.inf, 0.5], dtype=torch.float64))
    assert right is not None and wrong is not None and beside is not None
    assert (right.status, wrong.status, wrong.index, wrong.rule_value) == (CONSISTENT, INCONSISTENT, [2], 1.0)
    assert (beside.status, beside.tolerance) == (INCONSISTENT, wrong.tolerance)


@pytest.mark.parametrize("rule, fn, point", [
    # A length whose squares underflow float32: 0 there, not at its float64 copies.
    (ag.Subgradient(op="sqrt", when="result == 0", grad=0), lambda v: v.pow(2).sum().sqrt(),
     torch.tensor([1e-23, 0.0])),
    # exp(-z) underflows and exp(z) overflows float32: the value is NaN there, 111 in float64.
    (ag.NanSafe(), lambda z: (torch.exp(-z) * torch.exp(z) + z).sum(), torch.tensor([1.0, 110.0]))])
def test_a_rule_at_a_point_that_float32_moves_is_not_checked(rule: ag.Rule, fn, point: torch.Tensor) -> None:
    """Where float32's range changes the function's value, its float64 copies are another point: the
    rule is right or wrong for float32's point, and float64 does not tell which."""
    with ag.registry_scope():
        ag.register_rule("ref.moved", rule)
        (row,) = ag.verify(ag.autograd_group("ref.moved")(fn), point).rows
    assert row.status == "not checked" and row.reason.endswith(ROUNDING[ROUNDING.index(" (a special"):])


@pytest.mark.parametrize("fn, point, same", [
    (lambda z: _softplus(z).sum(), _OVERFLOWS, True),
    (lambda z: (torch.exp(-z) * torch.exp(z) + z).sum(), torch.tensor([1.0, 110.0]), False),
    (lambda v: v.pow(2).sum().sqrt(), torch.tensor([1e-23, 0.0]), False)])
def test_a_function_has_the_same_values_in_float32_only_where_float32_keeps_them(fn, point: torch.Tensor,
                                                                                 same: bool) -> None:
    """Where an overflow is only in a branch left out, float32's value is float64's rounded; where
    float32 underflows or overflows into the value itself, it is another."""
    wide = point_of(fn, [point], {}, lambda t: True)
    narrow = point_of(fn, [point], {}, lambda t: True, dtype=None)
    assert same_values(wide, narrow) is same


def test_a_with_block_at_a_point_special_only_in_float32_says_so() -> None:
    """Checked through the whole function, the softplus's rule is not compared with float64 (other
    rules may act there too), and the reason says why."""
    def fn(z: torch.Tensor) -> torch.Tensor:
        with ag.autograd_group("ref.softplus_block"):
            return _softplus(z).sum()

    with ag.registry_scope():
        ag.register_rule("ref.softplus_block", ag.NanSafe())
        (row,) = ag.verify(fn, _OVERFLOWS).rows
    assert (row.status, row.reason) == ("not checked", ROUNDING)


@pytest.mark.parametrize("grad, wrong", [("5 * grad", True), ("0", False)])
def test_a_minus_infinity_in_an_input_leaves_the_other_elements_their_limits(grad: str, wrong: bool) -> None:
    """Logits masked with -inf as given: the random directions are scaled by the finite entries,
    so a subgradient at a kink is judged against the limits, not left to finite differences; the
    masked entries themselves cannot be checked, and the row says so."""
    z = torch.tensor([[0.3, -0.2, -math.inf], [1.0, 0.5, -math.inf]])
    t = torch.softmax(z, -1)
    t[1, 0] += 0.1  # the first row's elements sit at |p - t| = 0: a kink

    with ag.registry_scope():
        ag.register_rule("ref.l1_masked", ag.Subgradient(op="abs", when="self == 0", grad=grad))
        fn = ag.autograd_group("ref.l1_masked")(lambda z, t: (torch.softmax(z, -1) - t).abs().sum())
        (row,) = ag.verify(fn, z, t).rows
    if wrong:
        assert (row.status, row.reference) == (INCONSISTENT, LIMITS)
    else:
        assert (row.status, row.reference) == ("not checked", LIMITS)
        assert row.reason.startswith("2 of the 8 elements it reaches cannot be checked, e.g. z[0, 2]")
        assert row.reason.endswith("it is consistent at the other 6")


def test_a_rule_at_a_float64_point_is_not_checked_against_itself() -> None:
    """The same NaN-safe softplus given float64 inputs: nothing overflows, the rule changes nothing,
    and there is no narrower dtype to check it in."""
    with ag.registry_scope():
        ag.register_rule("ref.softplus64", ag.NanSafe())
        fn = ag.autograd_group("ref.softplus64")(lambda z: _softplus(z).sum())
        (row,) = ag.verify(fn, _OVERFLOWS.double()).rows
    assert (row.status, row.reason) == ("not checked", "no rule fired in its 1 instance(s)")

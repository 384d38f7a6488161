"""NaN-safe sites decided from the graph's structure (issue 30, autograd_groups/finiteness.py): per
op class, which nodes are hooked with no value read (as on a GPU), and what that gives at a value
where the plain backward keeps the zeros and at a hostile one where it does not; each assumption of
docs/groups.md ("Where the hooks go") held and broken."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import pytest
import torch

import autograd_groups as ag
from autograd_groups import finiteness, host_reads
from autograd_groups.groups import lifecycle

INF = float("inf")
Op = Callable[[torch.Tensor], torch.Tensor]


@pytest.fixture(autouse=True)
def _rule() -> Iterator[None]:
    with ag.registry_scope():
        ag.register_rule("fin", ag.NanSafe())
        yield


def _sites(fn: Callable[..., torch.Tensor], *args: torch.Tensor) -> list[str]:
    """The ops of the group's NaN-safe sites in one call of ``fn``."""
    with ag.trace() as t:
        fn(*args)
    return sorted(data["op"] for instance in t.instances for _, data in instance.graph.nodes(data=True)
                  if any(r["kind"] == "nan_safe" for r in data.get("rules", ())))


def _grads(fn: Callable[..., torch.Tensor], *args: torch.Tensor) -> tuple[torch.Tensor, ...]:
    leaves = [a.detach().requires_grad_() for a in args]
    return torch.autograd.grad(fn(*leaves).sum(), leaves)


# Per op class: the op, the ops the structure hooks (no value read), a value where the plain
# backward keeps a zero gradient and one where it turns it into NaN.
# The op's result is selected away by a where, so the gradient flowing into it is 0.
CASES: dict[str, tuple[Op, list[str], float, float]] = {
    "log": (torch.log, ["log"], 2.0, 0.0),
    "sqrt of a value": (torch.sqrt, ["sqrt"], 2.0, 0.0),
    "rsqrt": (torch.rsqrt, ["rsqrt"], 2.0, 0.0),
    "reciprocal": (torch.reciprocal, ["reciprocal"], 2.0, 0.0),
    "div by a tensor": (lambda x: (x + 1) / x, ["div"], 2.0, 0.0),
    "pow 0.5": (lambda x: x ** 0.5, ["pow"], 2.0, 0.0),
    "pow -1": (lambda x: x ** -1, ["pow"], 2.0, 0.0),
    "acos": (torch.acos, ["acos"], 0.5, 1.0),
    "asin": (torch.asin, ["asin"], 0.5, 1.0),
    "atanh": (torch.atanh, ["atanh"], 0.5, 1.0),
    "exp": (lambda x: torch.exp(x) * x, ["exp", "mul"], 1.0, 100.0),  # exp(100) overflows float32
    # Products of finite inputs: no hook, and no hostile finite value exists (the assumptions'
    # tests break them with an infinite input).
    "mul": (lambda x: x * x, [], 2.0, 2.0),
    "sin": (torch.sin, [], 2.0, 2.0),
    "cos": (torch.cos, [], 2.0, 2.0),
    "tanh": (torch.tanh, [], 2.0, 2.0),
    "sigmoid": (torch.sigmoid, [], 2.0, 2.0),
    "pow 2": (lambda x: x ** 2, [], 2.0, 2.0),
    "div by a number": (lambda x: x / 6, [], 2.0, 2.0),
    # Only the root, singular at 0: sin of it is finite.
    "sqrt of a sum of squares": (lambda x: torch.sqrt(torch.stack([x * x, x * x]).sum(0)).sin(), ["sqrt"],
                                 2.0, 0.0),
}


def _selected_away(op: Op) -> Callable[[torch.Tensor], torch.Tensor]:
    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.where(torch.tensor([False, True]), x, op(x))
    return f


@pytest.mark.parametrize("name", CASES)
def test_the_structure_hooks_an_op_exactly_where_a_zero_can_meet_an_infinity(name: str) -> None:
    op, expected, benign, hostile = CASES[name]
    hooked = bool(expected)
    plain = _selected_away(op)
    grouped = ag.autograd_group("fin")(plain)
    for value, keeps in ((benign, True), (hostile, not hooked)):
        x = torch.tensor([0.25, value])  # op(x) is used at 0.25 and selected away at value
        with host_reads.off():
            sites = _sites(grouped, x.clone().requires_grad_())
            (got,) = _grads(grouped, x)
        assert sites == expected, (name, sites)
        (want,) = _grads(plain, x)
        # The release's own backward: zeros kept at the benign value; at the hostile one asked, not assumed.
        if keeps:
            assert want[1].item() == 1.0, (name, value, want)
        assert got[1].item() == 1.0 and got[0].isfinite(), (name, value, got)
        torch.testing.assert_close(got[0], want[0])
    if hooked:
        (want,) = _grads(plain, torch.tensor([0.25, hostile]))
        assert not want[1].isfinite() or want[1].item() == 1.0  # NaN where this release makes one


def test_a_product_zeroes_only_the_gradient_its_non_finite_factor_multiplies() -> None:
    # p * log(p): log p may be -inf, p is a group input. Only p's gradient through the product is
    # zeroed there; log p's (grad * p) needs none.
    @ag.autograd_group("fin")
    def entropy(p: torch.Tensor) -> torch.Tensor:
        return torch.where(p > 0, p * torch.log(p), 0.0)

    p = torch.tensor([0.0, 0.5], requires_grad=True)
    product = entropy(p).grad_fn.next_functions[0][0]
    tokens = finiteness.tokens_of([entropy(p).grad_fn])
    found = finiteness.sites(tokens, 1)
    assert sorted(found.values(), key=str) == [(0,), None]  # mul: input 0 (p's); log: all
    assert type(product).__name__ == "MulBackward0"
    with host_reads.off():
        (grad,) = _grads(entropy, p)
    torch.testing.assert_close(grad, torch.tensor([0.0, 1.0 + torch.log(torch.tensor(0.5)).item()]))


def test_the_decision_is_made_once_per_structure() -> None:
    made = []
    decide = finiteness._decide

    def counted(*args: object) -> finiteness.Plan:
        made.append(1)
        return decide(*args)  # type: ignore[arg-type]

    grouped = ag.autograd_group("fin")(lambda x, k: torch.where(x > 0, torch.log(x) * k, 0.0))
    finiteness._plans.clear()
    finiteness._decide = counted  # type: ignore[assignment]
    try:
        for _ in range(3):
            grouped(torch.rand(4, requires_grad=True), 2.0)
        assert len(made) == 1
        grouped(torch.rand(4, requires_grad=True), torch.rand(4, requires_grad=True))  # another edge
        grouped(torch.rand(4, 3, requires_grad=True), 2.0)  # another shape, the same structure
        assert len(made) == 2
    finally:
        finiteness._decide = decide  # type: ignore[assignment]


# --- the assumptions, held and broken ---------------------------------------------------------


def _zero_gradient_of_y(make: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], x: torch.Tensor,
                        reads: bool) -> torch.Tensor:
    """y's gradient through ``where(keep, x, make(x, y))`` selected away: 0 under NaN-safe."""
    grouped = ag.autograd_group("fin")(lambda a, b: torch.where(torch.ones_like(a, dtype=torch.bool), a,
                                                               make(a, b)))
    y = torch.ones_like(x)
    if reads:
        return _grads(grouped, x, y)[1]
    with host_reads.off():
        return _grads(grouped, x, y)[1]


def test_assumed_finite_group_inputs() -> None:
    # x * y saves x for y's gradient: finite by assumption, so no hook without a value read.
    assert torch.equal(_zero_gradient_of_y(torch.mul, torch.tensor([2.0]), reads=False), torch.zeros(1))
    # Broken: an infinite input gives the plain formula's 0 * inf, on the CPU as on a GPU (the CPU
    # read only clears nodes the structure hooks).
    for reads in (False, True):
        assert _zero_gradient_of_y(torch.mul, torch.tensor([INF]), reads).isnan().all()


def test_a_factor_that_needs_no_gradient_is_not_assumed_finite() -> None:
    """A product's factor made without autograd (a constant, or ``log`` of a value that needs no
    gradient) has no node to tell what made it: the product is hooked, so even an infinite one
    gives the rule's 0, with the CPU's reads on and off (what a GPU runs)."""
    def by_constant(value: float) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
        return lambda a, b: b * torch.full_like(a, value)  # a constant: it needs no gradient

    for reads in (False, True):
        assert torch.equal(_zero_gradient_of_y(by_constant(3.0), torch.tensor([2.0]), reads), torch.zeros(1))
        assert torch.equal(_zero_gradient_of_y(by_constant(INF), torch.tensor([2.0]), reads), torch.zeros(1))


def test_exp_of_y_log_x_in_y_at_a_constant_zero_x() -> None:
    """``exp(y · log x)`` in ``y`` with ``x = 0`` needing no gradient: ``log x = -inf`` is made
    without autograd, and the rule's gradient 0 (exact: ``0 ** y = 0``) holds with reads on and off."""
    ag.register_rule("fin.pow", ag.NanSafe())
    power = ag.autograd_group("fin.pow")(lambda x, y: torch.exp(y * torch.log(x)))
    for reads in (False, True):
        y = torch.tensor([1.0, 2.0], requires_grad=True)
        with contextlib.ExitStack() as stack:
            if not reads:
                stack.enter_context(host_reads.off())
            (grad,) = torch.autograd.grad(power(torch.zeros(2), y).sum(), y)
        assert torch.equal(grad, torch.zeros(2))


def test_assumed_no_overflow_in_a_product_but_in_exp() -> None:
    def square_times_y(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return (a * a) * b  # (a * a) is saved for b's gradient

    def exp_times_y(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.exp(a) * b

    assert torch.equal(_zero_gradient_of_y(square_times_y, torch.tensor([1e10]), False), torch.zeros(1))
    # Broken: 1e30 ** 2 overflows float32, and the structure trusts the product.
    for reads in (False, True):
        assert _zero_gradient_of_y(square_times_y, torch.tensor([1e30]), reads).isnan().all()
    # exp overflows from ordinary inputs: its result counts as possibly infinite, read or not.
    for x in (torch.tensor([1.0]), torch.tensor([100.0])):
        assert torch.equal(_zero_gradient_of_y(exp_times_y, x, False), torch.zeros(1))


def test_a_root_of_a_value_of_unknown_sign_is_not_trusted() -> None:
    # sqrt(x) of a negative x is NaN: sin of it is hooked; sqrt of a square's sum is not.
    def sine_of_root(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.sin(torch.sqrt(a)) * b

    with host_reads.off():
        sites = _sites(ag.autograd_group("fin")(sine_of_root), torch.tensor([-1.0], requires_grad=True),
                       torch.ones(1, requires_grad=True))
    assert "sin" in sites
    assert torch.equal(_zero_gradient_of_y(sine_of_root, torch.tensor([-1.0]), False), torch.zeros(1))


# --- nested groups ----------------------------------------------------------------------------


def test_a_nested_norm_and_atan2_need_no_hook_of_the_enclosing_group() -> None:
    def angle(p0: torch.Tensor, p1: torch.Tensor) -> torch.Tensor:
        cross = torch.linalg.cross(p0, p1)
        return ag.ops.atan2(ag.ops.vector_norm(cross, dim=-1), (p0 * p1).sum(-1))

    grouped = ag.autograd_group("fin")(angle)
    p0 = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
    p1 = torch.tensor([[1.0, 0.0, 0.0], [1.0, 0.0, 0.0]])  # a zero cross product in row 0
    with host_reads.off():
        assert _sites(grouped, p0.clone().requires_grad_(), p1.clone().requires_grad_()) == []
        got = _grads(grouped, p0, p1)
    native = _grads(lambda a, b: torch.atan2(torch.linalg.vector_norm(torch.linalg.cross(a, b), dim=-1),
                                             (a * b).sum(-1)), p0, p1)
    for g, w in zip(got, native):
        torch.testing.assert_close(g, w)


def test_a_nested_root_without_its_rule_is_hooked_by_the_enclosing_group() -> None:
    grouped = ag.autograd_group("fin")(lambda x: torch.sqrt((x * x).sum(-1)))
    inner = ag.autograd_group("fin")(lambda x: ag.ops.vector_norm(x, dim=-1))
    x = torch.zeros(1, 3, requires_grad=True)
    with host_reads.off():
        assert _sites(grouped, x) == ["sqrt"]
        assert _sites(inner, x) == []
        with ag.special_cases(False, groups=["ops.vector_norm"]):
            assert _sites(inner, x) == ["sqrt"]


def test_a_tagged_node_without_a_structure_is_hooked_where_it_may_make_nan() -> None:
    assert lifecycle.install_rules is not None  # the tagged path passes no sites: every such node
    x = torch.tensor([0.0, 1.0], requires_grad=True)
    y = ag.tag(torch.log(x), "fin")
    (grad,) = torch.autograd.grad(torch.where(x > 0, y, 0.0).sum(), x)
    assert grad.isfinite().all()


def test_assumed_on_at_backward_a_nested_rule_the_forward_saw_on() -> None:
    # The enclosing group trusts ops.vector_norm's sqrt rule, decided at forward. Turned off for
    # the backward alone, the root's 0 / 0 reaches the enclosing group unguarded.
    grouped = ag.autograd_group("fin")(lambda x: torch.where(torch.zeros((), dtype=torch.bool), 1.0,
                                                             ag.ops.vector_norm(x, dim=-1)) * 0.0)
    for off, finite in ((False, True), (True, False)):
        x = torch.zeros(1, 3, requires_grad=True)
        out = grouped(x).sum()
        with ag.special_cases(not off, during="backward", groups=["ops.vector_norm"]):
            (grad,) = torch.autograd.grad(out, x)
        assert bool(grad.isfinite().all()) is finite, (off, grad)


def test_under_checkpoint_no_saved_number_is_unpacked_at_forward() -> None:
    from torch.utils.checkpoint import checkpoint

    grouped = ag.autograd_group("fin")(lambda x: torch.where(x > 0, torch.log(x) * (x / 6), 0.0))
    x = torch.tensor([0.0, 1.0, 2.0])
    (want,) = _grads(grouped, x)
    (got,) = _grads(lambda a: checkpoint(grouped, a, use_reentrant=False), x)
    torch.testing.assert_close(got, want)
    assert got.isfinite().all()

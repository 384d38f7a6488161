"""Where a NaN-safe group puts its hooks, and the hook's shortcuts (issue 23): the semantics stay
those of tests/test_nan_safe.py -- where an op's incoming gradient is exactly zero, it passes on
exactly zero -- with hooks only at nodes whose backward could turn a zero into NaN."""

from __future__ import annotations

import warnings
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

import autograd_groups as ag
from autograd_groups.zero_passing import passes_zeros, passing_now

INF, NAN = float("inf"), float("nan")
# Values that make any multiplication by them or division of zero by them NaN.
HOSTILE = [INF, -INF, NAN, 0.0, -1.0, 2.0]


def _leaves() -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.tensor(HOSTILE, dtype=torch.float64, requires_grad=True)
    y = torch.tensor(list(reversed(HOSTILE)), dtype=torch.float64, requires_grad=True)
    return x, y


PASSING: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "add": lambda x, y: x + y,
    "add alpha": lambda x, y: x.add(y, alpha=2.5),
    "sub": lambda x, y: x - y,
    "rsub": lambda x, y: 1 - x,
    "neg": lambda x, y: -x,
    "sum": lambda x, y: x.sum(),
    "mean": lambda x, y: x.mean(),
    "expand": lambda x, y: x.unsqueeze(0).expand(3, 6),
    "view": lambda x, y: x.view(2, 3),
    "reshape transpose": lambda x, y: x.reshape(2, 3).t(),
    "index": lambda x, y: x[[0, 2, 2]],
    "slice": lambda x, y: x[1:4],
    "where": lambda x, y: torch.where(torch.tensor([True, False] * 3), x, y),
    "masked_fill": lambda x, y: x.masked_fill(torch.tensor([True, False] * 3), 0.0),
    "cat": lambda x, y: torch.cat([x, y]),
    "stack": lambda x, y: torch.stack([x, y]),
    "unbind": lambda x, y: x.view(2, 3).unbind(0)[1],
    "relu": lambda x, y: x.relu(),
    "clamp": lambda x, y: x.clamp(-1.0, 1.0),
    "clamp_min": lambda x, y: x.clamp_min(0.0),
    "hardtanh": lambda x, y: F.hardtanh(x),
    "sort": lambda x, y: x.sort().values,
    "max over a dim": lambda x, y: x.view(2, 3).max(1).values,
    "cumsum": lambda x, y: x.cumsum(0),
    "flip": lambda x, y: x.flip(0),
    "lerp": lambda x, y: x.lerp(y, 0.5),
}
NAN_MAKING: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "log": lambda x, y: x.log(),
    "mul": lambda x, y: x * y,
    "div": lambda x, y: x / y,
    "sqrt": lambda x, y: x.sqrt(),
    "add alpha inf": lambda x, y: x.add(y, alpha=INF),
}
# Hooked because their backward reads saved values or a scalar that may scale by 0, though PyTorch's
# formula happens to keep these zeros: the table errs on the side of a hook.
CAUTIOUS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "abs": lambda x, y: x.abs(),
    "max": lambda x, y: x.max(),
    "lerp weight 0": lambda x, y: x.lerp(y, 0.0),
}


Op = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def _zero_in_grads(op: Op) -> tuple[object, list[torch.Tensor]]:
    x, y = _leaves()
    out = op(x, y)
    grads = torch.autograd.grad(out, (x, y), torch.zeros_like(out), allow_unused=True, materialize_grads=True)
    return out.grad_fn, list(grads)


@pytest.mark.parametrize("name", PASSING)
def test_a_node_without_a_hook_passes_zeros_on_as_zeros_at_infinite_and_nan_values(name: str) -> None:
    node, grads = _zero_in_grads(PASSING[name])
    assert passes_zeros(node), type(node).__name__
    for grad in grads:
        assert torch.equal(grad, torch.zeros_like(grad))


@pytest.mark.parametrize("name", NAN_MAKING)
def test_a_node_that_can_turn_a_zero_into_nan_gets_a_hook(name: str) -> None:
    node, grads = _zero_in_grads(NAN_MAKING[name])
    assert not passes_zeros(node), type(node).__name__
    assert any(grad.isnan().any() for grad in grads), "the plain backward must make a NaN here"


@pytest.mark.parametrize("name", CAUTIOUS)
def test_a_node_whose_backward_reads_saved_values_gets_a_hook(name: str) -> None:
    node, _ = _zero_in_grads(CAUTIOUS[name])
    assert not passes_zeros(node), type(node).__name__


class _Constant(torch.autograd.Function):
    """A backward that ignores its incoming gradient: not linear in it."""

    @staticmethod
    def forward(ctx, x):  # type: ignore[override]
        return x.clone()

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        return torch.ones_like(grad)


def test_a_custom_function_is_hooked() -> None:
    x = torch.ones(2, requires_grad=True)
    assert not passes_zeros(_Constant.apply(x).grad_fn)


def test_only_the_nodes_that_can_make_nan_are_rule_sites() -> None:
    ag.register_rule("sites.entropy", ag.NanSafe())

    @ag.autograd_group("sites.entropy")
    def entropy(p: torch.Tensor) -> torch.Tensor:
        return -(torch.where(p > 0, p * torch.log(p), 0.0)).sum(-1)

    p = torch.tensor([[0.0, 0.25, 0.75], [0.5, 0.5, 0.0]], requires_grad=True)
    with ag.trace() as t:
        entropy(p).sum().backward()
    (instance,) = t.instances
    sites = sorted(data["op"] for _, data in instance.graph.nodes(data=True) if data.get("rules"))
    assert sites == ["log", "mul"]
    positive = p.detach() > 0
    torch.testing.assert_close(p.grad, torch.where(positive, -(p.detach().log() + 1), 0.0))
    assert ag.stats()["sites.entropy"]["rules"]["nan_safe"]["elements"] == 4  # 2 zeros, at mul and log


# Nodes that pass zeros on for the values they saved in one call: (op, values where they do, values
# where their plain backward turns a zero into NaN).
_FINITE = torch.tensor([[0.5, -2.0], [3.0, 0.25]], dtype=torch.float32)
_HOSTILE = torch.tensor([[0.5, INF], [NAN, 0.25]], dtype=torch.float32)
BY_VALUE: dict[str, tuple[Callable[[torch.Tensor], torch.Tensor], torch.Tensor, torch.Tensor]] = {
    "mul": (lambda x: x * x.detach().flip(0).requires_grad_(), _FINITE, _HOSTILE),
    "mm": (lambda x: x @ x.detach().t().requires_grad_(), _FINITE, _HOSTILE),
    "bmm": (lambda x: torch.bmm(x[None], x[None]), _FINITE, _HOSTILE),
    "exp": (torch.exp, _FINITE, torch.tensor([[0.5, 100.0], [1.0, 2.0]])),  # exp(100) is inf in float32
    "sin": (torch.sin, _FINITE, _HOSTILE),
    "cos": (torch.cos, _FINITE, _HOSTILE),
    "tanh": (torch.tanh, _FINITE, _HOSTILE),
    "sigmoid": (torch.sigmoid, _FINITE, _HOSTILE),
}


@pytest.mark.parametrize("name", BY_VALUE)
def test_a_node_passes_zeros_on_for_the_values_it_saved(name: str) -> None:
    op, finite, hostile = BY_VALUE[name]
    for values, passing in ((finite, True), (hostile, False)):
        x = values.clone().requires_grad_()
        out = op(x)
        assert (id(out.grad_fn) in passing_now([(out.grad_fn, None)])) is passing, (name, values)
        leaves = [t for t in (x, *_saved_leaves(out.grad_fn)) if t.requires_grad]
        grads = torch.autograd.grad(out, leaves, torch.zeros_like(out), allow_unused=True,
                                    materialize_grads=True)
        # Where it passes, the plain backward keeps the zeros; at the hostile values it does not.
        assert all(torch.equal(g, torch.zeros_like(g)) for g in grads) is passing, (name, grads)


def _saved_leaves(node: object) -> list[torch.Tensor]:
    return [child.variable for child, _ in node.next_functions  # type: ignore[attr-defined]
            if child is not None and hasattr(child, "variable")]


def test_a_quotient_by_a_tensor_that_needs_a_gradient_is_hooked_whatever_its_values() -> None:
    # d(x / y)/dy = -grad * x / y / y overflows for a tiny y: 0 * inf.
    x = torch.tensor([1.0], requires_grad=True)
    y = torch.tensor([1e-30], requires_grad=True)
    out = x / y
    assert passing_now([(out.grad_fn, None)]) == set()
    assert torch.autograd.grad(out, y, torch.zeros(1))[0].isnan().all()


@pytest.mark.parametrize("op", [torch.sqrt, torch.log, lambda x: x / x.detach().clone()])
def test_a_quotient_by_a_tensor_is_hooked_even_where_it_has_no_zero(
        op: Callable[[torch.Tensor], torch.Tensor]) -> None:
    # Testing a divisor of many elements for zeros would cost what the hook does: it is not read.
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    out = op(x)
    assert passing_now([(out.grad_fn, None)]) == set()


def test_the_rule_sites_of_a_call_follow_its_values() -> None:
    # The product exp(x) * y saves exp(x), infinite at x = 100 in float32: only then is it hooked,
    # and its zero (the where's other branch) must not turn into NaN.
    ag.register_rule("sites.values", ag.NanSafe())

    @ag.autograd_group("sites.values")
    def f(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.where(x < 50, x, torch.exp(x) * y)

    for big, sited in ((1.0, []), (100.0, ["exp", "mul"])):
        x = torch.tensor([1.0, big], requires_grad=True)
        y = torch.tensor([2.0, 3.0], requires_grad=True)
        with ag.trace() as t:
            f(x, y).sum().backward()
        (instance,) = t.instances
        assert sorted(data["op"] for _, data in instance.graph.nodes(data=True) if data.get("rules")) == sited
        selected = x.detach() >= 50
        want_y = torch.where(selected, torch.exp(x.detach()), 0.0)
        torch.testing.assert_close(y.grad, want_y)
        assert not y.grad.isnan().any() and not x.grad.isnan().any()


def test_a_second_derivative_through_a_product_without_a_hook() -> None:
    # x * y saves finite values, so it has no hook: its formula is differentiated plainly. Where
    # the first-order gradient into it is infinite (sqrt at 0) and the second-order one is 0, that
    # gives 0 * inf = NaN (docs/groups.md, "Second order through a rule"); elsewhere the function's.
    ag.register_rule("sites.second", ag.NanSafe())

    @ag.autograd_group("sites.second")
    def f(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.sqrt(x * y)

    x = torch.tensor([0.0, 1.0], dtype=torch.float64, requires_grad=True)
    y = torch.tensor([2.0, 3.0], dtype=torch.float64, requires_grad=True)
    gx, gy = torch.autograd.grad(f(x, y).sum(), (x, y), create_graph=True)
    assert gx[0].item() == INF and gy[0].isnan()
    hx, hy = torch.autograd.grad((gx * 0).sum(), (x, y))
    assert hy[0].isnan() and torch.equal(hx, torch.zeros(2, dtype=torch.float64)) and hy[1].item() == 0.0


@pytest.mark.parametrize("create_graph", [False, True])
def test_a_backward_not_linear_in_its_gradient_is_still_zeroed(create_graph: bool) -> None:
    # _Constant is not elementwise for the group: its gradient is zeroed when all of its incoming
    # gradient is zero, as for any op that is not elementwise (docs/groups.md).
    ag.register_rule("sites.constant", ag.NanSafe())

    @ag.autograd_group("sites.constant")
    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.where(x > 0, _Constant.apply(x), 0.0)

    x = torch.tensor([-1.0, -2.0], dtype=torch.float64, requires_grad=True)
    (plain,) = torch.autograd.grad(torch.where(x > 0, _Constant.apply(x), 0.0).sum(), x)
    assert torch.equal(plain, torch.ones(2, dtype=torch.float64))
    # _Constant's made-up backward is the automatic gradient the first-order check compares with.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ag.FirstOrderWarning)
        (grad,) = torch.autograd.grad(f(x).sum(), x, create_graph=create_graph)
    assert torch.equal(grad.detach(), torch.zeros(2, dtype=torch.float64))


def test_a_subgradient_not_linear_in_grad_in_the_same_group_is_zeroed_where_no_gradient_comes_in() -> None:
    # grad + 7 gives 7 where no gradient comes in: not a zero passed on as a zero.
    ag.register_rule("sites.mixed", ag.Subgradient(op="sqrt", when="result == 0", grad="grad + 7"))
    ag.register_rule("sites.mixed", ag.NanSafe())

    @ag.autograd_group("sites.mixed")
    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.where(x > 0, x.sqrt() * 2, 0.0)

    x = torch.tensor([0.0, 4.0], dtype=torch.float64, requires_grad=True)
    f(x).sum().backward()
    assert torch.equal(x.grad, torch.tensor([0.0, 0.5], dtype=torch.float64))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
@pytest.mark.parametrize("create_graph", [False, True])
def test_a_nan_where_the_gradient_comes_in_is_kept(dtype: torch.dtype, create_graph: bool) -> None:
    # log's backward is grad / x: at x = NaN it is NaN whatever comes in; only where nothing comes
    # in (the where's other branch) does the group zero it. Without create_graph the CPU hook
    # zeroes in place on the bits, with it by torch.where: both give the same.
    ag.register_rule("sites.log", ag.NanSafe())
    chosen = torch.tensor([True, False, False, True, False])

    @ag.autograd_group("sites.log")
    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.where(chosen, torch.log(x), 0.0)

    x = torch.tensor([NAN, NAN, 0.0, 2.0, -INF], dtype=dtype, requires_grad=True)
    (grad,) = torch.autograd.grad(f(x).sum(), x, create_graph=create_graph)
    want = torch.tensor([NAN, 0.0, 0.0, 0.5, 0.0], dtype=dtype)
    torch.testing.assert_close(grad.detach(), want, equal_nan=True)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_an_incoming_minus_zero_counts_as_zero_and_an_incoming_nan_as_not(dtype: torch.dtype) -> None:
    # The CPU hook zeroes in place where incoming.bool() is False: -0.0 is a zero that comes in
    # (log's 0 / 0 there is zeroed), NaN is not (its NaN is kept).
    ag.register_rule("sites.signed", ag.NanSafe())
    w = torch.tensor([-0.0, 0.0, NAN, 1.0], dtype=dtype)

    @ag.autograd_group("sites.signed")
    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.log(x) * w

    x = torch.tensor([0.0, 0.0, 2.0, 2.0], dtype=dtype, requires_grad=True)
    (grad,) = torch.autograd.grad(f(x).sum(), x)
    torch.testing.assert_close(grad, torch.tensor([0.0, 0.0, NAN, 0.5], dtype=dtype), equal_nan=True)


def test_the_cpu_read_is_bounded_per_product_it_would_spare_and_reads_a_shared_tensor_once() -> None:
    """``CHECKED`` elements per product: two products by one no-grad factor of 12288 elements are
    read (it counts once), one product by a factor of 20000 is not; nor two by a hostile one."""
    from autograd_groups.zero_passing import CHECKED
    x = torch.ones(4096, 3, requires_grad=True)
    shared = torch.rand(4096, 3)
    first, second = x * shared, torch.linalg.cross(x, shared)
    sites = [(first.grad_fn, (0,)), (second.grad_fn, (0,))]
    assert passing_now(sites) == {id(first.grad_fn), id(second.grad_fn)}
    big = torch.ones(20000, requires_grad=True)
    alone = big * torch.rand(20000)
    assert CHECKED < 20000 and passing_now([(alone.grad_fn, (0,))]) == set()
    hostile = x * shared.clone().index_put_((torch.tensor(7), torch.tensor(1)), torch.tensor(INF))
    assert passing_now([(hostile.grad_fn, (0,)), (first.grad_fn, (0,))]) == set()


def test_a_structure_whose_cpu_read_keeps_missing_is_read_less_often_with_the_same_gradients(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """After each read in a row that finds a non-finite value (so spares nothing) the structure's
    read is skipped for the next 1, 3, 7, ... calls, which keep their hooks; a read that spares
    hooks resets it. Read or not, the gradients are those of the reads-off path (a GPU's)."""
    from autograd_groups import host_reads
    from autograd_groups.groups import lifecycle
    ag.register_rule("sites.backoff", ag.NanSafe())

    @ag.autograd_group("sites.backoff")
    def f(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.where(x < 50, x, torch.exp(x) * y)

    reads: list[tuple[int, bool]] = []  # per read: the call, and whether it spared the hooks
    calls = [0]

    def counted(sites: list[tuple[object, tuple[int, ...] | None]]) -> set[int]:
        found = passing_now(sites)
        reads.append((calls[0], bool(found)))
        return found

    monkeypatch.setattr(lifecycle, "passing_now", counted)

    def grads(big: float) -> tuple[torch.Tensor, ...]:
        x = torch.tensor([1.0, big], requires_grad=True)
        y = torch.tensor([2.0, 3.0], requires_grad=True)
        return torch.autograd.grad(f(x, y).sum(), (x, y))

    # exp(100) is inf in float32: the first 20 calls' reads miss; exp(1) is finite.
    for big in [100.0] * 20 + [1.0] * 12:
        calls[0] += 1
        got = grads(big)
        with host_reads.off():
            want = grads(big)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w)
            assert not g.isnan().any()
    assert reads == [(1, False), (3, False), (7, False), (15, False), (31, True), (32, True)]


def test_under_a_trace_the_cpu_read_follows_each_calls_values() -> None:
    ag.register_rule("sites.traced", ag.NanSafe())

    @ag.autograd_group("sites.traced")
    def f(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.where(x < 50, x, torch.exp(x) * y)

    for big, sited in ((100.0, ["exp", "mul"]), (1.0, []), (100.0, ["exp", "mul"]), (1.0, [])):
        with ag.trace() as t:
            f(torch.tensor([1.0, big], requires_grad=True), torch.tensor([2.0, 3.0], requires_grad=True))
        (instance,) = t.instances
        assert sorted(data["op"] for _, data in instance.graph.nodes(data=True) if data.get("rules")) == sited

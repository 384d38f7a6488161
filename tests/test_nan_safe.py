"""NanSafe: where an op's incoming gradient is exactly zero, it passes on exactly zero."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

import autograd_groups as ag


@pytest.fixture(autouse=True)
def _rules():
    ag.register_rule("double_where", ag.NanSafe())
    ag.register_rule("pow_composite", ag.NanSafe())


def branchy(x: torch.Tensor) -> torch.Tensor:
    return torch.where(x <= 0, torch.exp(x), 1 + x)


def exp_log_pow(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.exp(y * torch.log(x))


@pytest.mark.parametrize("dtype, big", [(torch.float32, 100.0), (torch.float64, 1000.0)])
def test_double_where_unselected_branch_overflow(dtype, big):
    x = torch.tensor([big, -1.0, 0.5], dtype=dtype, requires_grad=True)
    branchy(x).sum().backward()
    assert x.grad[0].isnan(), "plain autograd must be NaN here"
    x.grad = None
    ag.autograd_group("double_where")(branchy)(x).sum().backward()
    torch.testing.assert_close(x.grad, torch.tensor([1.0, torch.exp(torch.tensor(-1.0)).item(), 1.0],
                                                    dtype=dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_exp_y_log_x_at_zero_equals_pow(dtype):
    # For y > 1 every 0 * inf in the composite's backward stands for a true 0. (At y = 1 the true
    # derivative is 1: NaN-safe mode gives 0 there, see docs/groups.md.)
    x0 = torch.tensor([0.0, 0.0, 0.0, 2.0, 0.5], dtype=dtype)
    y0 = torch.tensor([2.0, 2.5, 3.0, 1.5, 2.5], dtype=dtype)
    x, y = x0.clone().requires_grad_(), y0.clone().requires_grad_()
    torch.pow(x, y).sum().backward()
    native = (x.grad, y.grad)
    x, y = x0.clone().requires_grad_(), y0.clone().requires_grad_()
    exp_log_pow(x, y).sum().backward()
    assert x.grad[:3].isnan().all() or y.grad[:3].isnan().all(), "plain autograd must be NaN here"
    x, y = x0.clone().requires_grad_(), y0.clone().requires_grad_()
    out = ag.autograd_group("pow_composite")(exp_log_pow)(x, y)
    out.sum().backward()
    torch.testing.assert_close(out, torch.pow(x0, y0))
    torch.testing.assert_close((x.grad, y.grad), native)


def test_regular_points_are_untouched():
    g = torch.Generator().manual_seed(0)
    x0 = torch.rand(50, generator=g, dtype=torch.float64) + 0.1
    y0 = torch.rand(50, generator=g, dtype=torch.float64) * 3
    x, y = x0.clone().requires_grad_(), y0.clone().requires_grad_()
    exp_log_pow(x, y).sum().backward()
    plain = (x.grad, y.grad)
    x, y = x0.clone().requires_grad_(), y0.clone().requires_grad_()
    ag.autograd_group("pow_composite")(exp_log_pow)(x, y).sum().backward()
    assert torch.equal(x.grad, plain[0]) and torch.equal(y.grad, plain[1])


def test_gradcheck_through_nan_safe_sites():
    fn = ag.autograd_group("pow_composite")(exp_log_pow)
    x = torch.tensor([0.3, 1.2, 2.0], dtype=torch.float64, requires_grad=True)
    y = torch.tensor([1.5, 2.0, 0.5], dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(fn, (x, y))
    assert torch.autograd.gradgradcheck(fn, (x, y))


def test_broadcast_input_is_zeroed_only_where_all_incoming_is_zero():
    # y broadcasts over rows: its gradient sums a column of the incoming gradient.
    x = torch.tensor([[0.0, 2.0], [0.0, 3.0]], dtype=torch.float64, requires_grad=True)
    y = torch.tensor([2.0, 1.0], dtype=torch.float64, requires_grad=True)
    out = ag.autograd_group("pow_composite")(exp_log_pow)(x, y)
    out.sum().backward()
    xn, yn = x.detach().clone().requires_grad_(), y.detach().clone().requires_grad_()
    torch.pow(xn, yn).sum().backward()
    torch.testing.assert_close((x.grad, y.grad), (xn.grad, yn.grad))


def test_a_double_backward_whose_formula_returns_immutable_zeros_is_made_nan_safe() -> None:
    """A gradient penalty through |h|^1.5 at h = 0: the double backward's formulas return ZeroTensors
    there, which cannot be zeroed in place; the rule zeroes its 0 · inf all the same."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(2, 2)
    with torch.no_grad():
        lin.bias.zero_()

    def penalty(critic: Callable[[torch.Tensor], torch.Tensor]) -> list[torch.Tensor]:
        x = torch.zeros(3, 2, requires_grad=True)
        g, = torch.autograd.grad(critic(x), x, create_graph=True)
        return torch.autograd.grad((g ** 2).sum(), list(lin.parameters()))

    def critic(x: torch.Tensor) -> torch.Tensor:
        return lin(x).abs().pow(1.5).sum()

    ag.register_rule("critic", ag.NanSafe())
    grads = penalty(ag.autograd_group("critic")(critic))
    # The penalty is (grad of the critic)^2, whose gradient is 2 · grad · d(grad), and grad is 0 at h = 0.
    assert all(torch.equal(g, torch.zeros_like(g)) for g in grads)
    native = penalty(critic)
    assert all(torch.equal(g, torch.zeros_like(g)) or not bool(torch.isfinite(g).all()) for g in native)

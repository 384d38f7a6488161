"""Override rules: the replacement backward replaces the group's subgraph when the check fires."""

from __future__ import annotations

import pytest
import torch

import autograd_groups as ag

inner_nodes: list = []


def norm(x: torch.Tensor) -> torch.Tensor:
    squares = x.pow(2)
    total = squares.sum()
    out = total.sqrt()
    inner_nodes.extend([squares.grad_fn, total.grad_fn, out.grad_fn])
    return out


@pytest.fixture
def safe_norm():
    @ag.special_case("safe_norm")
    def norm_is_zero(ctx):
        return bool((ctx.outputs[0] == 0).any())

    @norm_is_zero.backward
    def norm_subgradient(ctx, grad):
        return torch.zeros_like(ctx.inputs[0])

    inner_nodes.clear()
    return ag.autograd_group("safe_norm")(norm)


def count_inner_calls() -> list[int]:
    calls = [0]
    for node in inner_nodes:
        node.register_prehook(lambda grad_outputs: calls.__setitem__(0, calls[0] + 1))
    return calls


def test_check_fires_replacement_runs_and_subgraph_is_skipped(safe_norm):
    x = torch.zeros(3, dtype=torch.float64, requires_grad=True)
    out = safe_norm(x)
    calls = count_inner_calls()
    out.backward()
    assert calls == [0]
    assert torch.equal(x.grad, torch.zeros(3, dtype=torch.float64))
    assert ag.stats()["safe_norm"]["rules"]["override(norm_is_zero)"]["firings"] == 1


def test_check_does_not_fire_automatic_chain_runs(safe_norm):
    x0 = torch.tensor([3.0, -4.0, 1.0], dtype=torch.float64)
    x = x0.clone().requires_grad_()
    out = safe_norm(x)
    calls = count_inner_calls()
    out.backward()
    assert calls == [3]
    torch.testing.assert_close(x.grad, x0 / x0.norm())


def test_plain_norm_is_nan_at_zero():
    x = torch.zeros(3, requires_grad=True)
    norm(x).backward()
    assert x.grad.isnan().all()


@pytest.mark.parametrize("x0", [[0.0, 0.0, 0.0], [0.5, -1.0, 2.0]])
def test_gradcheck_on_both_paths(safe_norm, x0):
    x = torch.tensor(x0, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(safe_norm, (x,))


def test_override_needs_an_explicit_boundary(safe_norm):
    x = torch.zeros(3, requires_grad=True)
    with pytest.raises(ag.GroupError, match=r"group 'safe_norm' has an override rule .* use "
                                            r"@autograd_group\('safe_norm'\) on a function"), \
            ag.autograd_group("safe_norm"):
        norm(x)


def test_replacement_with_the_wrong_shape_is_a_rule_error(safe_norm):
    @ag.special_case("bad_norm")
    def is_zero(ctx):
        return True

    @is_zero.backward
    def wrong(ctx, grad):
        return torch.zeros(5)

    x = torch.zeros(3, requires_grad=True)
    out = ag.autograd_group("bad_norm")(norm)(x)
    with pytest.raises(ag.RuleError, match=r"group 'bad_norm' .* rule override\(.*is_zero\): "
                                           r"gradient 0 has shape \(5,\), but input 0 has shape \(3,\)"):
        out.backward()


def test_override_without_backward_is_refused():
    @ag.special_case("half")
    def check(ctx):
        return True

    with pytest.raises(ag.RuleError, match="has no backward; attach one with @check.backward"):
        ag.register_rule("half", check)


def test_second_override_on_a_group_conflicts(safe_norm):
    rule = ag.Override(check=lambda ctx: True, backward=lambda ctx, g: g)
    with pytest.raises(ag.RuleError, match="a group has at most one override"):
        ag.register_rule("safe_norm", rule)


def test_running_a_special_case_cell_again_needs_replace():
    def define(replace: bool) -> ag.Override:
        @ag.special_case("rerun_norm", replace=replace)
        def is_zero(ctx):
            return bool((ctx.outputs[0] == 0).any())

        @is_zero.backward
        def zero(ctx, grad):
            return torch.zeros_like(ctx.inputs[0])

        return is_zero

    define(replace=False)
    with pytest.raises(ag.RuleError, match="a group has at most one override. To swap them, pass "
                                           "replace=True"):
        define(replace=False)  # new function objects: another override, as far as anyone can tell
    second = define(replace=True)
    assert ag.list_rules()["rerun_norm"] == (second,)


def _sinc_group(name: str):
    """sinc(x) = sin(x) / x with an override at 0 whose replacement reads the group's output: its
    slope (cos x - sinc x) / x, and -x/3 + x**3/30 near 0, so f''(0) = -1/3."""

    @ag.special_case(name)
    def at_zero(ctx):
        return (ctx.inputs[0] == 0).any()

    @at_zero.backward
    def sinc_slope(ctx, grad):
        (x,), (y,) = ctx.inputs, ctx.outputs
        small = x.abs() < 1e-3
        safe = torch.where(small, 1.0, x)
        return grad * torch.where(small, -x / 3 + x**3 / 30, (torch.cos(safe) - y) / safe)

    return ag.autograd_group(name)(lambda x: torch.sin(x) / x)


def _sinc_second(x: torch.Tensor) -> torch.Tensor:
    return -torch.sin(x) / x - 2 * torch.cos(x) / x**2 + 2 * torch.sin(x) / x**3


def test_a_replacement_reading_the_outputs_is_differentiated_through_the_override():
    # The outputs the replacement reads under create_graph are differentiable through the override
    # itself: a second derivative through them does not go back through sin(x) / x at 0 (NaN).
    with ag.registry_scope():
        sinc = _sinc_group("ov.sinc")
        x = torch.tensor([0.0, 0.5, -1.2], dtype=torch.float64, requires_grad=True)
        (g,) = torch.autograd.grad(sinc(x).sum(), x, create_graph=True)
        (second,) = torch.autograd.grad(g.sum(), x)
        expected = torch.cat([torch.tensor([-1 / 3], dtype=torch.float64), _sinc_second(x[1:].detach())])
        torch.testing.assert_close(second, expected)
        hessian = torch.func.jacrev(torch.func.jacrev(lambda a: sinc(a).sum()))(x.detach())
        torch.testing.assert_close(hessian.diagonal(), expected)


def test_a_two_output_replacement_reading_the_outputs_is_differentiated_through_the_override():
    # Polar coordinates; the override at the origin reads r from the outputs. The second derivatives
    # of x -> (r, theta) at the points off the origin equal torch's, and stay finite at the origin.
    with ag.registry_scope():
        @ag.special_case("ov.polar")
        def at_origin(ctx):
            return (ctx.outputs[0] == 0).any()

        @at_origin.backward
        def polar_gradients(ctx, grad_r, grad_theta):
            (x, y), (r, _) = ctx.inputs, ctx.outputs
            origin = r == 0
            safe = torch.where(origin, 1.0, r)
            gx = torch.where(origin, 0.0, (grad_r * x - grad_theta * y / safe) / safe)
            gy = torch.where(origin, 0.0, (grad_r * y + grad_theta * x / safe) / safe)
            return gx, gy

        @ag.autograd_group("ov.polar")
        def polar(x, y):
            return torch.sqrt(x * x + y * y), torch.atan2(y, x)

        def native(x, y):
            return torch.sqrt(x * x + y * y), torch.atan2(y, x)

        def weighted(fn, x, y):
            r, theta = fn(x, y)
            return (r * r * r).sum() + (theta * r).sum()

        x = torch.tensor([0.0, 0.6, -1.5], dtype=torch.float64, requires_grad=True)
        y = torch.tensor([0.0, 0.8, 0.4], dtype=torch.float64, requires_grad=True)
        ours = torch.autograd.functional.hessian(lambda a, b: weighted(polar, a, b), (x, y))
        theirs = torch.autograd.functional.hessian(lambda a, b: weighted(native, a, b), (x, y))
        for block_ours, block_theirs in (pair for rows in zip(ours, theirs) for pair in zip(*rows)):
            assert torch.isfinite(block_ours).all()
            torch.testing.assert_close(block_ours[1:, 1:], block_theirs[1:, 1:])


@pytest.mark.parametrize("op", [ag.ops.atan2, ag.ops.pow], ids=["atan2", "pow"])
@pytest.mark.parametrize("point", [[0.5, 0.3], [0.0, 0.3]], ids=["ordinary", "on the y axis"])
def test_a_second_backward_through_a_gradient_that_holds_the_groups_output(op, point) -> None:
    """``grad(h * y, q, create_graph=True)`` holds ``h`` itself: a backward of it runs through the
    group's subgraph twice (the gradient's graph, and the override's own backward of ``h``). Checked
    against finite differences (at ``pow``'s zero exponent torch.pow's own double backward drops a
    term on some releases, so it is no reference)."""
    q = torch.tensor(point, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradgradcheck(lambda q: op(q[1], q[0]) * q[1], (q,))

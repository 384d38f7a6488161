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

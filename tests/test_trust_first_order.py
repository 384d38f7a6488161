"""A wrong rule at a smooth point is flagged at first order: the first time a user's rule fires at a
call site it is checked as ``ag.verify`` checks it, and ``FirstOrderWarning`` is given only where
the gradient it gave is not the function's there. Exact values are analytic."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
import trust_cases as tc

import autograd_groups as ag
from autograd_groups.sites import first_order

F64 = torch.float64


@pytest.fixture(autouse=True)
def _scope() -> Any:
    with ag.registry_scope():
        yield


def told(run: Callable[[], Any]) -> list[warnings.WarningMessage]:
    """The ``FirstOrderWarning``s ``run()`` gave."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run()
    return [w for w in caught if issubclass(w.category, ag.FirstOrderWarning)]


def rodrigues(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """roma's axis-form Rodrigues formula, ``axis = v / |v|`` with a clamp: with the sqrt's
    subgradient 0 its gradient at ``v = 0`` is 0, where the rotation's is ``d/dv [v]x`` (not 0)."""
    ag.register_rule(name, ag.Subgradient(op="sqrt", when="result == 0", grad=0))

    @ag.autograd_group(name)
    def rotation(v: torch.Tensor) -> torch.Tensor:
        theta = (v * v).sum().sqrt()
        k = tc.hat(v / theta.clamp_min(1e-12))
        return torch.eye(3, dtype=v.dtype) + torch.sin(theta) * k + (1 - torch.cos(theta)) * (k @ k)

    return rotation


def test_roma_rodrigues_warns_on_its_first_backward_at_the_call_line() -> None:
    rotation = rodrigues("fo.rodrigues")
    v = torch.zeros(3, dtype=F64, requires_grad=True)
    weights = torch.randn(3, 3, dtype=F64, generator=torch.Generator().manual_seed(1))
    found = told(lambda: (rotation(v) * weights).sum().backward())
    line = test_roma_rodrigues_warns_on_its_first_backward_at_the_call_line.__code__.co_firstlineno + 4
    assert [(w.filename, w.lineno) for w in found] == [(__file__, line)]
    message = str(found[0].message)
    assert message.startswith("rule subgradient(sqrt: result == 0 -> 0) of group 'fo.rodrigues', at "
                              "op sqrt, gave a gradient that is not the function's")
    assert f"created at {__file__}:{line}" in message
    assert "the rule gives a gradient of 0 where the function's is" in message
    # The rotation's exact gradient at 0 is that of I + [v]x: not 0, which the rule gave.
    exact = torch.func.grad(lambda u: (tc.matrix_exp_of(u) * weights).sum())(v.detach())
    assert exact.abs().max() > 0.1 and torch.equal(v.grad, torch.zeros(3, dtype=F64))


def test_nan_safe_power_warns_for_x_to_the_first_at_zero() -> None:
    power = tc.pow_composite("fo.pow")
    x = torch.zeros(2, dtype=F64, requires_grad=True)
    found = told(lambda: power(x, torch.ones(2, dtype=F64)).sum().backward())
    assert len(found) == 1 and "group 'fo.pow'" in str(found[0].message)
    assert torch.equal(x.grad, torch.zeros(2, dtype=F64))  # d/dx x = 1: the NaN-safe rule gave 0


def test_the_check_runs_once_per_call_site() -> None:
    power = tc.pow_composite("fo.once")
    before = first_order.runs
    for _ in range(3):
        x = torch.zeros(2, dtype=F64, requires_grad=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ag.FirstOrderWarning)
            power(x, torch.ones(2, dtype=F64)).sum().backward()
    assert first_order.runs == before + 1
    x = torch.zeros(2, dtype=F64, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ag.FirstOrderWarning)
        power(x, torch.ones(2, dtype=F64)).sum().backward()  # another call site: checked again
    assert first_order.runs == before + 2


def _distance(name: str) -> Callable[[], Any]:
    ag.register_rule(name, ag.Subgradient(op="sqrt", when="result == 0", grad=0))
    distance = ag.autograd_group(name)(lambda a, b: ((a - b) ** 2).sum(-1).sqrt())
    a = torch.zeros(4, 3, dtype=F64, requires_grad=True)
    return lambda: distance(a, torch.zeros(4, 3, dtype=F64)).sum().backward()


def _exact(make: Callable[[str], Callable[..., torch.Tensor]], *args: torch.Tensor) -> Callable[[], Any]:
    f = make("fo.exact." + make.__name__)
    inputs = [a.clone().requires_grad_() for a in args]
    return lambda: f(*inputs).sum().backward()


CORRECT: dict[str, Callable[[], Callable[[], Any]]] = {
    "distance at a zero distance": lambda: _distance("fo.distance"),
    "so3 exp at 0": lambda: _exact(tc.so3_exp, torch.zeros(3, dtype=F64)),
    "softplus": lambda: _exact(tc.softplus, torch.tensor([0.0, 1000.0], dtype=F64)),
    "guarded division": lambda: _exact(tc.guarded_division, torch.zeros(2, dtype=F64),
                                       torch.ones(2, dtype=F64)),
    "entropy": lambda: _exact(tc.entropy, tc.masked_softmax(torch.Generator().manual_seed(0))),
}


@pytest.mark.parametrize("case", CORRECT)
def test_correct_rules_do_not_warn(case: str) -> None:
    before = first_order.runs
    assert told(CORRECT[case]()) == []
    assert first_order.runs == before + 1  # it was checked, and found right


def test_builtins_are_not_checked_and_the_switch_turns_the_check_off() -> None:
    before = first_order.runs
    x = torch.zeros(2, 3, dtype=F64, requires_grad=True)
    ag.ops.vector_norm(x, dim=-1).sum().backward()
    assert first_order.runs == before
    power = tc.pow_composite("fo.off")
    ag.set_rule_checks(False)
    try:
        assert not ag.rule_checks_enabled()
        x = torch.zeros(2, dtype=F64, requires_grad=True)
        assert told(lambda: power(x, torch.ones(2, dtype=F64)).sum().backward()) == []
    finally:
        ag.set_rule_checks(True)
    assert first_order.runs == before


def test_under_torch_func_and_vmap_the_check_is_skipped_without_an_error() -> None:
    power = tc.pow_composite("fo.func")
    before = first_order.runs
    x = torch.zeros(2, dtype=F64)
    y = torch.ones(2, dtype=F64)
    assert told(lambda: torch.func.grad(lambda a: power(a, y).sum())(x)) == []
    assert told(lambda: torch.func.vmap(torch.func.grad(lambda a: power(a, y).sum()))(x[:, None])) == []
    assert first_order.runs == before


def test_only_the_first_backward_pass_at_a_call_site_looks() -> None:
    power = tc.pow_composite("fo.later")
    before = first_order.runs
    found = []
    for start in (1.0, 0.0):  # one call site: the rule fires in its second pass only
        x = torch.full((2,), start, dtype=F64, requires_grad=True)
        found += told(lambda x=x: power(x, torch.ones(2, dtype=F64)).sum().backward())
    assert found == [] and first_order.runs == before


def test_where_a_host_read_is_off_nothing_is_read_or_checked() -> None:
    from autograd_groups import host_reads

    power = tc.pow_composite("fo.device")
    before = first_order.runs
    x = torch.zeros(2, dtype=F64, requires_grad=True)
    with host_reads.off():
        assert told(lambda: power(x, torch.ones(2, dtype=F64)).sum().backward()) == []
    assert first_order.runs == before and torch.equal(x.grad, torch.zeros(2, dtype=F64))


def test_a_rule_on_a_modules_method_is_checked_with_its_module() -> None:
    """A group on ``forward``: its call keeps the module weakly (a module dropped before the
    backward is not checked), and the check calls the method on that module again. Flagged where
    the rule is wrong (Rodrigues at 0), silent where it is right (a norm's subgradient at 0,
    scaled by the module's weight); the module's buffers as they were."""
    ag.register_rule("fo.method.rotation", ag.Subgradient(op="sqrt", when="result == 0", grad=0))
    ag.register_rule("fo.method.norm", ag.Subgradient(op="sqrt", when="result == 0", grad=0))

    class Rotation(torch.nn.Module):
        turns = 1.0

        @ag.autograd_group("fo.method.rotation")
        def forward(self, v: torch.Tensor) -> torch.Tensor:
            theta = (v * v).sum().sqrt() * self.turns
            k = tc.hat(v / theta.clamp_min(1e-12))
            return torch.eye(3, dtype=v.dtype) + torch.sin(theta) * k + (1 - torch.cos(theta)) * (k @ k)

    class Norm(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.scale = torch.nn.Parameter(torch.tensor(2.0, dtype=F64))
            self.register_buffer("calls", torch.zeros(()))  # state a forward changes, as a batch norm's

        @ag.autograd_group("fo.method.norm")
        def forward(self, v: torch.Tensor) -> torch.Tensor:
            self.calls.add_(1)
            return (v * v).sum().sqrt() * self.scale

    v = torch.zeros(3, dtype=F64, requires_grad=True)
    weights = torch.randn(3, 3, dtype=F64, generator=torch.Generator().manual_seed(1))
    rotation, norm = Rotation(), Norm()  # alive at the backward, as a model is
    wrong = told(lambda: (rotation(v) * weights).sum().backward())
    right = told(lambda: norm(v).backward())
    assert len(wrong) == 1 and "group 'fo.method.rotation'" in str(wrong[0].message)
    assert right == []
    assert float(norm.calls) == 1  # the script's call: the check's runs of the method leave its state

"""detect_nonfinite(): the error names the group instance, the op and the forward line; silence and
unchanged gradients when everything is finite."""

from __future__ import annotations

import inspect
import threading

import pytest
import torch
from torch.testing import assert_close

import autograd_groups as ag


@ag.autograd_group("planted")
def planted(x: torch.Tensor) -> torch.Tensor:
    return (x * 3).mul(torch.tensor(float("nan"))).sum(-1)


@ag.autograd_group("root")
def root(x: torch.Tensor) -> torch.Tensor:
    return (x + 1).log1p().sqrt() * 2


@ag.autograd_group("rooted_sum")
def rooted_sum(x: torch.Tensor) -> torch.Tensor:
    return root(x - 1).sum()


def line_of(marker: str) -> int:
    """The line of this file that holds ``marker`` (a comment), so the test can check ``where``."""
    lines = inspect.getsource(inspect.getmodule(line_of)).splitlines()  # type: ignore[arg-type]
    return next(i for i, text in enumerate(lines, 1) if marker in text and "line_of" not in text)


def test_planted_nan_names_group_op_and_forward_line() -> None:
    x = torch.ones(2, 3, requires_grad=True)
    with ag.detect_nonfinite(), pytest.raises(ag.NonFiniteError) as caught:
        planted(x).sum().backward()  # planted-call
    error = caught.value
    assert isinstance(error, ag.GroupError)
    where = f"{__file__}:{line_of('# planted-call')}"
    assert (error.group, error.op, error.where) == ("planted", "mul", where)
    assert str(error).startswith(f"non-finite gradient in group 'planted' (created at {where}): op mul "
                                 f"(MulBackward0) received a finite gradient and produced 6 NaN/inf of 6 "
                                 f"elements in the gradient of its input 0.")


def test_innermost_instance_is_named_for_a_nested_singularity() -> None:
    x = torch.tensor([0.0, 1.0, 2.0], requires_grad=True)  # root(x - 1) takes sqrt(log1p(0)) at x = 0
    with ag.detect_nonfinite(), pytest.raises(ag.NonFiniteError) as caught:
        rooted_sum(x).backward()
    error = caught.value
    assert (error.group, error.op) == ("root", "sqrt")
    assert error.where == f"{__file__}:{line_of('return root(x - 1).sum()')}"
    assert "1 NaN/inf of 3 elements" in str(error)


def test_instance_id_is_named_when_traced() -> None:
    x = torch.tensor([0.0, 1.0], requires_grad=True)
    with ag.trace(), ag.detect_nonfinite(), pytest.raises(ag.NonFiniteError) as caught:
        rooted_sum(x).backward()
    assert caught.value.instance == "root#0"
    assert "group 'root' (instance root#0, created at" in str(caught.value)


def test_silent_and_gradients_unchanged_when_a_rule_keeps_them_finite() -> None:
    ag.register_rule("root", ag.Subgradient(op="sqrt", when="result == 0", grad=0))
    x = torch.tensor([0.0, 1.0, 2.0], requires_grad=True)
    rooted_sum(x).backward()
    expected = x.grad.clone()
    x.grad = None
    with ag.detect_nonfinite():
        rooted_sum(x).backward()
    assert_close(x.grad, expected, rtol=0, atol=0)
    assert torch.isfinite(x.grad).all()


def test_silent_and_gradients_unchanged_when_all_is_finite() -> None:
    x = torch.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True, dtype=torch.float64)
    with ag.detect_nonfinite():
        rooted_sum(x).backward()
    reference = x.detach().clone().requires_grad_()
    ((reference - 1 + 1).log1p().sqrt() * 2).sum().backward()
    assert_close(x.grad, reference.grad, rtol=0, atol=0)


def test_an_enclosing_groups_rule_counts_before_the_check() -> None:
    # Where the unselected branch is sqrt(0), its gradient is 0 * inf = NaN, which outer's nan_safe
    # rule (installed on inner's sqrt node when outer closes) sets back to 0.
    @ag.autograd_group("branch")
    def branch(x: torch.Tensor) -> torch.Tensor:
        return x.sqrt()

    @ag.autograd_group("safe_where")
    def safe_where(x: torch.Tensor) -> torch.Tensor:
        return torch.where(x > 0, branch(x), torch.zeros_like(x))

    x = torch.tensor([0.0, 4.0], requires_grad=True)
    with ag.detect_nonfinite(), pytest.raises(ag.NonFiniteError, match="group 'branch'"):
        safe_where(x).sum().backward()
    ag.register_rule("safe_where", ag.NanSafe())
    x.grad = None
    with ag.detect_nonfinite():
        safe_where(x).sum().backward()
    assert_close(x.grad, torch.tensor([0.0, 0.25]))


def test_nan_from_outside_the_group_is_not_blamed_on_it() -> None:
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    with ag.detect_nonfinite():
        (rooted_sum(x) * float("nan")).backward()
    assert torch.isnan(x.grad).all()


def test_groups_without_rules_and_with_special_cases_off_are_checked() -> None:
    x = torch.ones(2, requires_grad=True)
    with ag.special_cases(False), ag.detect_nonfinite(), pytest.raises(ag.NonFiniteError, match="op mul"):
        planted(x).backward()


def test_instances_created_outside_the_block_are_not_checked() -> None:
    x = torch.ones(2, requires_grad=True)
    out = planted(x)
    with ag.detect_nonfinite():
        out.backward()
    assert torch.isnan(x.grad).all()


def test_backward_on_another_thread_is_checked() -> None:
    x = torch.ones(2, requires_grad=True)
    caught: list[BaseException] = []

    def run() -> None:
        try:
            planted(x).backward()
        except ag.NonFiniteError as e:
            caught.append(e)

    with ag.detect_nonfinite():
        worker = threading.Thread(target=run)
        worker.start()
        worker.join()
    assert [type(e) for e in caught] == [ag.NonFiniteError]

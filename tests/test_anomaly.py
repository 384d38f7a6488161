"""detect_nonfinite(): the error names the group instance, the op and the forward line; silence and
unchanged gradients when everything is finite."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import pytest
import torch
from torch.testing import assert_close

import autograd_groups as ag
from autograd_groups.observe import anomaly
from conftest import line_of


@ag.autograd_group("planted")
def planted(x: torch.Tensor) -> torch.Tensor:
    return (x * 3).mul(torch.tensor(float("nan"))).sum(-1)


@ag.autograd_group("root")
def root(x: torch.Tensor) -> torch.Tensor:
    return (x + 1).log1p().sqrt() * 2


@ag.autograd_group("rooted_sum")
def rooted_sum(x: torch.Tensor) -> torch.Tensor:
    return root(x - 1).sum()


def test_planted_nan_names_group_op_and_forward_line() -> None:
    x = torch.ones(2, 3, requires_grad=True)
    with ag.detect_nonfinite(), pytest.raises(ag.NonFiniteError) as caught:
        planted(x).sum().backward()  # planted-call
    error = caught.value
    assert isinstance(error, ag.GroupError)
    where = f"{__file__}:{line_of(__file__, '# planted-call')}"
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
    assert error.where == f"{__file__}:{line_of(__file__, 'return root(x - 1).sum()')}"
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


def _in_thread(work: Callable[[], object]) -> list[BaseException]:
    """Run ``work`` in a new thread; the exceptions it raised."""
    caught: list[BaseException] = []

    def run() -> None:
        try:
            work()
        except BaseException as e:  # noqa: BLE001 - handed to the test's thread
            caught.append(e)

    worker = threading.Thread(target=run)
    worker.start()
    worker.join()
    return caught


def test_backward_on_another_thread_is_checked() -> None:
    # The watch is read in the forward and kept by the instance: the thread of the backward does
    # not matter.
    x = torch.ones(2, requires_grad=True)
    with ag.detect_nonfinite():
        out = planted(x)
    assert [type(e) for e in _in_thread(out.backward)] == [ag.NonFiniteError]


def test_a_block_in_one_thread_does_not_watch_another_threads_groups() -> None:
    x = torch.ones(2, requires_grad=True)
    with ag.detect_nonfinite():
        assert _in_thread(lambda: planted(x).backward()) == []
        assert x.grad is not None and torch.isnan(x.grad).all()
        with pytest.raises(ag.NonFiniteError):  # this thread's own groups: watched
            planted(x).backward()


def test_verify_pausing_one_thread_leaves_another_threads_watch_on() -> None:
    # ag.verify pauses the watch around its own runs of a group: in its thread only.
    x = torch.ones(2, requires_grad=True)
    paused, done = threading.Event(), threading.Event()

    def verifying() -> None:
        with anomaly.paused():
            paused.set()
            done.wait(30)
            planted(x).backward()  # paused here: no error

    worker = threading.Thread(target=verifying)
    with ag.detect_nonfinite():
        worker.start()
        assert paused.wait(30)
        try:
            with pytest.raises(ag.NonFiniteError):
                planted(x).backward()
        finally:
            done.set()
            worker.join()
        with anomaly.paused():
            planted(x).backward()  # this thread's pause
        with pytest.raises(ag.NonFiniteError):
            planted(x).backward()  # and its watch is back after it


def test_a_decorated_generator_is_watched_at_each_resume() -> None:
    x = torch.ones(2, requires_grad=True)

    @ag.detect_nonfinite()
    def steps() -> Iterator[torch.Tensor]:
        while True:
            yield planted(x)

    batches = steps()
    assert not anomaly.active()
    out = next(batches)  # made inside the body: watched
    assert not anomaly.active()  # between resumes the caller is not
    with pytest.raises(ag.NonFiniteError, match="group 'planted'"):
        out.backward()
    unwatched = planted(x)
    unwatched.backward()
    batches.close()


# A NaN made in the forward pass that reaches a group's output is named where it was made: no
# gradient rule can fix it. One that a where discards is no error.

@ag.autograd_group("unit")
def unit(x: torch.Tensor) -> torch.Tensor:
    return x / torch.sqrt((x * x).sum())  # unit-div


def test_a_forward_nan_names_group_op_and_the_users_line() -> None:
    x = torch.zeros(3, requires_grad=True)
    with ag.detect_nonfinite(), pytest.raises(ag.NonFiniteError) as caught:
        unit(x)  # unit-call
    error = caught.value
    where = f"{__file__}:{line_of(__file__, '# unit-div')}"
    assert (error.group, error.op, error.where) == ("unit", "div", where)
    assert str(error).startswith(
        f"non-finite value in the forward of group 'unit' (created at {__file__}:"
        f"{line_of(__file__, '# unit-call')}): op div at {where} (return x / torch.sqrt((x * x).sum())  # "
        f"unit-div) made 3 NaN/inf of 3 elements from inputs without NaN, and it reaches the group's "
        f"output. No gradient rule can fix a forward value")
    assert torch._C._len_torch_function_stack() == 0  # the check is gone with the group


def test_a_rule_does_not_hide_a_forward_nan() -> None:
    ag.register_rule("unit", ag.NanSafe())
    x = torch.zeros(3, requires_grad=True)
    assert unit(x).isnan().all()  # whatever the rules do to gradients, the value is 0 / 0
    with ag.detect_nonfinite(), pytest.raises(ag.NonFiniteError, match="op div"):
        unit(x)


@pytest.mark.parametrize(("make", "op"), [
    (lambda x: torch.log(x), "log"),
    (lambda x: x.clone().log_(), "log_"),
    (lambda x: torch.exp(x + 100), "exp"),
    (lambda x: 1 / x, "rdiv"),
])
def test_ops_that_make_infinities_from_finite_inputs(make, op) -> None:
    x = torch.zeros(2, requires_grad=True)
    with ag.detect_nonfinite(), pytest.raises(ag.NonFiniteError, match=f"op {op} at .* from finite inputs"):
        ag.autograd_group("made")(make)(x)


def test_a_nan_from_infinities_is_named_and_infinities_passed_on_are_not() -> None:
    scores = torch.tensor([[0.0, 1.0], [-torch.inf, -torch.inf]], requires_grad=True)
    with ag.detect_nonfinite():
        with ag.autograd_group("masked"):
            masked = torch.zeros(2, 2).masked_fill(torch.tensor([[False, True], [True, True]]), -torch.inf)
            shifted = (scores + 1).amax(-1)  # -inf in, -inf out: passed on, not made
        assert torch.isinf(masked).sum() == 3 and torch.isinf(shifted).sum() == 1
        with pytest.raises(ag.NonFiniteError, match="op sub at .* from inputs without NaN"), \
                ag.autograd_group("logsumexp"):
            m = scores.amax(-1, keepdim=True)
            shifted = scores - m  # -inf - (-inf): the block's output


def test_the_forward_check_can_be_left_out_and_ops_outside_groups_are_not_checked() -> None:
    x = torch.zeros(3, requires_grad=True)
    with ag.detect_nonfinite(forward=False):
        assert unit(x).isnan().all()
    with ag.detect_nonfinite():
        assert (x / x).isnan().all()


def test_the_innermost_group_is_named_for_a_forward_nan() -> None:
    @ag.autograd_group("outer_norm")
    def outer(x: torch.Tensor) -> torch.Tensor:
        return unit(x) * 2

    with ag.detect_nonfinite(), pytest.raises(ag.NonFiniteError) as caught:
        outer(torch.zeros(2))
    assert caught.value.group == "unit"
    assert torch._C._len_torch_function_stack() == 0


def _softplus(x: torch.Tensor) -> torch.Tensor:
    # The tutorial's NaN-safe softplus: exp(100) overflows, and the where discards it.
    return torch.where(x < 20, torch.log1p(torch.exp(x)), x)


def test_a_forward_infinity_a_where_discards_is_no_error() -> None:
    with ag.registry_scope():
        ag.register_rule("softplus", ag.NanSafe())
        softplus = ag.autograd_group("softplus")(_softplus)
        x = torch.tensor([0.0, 100.0], requires_grad=True)
        with ag.detect_nonfinite():
            y = softplus(x)
            y.sum().backward()
        assert torch.isfinite(y).all() and torch.isfinite(x.grad).all()
        torch.testing.assert_close(x.grad, torch.tensor([0.5, 1.0]))


def test_a_forward_infinity_that_reaches_the_output_names_the_op_that_first_made_it() -> None:
    # exp(100) is inf; the where keeps it at x = 100 (a wrong threshold), and log1p passes it on.
    with ag.registry_scope():
        softplus = ag.autograd_group("softplus.wrong")(
            lambda x: torch.where(x < 200, torch.log1p(torch.exp(x)), x))  # wrong-threshold
        x = torch.tensor([0.0, 100.0], requires_grad=True)
        with ag.detect_nonfinite(), pytest.raises(ag.NonFiniteError) as caught:
            softplus(x)
        assert caught.value.group == "softplus.wrong" and caught.value.op == "exp"
        assert caught.value.where == f"{__file__}:{line_of(__file__, '# wrong-threshold')}"
        assert "made 1 NaN/inf of 2 elements from finite inputs, and it reaches the group's output" \
            in str(caught.value)


def test_a_nan_from_a_zero_gradient_advises_nan_safe_and_another_advises_a_subgradient() -> None:
    # softplus without its rule: exp's backward gets 0 from the where at x = 100, 0 * inf.
    softplus = ag.autograd_group("softplus.bare")(_softplus)
    x = torch.tensor([0.0, 100.0], requires_grad=True)
    with ag.detect_nonfinite(), pytest.raises(ag.NonFiniteError) as caught:
        softplus(x).sum().backward()
    assert caught.value.op == "exp"
    assert "The gradient it received is 0 there (0 * inf" in str(caught.value)
    assert "ag.register_rule('softplus.bare', ag.NanSafe()) passes 0 on" in str(caught.value)
    root = ag.autograd_group("root.bare")(lambda t: t.sqrt())
    with ag.detect_nonfinite(), pytest.raises(ag.NonFiniteError) as caught:
        root(torch.zeros(2, requires_grad=True)).sum().backward()
    assert "ag.Subgradient(op='sqrt', when=..., grad=0)" in str(caught.value)

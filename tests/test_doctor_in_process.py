"""``ag.doctor()`` in a running program: every backward pass of the block is watched, so what one
leaves behind (the forward's recording switched off, its gradients, another thread's backward at
the same time) decides what the next is told; and the classes of two findings that hold under the
command too (a division by the number 0, a gradient left non-finite before the step)."""

from __future__ import annotations

import gc
import threading
import weakref

import pytest
import torch
import torch.utils.checkpoint

import autograd_groups as ag
from autograd_groups.doctor.inprocess import UNSEEN_FORWARD
from tests.conftest import line_of


def _penalised_steps(bad_step: int) -> None:
    """Steps with a gradient penalty (the first backward builds a graph); the penalty's norm is 0
    at ``bad_step``."""
    w = torch.nn.Parameter(torch.ones(3))
    for step in range(bad_step + 1):
        x = torch.full((3,), 0.0 if step == bad_step else 1.0, requires_grad=True)
        (g,) = torch.autograd.grad((w * x).sum() * (x * x).sum(), x, create_graph=True)
        penalty = (g * g).sum().sqrt()  # born
        penalty.backward()


def test_a_gradient_penalty_a_step_after_the_first_keeps_its_line() -> None:
    """The penalty's first backward builds a graph; the forward after it is recorded again."""
    with ag.doctor() as report:
        _penalised_steps(1)
    assert (report.cls, report.born.node, report.born.line) == (
        "B", "SqrtBackward0", line_of(__file__, "# born"))
    assert report.notes == []


def _refuse(grad: torch.Tensor) -> torch.Tensor:
    raise ValueError("refused")


def test_a_backward_that_raised_in_the_block_leaves_the_forward_recorded() -> None:
    x = torch.ones(2, requires_grad=True)
    with ag.doctor() as report:
        y = x * 2
        y.register_hook(_refuse)
        with pytest.raises(ValueError, match="refused"):
            y.sum().backward()
        torch.zeros(2, requires_grad=True).sqrt().sum().backward()  # after the raise
    assert (report.cls, report.born.line) == ("B", line_of(__file__, "# after the raise"))


def test_a_backward_on_another_thread_at_the_same_time_is_watched() -> None:
    """Thread a's backward is held open (a hook waits) while thread b's goes bad."""
    a_inside, b_done = threading.Event(), threading.Event()

    def hold(g: torch.Tensor) -> torch.Tensor:
        a_inside.set()
        b_done.wait(30)
        return g

    def thread_a() -> None:
        h = torch.ones(3, requires_grad=True) * 2
        h.register_hook(hold)
        h.sum().backward()

    def thread_b() -> None:
        a_inside.wait(30)
        torch.zeros(3, requires_grad=True).sqrt().sum().backward()
        b_done.set()

    with ag.doctor() as report:
        threads = [threading.Thread(target=thread_a), threading.Thread(target=thread_b)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    assert (report.status, report.backward_calls, report.cls) == ("found", 2, "B")
    # Its forward ran on another thread than the block's: no line, and the note says why.
    assert report.born.line is None and report.notes == [UNSEEN_FORWARD]


def test_a_forward_made_before_an_earlier_backward_of_its_step_says_why_it_has_no_line() -> None:
    """A GAN's layout: the fake batch is made, the critic's backward runs, then the generator's."""
    g = torch.nn.Parameter(torch.zeros(3))
    critic = torch.nn.Parameter(torch.ones(3))
    with ag.doctor() as report:
        fake = (g * g).sum().sqrt() * torch.ones(3)
        (critic * fake.detach()).sum().backward()
        (critic * fake).sum().backward()
    assert (report.cls, report.born.node, report.born.line) == ("B", "SqrtBackward0", None)
    assert report.notes == [UNSEEN_FORWARD]


def test_a_finite_backward_keeps_nothing_alive() -> None:
    model = torch.nn.Linear(4, 2)
    caught: list[weakref.ref] = []
    with ag.doctor() as report:
        h = model(torch.randn(8, 4))
        h.register_hook(lambda grad: caught.append(weakref.ref(grad)))
        h.pow(2).mean().backward()
        leaf_grad = weakref.ref(model.weight.grad)
        model.zero_grad()  # set to None: the step's gradients are dropped
        del h
        gc.collect()
        assert leaf_grad() is None and caught[0]() is None
    assert report.status == "clean"


def test_a_clean_block_whose_last_step_a_loss_scaler_skipped_says_so() -> None:
    w = torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.SGD([w], lr=0.1)
    scaler = torch.amp.GradScaler("cpu")
    with ag.doctor() as report:
        for step in range(3):
            opt.zero_grad()
            scaler.scale((w * (0.0 if step == 2 else 1.0)).sum().sqrt()).backward()
            scaler.step(opt)
            scaler.update()
    assert report.status == "clean"
    assert report.notes and report.notes[0].startswith("the last 1 step(s) overflowed under a loss scaler")


def test_a_birth_inside_a_reentrant_checkpoint_says_what_hides_it() -> None:
    x = torch.zeros(3, requires_grad=True)
    with ag.doctor() as report:
        torch.utils.checkpoint.checkpoint(lambda v: v.sqrt(), x, use_reentrant=True).sum().backward()
    assert report.born.node == "CheckpointFunctionBackward"
    assert "reentrant checkpoint" in report.notes[0]


@pytest.mark.parametrize("divisor, cls", [("0", "C"), ("0.0", "C"), ("torch.tensor(0.0)", "C"),
                                          ("torch.tensor(1e-30)", "D")])
def test_a_division_by_the_number_zero_is_a_pole_not_an_overflow(divisor: str, cls: str) -> None:
    """``x / 0`` makes an infinity from finite values as an overflow does, but at a pole: C, as
    for a tensor 0; a divisor that is tiny, not 0, overflows (D)."""
    w = torch.nn.Parameter(torch.tensor([1e10]))
    with ag.doctor() as report:
        (w / eval(divisor)).sum().backward()
    assert (report.cls, report.born.phase, report.born.op) == (cls, "forward", "div")


@pytest.mark.parametrize("held, cls", [("float('nan')", "E"), ("float('inf')", "E"), ("None", "B")])
def test_a_gradient_left_non_finite_before_the_step_is_data(held: str, cls: str) -> None:
    """A leaf's ``.grad`` the script set non-finite (or never zeroed) is there at the step's start:
    E, with a note; a zeroed one leaves the step's own birth (B)."""
    w = torch.nn.Parameter(torch.zeros(2))
    w.grad = None if held == "None" else torch.full((2,), eval(held))
    with ag.doctor() as report:
        w.sqrt().sum().backward()
    assert report.cls == cls
    assert any("was not finite before this backward pass" in n for n in report.notes) == (cls == "E")

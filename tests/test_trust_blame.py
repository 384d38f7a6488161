"""The trust signals name what is wrong: the op whose derivative made a NaN (not the rule beside
it), and the user's line when a PyTorch function (``torch.func.hessian``,
``torch.autograd.functional.hessian``) called the group."""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
import trust_cases as tc

import autograd_groups as ag
from autograd_groups.viz.fold import short_where

F64 = torch.float64


@pytest.fixture(autouse=True)
def _scope() -> Any:
    with ag.registry_scope():
        yield


def second_order(run: Callable[[], Any]) -> list[warnings.WarningMessage]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run()
    return [w for w in caught if issubclass(w.category, ag.SecondOrderWarning)]


def sinc_of_length(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """``sinc(|v|) · v``: its Hessian at 0 is 0, and ``torch.sinc``'s double backward is what the
    running release makes it there."""
    ag.register_rule(name, ag.Subgradient(op="sqrt", when="result == 0", grad=0))
    return ag.autograd_group(name)(lambda v: torch.sinc(v.pow(2).sum(-1, keepdim=True).sqrt()) * v)


def _sinc_double_backward_is_nan_at_0() -> bool:
    x = torch.zeros(1, dtype=F64, requires_grad=True)
    (g,) = torch.autograd.grad(torch.sinc(x).sum(), x, create_graph=True)
    (h,) = torch.autograd.grad(g.sum(), x)
    return bool(h.isnan().any())


@pytest.mark.skipif(not _sinc_double_backward_is_nan_at_0(),
                    reason="this release's torch.sinc has a finite double backward at 0")
def test_a_nan_made_by_sinc_s_double_backward_names_sinc_not_the_rule() -> None:
    """Reverse mode over the backward meets torch.sinc's double backward: the Hessian is NaN."""
    f = sinc_of_length("blame.sinc")
    v = torch.zeros(3, dtype=F64)
    found = second_order(lambda: torch.func.jacrev(torch.func.jacrev(lambda u: f(u).sum()))(v))
    assert len(found) == 1
    message = str(found[0].message)
    assert "sinc's derivative formula (SincBackward0" in message and "not by the rule" in message
    assert "which is not the function's" not in message
    report = ag.verify(lambda u: f(u).sum(), v, order=2)
    (row,) = [r for r in report.rows if r.instance]
    assert "sinc's derivative formula" in row.origin and "not by the rule" in row.origin
    assert "sinc's derivative formula" in " ".join(str(report).split())


def _functional_forward(f: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[torch.Tensor], torch.Tensor]:
    return lambda x: torch.autograd.functional.hessian(f, x, outer_jacobian_strategy="forward-mode",
                                                       vectorize=True)


#: Hessians whose outer derivative is forward mode, over a reverse or a forward first derivative:
#: forward mode meets each op's forward formula, not its double backward.
FORWARD_OVER: dict[str, Callable[[Callable[[torch.Tensor], torch.Tensor]],
                                 Callable[[torch.Tensor], torch.Tensor]]] = {
    "hessian": torch.func.hessian,
    "jacfwd(jacfwd)": lambda f: torch.func.jacfwd(torch.func.jacfwd(f)),
    "jacrev(jacfwd)": lambda f: torch.func.jacrev(torch.func.jacfwd(f)),
    "jvp(grad)": lambda f: lambda x: torch.stack([torch.func.jvp(torch.func.grad(f), (x,), (e,))[1]
                                                  for e in torch.eye(x.numel(), dtype=x.dtype)]),
    "functional forward-mode": _functional_forward,
}


@pytest.mark.parametrize("mode", FORWARD_OVER)
def test_where_forward_mode_takes_the_hessian_past_sinc_it_is_exact_and_nothing_warns(mode: str) -> None:
    """sinc(|v|)·v ≈ v − π²|v|²v/6 at 0: the Hessian of its sum plus its squared norm is 2I."""
    f = sinc_of_length(f"blame.sinc.forward.{mode}")
    v = torch.zeros(3, dtype=F64)
    hessian = None

    def run() -> None:
        nonlocal hessian
        hessian = FORWARD_OVER[mode](lambda u: f(u).sum() + (f(u) ** 2).sum())(v)

    assert second_order(run) == []
    assert torch.equal(hessian, 2 * torch.eye(3, dtype=F64))


@pytest.mark.parametrize("mode", FORWARD_OVER)
def test_where_forward_mode_takes_a_wrong_hessian_it_still_warns(mode: str) -> None:
    """cos(|v|) at 0 through the sqrt's subgradient: 0 where the function's Hessian is −I."""
    f = tc.cos_of_length(f"blame.cos.forward.{mode}")
    v = torch.zeros(3, dtype=F64)
    found = second_order(lambda: FORWARD_OVER[mode](f)(v))
    # torch.autograd.functional hands the check no function to run through: it says what decides.
    said = "could not be checked" if mode.startswith("functional") else "which is not the function's"
    assert found and said in str(found[0].message)


def test_a_wrong_rule_without_a_nan_names_no_other_op() -> None:
    power = tc.pow_composite("blame.power")  # d²/dx² x² at 0: the NaN-safe rule gives 0, not 2
    x = torch.zeros(2, dtype=F64)

    def f(u: torch.Tensor) -> torch.Tensor:
        return power(u, torch.full_like(u, 2.0)).sum()

    found = second_order(lambda: torch.func.hessian(f)(x))
    assert len(found) == 1 and "which is not the function's" in str(found[0].message)
    assert "derivative formula" not in str(found[0].message)
    (row,) = [r for r in ag.verify(f, x, order=2).rows if r.instance]
    assert row.status == "inconsistent" and row.origin == ""


def test_under_pytorch_s_hessians_the_warning_is_at_the_user_s_line() -> None:
    ag.register_rule("blame.where", ag.Subgradient(op="sqrt", when="result == 0", grad=0))
    f = ag.autograd_group("blame.where")(lambda v: torch.cos((v * v).sum().sqrt()))
    v = torch.zeros(3, dtype=F64)
    first = test_under_pytorch_s_hessians_the_warning_is_at_the_user_s_line.__code__.co_firstlineno
    for run, line in ((lambda: torch.func.hessian(f)(v), first + 5),
                      (lambda: torch.autograd.functional.hessian(f, v), first + 6)):
        found = second_order(run)
        assert [(w.filename, w.lineno) for w in found] == [(__file__, line)]
        assert f"created at {__file__}:{line}" in str(found[0].message)


def test_stats_paths_are_relative_to_the_working_directory_through_a_link(tmp_path: Any,
                                                                          monkeypatch: Any) -> None:
    real = tmp_path / "real"
    (real / "sub").mkdir(parents=True)
    (tmp_path / "link").symlink_to(real)
    monkeypatch.chdir(real)
    assert short_where(f"{tmp_path / 'link' / 'sub' / 's.py'}:7") == os.path.join("sub", "s.py") + ":7"
    assert short_where(f"{real / 'sub' / 's.py'}:7") == os.path.join("sub", "s.py") + ":7"
    outside = f"{tmp_path / 'elsewhere.py'}:3"
    assert short_where(outside) == outside

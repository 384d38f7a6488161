"""A group compiled as its own region in every way PyTorch runs code: checkpointing, autocast,
compiled autograd, inference, a backward-scoped flag, ``torch.export`` and TorchScript. Each gives
the eager group's values, or what the eager group says in that mode. (``torch.func``, forward mode
and an outer ``torch.compile``: tests/test_region.py; DDP and FSDP2: tests/test_ddp.py and
tests/test_fsdp.py.)"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator

import pytest
import torch
from torch.utils.checkpoint import checkpoint

import autograd_groups as ag
from autograd_groups.groups import differentiated_again

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("compile")]

RULE = ag.Subgradient(op="sqrt", when="result == 0", grad=0)


def length(v: torch.Tensor) -> torch.Tensor:
    return v.pow(2).sum(-1, keepdim=True).sqrt() * v


region = ag.autograd_group("modes.region", compile={"backend": "aot_eager"})(length)
eager = ag.autograd_group("modes.eager")(length)


@pytest.fixture(autouse=True, scope="module")
def registered() -> Iterator[None]:
    """The groups' rules, for this module's tests only (other modules list the registry)."""
    with ag.registry_scope():
        ag.register_rule("modes.region", RULE)
        ag.register_rule("modes.eager", RULE)
        yield


def rows(dtype: torch.dtype = torch.float64) -> torch.Tensor:
    return torch.tensor([[0.0, 0.0, 0.0], [1.0, 2.0, 3.0]], dtype=dtype)


def grad_of(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    x = x.detach().requires_grad_()
    fn(x).sum().backward()
    assert x.grad is not None
    return x.grad


def compiled_calls() -> int:
    calls: int = ag.stats()["modes.region"]["region"]["compiled_calls"]
    return calls


def test_under_checkpointing() -> None:
    ag.reset_stats()
    got = grad_of(lambda v: checkpoint(region, v, use_reentrant=False), rows())
    torch.testing.assert_close(got, grad_of(eager, rows()))
    assert compiled_calls() >= 1


def test_under_autocast() -> None:
    x = rows(torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got, want = grad_of(region, x), grad_of(eager, x)
    torch.testing.assert_close(got, want)
    assert torch.isfinite(got).all()


def test_under_compiled_autograd() -> None:
    ag.reset_stats()
    x = rows().requires_grad_()
    with torch._dynamo.compiled_autograd._enable(torch.compile(backend="aot_eager")):
        (region(x) * torch.arange(3.0, dtype=x.dtype)).sum().backward()
    want = rows().requires_grad_()
    (eager(want) * torch.arange(3.0, dtype=want.dtype)).sum().backward()
    torch.testing.assert_close(x.grad, want.grad)
    assert compiled_calls() == 1


def test_inference() -> None:
    with torch.no_grad():
        torch.testing.assert_close(region(rows()), length(rows()))


def test_a_backward_scope_cannot_reach_its_compiled_rules_and_says_so() -> None:
    scoped = ag.autograd_group("modes.scoped", compile={"backend": "aot_eager"})(length)
    x = rows().requires_grad_()
    with ag.registry_scope():
        ag.register_rule("modes.scoped", RULE)
        loss = scoped(x).sum()
    with pytest.warns(UserWarning, match=r"cannot turn off the rules of 'modes\.scoped' inside "
                                         r"torch\.compile'd"), ag.special_cases(False, during="backward"):
        loss.backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()


def test_export_and_torchscript_say_what_they_do_with_its_rules() -> None:
    class Model(torch.nn.Module):
        def forward(self, v: torch.Tensor) -> torch.Tensor:
            return region(v)

    with pytest.warns(UserWarning, match=r"group 'modes\.region' has special-case rules that torch\.export "
                                         r"cannot carry"):
        torch.export.export(Model(), (rows(),))
    with pytest.raises(torch._dynamo.exc.Unsupported, match=r"torch\.export \(strict\) cannot carry"):
        torch.export.export(Model(), (rows(),), strict=True)
    told = r"group 'modes\.region' has special-case rules that torch\.jit\.trace"
    with pytest.warns(UserWarning, match=told):
        torch.jit.trace(Model(), (rows(),))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # torch.jit.script's own, on newer releases
        with pytest.raises(ag.GroupError, match=r"group 'modes\.region' has special-case rules that "
                                                r"TorchScript"):
            torch.jit.script(region)


def test_a_backward_through_its_gradient_is_the_eager_groups() -> None:
    """``create_graph=True``, then a backward through the gradient (a gradient penalty): the eager
    group's backward takes the compiled one's place, at the special row too."""
    def penalty(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        x = x.detach().requires_grad_()
        (grad,) = torch.autograd.grad((fn(x) * torch.arange(1.0, 4.0, dtype=x.dtype)).sum(), x,
                                      create_graph=True)
        (grad.pow(2).sum() + fn(x).sum()).backward()
        assert x.grad is not None
        return x.grad

    got, want = penalty(region, rows()), penalty(eager, rows())
    torch.testing.assert_close(got, want)
    assert torch.isfinite(got).all()
    hessian = torch.func.hessian(lambda v: region(v).sum())(rows()[1])  # eager under torch.func
    torch.testing.assert_close(hessian, torch.func.hessian(lambda v: eager(v).sum())(rows()[1]))


def test_with_inductor_a_dynamic_graph_is_differentiated_twice_and_kept_for_a_second_backward() -> None:
    """At a second batch size the graph has a dynamic batch dimension; inductor's backward of it
    takes create_graph=True and retain_graph=True (aot_eager's refuses both, as PyTorch does for a
    plain torch.compile with it)."""
    default = ag.autograd_group("modes.inductor", compile=True)(length)
    weights = torch.tensor([1.0, 2.0, 3.0])
    with ag.registry_scope():
        ag.register_rule("modes.inductor", RULE)
        for batch in (2, 3):
            found = []
            for fn in (default, eager):
                x = torch.zeros(batch, 3)
                x[1:] = torch.arange(3 * (batch - 1), dtype=torch.float32).reshape(batch - 1, 3) + 1
                x.requires_grad_()
                out = (fn(x) * weights).sum()
                (grad,) = torch.autograd.grad(out, x, create_graph=True, retain_graph=True)
                grad.pow(2).sum().backward(retain_graph=True)
                out.backward()
                found.append(x.grad)
            torch.testing.assert_close(found[0], found[1])


def test_a_list_of_tensors_as_argument_is_differentiated_again_eagerly_too() -> None:
    @ag.autograd_group("modes.listed", compile={"backend": "aot_eager"})
    def scaled(vs: list[torch.Tensor]) -> torch.Tensor:
        return length(vs[0] * vs[1])

    def penalty(fn: Callable[[list[torch.Tensor]], torch.Tensor]) -> list[torch.Tensor]:
        x, w = rows().requires_grad_(), torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64).requires_grad_()
        (grad,) = torch.autograd.grad(fn([x, w]).sum(), x, create_graph=True)
        grad.pow(2).sum().backward()
        return [x.grad, w.grad]  # type: ignore[list-item]

    with ag.registry_scope():
        ag.register_rule("modes.listed", RULE)
        got = penalty(scaled)
    want = penalty(lambda vs: eager(vs[0] * vs[1]))
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)


def test_where_its_inputs_are_not_all_known_a_backward_through_its_gradient_names_the_group() -> None:
    x, w = rows().requires_grad_(), torch.ones(3, dtype=torch.float64, requires_grad=True)
    compiled = torch.compile(lambda a, b: length(a * b), backend="aot_eager")
    out = compiled(x, w)
    differentiated_again.eagerly("modes.partial", out, [x], lambda: length(x * w))  # w not told
    (grad,) = torch.autograd.grad(out.sum(), x, create_graph=True)
    with pytest.raises(ag.GroupError, match=r"group 'modes\.partial' \(compile=True\): a gradient of its "
                                            r"compiled backward was asked for .* reads tensors other than"):
        grad.pow(2).sum().backward()

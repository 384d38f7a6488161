"""torch.compile: a model that calls ``ag.ops.cdist`` compiles (with a graph break around the group,
which runs eagerly) and gives the eager gradients; grouping compiled code is refused, not ignored."""

from __future__ import annotations

import pytest
import torch

import autograd_groups as ag

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::UserWarning")]


class PairwiseModel(torch.nn.Module):
    """Embeds points and penalises their pairwise distances; ``cdist(z, z)`` has a zero diagonal,
    where the plain composite's gradient is NaN."""

    def __init__(self, cdist=ag.ops.cdist) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(3, 3, dtype=torch.float64)
        self.cdist = cdist

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = torch.tanh(self.lin(x))
        return (self.cdist(z, z) - 1.0).pow(2).mean()


def _grads(model: torch.nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    model.zero_grad(set_to_none=True)
    model(x).backward()
    return [p.grad.clone() for p in model.parameters()]  # type: ignore[union-attr]


def test_compiled_model_gives_eager_gradients() -> None:
    torch.manual_seed(0)
    model = PairwiseModel()
    x = torch.randn(6, 3, dtype=torch.float64)
    eager = _grads(model, x)
    assert all(torch.isfinite(g).all() for g in eager)
    model.cdist = ag.ops.cdist.__wrapped__  # the plain composite: NaN on the diagonal
    assert any(g.isnan().any() for g in _grads(model, x))
    model.cdist = ag.ops.cdist
    compiled = torch.compile(model)
    for got, want in zip(_grads(compiled, x), eager):
        torch.testing.assert_close(got, want)
    explained = torch._dynamo.explain(model)(x)
    assert explained.graph_break_count >= 1
    assert any("disable" in str(reason.reason) for reason in explained.break_reasons)


def test_grouping_compiled_code() -> None:
    """A tag or a decorated function over compiled code would hide the ops in one compiled node: an
    error, not a rule silently left out. A ``with`` block records through a TorchFunctionMode, which
    runs each torch call eagerly under Dynamo: its rules apply."""
    ag.register_rule("rel_compiled", ag.Subgradient(op="sqrt", when="result == 0", grad=0))
    compiled_norm = torch.compile(lambda t: t.pow(2).sum(-1).sqrt(), backend="aot_eager")
    x = torch.zeros(2, 3, requires_grad=True)
    refused = r"group 'rel_compiled' .* torch\.compile'd graph"
    with pytest.raises(ag.GroupError, match=refused):
        torch.compile(lambda t: ag.tag(t.pow(2).sum(-1).sqrt(), "rel_compiled"), backend="aot_eager")(x)
    with pytest.raises(ag.GroupError, match=refused):
        ag.autograd_group("rel_compiled")(compiled_norm)(x)
    assert ag.groups.lifecycle.open_instances() == []
    with ag.autograd_group("rel_compiled"):
        out = compiled_norm(x)
    (grad,) = torch.autograd.grad(out.sum(), x)
    torch.testing.assert_close(grad, torch.zeros_like(x))


def test_without_autograd_groups_are_traced_through() -> None:
    """Under no_grad and in torch.export there is no autograd graph to put rules on: no graph break,
    the plain values."""
    torch.manual_seed(0)
    model = PairwiseModel()
    x = torch.randn(6, 3, dtype=torch.float64)
    with torch.no_grad():
        want = model(x)
        explained = torch._dynamo.explain(model)(x)
        assert explained.graph_break_count == 0
        torch.testing.assert_close(torch.compile(model, backend="aot_eager")(x), want)
    exported = torch.export.export(model, (x,))
    torch.testing.assert_close(exported.module()(x), want)

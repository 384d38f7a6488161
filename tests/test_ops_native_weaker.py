"""Where the native ops are weaker than the built-ins: each row of docs/builtins.md's table
"Where native PyTorch is weaker" is one test here, asserting both what PyTorch does and what the
built-in does instead."""

from __future__ import annotations

import math

import pytest
import torch

import autograd_groups as ag

DISTANCES = {
    "cdist p=2, direct form": (ag.ops.cdist, torch.cdist, ((6, 3), (5, 3)), {}),
    "cdist p=1": (ag.ops.cdist, torch.cdist, ((6, 3), (5, 3)), {"p": 1.0}),
    "cdist p=3": (ag.ops.cdist, torch.cdist, ((6, 3), (5, 3)), {"p": 3.0}),
    "pdist p=2": (ag.ops.pdist, torch.pdist, ((6, 3),), {}),
    "pdist p=0.5": (ag.ops.pdist, torch.pdist, ((6, 3),), {"p": 0.5}),
}


def _inputs(shapes, dtype=torch.float64):
    g = torch.Generator().manual_seed(0)
    return tuple(torch.randn(s, generator=g, dtype=torch.float64).to(dtype).requires_grad_() for s in shapes)


@pytest.mark.parametrize("name", list(DISTANCES))
def test_double_backward_of_distances(name) -> None:
    ours, native, shapes, kwargs = DISTANCES[name]
    args = _inputs(shapes)
    (grad,) = torch.autograd.grad(native(*args, **kwargs).sum(), args[0], create_graph=True)
    with pytest.raises(NotImplementedError, match=r"derivative for '_(c|p)dist_backward' is not implemented"):
        torch.autograd.grad(grad.sum(), args[0])
    assert torch.autograd.gradgradcheck(lambda *a: ours(*a, **kwargs), args)


@pytest.mark.parametrize("name", ["cdist p=2, direct form", "cdist p=1", "pdist p=2"])
def test_forward_mode_of_distances(name) -> None:
    ours, native, shapes, kwargs = DISTANCES[name]
    args = tuple(a.detach() for a in _inputs(shapes))
    with pytest.raises(NotImplementedError, match="forward AD"):
        torch.func.jacfwd(lambda *a: native(*a, **kwargs))(*args)
    forward = torch.func.jacfwd(lambda *a: ours(*a, **kwargs))(*args)
    torch.testing.assert_close(forward, _jacobian(native, args, kwargs))


def _jacobian(op, args, kwargs):
    """The Jacobian in the first argument, one plain backward pass per output element."""
    return torch.autograd.functional.jacobian(lambda a: op(a, *args[1:], **kwargs), args[0])


def test_jacrev_of_cdist() -> None:
    # torch.func.jacrev runs _cdist_backward under vmap, whose batched fallback gives a wrong
    # Jacobian in torch 2.13; ops.cdist's backward is made of batchable ops.
    ours, native, shapes, kwargs = DISTANCES["cdist p=2, direct form"]
    args = tuple(a.detach() for a in _inputs(shapes))
    expected = _jacobian(native, args, kwargs)
    assert not torch.allclose(torch.func.jacrev(native)(*args), expected)
    torch.testing.assert_close(torch.func.jacrev(ours)(*args), expected)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", ["cdist p=2, direct form", "pdist p=2"])
def test_half_and_bfloat16_distances(name, dtype) -> None:
    ours, native, shapes, kwargs = DISTANCES[name]
    args = _inputs(shapes, dtype)
    with pytest.raises(NotImplementedError, match="not implemented for"):
        native(*args, **kwargs)
    out = ours(*args, **kwargs)
    assert out.dtype == dtype
    out.sum().backward()
    exact = _inputs(shapes, torch.float32)
    expected = native(*(a.detach().to(dtype).float().requires_grad_() for a in exact), **kwargs)
    torch.testing.assert_close(out.float(), expected, rtol=2e-2, atol=2e-2)
    assert all(a.grad is not None and a.grad.isfinite().all() for a in args)


def test_logsumexp_of_a_masked_row_is_finite_where_torch_is_not() -> None:
    x = torch.tensor([[0.0, -math.inf], [-math.inf, -math.inf]], dtype=torch.float64)
    grads = []
    for op in (ag.ops.logsumexp, torch.logsumexp):
        leaf = x.clone().requires_grad_()
        (op(leaf, 1) * torch.tensor([1.0, 0.0], dtype=torch.float64)).sum().backward()
        grads.append(leaf.grad)
    ours, native = grads
    assert native[1].isnan().all()
    assert torch.equal(ours, torch.tensor([[1.0, 0.0], [0.0, 0.0]], dtype=torch.float64))


def test_atan2_second_order_at_the_origin_is_finite_where_torch_is_not() -> None:
    def hessian_diagonal(op):
        y, x = torch.zeros(1, dtype=torch.float64, requires_grad=True), torch.zeros(1, dtype=torch.float64,
                                                                                     requires_grad=True)
        gy, gx = torch.autograd.grad(op(y, x).sum(), (y, x), create_graph=True)
        return torch.autograd.grad(gy.sum() + gx.sum(), (y, x))

    native, ours = hessian_diagonal(torch.atan2), hessian_diagonal(ag.ops.atan2)
    assert all(h.isnan().all() for h in native)
    # The reference: atan2 with a double where at the origin, whose derivatives there are all 0.
    assert all(torch.equal(h, torch.zeros(1, dtype=torch.float64)) for h in ours)


def test_pow_exponent_gradient_at_a_negative_base_is_finite_where_torch_is_not() -> None:
    base, power = torch.tensor([-2.0, -0.5]), torch.tensor([3.0, 2.0])
    grads = []
    for op in (ag.ops.pow, torch.pow):
        y = power.clone().requires_grad_()
        op(base, y).sum().backward()
        grads.append(y.grad)
    ours, native = grads
    assert native.isnan().all()
    torch.testing.assert_close(ours, torch.pow(base, power) * torch.log(base.abs()))

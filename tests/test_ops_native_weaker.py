"""Where the native ops are weaker than the built-ins: each row of docs/builtins.md's table
"Where native PyTorch is weaker" is one test here. Each asks the running release what native does
(a release may add a derivative or fix a NaN): where native is weaker, the test checks that it fails
the way the table says, and the built-in's own answer; where a release fixed it, the built-in must
agree with native."""

from __future__ import annotations

import math
import re

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


def _second_derivative(op, args, kwargs):
    (grad,) = torch.autograd.grad(op(*args, **kwargs).sum(), args[0], create_graph=True)
    return torch.autograd.grad((grad * grad).sum(), args)


@pytest.mark.parametrize("name", list(DISTANCES))
def test_double_backward_of_distances(name) -> None:
    ours, native, shapes, kwargs = DISTANCES[name]
    args = _inputs(shapes)
    assert torch.autograd.gradgradcheck(lambda *a: ours(*a, **kwargs), args)
    try:
        expected = _second_derivative(native, args, kwargs)
    except NotImplementedError as e:  # torch 2.11-2.13: no double backward
        assert re.search(r"derivative for '_(c|p)dist_backward' is not implemented", str(e))
        return
    for got, want in zip(_second_derivative(ours, args, kwargs), expected):
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("name", ["cdist p=2, direct form", "cdist p=1", "pdist p=2"])
def test_forward_mode_of_distances(name) -> None:
    ours, native, shapes, kwargs = DISTANCES[name]
    args = tuple(a.detach() for a in _inputs(shapes))
    expected = _jacobian(native, args, kwargs)
    torch.testing.assert_close(torch.func.jacfwd(lambda *a: ours(*a, **kwargs))(*args), expected)
    try:
        forward = torch.func.jacfwd(lambda *a: native(*a, **kwargs))(*args)
    except NotImplementedError as e:
        assert "forward AD" in str(e)
        return
    torch.testing.assert_close(forward, expected)


def _jacobian(op, args, kwargs):
    """The Jacobian in the first argument, one plain backward pass per output element."""
    return torch.autograd.functional.jacobian(lambda a: op(a, *args[1:], **kwargs), args[0])


def test_jacrev_of_cdist() -> None:
    # torch.func.jacrev runs _cdist_backward under vmap, whose batched fallback gives a wrong
    # Jacobian (torch 2.11-2.15); ops.cdist's backward is made of batchable ops.
    ours, native, shapes, kwargs = DISTANCES["cdist p=2, direct form"]
    args = tuple(a.detach() for a in _inputs(shapes))
    expected = _jacobian(native, args, kwargs)
    torch.testing.assert_close(torch.func.jacrev(ours)(*args), expected)
    native_jacobian = torch.func.jacrev(native)(*args)
    if not torch.allclose(native_jacobian, expected):
        assert (native_jacobian - expected).abs().max() > 0.1  # wrong, not rounded: the table's row


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", ["cdist p=2, direct form", "pdist p=2"])
def test_half_and_bfloat16_distances(name, dtype) -> None:
    ours, native, shapes, kwargs = DISTANCES[name]
    args = _inputs(shapes, dtype)
    out = ours(*args, **kwargs)
    assert out.dtype == dtype
    out.sum().backward()
    assert all(a.grad is not None and a.grad.isfinite().all() for a in args)
    exact = _inputs(shapes, torch.float32)
    expected = native(*(a.detach().to(dtype).float().requires_grad_() for a in exact), **kwargs)
    torch.testing.assert_close(out.float(), expected, rtol=2e-2, atol=2e-2)
    try:
        native(*args, **kwargs)
    except NotImplementedError as e:
        assert "not implemented for" in str(e)


def test_logsumexp_of_a_masked_row_is_finite_where_torch_is_not() -> None:
    x = torch.tensor([[0.0, -math.inf], [-math.inf, -math.inf]], dtype=torch.float64)
    grads = []
    for op in (ag.ops.logsumexp, torch.logsumexp):
        leaf = x.clone().requires_grad_()
        (op(leaf, 1) * torch.tensor([1.0, 0.0], dtype=torch.float64)).sum().backward()
        grads.append(leaf.grad)
    ours, native = grads
    assert torch.equal(ours, torch.tensor([[1.0, 0.0], [0.0, 0.0]], dtype=torch.float64))
    assert native[1].isnan().all() or torch.equal(native, ours)


def test_atan2_second_order_at_the_origin_is_finite_where_torch_is_not() -> None:
    def hessian_diagonal(op):
        y, x = torch.zeros(1, dtype=torch.float64, requires_grad=True), torch.zeros(1, dtype=torch.float64,
                                                                                     requires_grad=True)
        gy, gx = torch.autograd.grad(op(y, x).sum(), (y, x), create_graph=True)
        return torch.autograd.grad(gy.sum() + gx.sum(), (y, x))

    native, ours = hessian_diagonal(torch.atan2), hessian_diagonal(ag.ops.atan2)
    # The reference: atan2 with a double where at the origin, whose derivatives there are all 0.
    assert all(torch.equal(h, torch.zeros(1, dtype=torch.float64)) for h in ours)
    assert all(h.isnan().all() for h in native) or all(torch.equal(h, o) for h, o in zip(native, ours))


def test_pow_exponent_gradient_at_a_negative_base_is_finite_where_torch_is_not() -> None:
    base, power = torch.tensor([-2.0, -0.5]), torch.tensor([3.0, 2.0])
    grads = []
    for op in (ag.ops.pow, torch.pow):
        y = power.clone().requires_grad_()
        op(base, y).sum().backward()
        grads.append(y.grad)
    ours, native = grads
    torch.testing.assert_close(ours, torch.pow(base, power) * torch.log(base.abs()))
    assert native.isnan().all() or torch.allclose(native, ours)


def test_xlogy_cross_entropy_against_a_masked_class_is_finite_where_torch_is_not() -> None:
    # Target 0 at a class the softmax gives probability 0: xlogy(0, p) is 0 for every p, so the
    # loss does not depend on p there; torch.xlogy's gradient of p is grad * 0 / 0.
    z = torch.tensor([[1.0, -math.inf, 0.5]], dtype=torch.float64)
    t = torch.tensor([[0.7, 0.0, 0.3]], dtype=torch.float64)
    grads = []
    for op in (ag.ops.xlogy, torch.xlogy):
        leaf = z.clone().requires_grad_()
        (-op(t, torch.softmax(leaf, -1))).sum().backward()
        grads.append(leaf.grad)
    ours, native = grads
    torch.testing.assert_close(ours, torch.softmax(z, -1) - t)
    assert native.isnan().all() or torch.allclose(native, ours)

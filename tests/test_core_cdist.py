"""The grouped composite cdist against torch.cdist and against plain autograd."""

from __future__ import annotations

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import autograd_groups as ag


def native(x1: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:
    return torch.cdist(x1, x2, compute_mode="donot_use_mm_for_euclid_dist")


def grads(fn, x1: torch.Tensor, x2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    a, b = x1.detach().requires_grad_(), x2.detach().requires_grad_()
    out = fn(a, b)
    # A non-uniform upstream gradient, so a wrong mask cannot hide behind symmetry.
    out.backward(torch.arange(out.numel(), dtype=out.dtype).reshape(out.shape) % 5 + 1)
    return a.grad, b.grad


@st.composite
def points_with_duplicates(draw):
    batch = draw(st.sampled_from([(), (2,), (2, 3)]))
    n, m, d = draw(st.integers(1, 6)), draw(st.integers(1, 6)), draw(st.integers(1, 4))
    values = st.integers(-3, 3)
    x1 = torch.tensor(draw(st.lists(values, min_size=n * d * _numel(batch),
                                    max_size=n * d * _numel(batch))), dtype=torch.float64)
    x2 = torch.tensor(draw(st.lists(values, min_size=m * d * _numel(batch),
                                    max_size=m * d * _numel(batch))), dtype=torch.float64)
    x1, x2 = x1.reshape(*batch, n, d), x2.reshape(*batch, m, d)
    i, j = draw(st.integers(0, n - 1)), draw(st.integers(0, m - 1))
    x2[..., j, :] = x1[..., i, :]  # at least one zero distance in every batch entry
    return x1, x2


def _numel(shape: tuple[int, ...]) -> int:
    out = 1
    for s in shape:
        out *= s
    return out


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(points_with_duplicates())
def test_grouped_cdist_equals_torch_cdist_at_zero_distances(cdist_example, points):
    x1, x2 = points
    torch.testing.assert_close(cdist_example.grouped_cdist(x1, x2), native(x1, x2))
    for ours, theirs in zip(grads(cdist_example.grouped_cdist, x1, x2), grads(native, x1, x2)):
        assert torch.isfinite(ours).all()
        torch.testing.assert_close(ours, theirs)


def test_plain_composite_is_nan_at_zero_distances(cdist_example, direct_cdist):
    x1 = torch.tensor([[0.0, 1.0], [2.0, 3.0]], dtype=torch.float64)
    g1, _ = grads(direct_cdist.euclidean_cdist, x1, x1.clone())
    assert g1.isnan().all(), "the bug the group fixes must exist in the plain composite"
    # The ATen form's: NaN up to torch 2.14; from 2.15 clamp_min's backward passes 0 at the
    # boundary, and its gradient there is the rule's. Asked of the running release.
    g1, _ = grads(cdist_example.euclidean_cdist, x1, x1.clone())
    assert g1.isnan().all() or torch.equal(g1, grads(cdist_example.grouped_cdist, x1, x1.clone())[0])


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.integers(0, 10_000), st.sampled_from([(), (3,)]))
def test_away_from_special_points_grouped_equals_plain_autograd(cdist_example, seed, batch):
    g = torch.Generator().manual_seed(seed)
    x1 = torch.randn(*batch, 5, 3, generator=g, dtype=torch.float64)
    x2 = torch.randn(*batch, 4, 3, generator=g, dtype=torch.float64) + 10
    ours = grads(cdist_example.grouped_cdist, x1, x2)
    plain = grads(cdist_example.euclidean_cdist, x1, x2)
    for a, b in zip(ours, plain):
        assert torch.equal(a, b)


def test_special_element_does_not_contaminate_other_rows(direct_cdist):
    g = torch.Generator().manual_seed(0)
    x1 = torch.randint(-3, 4, (6, 3), generator=g).double()
    x2 = torch.randint(-3, 4, (5, 3), generator=g).double() + 20  # far from x1: no zero distance
    x2[1] = x1[2]
    x2[3] = x1[4]
    special_rows = torch.tensor([2, 4])
    regular = torch.ones(6, dtype=torch.bool)
    regular[special_rows] = False
    ours, _ = grads(direct_cdist.grouped_cdist, x1, x2)
    plain, _ = grads(direct_cdist.euclidean_cdist, x1, x2)
    assert plain[special_rows].isnan().all() and plain[regular].isfinite().all()
    assert torch.equal(ours[regular], plain[regular])
    torch.testing.assert_close(ours, grads(native, x1, x2)[0])


def test_float32_matches_native(cdist_example):
    x1 = torch.randint(-3, 4, (2, 7, 4)).float()
    x2 = torch.randint(-3, 4, (2, 6, 4)).float()
    x2[:, :3] = x1[:, 2:5]
    for ours, theirs in zip(grads(cdist_example.grouped_cdist, x1, x2), grads(native, x1, x2)):
        torch.testing.assert_close(ours, theirs)


def test_retain_graph_twice_gives_the_same_gradients(cdist_example):
    x1 = torch.tensor([[0.0, 1.0], [2.0, 3.0], [1.0, 1.0]], dtype=torch.float64, requires_grad=True)
    x2 = torch.tensor([[0.0, 1.0], [5.0, 5.0]], dtype=torch.float64, requires_grad=True)
    loss = cdist_example.grouped_cdist(x1, x2).sum()
    first = torch.autograd.grad(loss, (x1, x2), retain_graph=True)
    second = torch.autograd.grad(loss, (x1, x2))
    for a, b in zip(first, second):
        assert torch.isfinite(a).all()
        assert torch.equal(a, b)


def test_gradcheck_and_gradgradcheck_through_a_rule_site(cdist_example):
    g = torch.Generator().manual_seed(1)
    x1 = torch.randn(3, 2, generator=g, dtype=torch.float64, requires_grad=True)
    x2 = torch.randn(4, 2, generator=g, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(cdist_example.grouped_cdist, (x1, x2))
    assert torch.autograd.gradgradcheck(cdist_example.grouped_cdist, (x1, x2))


def test_gradgradcheck_where_a_constant_rule_fires():
    # sqrt(clamp_min(x, 0)) is 0 on x < 0, so the rule fires on a whole neighbourhood there and
    # the function is smooth: second derivatives exist and must be finite and right.
    ag.register_rule("soft", ag.Subgradient(op="sqrt", when="result == 0", grad=0))
    fn = ag.autograd_group("soft")(lambda x: x.clamp_min(0).sqrt() * 3 + x * x)
    x = torch.tensor([-1.5, -0.5, 0.7, 2.0], dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(fn, (x,))
    assert torch.autograd.gradgradcheck(fn, (x,))

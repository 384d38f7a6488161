"""The built-in ops equal PyTorch's native ops, values and gradients, at regular and special points;
with special cases off they are exactly their plain composites."""

from __future__ import annotations

import pytest
import torch
from ops_cases import CASES, DTYPES, Case, forward_backward, inputs

import autograd_groups as ag

#: float32: a composite rounds after every op where the native kernel fuses (|d| ** 0.5, then the sum,
#: then its square): a few tens of ulps apart. float64: assert_close's defaults.
TOLERANCE = {torch.float32: {"rtol": 1e-5, "atol": 1e-5}, torch.float64: {}}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_values_and_gradients_equal_the_native_op(case: Case, dtype: torch.dtype) -> None:
    ours, ours_grads = forward_backward(case.ours, inputs(case, dtype), case.kwargs)
    native, native_grads = forward_backward(case.native, inputs(case, dtype), case.kwargs)
    torch.testing.assert_close(ours, native, equal_nan=True, **TOLERANCE[dtype])
    assert len(ours_grads) == len(native_grads)
    for mine, theirs in zip(ours_grads, native_grads):
        torch.testing.assert_close(mine, theirs, equal_nan=True, **TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_the_forward_runs_on_the_meta_device_as_native(case: Case, dtype: torch.dtype) -> None:
    """Shapes without data (model initialisation, shape inference): the autocast policy asked
    torch.is_autocast_enabled("meta"), which raises, before any built-in ran."""
    args = tuple(a.detach().to("meta").requires_grad_() if isinstance(a, torch.Tensor) else a
                 for a in inputs(case, dtype))
    try:
        native = case.native(*args, **case.kwargs)
    except (NotImplementedError, RuntimeError) as error:
        pytest.skip(f"native {case.id} does not run on meta: {error}")
    ours = case.ours(*args, **case.kwargs)
    assert (ours.device, ours.shape, ours.dtype) == (native.device, native.shape, native.dtype)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_special_cases_off_is_exactly_the_plain_composite(case: Case) -> None:
    plain = case.ours.__wrapped__  # type: ignore[attr-defined]
    expected, expected_grads = forward_backward(plain, inputs(case, torch.float64), case.kwargs)
    with ag.special_cases(False):
        got, got_grads = forward_backward(case.ours, inputs(case, torch.float64), case.kwargs)
    torch.testing.assert_close(got, expected, rtol=0, atol=0, equal_nan=True)
    for mine, theirs in zip(got_grads, expected_grads):
        torch.testing.assert_close(mine, theirs, rtol=0, atol=0, equal_nan=True)
    _, native_grads = forward_backward(case.native, inputs(case, torch.float64), case.kwargs)
    broken = any(bool((~g.isfinite() & n.isfinite()).any()) for g, n in zip(got_grads, native_grads))
    assert broken == case.composite_breaks, (
        "the plain composite must be non-finite at these special points exactly when the case needs a rule")


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_the_groups_rules_fire_at_the_special_points(case: Case) -> None:
    group = case.ours.__autograd_group__  # type: ignore[attr-defined]
    with ag.trace():
        forward_backward(case.ours, inputs(case, torch.float64), case.kwargs)
    counted = ag.stats().get(group, {}).get("rules", {})
    # A subgradient rule counts the elements it set; an override, the backward passes it replaced.
    changed = sum(rule["elements"] + rule.get("firings", 0) for rule in counted.values())
    assert (changed > 0) == case.composite_breaks


REGULAR = [
    ("cdist-p2", lambda a, b: ag.ops.cdist(a, b), (2, 3, 4), (2, 5, 4)),
    ("cdist-p2-mm", lambda a, b: ag.ops.cdist(a, b, compute_mode="use_mm_for_euclid_dist"), (3, 4), (5, 4)),
    *[(f"cdist-p{p}", lambda a, b, p=p: ag.ops.cdist(a, b, p), (3, 4), (2, 4)) for p in (1.0, 0.5, 3.0)],
    ("cdist-pinf", lambda a, b: ag.ops.cdist(a, b, float("inf")), (3, 4), (2, 4)),
    ("pdist-p2", lambda a: ag.ops.pdist(a), (4, 3)),
    ("pdist-p0.5", lambda a: ag.ops.pdist(a, 0.5), (4, 3)),
    ("dist-p3", lambda a, b: ag.ops.dist(a, b, 3), (3, 4), (4,)),
    *[(f"vector_norm-ord{o}", lambda a, o=o: ag.ops.vector_norm(a, o, dim=-1), (3, 4))
      for o in (1.0, 2.0, 3.0, 0.5, float("inf"))],
    ("normalize", lambda a: ag.ops.normalize(a), (3, 4)),
    ("normalize-p3", lambda a: ag.ops.normalize(a, 3.0, dim=-1), (3, 4)),
    ("cosine_similarity", lambda a, b: ag.ops.cosine_similarity(a, b), (3, 4), (3, 4)),
    ("std", lambda a: ag.ops.std(a, dim=-1), (3, 5)),
    ("var", lambda a: ag.ops.var(a, dim=(0, 1), correction=0), (3, 5)),
    ("atan2", lambda a, b: ag.ops.atan2(a, b), (3, 4), (3, 4)),
]
POSITIVE = [
    ("pow", lambda a, b: ag.ops.pow(a, b), (3, 4), (3, 4)),
    ("pow-scalar", lambda a: ag.ops.pow(a, 2.5), (3, 4)),
    ("xlogy", lambda a, b: ag.ops.xlogy(a, b), (3, 4), (3, 4)),
]


def _regular(shapes: tuple[tuple[int, ...], ...], positive: bool) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(1)
    made = [torch.rand(s, generator=g, dtype=torch.float64) + 0.5 if positive
            else torch.randn(s, generator=g, dtype=torch.float64) for s in shapes]
    return tuple(t.requires_grad_() for t in made)


@pytest.mark.parametrize(("fn", "shapes", "positive"),
                         [pytest.param(f, s, False, id=n) for n, f, *s in REGULAR]
                         + [pytest.param(f, s, True, id=n) for n, f, *s in POSITIVE])
def test_gradcheck_and_gradgradcheck_at_regular_points(fn, shapes, positive) -> None:
    args = _regular(shapes, positive)
    assert torch.autograd.gradcheck(fn, args)
    assert torch.autograd.gradgradcheck(fn, args)

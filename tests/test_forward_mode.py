"""Forward-mode AD (``jvp``, ``jacfwd``, ``hessian``, ``forward_ad``) through groups with rules.

A group's tangents are the transpose of its rule-corrected vjp (sites/tangents.py), so forward mode
must give exactly the Jacobian reverse mode gives, at the special points too."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch
import torch.autograd.forward_ad as fwAD
from hypothesis import given, settings
from hypothesis import strategies as st
from ops_cases import CASES, Case, inputs, ordinary_inputs
from torch.func import hessian, jacfwd, jacrev, jvp, vmap

import autograd_groups as ag
from autograd_groups import ops
from autograd_groups.errors import GroupError, RuleError

F64 = torch.float64
#: pow's second derivative is infinite at a zero base for exponents below 2 (but 1): forward mode
#: spreads an infinite partial derivative along its row (inf * 0 for the other tangents), reverse
#: mode down its column, as native PyTorch's modes do. test_second_order_of_pow_at_a_zero_base_equals_native
#: takes pow at exponents whose second derivative is finite.
SPECIAL_SECOND_ORDER = [c.id for c in CASES if c.id != "pow"]


def _split(case: Case, args: tuple[Any, ...] | None = None,
           ) -> tuple[Callable[..., torch.Tensor], tuple[torch.Tensor, ...]]:
    """The case as a function of its tensor inputs alone, and those inputs (float64, detached): its
    ``inputs``, or ``args``."""
    args = inputs(case, F64) if args is None else args
    positions = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]

    def fn(*tensors: torch.Tensor, impl: Callable[..., torch.Tensor] = case.ours) -> torch.Tensor:
        values = list(args)
        for i, t in zip(positions, tensors):
            values[i] = t
        return impl(*values, **case.kwargs)

    return fn, tuple(args[i].detach() for i in positions)


def _assert_equal_where_finite(ours: torch.Tensor, reference: torch.Tensor) -> None:
    """Equal wherever ``reference`` is finite, and ``reference`` finite mostly."""
    finite = torch.isfinite(reference)
    assert finite.float().mean() > 0.5
    assert torch.isfinite(ours[finite]).all()
    torch.testing.assert_close(ours[finite], reference[finite])


def _contract(jacobians: tuple[torch.Tensor, ...], out: torch.Tensor,
              tangents: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """J·t from the Jacobians of one output with respect to each input."""
    total = torch.zeros_like(out)
    for jac, t in zip(jacobians, tangents):
        total = total + (jac.reshape(out.numel(), -1) @ t.reshape(-1)).reshape(out.shape)
    return total


def _tangents(xs: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(1)
    return tuple(torch.randn(x.shape, generator=g, dtype=F64) for x in xs)


def _reverse(fn: Callable[..., torch.Tensor], xs: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    """Reverse mode, one output element at a time, by torch.autograd.functional: the groups' own
    autograd nodes and hooks, none of the torch.func path forward mode takes."""
    return tuple(torch.autograd.functional.jacobian(fn, xs))


def _assert_equal_but_undefined(forward: tuple[torch.Tensor, ...], reverse: tuple[torch.Tensor, ...],
                                out: torch.Tensor) -> None:
    """Equal and finite except along undefined partial derivatives.

    A partial derivative that is itself infinite or undefined (xlogy's x / y at y = 0, x != 0, pow's
    slope at a zero base with exponent < 1) is non-finite in both modes; reverse mode spreads it down
    its column (0 * NaN for the other cotangents), forward mode along its row (NaN * 0 for the other
    tangents), as native PyTorch's modes do. Those rows and columns, and the rows of non-finite
    values of ``out``, are left out; everything else must agree.
    """
    fw = torch.cat([f.reshape(out.numel(), -1) for f in forward], 1)
    rv = torch.cat([r.reshape(out.numel(), -1) for r in reverse], 1)
    undefined = ~torch.isfinite(fw) & ~torch.isfinite(rv)
    keep = ~undefined.any(1, keepdim=True) & ~undefined.any(0, keepdim=True)
    keep = keep & torch.isfinite(out).reshape(-1, 1)
    assert keep.float().mean() > 0.25
    assert torch.isfinite(fw[keep]).all() and torch.isfinite(rv[keep]).all()
    torch.testing.assert_close(fw[keep], rv[keep])


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_jacfwd_jvp_and_dual_numbers_equal_jacrev(case: Case) -> None:
    fn, xs = _split(case)
    argnums = tuple(range(len(xs)))
    reverse = _reverse(fn, xs)
    forward = jacfwd(fn, argnums=argnums)(*xs)
    out = fn(*xs)
    _assert_equal_but_undefined(forward, reverse, out)
    ts = _tangents(xs)
    if not all(torch.isfinite(r).all() for r in reverse):
        return  # xlogy at y = 0, x != 0: d/dy = x / y is infinite, as in torch.xlogy's backward
    expected = _contract(reverse, out, ts)
    value, tangent = jvp(fn, xs, ts)
    torch.testing.assert_close(value, out)
    torch.testing.assert_close(tangent, expected, equal_nan=True)
    with fwAD.dual_level():
        dual = fn(*(fwAD.make_dual(x, t) for x, t in zip(xs, ts)))
        torch.testing.assert_close(fwAD.unpack_dual(dual).tangent, expected, equal_nan=True)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_jacfwd_equals_native_where_native_has_forward_ad(case: Case) -> None:
    fn, xs = _split(case)
    argnums = tuple(range(len(xs)))
    try:
        native = jacfwd(lambda *t: fn(*t, impl=case.native), argnums=argnums)(*xs)
    except NotImplementedError:
        pytest.skip(f"native {case.id} has no forward AD")
    ours = jacfwd(fn, argnums=argnums)(*xs)
    for o, n in zip(ours, native):
        # Where native forward mode is finite: ours is finite in more places (its rules).
        finite = torch.isfinite(n)
        assert finite.any() and torch.isfinite(o[finite]).all()
        torch.testing.assert_close(o[finite], n[finite])


def test_native_cdist_has_no_forward_ad_but_the_group_has() -> None:
    x1 = torch.randn(4, 3, dtype=F64)
    x2 = torch.cat([x1[:2], torch.randn(2, 3, dtype=F64)])
    with pytest.raises(NotImplementedError, match="forward AD"):
        jacfwd(torch.cdist)(x1, x2)
    forward = jacfwd(ops.cdist, argnums=(0, 1))(x1, x2)
    reverse = jacrev(ops.cdist, argnums=(0, 1))(x1, x2)
    for f, r in zip(forward, reverse):
        assert torch.isfinite(f).all()
        torch.testing.assert_close(f, r)


#: How many elements of a case's first input its second-order tests vary: a Hessian of every
#: element of a (2, 30, 4) input takes 240 jvp-of-jvp passes.
VARIED = 24
#: Every mix of the two modes for a second derivative but reverse over reverse, the reference.
MIXES = {"jacfwd(jacrev)": lambda f: jacfwd(jacrev(f)), "jacrev(jacfwd)": lambda f: jacrev(jacfwd(f)),
         "jacfwd(jacfwd)": lambda f: jacfwd(jacfwd(f))}


def _assert_second_order_mixes_equal_reverse_over_reverse(scalar: Callable[[torch.Tensor], torch.Tensor],
                                                          x: torch.Tensor) -> None:
    """Each mix of MIXES, and ``jvp`` of ``jvp`` along two directions, equals ``jacrev(jacrev)``."""
    expected = jacrev(jacrev(scalar))(x)
    assert torch.isfinite(expected).all()
    for name, mix in MIXES.items():
        torch.testing.assert_close(mix(scalar)(x), expected, msg=lambda m, name=name: f"{name}: {m}")
    v1, v2 = _tangents((x, x))
    _, second = jvp(lambda a: jvp(scalar, (a,), (v1,))[1], (x,), (v2,))
    bilinear = v2.reshape(-1) @ expected.reshape(x.numel(), x.numel()) @ v1.reshape(-1)
    torch.testing.assert_close(second, bilinear, msg=lambda m: f"jvp(jvp): {m}")


def _first_input_scalar(case: Case, args: tuple[Any, ...]) -> tuple[Callable[[torch.Tensor], torch.Tensor],
                                                                    torch.Tensor]:
    """The sum of ``case``'s output as a function of the first :data:`VARIED` elements of its first
    tensor input (where its special points lie), and those elements."""
    fn, (x, *rest) = _split(case, args)
    flat = x.reshape(-1)

    def scalar(a: torch.Tensor) -> torch.Tensor:
        return fn(torch.cat([a, flat[len(a):]]).reshape(x.shape), *rest).sum()

    return scalar, flat[:VARIED]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_second_order_mixes_at_ordinary_points(case: Case) -> None:
    scalar, x = _first_input_scalar(case, ordinary_inputs(case, F64))
    _assert_second_order_mixes_equal_reverse_over_reverse(scalar, x)


@pytest.mark.parametrize("case_id", SPECIAL_SECOND_ORDER)
def test_second_order_mixes_at_special_points(case_id: str) -> None:
    case = next(c for c in CASES if c.id == case_id)
    _assert_second_order_mixes_equal_reverse_over_reverse(*_first_input_scalar(case, inputs(case, F64)))


def test_second_order_of_pow_at_a_zero_base_equals_native() -> None:
    """ops.pow's override in every mix of modes, at zero bases whose second derivative is finite
    (exponents 1, 2, 2.5, 3, 4: 0, 2, 0, 0, 0), beside regular points. (At exponent 0 native's own
    second derivative is NaN.)"""
    x = torch.tensor([0.0, 0.0, 0.0, 0.0, 0.0, 0.7, 1.3, 2.0], dtype=F64)
    y = torch.tensor([1.0, 2.0, 2.5, 3.0, 4.0, 1.5, -0.5, 2.0], dtype=F64)

    def scalar(a: torch.Tensor, impl: Callable[..., torch.Tensor] = ops.pow) -> torch.Tensor:
        return impl(a, y).sum()

    native = jacrev(jacrev(lambda a: scalar(a, torch.pow)))(x)
    assert torch.isfinite(native).all()
    torch.testing.assert_close(jacrev(jacrev(scalar))(x), native)
    _assert_second_order_mixes_equal_reverse_over_reverse(scalar, x)


def test_vmap_over_jvp() -> None:
    x1 = torch.randn(5, 3, dtype=F64)
    x2 = torch.cat([x1[:2], torch.randn(3, 3, dtype=F64)])
    ts = torch.randn(4, 5, 3, dtype=F64)
    batched = vmap(lambda t: jvp(lambda a: ops.cdist(a, x2), (x1,), (t,))[1])(ts)
    reverse = jacrev(ops.cdist)(x1, x2)
    for t, tangent in zip(ts, batched):
        torch.testing.assert_close(tangent, _contract((reverse,), ops.cdist(x1, x2), (t,)))


@pytest.mark.parametrize("case_id", ["cdist-p2.0", "pdist-p0.5", "normalize-p2.0", "std-c1", "pow",
                                     "atan2", "xlogy"])
def test_vmap_over_jvp_of_the_built_ins(case_id: str) -> None:
    case = next(c for c in CASES if c.id == case_id)
    fn, xs = _split(case)
    g = torch.Generator().manual_seed(2)
    ts = tuple(torch.randn(3, *x.shape, generator=g, dtype=F64) for x in xs)
    batched = vmap(lambda *t: jvp(fn, xs, t)[1])(*ts)
    for b in range(3):
        torch.testing.assert_close(batched[b], jvp(fn, xs, tuple(t[b] for t in ts))[1], equal_nan=True)
    assert torch.isfinite(batched).float().mean() > 0.5


def test_logsumexp_of_a_fully_masked_row_in_every_mode() -> None:
    x = torch.tensor([[-torch.inf, -torch.inf, -torch.inf], [0.0, 1.0, 2.0]], dtype=F64)
    t = torch.tensor([[1.0, -2.0, 0.5], [0.3, 0.2, -1.0]], dtype=F64)

    def lse(a: torch.Tensor) -> torch.Tensor:
        return ops.logsumexp(a, -1)

    reverse = jacrev(lse)(x)
    assert torch.isfinite(reverse).all() and (reverse[0] == 0).all()
    assert jacfwd(torch.logsumexp, argnums=0)(x, -1)[0].isnan().any()  # native's masked row
    torch.testing.assert_close(jacfwd(lse)(x), reverse)
    expected = (reverse.reshape(2, 6) @ t.reshape(6)).reshape(2)
    torch.testing.assert_close(jvp(lse, (x,), (t,))[1], expected)
    with fwAD.dual_level():
        torch.testing.assert_close(fwAD.unpack_dual(lse(fwAD.make_dual(x, t))).tangent, expected)

    def scalar(a: torch.Tensor) -> torch.Tensor:
        return lse(a).sum()

    second = jacrev(jacrev(scalar))(x)
    assert torch.isfinite(second).all()
    for mix in (hessian(scalar), jacfwd(jacrev(scalar)), jacrev(jacfwd(scalar))):
        torch.testing.assert_close(mix(x), second)


def _norm_group(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    return ag.autograd_group(name)(lambda x: x.pow(2).sum(-1).sqrt())


ZERO_ROW = torch.tensor([[0.0, 0.0], [3.0, 4.0]], dtype=F64)


@pytest.mark.parametrize("grad", ["grad * 2", lambda grad, result: grad * 2,
                                  "where(result == 0, grad * 2, 0)"])
def test_a_rule_linear_in_grad_gives_its_transpose(grad: Any) -> None:
    # sqrt's gradient at 0 set to 2 * grad: its local derivative is 2, on the tangent too.
    with ag.registry_scope():
        ag.register_rule("fm.scaled", ag.Subgradient(op="sqrt", when="result == 0", grad=grad))
        norm = _norm_group("fm.scaled")
        x = ZERO_ROW.clone()
        forward, reverse = jacfwd(norm)(x), jacrev(norm)(x)
        torch.testing.assert_close(forward, reverse)
        # Row 0: pow(2) has derivative 2x = 0 there, so sqrt's tangent input is 0 and 2 * 0 = 0.
        assert torch.isfinite(forward).all()
        torch.testing.assert_close(forward[1, 1], torch.tensor([0.6, 0.8], dtype=F64))


@pytest.mark.parametrize("grad", ["grad + 1", "abs(grad)", "where(grad == 0, 0, grad)"])
def test_a_rule_not_linear_in_grad_is_refused_in_forward_mode(grad: Any) -> None:
    with ag.registry_scope():
        ag.register_rule("fm.affine", ag.Subgradient(op="sqrt", when="result == 0", grad=grad))
        norm = _norm_group("fm.affine")
        x = ZERO_ROW.clone().requires_grad_()
        norm(x).sum().backward()  # reverse mode: the rule applies as written
        with pytest.raises(RuleError, match=r"group 'fm.affine'.*at op sqrt: a forward-mode pass .* "
                                            r"not linear in grad"):
            jacfwd(norm)(ZERO_ROW)


def test_a_zero_tangent_stays_zero_through_a_nan_safe_group() -> None:
    # sqrt(x) * 0 at x = 0: the plain tangent is t / (2 sqrt 0) * 0 = NaN even for t = 0.
    with ag.registry_scope():
        ag.register_rule("fm.safe", ag.NanSafe())
        fn = ag.autograd_group("fm.safe")(lambda x, w: x.sqrt() * w)
        x = torch.tensor([0.0, 4.0], dtype=F64)
        w = torch.tensor([0.0, 1.0], dtype=F64)
        t = torch.tensor([0.0, 1.0], dtype=F64)
        plain = jvp(lambda a: a.sqrt() * w, (x,), (t,))[1]
        assert plain.isnan()[0]
        tangent = jvp(lambda a: fn(a, w), (x,), (t,))[1]
        torch.testing.assert_close(tangent, torch.tensor([0.0, 0.25], dtype=F64))


def test_an_override_gives_the_transpose_of_its_replacement() -> None:
    # ops.pow at a zero base with exponent 1: the check fires, the replacement gives slope 1.
    x = torch.tensor([0.0, 0.0, 2.0], dtype=F64)
    y = torch.tensor([1.0, 2.0, 3.0], dtype=F64)
    forward = jacfwd(ops.pow, argnums=(0, 1))(x, y)
    reverse = torch.autograd.functional.jacobian(ops.pow, (x, y))
    native = jacfwd(torch.pow, argnums=(0, 1))(x, y)
    for f, r, n in zip(forward, reverse, native):
        assert torch.isfinite(f).all()
        torch.testing.assert_close(f, r)
        torch.testing.assert_close(f, n)
    with ag.special_cases(False, groups=["ops.pow"]):  # the plain composite: NaN at the zero base
        assert jacfwd(ops.pow)(x, y)[:2].isnan().all()


def test_an_override_check_that_reads_data_works_until_its_inputs_are_batched() -> None:
    with ag.registry_scope():
        @ag.autograd_group("fm.override")
        def norm(x: torch.Tensor) -> torch.Tensor:
            return x.pow(2).sum(-1).sqrt()

        @ag.special_case("fm.override")
        def has_zero(ctx: ag.OverrideContext) -> bool:
            return bool((ctx.outputs[0] == 0).any())

        @has_zero.backward
        def zero_there(ctx: ag.OverrideContext, grad: torch.Tensor) -> torch.Tensor:
            (x,), (n,) = ctx.inputs, ctx.outputs
            return torch.where(n.unsqueeze(-1) == 0, 0.0, x / n.unsqueeze(-1)) * grad.unsqueeze(-1)

        # jacfwd batches the tangents only: the check reads the primal values, one answer.
        forward = jacfwd(norm)(ZERO_ROW)
        torch.testing.assert_close(forward, torch.autograd.functional.jacobian(norm, ZERO_ROW))
        assert torch.isfinite(forward).all()
        # vmap over the inputs batches the values the check reads: it must answer with a tensor.
        with pytest.raises(RuleError, match=r"group 'fm.override' .* the check raised .* Under vmap "
                                            r"over the group's inputs .* must return its answer as a "
                                            r"bool tensor, without bool\(\) or .item\(\): declare the "
                                            r"check `-> torch.Tensor`"):
            vmap(jacfwd(norm))(ZERO_ROW[None])


def test_with_blocks_and_tags_are_refused_in_forward_mode() -> None:
    with ag.registry_scope():
        ag.register_rule("fm.block", ag.Subgradient(op="sqrt", when="result == 0", grad=0))

        def block(x: torch.Tensor) -> torch.Tensor:
            with ag.autograd_group("fm.block"):
                return x.pow(2).sum(-1).sqrt()

        def tagged(x: torch.Tensor) -> torch.Tensor:
            return ag.tag(x.pow(2).sum(-1).sqrt(), "fm.block")

        for fn, form in ((block, "a `with` block"), (tagged, "tag()")):
            with pytest.raises(GroupError, match=rf"group 'fm.block' .* forward-mode AD .* {form}.*"
                                                 r"@autograd_group\('fm.block'\)"):
                jvp(fn, (ZERO_ROW,), (torch.ones_like(ZERO_ROW),))
        with ag.special_cases(False, groups=["fm.block"]):
            assert jvp(block, (ZERO_ROW,), (torch.ones_like(ZERO_ROW),))[1].isnan()[0]


def test_a_group_without_rules_is_plain_forward_ad() -> None:
    fn = _norm_group("fm.unruled")
    tangent = jvp(fn, (ZERO_ROW,), (torch.ones_like(ZERO_ROW),))[1]
    plain = jvp(lambda x: x.pow(2).sum(-1).sqrt(), (ZERO_ROW,), (torch.ones_like(ZERO_ROW),))[1]
    torch.testing.assert_close(tangent, plain, equal_nan=True)
    with fwAD.dual_level():
        x = ZERO_ROW.clone()  # no tangent: the dual level alone does not change the call
        assert fn(x).grad_fn is None


def test_reverse_mode_inside_a_dual_level_keeps_the_rules() -> None:
    with fwAD.dual_level():
        x1 = fwAD.make_dual(ZERO_ROW, torch.ones_like(ZERO_ROW))
        x = ZERO_ROW.clone().requires_grad_()
        ops.vector_norm(x, dim=-1).sum().backward()
        assert torch.isfinite(fwAD.unpack_dual(ops.vector_norm(x1, dim=-1)).tangent).all()
    torch.testing.assert_close(x.grad, torch.tensor([[0.0, 0.0], [0.6, 0.8]], dtype=F64))


def test_a_group_transposed_whole_must_return_tensors_in_forward_mode() -> None:
    # A group of subgradients runs as its own function, rule sites apart: it may return any
    # pytree. A NaN-safe group's tangents are its whole vjp's transpose, which needs tensors.
    with ag.registry_scope():
        ag.register_rule("fm.dict", ag.Subgradient(op="sqrt", when="result == 0", grad=0))
        fn = ag.autograd_group("fm.dict")(lambda x: {"norm": x.pow(2).sum(-1).sqrt()})
        _, tangent = jvp(fn, (ZERO_ROW,), (torch.ones_like(ZERO_ROW),))
        torch.testing.assert_close(tangent["norm"], torch.tensor([0.0, (3.0 + 4.0) / 5.0], dtype=F64))
        ag.register_rule("fm.dict_nan_safe", ag.NanSafe())
        whole = ag.autograd_group("fm.dict_nan_safe")(lambda x: {"norm": x.pow(2).sum(-1).sqrt()})
        with pytest.raises(GroupError, match=r"group 'fm.dict_nan_safe' .* must return a tensor or a "
                                             r"tuple of tensors, not dict"):
            jvp(whole, (ZERO_ROW,), (torch.ones_like(ZERO_ROW),))


def test_an_override_group_nested_in_a_group_with_rules_is_refused_by_name() -> None:
    # Under forward mode the outer group's vjp runs inside torch.func transforms; reverse mode
    # (jacrev) takes the nesting, since there the outer group's rules are hooks.
    with ag.registry_scope():
        ag.register_rule("fm.outer", ag.Subgradient(op="sqrt", when="result == 0", grad=0))
        outer = ag.autograd_group("fm.outer")(lambda x: ops.pow(x, torch.full_like(x, 2.0)).sum(-1).sqrt())
        with pytest.raises(RuleError, match=r"group 'ops.pow' .* override rule .* inside another group "
                                            r"with rules"):
            jvp(outer, (ZERO_ROW,), (torch.ones_like(ZERO_ROW),))
        reverse = jacrev(outer)(ZERO_ROW)
    native = jacrev(lambda x: torch.linalg.vector_norm(x, dim=-1))(ZERO_ROW)
    torch.testing.assert_close(reverse, native)


def _sinc(x: torch.Tensor) -> torch.Tensor:
    return torch.where(x == 0, 1.0, torch.sin(x) / torch.where(x == 0, 1.0, x))


@contextmanager
def _user_group(kind: str) -> Iterator[Callable[[torch.Tensor], torch.Tensor]]:
    """A user group with one rule of ``kind``, and a smooth scalar function through it whose
    special points are zeros of its input."""
    with ag.registry_scope():
        if kind == "subgradient":
            ag.register_rule("fm.user.norm", ag.Subgradient(op="sqrt", when="result == 0", grad=0))
            norm = ag.autograd_group("fm.user.norm")(lambda v: (v * v).sum(-1).sqrt())
            yield lambda x: (norm(x.reshape(-1, 2)) ** 3).sum()
        elif kind == "nan_safe":
            ag.register_rule("fm.user.entropy", ag.NanSafe())
            entropy = ag.autograd_group("fm.user.entropy")(
                lambda p: -torch.where(p > 0, p * torch.log(p), 0.0).sum())
            yield lambda x: entropy(x * x) + (x * x * x).sum()
        else:
            @ag.special_case("fm.user.sinc")
            def at_zero(ctx: ag.OverrideContext) -> torch.Tensor:
                return (ctx.inputs[0] == 0).any()

            @at_zero.backward
            def sinc_slope(ctx: ag.OverrideContext, grad: torch.Tensor) -> torch.Tensor:
                (x,) = ctx.inputs
                safe = torch.where(x == 0, 1.0, x)
                return grad * torch.where(x == 0, 0.0, (torch.cos(safe) - torch.sin(safe) / safe) / safe)

            sinc = ag.autograd_group("fm.user.sinc")(lambda x: torch.sin(x) / x)
            yield lambda x: (sinc(x) * x).sum() + sinc(x).sum()


USER_POINTS = {"ordinary": torch.tensor([0.7, -1.3, 0.4, 2.1], dtype=F64),
               "special": torch.tensor([0.0, 0.0, 0.4, 2.1], dtype=F64)}


@pytest.mark.parametrize("point", USER_POINTS)
@pytest.mark.parametrize("kind", ["subgradient", "nan_safe", "override"])
def test_second_order_mixes_through_a_user_group_of_each_rule_kind(kind: str, point: str) -> None:
    with _user_group(kind) as scalar, warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the second-order warning (tested elsewhere)
        _assert_second_order_mixes_equal_reverse_over_reverse(scalar, USER_POINTS[point])


def test_forward_over_forward_of_a_nan_safe_cube_is_its_second_derivative() -> None:
    # The example: jacfwd(jacfwd) gave 0 where d2/dx2 x**3 = 6x = 12.
    with ag.registry_scope():
        ag.register_rule("fm.cube", ag.NanSafe())
        cube = ag.autograd_group("fm.cube")(lambda x: x * x * x)
        x = torch.tensor(2.0, dtype=F64)
        torch.testing.assert_close(jacfwd(jacfwd(cube))(x), torch.tensor(12.0, dtype=F64))
        one = torch.ones((), dtype=F64)
        torch.testing.assert_close(jvp(lambda a: jvp(cube, (a,), (one,))[1], (x,), (one,))[1],
                                   torch.tensor(12.0, dtype=F64))
        torch.testing.assert_close(jacfwd(jacfwd(jacfwd(cube)))(x), torch.tensor(6.0, dtype=F64))


def test_forward_over_forward_of_a_norm_equals_torch() -> None:
    x = torch.tensor([3.0, 4.0], dtype=F64)
    native = jacfwd(jacfwd(torch.linalg.vector_norm))(x)
    torch.testing.assert_close(jacfwd(jacfwd(ops.vector_norm))(x), native)
    torch.testing.assert_close(native, torch.tensor([[0.128, -0.096], [-0.096, 0.072]], dtype=F64))


#: Elementwise ops defined and smooth on the whole real line, for random compositions.
ELEMENTWISE: list[Callable[[torch.Tensor], torch.Tensor]] = [
    torch.sin, torch.cos, torch.tanh, torch.sigmoid, lambda x: x * x, lambda x: 0.5 * x + 1.0,
    lambda x: torch.sqrt(x * x + 1.0), lambda x: torch.exp(-x * x), lambda x: x * torch.sin(x)]


@settings(max_examples=12, deadline=None)
@given(chain=st.lists(st.integers(0, len(ELEMENTWISE) - 1), min_size=2, max_size=5),
       values=st.lists(st.floats(-2.0, 2.0), min_size=3, max_size=3),
       rule=st.sampled_from(["nan_safe", "subgradient"]))
def test_second_order_mixes_agree_on_random_compositions(chain: list[int], values: list[float],
                                                         rule: str) -> None:
    with ag.registry_scope():
        ag.register_rule("fm.random", ag.NanSafe() if rule == "nan_safe"
                         else ag.Subgradient(op="sqrt", when="result == 0", grad=0))

        @ag.autograd_group("fm.random")
        def composed(x: torch.Tensor) -> torch.Tensor:
            for k in chain:
                x = ELEMENTWISE[k](x)
            return torch.sqrt(x * x + 1.0)

        _assert_second_order_mixes_equal_reverse_over_reverse(lambda x: composed(x).sum(),
                                                              torch.tensor(values, dtype=F64))


@pytest.mark.parametrize("point", ["ordinary", "special"])
def test_dual_numbers_over_reverse_mode_are_the_hessian_vector_product(point: str) -> None:
    # forward_ad around torch.func.grad, and around torch.autograd.grad(create_graph=True).
    g = torch.Generator().manual_seed(4)
    x1, x2, t = (torch.randn(4, 3, dtype=F64, generator=g) for _ in range(3))
    if point == "special":
        x2[:2] = x1[:2]  # zero distances

    def f(a: torch.Tensor) -> torch.Tensor:
        return ops.cdist(a, x2).sum()

    expected = (jacrev(jacrev(f))(x1).reshape(12, 12) @ t.reshape(-1)).reshape(4, 3)
    assert torch.isfinite(expected).all()
    with fwAD.dual_level():
        tangent = fwAD.unpack_dual(torch.func.grad(f)(fwAD.make_dual(x1, t))).tangent
    torch.testing.assert_close(tangent, expected)
    with fwAD.dual_level():
        dual = fwAD.make_dual(x1.clone().requires_grad_(), t)
        (g,) = torch.autograd.grad(f(dual), dual, create_graph=True)
        torch.testing.assert_close(fwAD.unpack_dual(g).tangent, expected)

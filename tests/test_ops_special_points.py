"""The built-in library's special points one by one, and how the library is made: rules only from
builtin.yaml, no hand-written backward under autograd_groups/ops/."""

from __future__ import annotations

import ast
import importlib
import inspect
import math
import pkgutil
import re
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from ops_cases import forward_backward, upstream
from torch.func import grad, hessian, jacfwd, jacrev, jvp

import autograd_groups as ag
from autograd_groups import ops
from autograd_groups.ops import distance
from autograd_groups.spec.loader import origin

OPS_DIR = Path(ops.__file__).parent
MODULES = [importlib.import_module(f"{ops.__name__}.{m.name}") for m in pkgutil.iter_modules([str(OPS_DIR)])]
DOC = Path(__file__).resolve().parents[1] / "docs" / "builtins.md"


def _duplicate_float_rows(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    x1 = torch.randn(2, 40, 16, generator=g, dtype=torch.float64).to(dtype)
    x2 = torch.randn(2, 30, 16, generator=g, dtype=torch.float64).to(dtype)
    x2[:, :10] = x1[:, 5:15]
    return x1.requires_grad_(), x2.requires_grad_()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_cdist_matmul_form_at_duplicate_float_rows_gives_torch_cdists_answer(dtype: torch.dtype) -> None:
    x1, x2 = _duplicate_float_rows(dtype)
    ours, ours_grads = forward_backward(ag.ops.cdist, (x1, x2), {})
    native, native_grads = forward_backward(torch.cdist, _duplicate_float_rows(dtype), {})
    # The same ops as ATen's _euclidean_dist, so the same values, rounding residue included: the
    # duplicate pairs' distances are not all exactly 0 in either.
    assert torch.equal(ours, native)
    pairs = native[:, 5:15, :10].diagonal(dim1=-2, dim2=-1)
    assert (pairs > 0).any() and (pairs == 0).any()
    # Where the residue is 0 the rule gives the pair's term 0; where it is not, both backward passes
    # scale the pair's (zero) difference by 1/residue, so they agree to sqrt(eps) * |grad| only.
    noise = 10 * torch.finfo(dtype).eps ** 0.5 * float(upstream(ours).abs().max())
    for mine, theirs, rows in zip(ours_grads, native_grads, (slice(5, 15), slice(0, 10))):
        assert torch.isfinite(mine).all()
        torch.testing.assert_close(mine, theirs, rtol=0, atol=noise)
        away = torch.ones(mine.shape[-2], dtype=torch.bool)
        away[rows] = False
        tolerance = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {}
        torch.testing.assert_close(mine[:, away], theirs[:, away], **tolerance)


@pytest.mark.parametrize(("rows", "uses_mm"), [(25, False), (26, True)])
def test_cdist_p2_chooses_the_matmul_form_as_torch_cdist(rows: int, uses_mm: bool) -> None:
    x1, x2 = torch.randn(rows, 3, requires_grad=True), torch.randn(4, 3)
    with ag.trace() as t:
        ag.ops.cdist(x1, x2)
    (instance,) = t.instances
    graph_ops = {data["op"] for _, data in instance.graph.nodes(data=True) if data["kind"] == "op"}
    assert ("mm" in graph_ops) == uses_mm
    native = torch.cdist(x1, x2).grad_fn
    assert (type(native.next_functions[0][0]).__name__ == "EuclideanDistBackward0") == uses_mm


def _direct_pairs_with_duplicates(rows: int, others: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    x1 = torch.randn(2, rows, 16, generator=g, dtype=torch.float64)
    x2 = torch.randn(2, others, 16, generator=g, dtype=torch.float64)
    x2[:, 100:110] = x1[:, 3:13]
    return x1.requires_grad_(), x2.requires_grad_()


def test_cdist_direct_form_in_row_chunks_gives_torch_cdists_answer() -> None:
    # 2 x 30 x 16 doubles a row of x2: the CPU direct form takes x2's 2048 rows a few at a time.
    kwargs = {"compute_mode": "donot_use_mm_for_euclid_dist"}
    with ag.trace() as t:
        ours, ours_grads = forward_backward(ag.ops.cdist, _direct_pairs_with_duplicates(30, 2048), kwargs)
    (instance,) = t.instances
    graph_ops = [data["op"] for _, data in instance.graph.nodes(data=True) if data["kind"] == "op"]
    assert "cat" in graph_ops and graph_ops.count("sqrt") == 1, graph_ops
    native, native_grads = forward_backward(torch.cdist, _direct_pairs_with_duplicates(30, 2048), kwargs)
    assert (native[:, 3:13, 100:110].diagonal(dim1=-2, dim2=-1) == 0).all()
    torch.testing.assert_close(ours, native)
    for mine, theirs in zip(ours_grads, native_grads):
        assert torch.isfinite(mine).all()
        torch.testing.assert_close(mine, theirs)


@pytest.mark.parametrize("rows1, rows2", [(5, 4), (4, 5)], ids=["x1 split", "x2 split"])
def test_cdist_direct_form_in_row_chunks_has_right_forward_and_second_derivatives(monkeypatch, rows1,
                                                                                  rows2) -> None:
    # The side with more rows is split, into chunks of three rows and two (_CHUNK_BYTES, two rows'
    # differences here, is per thread).
    g = torch.Generator().manual_seed(6)
    x1 = torch.randn(2, rows1, 3, generator=g, dtype=torch.float64, requires_grad=True)
    x2 = torch.randn(rows2, 3, generator=g, dtype=torch.float64, requires_grad=True)
    monkeypatch.setattr(distance, "_CHUNK_BYTES", 2 * 2 * 4 * 3 * 8 // torch.get_num_threads())

    def cdist(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return ag.ops.cdist(a, b, compute_mode="donot_use_mm_for_euclid_dist")

    assert torch.autograd.gradcheck(cdist, (x1, x2), check_forward_ad=True)
    assert torch.autograd.gradgradcheck(cdist, (x1, x2), check_fwd_over_rev=True)
    with ag.trace() as t:
        cdist(x1, x2)
    (instance,) = t.instances
    assert "cat" in {data["op"] for _, data in instance.graph.nodes(data=True) if data["kind"] == "op"}


@pytest.mark.parametrize("exponent", [0.5, 1.0])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_pow_at_zero_base_with_exponent_in_0_1_equals_torch_pow(exponent: float, dtype: torch.dtype) -> None:
    # torch.pow gives grad * y * 0 ** (y - 1) there: inf for y < 1, grad for y = 1. exp(y * log x)
    # multiplies the gradient by x ** y = 0 at exp, before log(x) could divide by x = 0, so the
    # override rule of builtin.yaml answers for the group (docs/builtins.md).
    base = torch.tensor([[0.0, 2.0, 0.0], [0.5, 0.0, 3.0]], dtype=dtype)
    power = torch.tensor([exponent, 1.5, 3.0], dtype=dtype)
    grads = []
    for fn in (ag.ops.pow, torch.pow):
        x, y = base.clone().requires_grad_(), power.clone().requires_grad_()
        fn(x, y).backward(torch.arange(1.0, 7.0, dtype=dtype).reshape(2, 3))
        grads.append((x.grad, y.grad))
    torch.testing.assert_close(grads[0], grads[1])
    assert grads[1][0][0, 0] == (1.0 if exponent == 1 else torch.inf)


def test_std_of_a_constant_is_exactly_zero_even_where_torch_std_rounds() -> None:
    x = torch.full((7,), 0.1, requires_grad=True)
    s = ag.ops.std(x)
    s.backward()
    assert s == 0 and x.grad is not None and (x.grad == 0).all()
    assert torch.std(torch.full((7,), 0.1)) > 0, "PyTorch's own rounding, the reason for this test"


def test_every_builtin_rule_is_loaded_from_builtin_yaml() -> None:
    spec = OPS_DIR / "builtin.yaml"
    groups = {name: rules for name, rules in ag.list_rules().items() if name.startswith("ops.")}
    assert set(groups) == {g.name for g in ops.SPEC.groups}
    for name, rules in groups.items():
        for rule in rules:
            loaded = origin(rule)
            assert loaded is not None and loaded.name == name
            assert Path(loaded.where.rsplit(":", 2)[0]) == spec


def test_builtin_yaml_passes_the_spec_check_on_its_own() -> None:
    with ag.registry_scope():
        ops.SPEC.unload()
        assert ag.check_spec(OPS_DIR / "builtin.yaml") == []


def test_each_op_is_its_own_namespaced_group() -> None:
    for name in ops.__all__:
        fn = getattr(ops, name)
        if callable(fn):
            assert fn.__autograd_group__ == f"ops.{name}"
    assert ag.ops is ops


def test_no_op_module_registers_rules_or_defines_a_backward() -> None:
    for module in MODULES:
        tree = ast.parse(inspect.getsource(module))
        called = {node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
                  for node in ast.walk(tree) if isinstance(node, ast.Call)}
        assert not called & {"register_rule", "Subgradient", "NanSafe", "Override", "special_case"}, module
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                bases = {ast.unparse(b) for b in node.bases}
                assert not any("Function" in b for b in bases), f"{module.__name__}.{node.name}"
        for _, value in inspect.getmembers(module, inspect.isclass):
            assert not issubclass(value, torch.autograd.Function), f"{module.__name__}.{value.__name__}"


def test_docs_list_every_group_with_its_rule_kinds() -> None:
    rows = [line for line in DOC.read_text().splitlines() if line.startswith("| `ops.")]
    documented: dict[str, set[str]] = {}
    for row in rows:
        group = re.match(r"\| `(ops\.\w+)", row)
        assert group is not None
        kinds = set(re.findall(r"\b(subgradient|nan_safe|override|none)\b", row.split("|")[-2]))
        documented.setdefault(group[1], set()).update(kinds)
    for name in ops.__all__:
        if callable(getattr(ops, name)):
            rules = ag.list_rules().get(f"ops.{name}", ())
            assert documented.get(f"ops.{name}") == ({r.kind for r in rules} or {"none"}), name


# Regressions found by tests/test_ops_opinfo.py (issue 13), one test each.


def _grads(fn, args, create_graph=False):
    leaves = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
    out = fn(*args)
    return out, torch.autograd.grad(out, leaves, upstream(out), create_graph=create_graph)


def _second_order(fn, args):
    """The gradients of sum(grad * v) with respect to the inputs, for fixed upstream gradient and v."""
    out, grads = _grads(fn, args, create_graph=True)
    total = sum((g * (torch.arange(g.numel(), dtype=g.dtype).reshape(g.shape) % 3 + 1)).sum() for g in grads)
    return torch.autograd.grad(total, [a for a in args if isinstance(a, torch.Tensor)], allow_unused=True,
                               materialize_grads=True)


def _pair(*values, dtype=torch.float64):
    return [torch.tensor(v, dtype=dtype, requires_grad=True) for v in values]


def test_atan2_broadcasting_inputs_that_both_need_gradients() -> None:
    # The example: ops.atan2 raised a RuleError whenever its inputs broadcast.
    y, x = torch.randn(5, dtype=torch.float64), torch.randn(5, 1, dtype=torch.float64)
    ours = _grads(ag.ops.atan2, (y.clone().requires_grad_(), x.clone().requires_grad_()))
    native = _grads(torch.atan2, (y.clone().requires_grad_(), x.clone().requires_grad_()))
    torch.testing.assert_close(ours, native)


def test_atan2_on_and_near_the_y_axis_equals_torch_atan2() -> None:
    # x = 0 (the origin too), and x so small against y that (y / x)^2 overflows float32: there
    # atan(y / x)'s chain alone gives NaN or 0 in x's gradient, where atan2's is -1 / y.
    y = torch.tensor([1.0, -2.0, 0.0, -0.0, 1.0, 3.0, 1e-3])
    x = torch.tensor([0.0, -0.0, 0.0, -0.0, 1e-20, -1e-25, 1e-21])
    ours = _grads(ag.ops.atan2, (y.clone().requires_grad_(), x.clone().requires_grad_()))
    native = _grads(torch.atan2, (y.clone().requires_grad_(), x.clone().requires_grad_()))
    torch.testing.assert_close(ours, native)
    with ag.special_cases(False):
        plain = _grads(ag.ops.atan2, (y.clone().requires_grad_(), x.clone().requires_grad_()))[1]
    assert not plain[1].isfinite().all(), "the chain's NaN here is what the override replaces"


#: Coordinates for ops.atan2: zeros of both signs, values tiny enough that (y / x)^2 overflows or
#: x^2 + y^2 underflows in float32, and any finite float32.
_COORDINATES = st.one_of(st.sampled_from([0.0, -0.0, 1e-30, -1e-25, 1e-20, -6e-20, 1e-19, 2.5e-10]),
                         st.floats(-1e6, 1e6, width=32),
                         st.floats(allow_nan=False, allow_infinity=False, width=32))


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(_COORDINATES, _COORDINATES), min_size=1, max_size=6),
       st.sampled_from([torch.float32, torch.float64]))
def test_atan2_equals_torch_atan2_wherever_torch_is_finite(points, dtype) -> None:
    # Whether the override fires depends on the whole call (min |x| against max |y|), so points
    # near the axis share calls with ordinary ones.
    y, x = (torch.tensor(c, dtype=dtype) for c in zip(*points))
    ours = _grads(ag.ops.atan2, (y.clone().requires_grad_(), x.clone().requires_grad_()))
    native = _grads(torch.atan2, (y.clone().requires_grad_(), x.clone().requires_grad_()))
    torch.testing.assert_close(ours[0], native[0])
    for mine, theirs in zip(ours[1], native[1]):
        finite = theirs.isfinite()
        assert mine[finite].isfinite().all()
        torch.testing.assert_close(mine[finite], theirs[finite])


@pytest.mark.parametrize("reentrant", [False, True])
def test_atan2_under_checkpoint_equals_torch_atan2(reentrant) -> None:
    # The forward fills the origin's quotient only when some x is 0, a branch the recompute must
    # take again; the override's check then fires in the recomputed group.
    g = torch.Generator().manual_seed(4)
    y, x = (torch.randn(12, generator=g, dtype=torch.float64) for _ in range(2))
    x[:3], y[1:3] = 0.0, 0.0
    grads = []
    for op in (lambda a, b: torch.utils.checkpoint.checkpoint(ag.ops.atan2, a, b, use_reentrant=reentrant),
               torch.atan2):
        leaves = (y.clone().requires_grad_(), x.clone().requires_grad_())
        out = op(*leaves)
        out.backward(upstream(out))  # reentrant checkpoint takes .backward(), not autograd.grad
        grads.append([t.grad for t in leaves])
    torch.testing.assert_close(grads[0], grads[1])


def test_atan2_override_fires_only_near_the_y_axis() -> None:
    # The check reads min |x| against max |y|: ordinary data keeps the cheap chain.
    g = torch.Generator().manual_seed(3)
    y, x = torch.randn(1000, generator=g), torch.randn(1000, generator=g)
    ag.reset_stats()
    for x_ in (x, torch.cat([x, torch.zeros(1)]), torch.cat([x, torch.full((1,), 1e-12)])):
        y_ = torch.cat([y, torch.ones(x_.numel() - y.numel())])
        ag.ops.atan2(y_.requires_grad_(), x_.requires_grad_()).sum().backward()
    rule = ag.stats()["ops.atan2"]["rules"]["override(near_the_y_axis)"]
    assert (rule["calls"], rule["firings"]) == (3, 2)


@pytest.mark.parametrize(("args", "kwargs"), [((), {"dim": 1, "correction": None}), ((False,), {}),
                                              ((1, True, True), {}), ((), {"dim": 0, "unbiased": False})])
@pytest.mark.parametrize("name", ["std", "var"])
def test_std_and_var_take_both_torch_signatures(name, args, kwargs) -> None:
    x = torch.randn(4, 5, dtype=torch.float64)
    ours, native = getattr(ag.ops, name), getattr(torch, name)
    torch.testing.assert_close(ours(x, *args, **kwargs), native(x, *args, **kwargs))


def test_std_refuses_unbiased_and_correction_together() -> None:
    with pytest.raises(ValueError, match="got both unbiased=True and correction=0"):
        ag.ops.std(torch.randn(3), unbiased=True, correction=0)


@pytest.mark.parametrize("zero", [0.0, -0.0])
def test_xlogy_second_order_at_zero_input_and_negative_other(zero) -> None:
    # The mixed derivative grad * v_y / other came out 0; torch.xlogy's is finite and right.
    values = ([zero, zero, 1.0], [-2.0, -0.5, 3.0])
    ours, native = _second_order(ag.ops.xlogy, _pair(*values)), _second_order(torch.xlogy, _pair(*values))
    torch.testing.assert_close(ours, native)
    assert ours[0][0] != 0


def test_xlogy_input_gradient_at_zero_input_when_other_needs_none() -> None:
    # The rule read the product's saved input, which autograd does not keep when other needs no
    # gradient: it never fired, and x = 0, y <= 0 gave -inf and NaN where torch.xlogy gives 0.
    x = torch.tensor([0.0, -0.0, 0.0, -0.6, 1.5], dtype=torch.float64)
    y = torch.tensor([0.0, -1.0, -0.0, 0.0, 2.0], dtype=torch.float64)
    ours = torch.autograd.grad(ag.ops.xlogy(x.requires_grad_(), y).sum(), x)[0]
    native = torch.autograd.grad(torch.xlogy(x, y).sum(), x)[0]
    torch.testing.assert_close(ours, native)
    assert (ours[:3] == 0).all()


def test_xlogy_gradient_in_other_is_zero_where_input_is_zero() -> None:
    # xlogy(0, p) is 0 for every p, so its derivative in p is 0 there, p = +-0 included, where
    # grad * input / other is 0 / 0. Everywhere else the gradients are torch.xlogy's.
    x = torch.tensor([0.0, -0.0, 0.0, 0.0, 0.0, 0.0, 1.5, -0.5], dtype=torch.float64)
    y = torch.tensor([0.0, 0.0, -0.0, 2.0, -1.0, math.inf, 0.5, 0.0], dtype=torch.float64)
    (gx, gy), (nx, ny) = (torch.autograd.grad(op(a, b), (a, b), upstream(y))
                          for op in (ag.ops.xlogy, torch.xlogy) for a, b in [_pair(x.tolist(), y.tolist())])
    assert torch.equal(gy[:6], torch.zeros(6, dtype=torch.float64))
    for mine, native in ((gx, nx), (gy, ny)):
        finite = native.isfinite()
        torch.testing.assert_close(mine[finite], native[finite])
    # x != 0, y = 0: both slopes are infinite, as torch.xlogy's.
    assert gx[7].isinf() and gy[7].isinf() and torch.equal(gx[7:], nx[7:]) and torch.equal(gy[7:], ny[7:])


@pytest.mark.parametrize(("dtype", "tiny"), [(torch.float32, 1e-40), (torch.float64, 1e-310)])
def test_xlogy_tangent_in_other_is_zero_where_input_is_zero_and_other_subnormal(dtype, tiny) -> None:
    # 1 / other overflows at a subnormal other: a tangent through it would be 0 * inf. torch.xlogy's
    # forward formula gives 0, as the derivative of xlogy(0, p) = 0 is; jvp and jacfwd agree.
    x = torch.zeros(3, dtype=dtype)
    y = torch.tensor([tiny, 0.0, 2.0], dtype=dtype)
    tangent = torch.tensor([1.0, -2.0, 3.0], dtype=dtype)
    ours = jvp(lambda b: ag.ops.xlogy(x, b), (y,), (tangent,))[1]
    assert torch.equal(ours, torch.zeros(3, dtype=dtype))
    native = jvp(lambda b: torch.xlogy(x, b), (y,), (tangent,))[1]
    torch.testing.assert_close(ours[native.isfinite()], native[native.isfinite()])
    assert torch.equal(jacfwd(lambda b: ag.ops.xlogy(x, b))(y), torch.zeros(3, 3, dtype=dtype))


def test_xlogy_second_derivative_in_other_is_zero_where_input_is_zero() -> None:
    # d2/dy2 xlogy(x, y) = -x / y**2: 0 where x = 0, at y = 0 too; reverse over reverse, forward over
    # reverse and reverse over forward alike.
    x = torch.tensor([0.0, 0.0, -0.0, 0.0, 1.5, -2.0], dtype=torch.float64)
    y = torch.tensor([0.0, -0.0, 0.0, 2.0, 0.5, 3.0], dtype=torch.float64)
    weight = torch.arange(1.0, 7.0, dtype=torch.float64)
    expected = torch.diag(torch.where(x == 0, 0.0, -weight * x / y**2))

    def f(other: torch.Tensor) -> torch.Tensor:
        return (weight * ag.ops.xlogy(x, other)).sum()

    with warnings.catch_warnings():
        warnings.simplefilter("error", ag.SecondOrderWarning)  # exact: nothing to warn about
        for hessian in (jacrev(jacrev(f)), jacfwd(jacrev(f)), jacrev(jacfwd(f))):
            torch.testing.assert_close(hessian(y), expected, rtol=1e-12, atol=0)
        leaf = y.clone().requires_grad_()
        (g,) = torch.autograd.grad(f(leaf), leaf, create_graph=True)
        assert torch.equal(g[:4], torch.zeros(4, dtype=torch.float64))
        (hv,) = torch.autograd.grad(g.sum(), leaf)
        torch.testing.assert_close(hv, expected.sum(1), rtol=1e-12, atol=0)


def _masked_softmax_problem() -> tuple[torch.Tensor, torch.Tensor]:
    """Logits with -inf at masked classes, and a target that is 0 there (and at one unmasked class)."""
    z = torch.tensor([[1.0, -math.inf, 0.5, -math.inf, -0.3],
                      [0.2, 0.3, -math.inf, 2.0, 1.1],
                      [-math.inf, -1.0, 0.0, -math.inf, -math.inf]], dtype=torch.float64)
    t = torch.tensor([[0.9, 0.0, 0.1, 0.0, 0.0],
                      [0.25, 0.25, 0.0, 0.5, 0.0],
                      [0.0, 0.6, 0.4, 0.0, 0.0]], dtype=torch.float64)
    return z, t


def _cross_entropy(z: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    return -ag.ops.xlogy(t, torch.softmax(z, -1)).sum()


def _kl_divergence(z: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    return (ag.ops.xlogy(t, t) - ag.ops.xlogy(t, torch.softmax(z, -1))).sum()


def _eager_grad(loss: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[torch.Tensor], torch.Tensor]:
    def grad_of(z: torch.Tensor) -> torch.Tensor:
        leaf = z.clone().requires_grad_()
        loss(leaf).backward()
        assert leaf.grad is not None
        return leaf.grad
    return grad_of


@pytest.mark.parametrize("mode", ["eager", "grad", "jacrev", "jacfwd"])
@pytest.mark.parametrize("loss", [_cross_entropy, _kl_divergence], ids=["cross-entropy", "kl"])
def test_xlogy_losses_against_a_masked_softmax_have_gradient_p_minus_t(loss, mode) -> None:
    # Each row of t sums to 1, so the gradient in the logits is softmax(z) - t: 0 at a masked class.
    z, t = _masked_softmax_problem()
    transforms = {"eager": _eager_grad, "grad": grad, "jacrev": jacrev, "jacfwd": jacfwd}
    ours = transforms[mode](lambda a: loss(a, t))(z)
    torch.testing.assert_close(ours, torch.softmax(z, -1) - t, rtol=0, atol=1e-15)


def _verify_masked_cross_entropy(order: int, scope: str) -> dict[str, str]:
    z, t = _masked_softmax_problem()
    report = ag.verify(lambda a: _cross_entropy(a, t), z.requires_grad_(), order=order)
    return {row.rule: row.status for row in report.rows if row.instance and row.scope == scope}


_XLOGY_RULES_CONSISTENT = {"subgradient(log: (grad == 0) & isinf(1 / self) -> 0)": "consistent",
                           "subgradient(where [input 1]: condition -> grad)": "consistent"}


@pytest.mark.parametrize("order", [1, 2])
def test_verify_finds_xlogys_rules_consistent_in_a_masked_cross_entropy(order) -> None:
    assert _verify_masked_cross_entropy(order, "") == _XLOGY_RULES_CONSISTENT


def test_verify_end_to_end_finds_xlogys_rules_consistent_in_a_masked_cross_entropy() -> None:
    # An end-to-end row is shown only where it says otherwise than the group's own (consistent):
    # finite differences along an unmasked logit are taken at the scale of the finite logits, not
    # at the -inf of the masked ones (every step was infinite, every quotient 0).
    assert _verify_masked_cross_entropy(1, "end to end") == {}


@pytest.mark.parametrize("loss", [_cross_entropy, _kl_divergence], ids=["cross-entropy", "kl"])
def test_xlogy_losses_against_a_masked_softmax_have_the_exact_hessian(loss) -> None:
    # The Hessian in the logits is diag(p) - p p^T per row, 0 at masked classes: no warning.
    z, t = _masked_softmax_problem()
    p = torch.softmax(z, -1)
    expected = torch.zeros(*z.shape, *z.shape, dtype=torch.float64)
    for row in range(z.shape[0]):
        expected[row, :, row, :] = torch.diag(p[row]) - torch.outer(p[row], p[row])
    with warnings.catch_warnings():
        warnings.simplefilter("error", ag.SecondOrderWarning)
        torch.testing.assert_close(hessian(lambda a: loss(a, t))(z), expected, rtol=0, atol=1e-15)


def test_pow_second_derivative_at_a_zero_base() -> None:
    # Exponent 2 at x = 0: torch.pow's second derivative is 2 * grad * v; the composite's was 0.
    for exponent in (2.0, 3.0, 2.5):
        (x,), (xn,) = _pair([0.0, 1.5]), _pair([0.0, 1.5])
        ours, native = _second_order(ag.ops.pow, (x, exponent)), _second_order(torch.pow, (xn, exponent))
        torch.testing.assert_close(ours, native)


@pytest.mark.parametrize("exponent", [0.0, 0.5, 1.0, 1.5, 2.0, -0.5, -1.0, -2.0])
@pytest.mark.parametrize("tensor_exponent", [False, True], ids=["scalar", "tensor"])
def test_pow_derivatives_at_a_zero_base_are_torch_pows_infinities_too(exponent, tensor_exponent) -> None:
    # Where torch.pow's first or second derivative in the base is 0, finite or +-inf at x = 0,
    # ops.pow's is the same (pow(x, 0): 0 at second order, was NaN; y < 0: torch's infinities).
    # -0.0 only with integer exponents: torch.pow(-0.0, 0.5) takes sqrt's sign, -0.0.
    def derivatives(op):
        bases = [0.0, 0.7] + ([-0.0] if exponent.is_integer() else [])
        x = torch.tensor(bases, dtype=torch.float64, requires_grad=True)
        y = torch.full_like(x, exponent, requires_grad=True) if tensor_exponent else exponent
        wrt = [x, y] if tensor_exponent else [x]
        firsts = torch.autograd.grad(op(x, y).sum(), wrt, create_graph=True)
        total = sum(f.sum() for f in firsts)
        if not total.requires_grad:  # torch.pow(x, 0) gives zeros without a graph
            return firsts[0], torch.zeros_like(x)
        (second,) = torch.autograd.grad(total, x)  # with the exponent's gradient's slope in x
        return firsts[0].detach(), second

    for ours, native in zip(derivatives(ag.ops.pow), derivatives(torch.pow)):
        shown = ~native.isnan()
        assert shown[1], "the regular point is finite"
        torch.testing.assert_close(ours[shown], native[shown])


def test_pow_of_negative_zero_and_negative_bases() -> None:
    # -0.0 is in the domain: pow(-0.0, -1) = -inf, and the exponent's gradient has native's sign.
    base, power = [-0.0, -2.0, -2.0, 3.0], [-1.0, 3.0, 2.0, 0.5]
    (x, y), (xn, yn) = _pair(base, power), _pair(base, power)
    ours, (gx, gy) = _grads(ag.ops.pow, (x, y))
    native, (gxn, gyn) = _grads(torch.pow, (xn, yn))
    assert ours[0] == -math.inf
    torch.testing.assert_close(ours, native)
    torch.testing.assert_close(gx, gxn)
    # The exponent's gradient at a negative base: torch.pow's is NaN (log of a negative number);
    # ops.pow's is x ** y * log|x| * grad, the sign (-1) ** y held as it is between integers.
    torch.testing.assert_close(gy[[0, 3]], gyn[[0, 3]])
    assert gyn[1:3].isnan().all()
    torch.testing.assert_close(gy[1:3], (native * torch.log(xn.abs()) * upstream(native))[1:3].detach())


@pytest.mark.parametrize("op", [ag.ops.cdist, ag.ops.pdist])
def test_distances_refuse_negative_p_with_torchs_message(op) -> None:
    args = (torch.randn(3, 2), torch.randn(4, 2)) if op is ag.ops.cdist else (torch.randn(3, 2),)
    native = torch.cdist if op is ag.ops.cdist else torch.pdist
    with pytest.raises(RuntimeError) as theirs:
        native(*args, -1.0)
    with pytest.raises(RuntimeError, match="ops.(c|p)dist: ") as ours:
        op(*args, -1.0)
    assert str(theirs.value) in str(ours.value)


@pytest.mark.parametrize("order", [0.0, -1.0, -2.5, -math.inf])
def test_norms_of_order_zero_and_negative_orders_equal_torch(order) -> None:
    x = torch.tensor([[0.5, -2.0, 3.0], [0.0, 1.0, -4.0]], dtype=torch.float64)
    other = x.flip(0)
    pairs = [(lambda a: ag.ops.vector_norm(a, order, -1), lambda a: torch.linalg.vector_norm(a, order, -1)),
             (lambda a: ag.ops.normalize(a, order, dim=-1), lambda a: F.normalize(a, order, dim=-1)),
             (lambda a: ag.ops.dist(a, other, order), lambda a: torch.dist(a, other, order))]
    for ours, native in pairs:
        mine, theirs = x.clone().requires_grad_(), x.clone().requires_grad_()
        out, expected = ours(mine), native(theirs)
        torch.testing.assert_close(out, expected)
        grad = torch.autograd.grad(out.sum(), mine)[0]
        # torch's order-0 norm has a grad_fn but no gradient: autograd says the input is unused.
        (native_grad,) = torch.autograd.grad(expected.sum(), theirs, allow_unused=True,
                                             materialize_grads=True)
        torch.testing.assert_close(grad, native_grad)


def test_logsumexp_of_a_fully_masked_row_has_gradient_zero() -> None:
    x = torch.tensor([[1.0, -math.inf, 2.0], [-math.inf, -math.inf, -math.inf], [0.5, 0.25, -1.0]],
                     dtype=torch.float64)
    weight = torch.tensor([1.0, 0.0, 2.0], dtype=torch.float64)  # the masked row does not count
    mine, theirs = x.clone().requires_grad_(), x.clone().requires_grad_()
    ours, native = ag.ops.logsumexp(mine, 1), torch.logsumexp(theirs, 1)
    assert torch.equal(ours, native) or torch.allclose(ours, native, equal_nan=True)
    assert ours[1] == -math.inf
    (ours * weight).sum().backward()
    (native * weight).sum().backward()
    assert theirs.grad[1].isnan().all(), "torch.logsumexp's NaN even at weight 0: the reason for the rule"
    assert mine.grad is not None and torch.equal(mine.grad[1], torch.zeros(3, dtype=torch.float64))
    torch.testing.assert_close(mine.grad[[0, 2]], theirs.grad[[0, 2]])
    with ag.special_cases(False):
        plain = x.clone().requires_grad_()
        (ag.ops.logsumexp(plain, 1) * weight).sum().backward()
    assert plain.grad is not None and plain.grad[1].isnan().all()


def test_pdist_matmul_form_equals_torch_pdist_and_needs_no_rule_for_distinct_rows() -> None:
    x = torch.randn(40, 5, dtype=torch.float64)
    mine, theirs = x.clone().requires_grad_(), x.clone().requires_grad_()
    ours, grads = _grads(ag.ops.pdist, (mine,))
    native, native_grads = _grads(torch.pdist, (theirs,))
    torch.testing.assert_close(ours, native)
    torch.testing.assert_close(grads, native_grads)
    with ag.special_cases(False):  # the diagonal's zero distances never reach the sqrt
        plain = _grads(ag.ops.pdist, (x.clone().requires_grad_(),))[1][0]
    assert plain.isfinite().all()


def test_pdist_called_first_under_a_torch_func_transform_keeps_working_after_it() -> None:
    # The pair indices are cached per size; made under a transform they were its tensors, and the
    # next call met them "escaped" from a level that had exited (an internal assert in functorch).
    from autograd_groups.ops.distance import _cached_triangle

    _cached_triangle.cache_clear()
    x = torch.randn(7, 3, dtype=torch.float64)

    def total(t: torch.Tensor) -> torch.Tensor:
        return ag.ops.pdist(t).sum()

    first = torch.func.jacrev(torch.func.jacrev(total))(x)
    torch.testing.assert_close(torch.func.hessian(total)(x), first)
    torch.testing.assert_close(ag.ops.pdist(x), torch.pdist(x))

"""The built-in library's special points one by one, and how the library is made: rules only from
builtin.yaml, no hand-written backward under autograd_groups/ops/."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import re
from pathlib import Path

import pytest
import torch
from ops_cases import forward_backward, upstream

import autograd_groups as ag
from autograd_groups import ops
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

"""Under CPU autocast every built-in follows its native op: the same output dtype, and values and
gradients as close to the float32 result as native's own (scripts/autocast_check.py runs the same
comparison on a GPU).

Operands of two dtypes (bfloat16 or float16 beside float32) are checked the same way, with and
without autocast: native promotes them to ``torch.result_type`` and computes there.

What native does is asked of the running release, never written down here: the expected dtype is
the native op's under the same autocast, and the tolerance is native's own error there.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import torch
from ops_cases import Case

import autograd_groups as ag
from conftest import line_of

sys.path.insert(0, str(Path(__file__).parents[1] / "scripts"))
from autocast_check import AUTOCAST_CASES, autocast_check, compare  # noqa: E402

LOW = [torch.bfloat16, torch.float16]


@pytest.mark.parametrize("inputs_dtype", ["float32", "autocast"])
@pytest.mark.parametrize("autocast_dtype", LOW, ids=str)
@pytest.mark.parametrize("case", AUTOCAST_CASES, ids=lambda c: c.id)
def test_autocast_follows_the_native_op(case: Case, autocast_dtype: torch.dtype, inputs_dtype: str) -> None:
    """Inputs in float32 (parameters, data) and in the autocast dtype (what an autocast matmul made
    before the op); native's missing kernels (torch.pdist has none for low precision on the CPU)
    leave nothing to compare."""
    dtype = torch.float32 if inputs_dtype == "float32" else autocast_dtype
    result = compare(case, torch.device("cpu"), autocast_dtype, dtype)
    if result.native_dtype is None:
        pytest.skip(f"native {case.id} has no {dtype} kernel on the CPU")
    assert result.failures == [], "\n".join(result.failures)


def _tensor_arguments(case: Case) -> int:
    made = case.make(torch.float32, torch.Generator().manual_seed(0))
    return sum(isinstance(a, torch.Tensor) for a in made)


#: The cases with two tensor operands (always the first two arguments).
TWO_OPERANDS = [case for case in AUTOCAST_CASES if _tensor_arguments(case) == 2]


@pytest.mark.parametrize("autocast_dtype", [None, torch.bfloat16], ids=["eager", "autocast"])
@pytest.mark.parametrize("widened", [(0,), (1,)], ids=["float32-first", "float32-second"])
@pytest.mark.parametrize("low", LOW, ids=str)
@pytest.mark.parametrize("case", TWO_OPERANDS, ids=lambda c: c.id)
def test_operands_of_two_dtypes_follow_the_native_op(case: Case, low: torch.dtype, widened: tuple[int],
                                                     autocast_dtype: torch.dtype | None) -> None:
    """The issue's failures: ops.pow took the bfloat16 base's log before promoting (1.5e-2 off
    native), ops.atan2 rounded pi/2 to bfloat16 for a bfloat16 y (9.7e-4 off)."""
    result = compare(case, torch.device("cpu"), autocast_dtype, low, widened)
    if result.native_dtype is None:
        pytest.skip(f"native {case.id} refuses {low} beside float32 here")
    assert result.failures == [], "\n".join(result.failures)


def test_every_two_operand_builtin_is_checked_with_two_dtypes() -> None:
    covered = {case.ours.__autograd_group__ for case in TWO_OPERANDS}  # type: ignore[attr-defined]
    assert covered == {"ops.cdist", "ops.dist", "ops.cosine_similarity", "ops.pow", "ops.atan2", "ops.xlogy"}


def test_every_builtin_has_an_autocast_case() -> None:
    covered = {case.ours.__autograd_group__ for case in AUTOCAST_CASES}  # type: ignore[attr-defined]
    assert covered == {f"ops.{name}" for name in ag.ops.__all__ if name != "SPEC"}


def test_the_docs_table_is_the_declared_policies() -> None:
    text = (Path(__file__).parents[1] / "docs" / "builtins.md").read_text()
    section = text[text.index("## Autocast"):].split("\n## ")[0]
    rows = re.findall(r"^\| `ops\.(\w+)` \| (\w+) \| (\w+) \|$", section, re.MULTILINE)
    declared = [(name, *getattr(ag.ops, name).__autocast_policy__.values()) for name in ag.ops.__all__
                if name != "SPEC"]
    assert sorted(rows) == sorted(declared)


def test_cdist_and_pdist_compute_in_float32_on_the_matmul_path() -> None:
    """The issue's failure: at 256 x 64 the matrix form in bfloat16 put gradients 0.2 off native's."""
    x = torch.randn(256, 64, generator=torch.Generator().manual_seed(0), requires_grad=True)
    pairs = [(lambda a: ag.ops.cdist(a, a), lambda a: torch.cdist(a, a)), (ag.ops.pdist, torch.pdist)]
    for ours, native in pairs:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            mine, theirs = ours(x), native(x)
        assert mine.dtype == theirs.dtype == torch.float32
        (grad,), (native_grad,) = torch.autograd.grad(mine.sum(), x), torch.autograd.grad(theirs.sum(), x)
        torch.testing.assert_close(grad, native_grad, rtol=1e-4, atol=1e-4)


def test_outside_autocast_and_for_other_devices_nothing_is_cast() -> None:
    x = torch.randn(30, 4, dtype=torch.bfloat16)
    assert ag.ops.cdist(x, x).dtype == torch.bfloat16
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=torch.cuda.is_available()):
        assert ag.ops.cdist(x, x).dtype == torch.bfloat16  # a CUDA autocast leaves CPU tensors alone


def test_float64_is_never_cast() -> None:
    x = torch.randn(30, 4, dtype=torch.float64)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert ag.ops.cdist(x, x).dtype == torch.cdist(x, x).dtype == torch.float64


def test_the_group_sees_its_call_site_not_the_policy() -> None:
    x = torch.zeros(3, 4, requires_grad=True)
    with ag.trace() as trace, torch.autocast("cpu", dtype=torch.bfloat16):
        ag.ops.pdist(x)  # call-site
    assert [i.where for i in trace.instances] == [f"{__file__}:{line_of(__file__, '# call-site')}"]


def test_compiled_under_autocast() -> None:
    x = torch.randn(30, 4, generator=torch.Generator().manual_seed(1))
    compiled = torch.compile(ag.ops.cdist, fullgraph=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        eager, got = ag.ops.cdist(x, x), compiled(x, x)
    assert got.dtype == eager.dtype == torch.cdist(x, x).dtype == torch.float32
    torch.testing.assert_close(got, eager, rtol=1e-5, atol=1e-5)


def test_transformed_under_autocast() -> None:
    """torch.func.grad gives the gradient a backward pass does (torch.cdist itself fails here on
    torch 2.13: "expected m1 and m2 to have the same dtype" in its matmul form's backward)."""
    x = torch.randn(30, 4, generator=torch.Generator().manual_seed(1), dtype=torch.bfloat16)

    def summed(a: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.bfloat16):  # the forward only, as in training
            return ag.ops.cdist(a, x + 1).sum()

    leaf = x.clone().requires_grad_()
    (expected,) = torch.autograd.grad(summed(leaf), leaf)
    grad = torch.func.grad(summed)(x)
    assert grad.dtype == expected.dtype == torch.bfloat16
    torch.testing.assert_close(grad, expected, rtol=0, atol=0)


def test_the_check_script_runs_on_the_cpu(capsys: pytest.CaptureFixture[str]) -> None:
    assert autocast_check(torch.device("cpu")) == 0
    assert "autocast bfloat16 on cpu" in capsys.readouterr().out

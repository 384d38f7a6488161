"""Every built-in against its native op under ``torch.autocast``, on one device.

    python scripts/autocast_check.py                 # CUDA where there is a device, else the CPU
    python scripts/autocast_check.py --device cpu --dtype float16

Each case of tests/ops_cases.py (and ``logsumexp``'s) runs its forward under
``torch.autocast(device.type, dtype)`` and its backward outside it (as PyTorch advises), with
inputs in float32 and in the autocast dtype. Checked against the native op under the same autocast:

- the output dtype is native's;
- values and gradients are non-finite where native's are, and elsewhere as close to the float32
  result (the native op on the inputs in float32, without autocast) as native's own:
  ``error(ours) <= FACTOR * error(native) + ULPS``, each error the largest
  ``|x - ref| / (|ref| + mean |ref|)`` in units of the machine epsilon of native's dtype for that
  tensor (its output's, or its gradient's).

Where native has no kernel (``torch.pdist`` has none for float16 or bfloat16 on the CPU) nothing
is compared. tests/test_autocast.py runs this comparison on the CPU.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from autograd_groups import ops

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from ops_cases import CASES, Case, upstream  # noqa: E402  (the built-ins' cases, shared with the tests)

#: A composite rounds after each of its ops where a native kernel fuses them: a few ulps more than
#: native's own error (2.3 ulps of float32 at most here, against a float32 native exactly at the
#: reference), or up to twice native's where both compute in low precision.
FACTOR, ULPS = 2.0, 8.0


def _logsumexp_input(dtype: torch.dtype, g: torch.Generator) -> tuple[torch.Tensor]:
    x = torch.randn(4, 6, generator=g, dtype=torch.float64).to(dtype)
    x[1] = 0.5  # a constant row
    return (x,)


#: Every built-in: the cases of tests/ops_cases.py, and logsumexp, which has none there.
AUTOCAST_CASES = [*CASES, Case("logsumexp", ops.logsumexp, torch.logsumexp, _logsumexp_input, {"dim": -1},
                               False)]


@dataclass
class Result:
    """One case under one autocast: the output dtypes, and the worst errors in ulps of native's."""

    case: str
    ours_dtype: torch.dtype | None = None
    native_dtype: torch.dtype | None = None  # None: native has no kernel here
    ours_error: float = 0.0
    native_error: float = 0.0
    failures: list[str] = field(default_factory=list)


def _run(case: Case, args: tuple[Any, ...], device: str,
         autocast_dtype: torch.dtype | None, native: bool) -> list[torch.Tensor]:
    """The output and the inputs' gradients, the forward under autocast (None: without)."""
    leaves = [a.detach().requires_grad_() if isinstance(a, torch.Tensor) else a for a in args]
    with torch.autocast(device, dtype=autocast_dtype or torch.bfloat16, enabled=autocast_dtype is not None):
        out = (case.native if native else case.ours)(*leaves, **case.kwargs)
    tensors = [a for a in leaves if isinstance(a, torch.Tensor)]
    return [out.detach(), *torch.autograd.grad(out, tensors, upstream(out).to(out.device))]


def _error(x: torch.Tensor, ref: torch.Tensor, where: torch.Tensor, eps: float) -> float:
    """The largest ``|x - ref| / (|ref| + mean |ref|)`` over ``where``, in units of ``eps``."""
    if not where.any():
        return 0.0
    x, ref = x.double()[where], ref.double()[where]
    scale = ref.abs() + ref.abs().mean()
    return float(((x - ref).abs() / scale.clamp_min(torch.finfo(torch.float64).tiny)).max()) / eps


def compare(case: Case, device: torch.device, autocast_dtype: torch.dtype | None,
            inputs_dtype: torch.dtype, widened: tuple[int, ...] = ()) -> Result:
    """``case`` under ``torch.autocast(device.type, autocast_dtype)`` (None: outside autocast),
    inputs in ``inputs_dtype`` but the arguments at the positions ``widened``, cast to float32
    after they are made (exactly, so the special points stay): operands of two dtypes."""
    made = case.make(inputs_dtype, torch.Generator().manual_seed(0))
    made = tuple(a.float() if i in widened else a for i, a in enumerate(made))
    args = tuple(a.to(device) if isinstance(a, torch.Tensor) else a for a in made)
    result = Result(case.id)
    try:
        natives = _run(case, args, device.type, autocast_dtype, native=True)
    except NotImplementedError:  # no kernel for this dtype on this device
        return result
    except RuntimeError:
        if not widened:
            raise
        return result  # torch.cdist refuses operands of two dtypes outside autocast
    ours = _run(case, args, device.type, autocast_dtype, native=False)
    refs = _run(case, tuple(a.float() if isinstance(a, torch.Tensor) else a for a in args), device.type, None,
                native=True)
    result.ours_dtype, result.native_dtype = ours[0].dtype, natives[0].dtype
    if result.ours_dtype != result.native_dtype:
        result.failures.append(f"{case.id}: output {result.ours_dtype}, native's {result.native_dtype}")
    names = ["value", *[f"gradient {i}" for i in range(len(ours) - 1)]]
    for name, mine, theirs, ref in zip(names, ours, natives, refs):
        if mine.dtype != theirs.dtype:
            result.failures.append(f"{case.id}: {name} in {mine.dtype}, native's in {theirs.dtype}")
            continue
        finite = theirs.isfinite()
        if not torch.equal(mine.isfinite(), finite):
            result.failures.append(f"{case.id}: {name} is non-finite elsewhere than native's")
            continue
        where, eps = finite & ref.isfinite(), torch.finfo(theirs.dtype).eps
        error, native_error = _error(mine, ref, where, eps), _error(theirs, ref, where, eps)
        result.ours_error = max(result.ours_error, error)
        result.native_error = max(result.native_error, native_error)
        if error > FACTOR * native_error + ULPS:
            result.failures.append(f"{case.id}: {name} {error:.1f} ulps from the float32 result, "
                                   f"native's {native_error:.1f}")
    return result


def _name(dtype: torch.dtype | None) -> str:
    return str(dtype).removeprefix("torch.")


def _row(op: str, inputs_dtype: torch.dtype, device: torch.device, results: list[Result]) -> str:
    """The table's line for ``op``'s cases with inputs in ``inputs_dtype``."""
    policy = getattr(ops, op.removeprefix("ops.")).__autocast_policy__
    ran = [r for r in results if r.native_dtype is not None]
    failures = [f for r in results for f in r.failures]
    status = "no native kernel" if not ran else f"FAIL: {failures[0]}" if failures else "ok"
    ours, native = ("/".join(sorted({_name(getattr(r, f"{who}_dtype")) for r in ran})) or "-"
                    for who in ("ours", "native"))
    errors = (max((getattr(r, f"{who}_error") for r in ran), default=0.0) for who in ("ours", "native"))
    return (f"{op:<22} {_name(inputs_dtype):<9} {policy['cpu' if device.type == 'cpu' else 'cuda']:<12} "
            f"{ours:<9} {native:<9} {next(errors):>7.1f} {next(errors):>7.1f}  {status}")


def autocast_check(device: torch.device, dtype: torch.dtype = torch.bfloat16) -> int:
    """Compare every case under ``torch.autocast(device.type, dtype)``; print a table, one line per
    op and inputs' dtype; return the number of cases that failed."""
    print(f"autocast {_name(dtype)} on {device.type} (torch {torch.__version__}): errors in ulps of "
          f"native's dtype from the float32 result, worst over the op's cases")
    print(f"{'op':<22} {'inputs':<9} {'policy':<12} {'ours':<9} {'native':<9} {'err':>7} {'native':>7}  "
          f"status")
    failed = 0
    for inputs_dtype in (torch.float32, dtype):
        by_op: dict[str, list[Result]] = {}
        for case in AUTOCAST_CASES:
            result = compare(case, device, dtype, inputs_dtype)
            by_op.setdefault(case.ours.__autograd_group__, []).append(result)
            failed += bool(result.failures)
        for op, results in by_op.items():
            print(_row(op, inputs_dtype, device, results))
    print(f"autocast: {failed} failing case(s)")
    return failed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    options = parser.parse_args()
    return 1 if autocast_check(torch.device(options.device), getattr(torch, options.dtype)) else 0


if __name__ == "__main__":
    sys.exit(main())

"""The built-ins on PyTorch's own test inputs: every sample of the OpInfo of each op that has one.

``torch.testing._internal.common_methods_invocations.op_db`` describes each torch op with sample
inputs (``sample_inputs``) and, for some, ``reference_inputs``: broadcasting, non-contiguous
tensors, scalars, empty tensors, extremal values. Where an OpInfo has a reference-inputs function its
reference inputs start with its sample inputs, so those are run; otherwise the sample inputs. Each
sample runs in float64 and float32, through the built-in and through the native op:

- the forward values are equal;
- the first-order gradients of every differentiable input are equal, for a random ``grad_output``;
- the second order, the gradient of ``sum(grad · v)`` with respect to the inputs and to
  ``grad_output``, is equal, for a random ``v``;
- where the native op raises, the built-in raises the same error type with the same message.

"Equal" is elementwise where the native result is finite; where it is not, the built-in must give
the same non-finite value, or a finite one that equals the op's :class:`Entry` ``reference``, an
independent formula written from other native ops: those are the points where the built-in is
"finite where PyTorch is not", listed in docs/builtins.md. Native ``cdist`` and ``pdist`` have no
double backward outside the matmul form; there the second order is compared with the reference.

Samples outside a built-in's documented domain are listed in :data:`OUTSIDE`, with the reason.

    python tests/test_ops_opinfo.py      # the counts, per op and in all
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
from torch.testing._internal.common_methods_invocations import SampleInput, op_db
from torch.testing._internal.opinfo.core import OpInfo

from autograd_groups import ops

DTYPES = [torch.float64, torch.float32]
#: A composite rounds after every op where the native kernel fuses: a few tens of ulps in float32.
#: The absolute part scales with the largest value compared, where cancellation leaves an element
#: near 0 with the rounding error of its largest terms (second derivatives of p-norms, p < 1).
TOLERANCE = {torch.float64: (1e-7, 1e-7), torch.float32: (1e-4, 1e-5)}
#: float32 second derivatives add the rounding of two backward passes: normalize with p = 0.5 over a
#: single element, whose second derivative is 0 up to cancellation, is off by 2e-4 of its terms.
SECOND_ORDER_FLOAT32 = (1e-3, 1e-3)


def _tolerance(expected: torch.Tensor, dtype: torch.dtype, order: int) -> dict[str, float]:
    rtol, atol = TOLERANCE[dtype] if order < 2 or dtype == torch.float64 else SECOND_ORDER_FLOAT32
    finite = expected[expected.isfinite()]
    scale = max(1.0, float(finite.abs().max())) if finite.numel() else 1.0
    return {"rtol": rtol, "atol": atol * scale}
Fn = Callable[..., Any]


def _cdist_reference(x1: torch.Tensor, x2: torch.Tensor, p: float = 2.0, compute_mode: str = "",
                     ) -> torch.Tensor:
    return torch.linalg.vector_norm(x1.unsqueeze(-2) - x2.unsqueeze(-3), p, -1)


def _pdist_reference(x: torch.Tensor, p: float = 2.0) -> torch.Tensor:
    rows, cols = torch.triu_indices(x.shape[0], x.shape[0], 1)
    return torch.linalg.vector_norm(x[rows] - x[cols], p, -1)


class _PowReference(torch.autograd.Function):
    """``torch.pow`` whose first derivatives are those of PyTorch's ``pow_backward_self`` and
    ``pow_backward_exponent`` (FunctionsManual.cpp), written with a double ``where`` so that their own
    derivatives are finite at a zero base, and with a negative base's sign held constant, so that the
    exponent's derivative is ``x ** y * log|x|`` (torch.pow's is NaN there)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, y)
        return torch.pow(x, y)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = ctx.saved_tensors
        zero = y == 0
        d_x = torch.where(zero, 0.0, grad * y * torch.pow(x, torch.where(zero, 1.0, y - 1)))
        held = (x == 0) & (y >= 0)
        safe = torch.where(held, 1.0, x.abs())
        sign = torch.pow(x, y).sign().detach()
        d_y = torch.where(held, 0.0, grad * sign * torch.pow(safe, y) * torch.log(safe))
        return d_x.sum_to_size(x.shape), d_y.sum_to_size(y.shape)


def _pow_reference(base: Any, exponent: Any) -> torch.Tensor:
    like = base if isinstance(base, torch.Tensor) else exponent
    x, y = (v if isinstance(v, torch.Tensor) else torch.tensor(v, dtype=like.dtype) for v in (base, exponent))
    return _PowReference.apply(x, y)


def _atan2_reference(y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``torch.atan2`` with a double ``where`` at the origin: every derivative is 0 there."""
    origin = (x == 0) & (y == 0)
    safe = torch.atan2(torch.where(origin, 1.0, y), torch.where(origin, 1.0, x))
    return torch.where(origin, torch.atan2(y, x).detach(), safe)


def _xlogy_reference(x: Any, y: Any) -> torch.Tensor:
    """``torch.xlogy`` with a double ``where`` at ``x = y = 0``: ``xlogy(0, y)`` is 0 for every ``y``,
    so every derivative is 0 there (``torch.xlogy``'s gradient of ``y``, ``x / y``, is ``0 / 0``)."""
    like = x if isinstance(x, torch.Tensor) else y
    x, y = (v if isinstance(v, torch.Tensor) else torch.tensor(v, dtype=like.dtype) for v in (x, y))
    return torch.xlogy(x, torch.where((x == 0) & (y == 0), 1.0, y))


def _logsumexp_reference(x: torch.Tensor, dim: Any, keepdim: bool = False) -> torch.Tensor:
    """``torch.logsumexp`` with a double ``where`` at slices that are all ``-inf``: -inf, gradient 0."""
    dims = (dim,) if isinstance(dim, int) else tuple(dim)
    empty = (x == -math.inf).to(x.dtype).mean(dims, keepdim=True) == 1
    safe = torch.logsumexp(torch.where(empty, 0.0, x), dims, keepdim=True)
    out = torch.where(empty, -math.inf, safe)
    return out if keepdim else out.squeeze(dims)


@dataclass(frozen=True)
class Entry:
    """One OpInfo (``name``, ``variant``) and the built-in called with its samples' arguments."""

    name: str
    ours: Fn
    variant: str = ""
    reference: Fn | None = None


ENTRIES = [
    Entry("cdist", ops.cdist, reference=_cdist_reference),
    Entry("nn.functional.pdist", ops.pdist, reference=_pdist_reference),
    Entry("dist", ops.dist),
    Entry("linalg.vector_norm", ops.vector_norm),
    Entry("nn.functional.normalize", ops.normalize),
    Entry("nn.functional.cosine_similarity", ops.cosine_similarity),
    Entry("std", ops.std),
    Entry("std", ops.std, "unbiased"),
    Entry("var", ops.var),
    Entry("var", ops.var, "unbiased"),
    Entry("pow", ops.pow, reference=_pow_reference),
    Entry("atan2", ops.atan2, reference=_atan2_reference),
    Entry("xlogy", ops.xlogy, reference=_xlogy_reference),
    Entry("logsumexp", ops.logsumexp, reference=_logsumexp_reference),
]

def _values(sample: SampleInput) -> list[torch.Tensor]:
    found = [sample.input, *sample.args]
    return [t.detach() for t in found if isinstance(t, torch.Tensor)]


def _not_finite(sample: SampleInput) -> bool:
    return any(not bool(t.isfinite().all()) for t in _values(sample))


def _both_coordinates_infinite(sample: SampleInput) -> bool:
    y, x = (torch.as_tensor(v).detach() for v in (sample.input, sample.args[0]))
    return bool((y.isinf() & x.isinf()).any())


def _huge_exponent_of_negative_base(sample: SampleInput) -> bool:
    base, exponent = (torch.as_tensor(v) for v in (sample.input, sample.args[0]))
    return bool((base < 0).any()) and bool((exponent.abs() >= 2.0 ** 24).any())


#: Samples outside a built-in's documented domain: (OpInfo name, predicate over the sample, reason).
OUTSIDE: list[tuple[str, Callable[[SampleInput], bool], str]] = [
    ("atan2", _both_coordinates_infinite, "both coordinates infinite: ops.atan2's quotient is inf / inf "
                                          "there, where torch.atan2 gives an odd multiple of pi / 4"),
    ("pow", _not_finite, "an infinite or NaN base or exponent: exp(y log|x|) is exp(inf * 0) where C's "
                         "pow special-cases 1 ** inf, (-1) ** inf and nan ** 0"),
    ("pow", _huge_exponent_of_negative_base,
     "a negative base with an exponent beyond 2^24: the exponent's parity, which gives the sign, is "
     "not representable in float32, and torch.pow's own gradient rounds y - 1 to y"),
]


@dataclass
class Tally:
    """What one op's run compared."""

    samples: int = 0
    comparisons: int = 0
    finite_points: int = 0
    outside: dict[str, int] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)


def _opinfo(entry: Entry) -> OpInfo:
    return next(o for o in op_db if o.name == entry.name and o.variant_test_name == entry.variant)


def _samples(info: OpInfo, dtype: torch.dtype) -> Iterator[SampleInput]:
    torch.manual_seed(0)
    if info.reference_inputs_func is not None:
        return info.reference_inputs("cpu", dtype, requires_grad=True)
    return info.sample_inputs("cpu", dtype, requires_grad=True)


def _leaves(sample: SampleInput) -> list[torch.Tensor]:
    found = [sample.input, *sample.args, *sample.kwargs.values()]
    return [t for t in found if isinstance(t, torch.Tensor) and t.requires_grad]


def _call(fn: Fn, sample: SampleInput) -> torch.Tensor:
    return fn(sample.input, *sample.args, **sample.kwargs)


def _random_like(t: torch.Tensor) -> torch.Tensor:
    g = torch.Generator().manual_seed(t.numel())
    return torch.randn(t.shape, generator=g, dtype=torch.float64).to(t.dtype)


def _derivatives(fn: Fn, sample: SampleInput, order: int) -> list[torch.Tensor]:
    """``fn``'s value (order 0), the gradients of the sample's leaves (1), or the gradients of
    ``sum(grad · v)`` with respect to the leaves and ``grad_output`` (2)."""
    leaves = _leaves(sample)
    out = _call(fn, sample)
    if order == 0:
        return [out.detach()]
    grad_out = _random_like(out).requires_grad_(order == 2)
    if not out.requires_grad:  # a piecewise-constant value (an order-0 norm): the gradients are 0
        return [torch.zeros_like(t) for t in leaves] + ([torch.zeros_like(out)] if order == 2 else [])
    grads = torch.autograd.grad(out, leaves, grad_out, create_graph=order == 2, allow_unused=True,
                                materialize_grads=True)
    if order == 1:
        return list(grads)
    total = sum(((g * _random_like(g)).sum() for g in grads), torch.zeros((), dtype=out.dtype))
    wrt = [*leaves, grad_out]
    if not total.requires_grad:
        return [torch.zeros_like(t) for t in wrt]
    return list(torch.autograd.grad(total, wrt, allow_unused=True, materialize_grads=True))


def _compare(what: str, ours: list[torch.Tensor], theirs: list[torch.Tensor], order: int,
             reference: Callable[[], list[torch.Tensor]] | None, dtype: torch.dtype, tally: Tally) -> None:
    assert len(ours) == len(theirs), what
    for k, (mine, native) in enumerate(zip(ours, theirs)):
        tally.comparisons += 1
        where = f"{what}[{k}]"
        assert mine.shape == native.shape, f"{where}: shape {tuple(mine.shape)} != {tuple(native.shape)}"
        finite = native.isfinite()
        torch.testing.assert_close(mine[finite], native[finite], **_tolerance(native[finite], dtype, order),
                                   msg=functools.partial("{}: {}".format, where))
        # A value must be the same non-finite number as native's; a derivative may be NaN where
        # native's is NaN, or a finite one that the reference confirms; where native's is infinite,
        # it is the same infinity or that finite one.
        odd = ~finite & ~((mine == native) | (mine.isnan() & native.isnan()))
        if order > 0:
            odd &= mine.isfinite() | native.isinf()
        if not odd.any():
            continue
        assert reference is not None, f"{where}: {mine[odd]} where native gives {native[odd]}, no reference"
        expected = reference()[k]
        torch.testing.assert_close(mine[odd], expected[odd], **_tolerance(expected[odd], dtype, order),
                                   msg=functools.partial("{}, against the reference: {}".format, where))
        tally.finite_points += int(odd.sum())


def _native(info: OpInfo, sample: SampleInput, order: int) -> list[torch.Tensor] | Exception:
    try:
        return _derivatives(info.op, sample, order)
    except (RuntimeError, NotImplementedError, ValueError) as e:
        return e


def _describe(sample: SampleInput) -> str:
    def one(a: Any) -> str:
        return f"T{tuple(a.shape)}" if isinstance(a, torch.Tensor) else repr(a)

    keywords = (f"{k}={one(v)}" for k, v in sample.kwargs.items())
    return ", ".join([one(sample.input), *map(one, sample.args), *keywords])


def run(entry: Entry, dtype: torch.dtype) -> Tally:
    """Compare ``entry``'s built-in with its native op on every sample in ``dtype``."""
    info = _opinfo(entry)
    tally = Tally()
    for n, sample in enumerate(_samples(info, dtype)):
        reason = next((r for name, outside, r in OUTSIDE if name == entry.name and outside(sample)), None)
        if reason is not None:
            tally.outside[reason] = tally.outside.get(reason, 0) + 1
            continue
        tally.samples += 1
        try:
            _run_sample(entry, info, sample, dtype, tally)
        except Exception as e:  # noqa: BLE001 - every failing sample is reported, not only the first
            tally.failures.append(f"{info.name} {dtype} sample {n} ({_describe(sample)}): {e!r}")
    return tally


def _run_sample(entry: Entry, info: OpInfo, sample: SampleInput, dtype: torch.dtype, tally: Tally) -> None:
    for order in (0, 1, 2) if _leaves(sample) else (0,):
        native = _native(info, sample, order)
        reference = None if entry.reference is None else functools.partial(_derivatives, entry.reference,
                                                                             sample, order)
        if isinstance(native, Exception) and order < 2:
            # The native op refuses the sample: the built-in must refuse it with the same error.
            with pytest.raises(type(native)) as raised:
                _derivatives(entry.ours, sample, order)
            assert str(native) in str(raised.value), f"order {order}: {raised.value!r}, native {native!r}"
            tally.comparisons += 1
            return
        ours = _derivatives(entry.ours, sample, order)
        if isinstance(native, Exception):
            # No native double backward (cdist, pdist): the reference is the one to equal.
            assert reference is not None, f"native has no order-{order} derivative ({native}), no reference"
            _compare(f"order {order} (against the reference)", ours, reference(), order, None, dtype, tally)
        else:
            _compare(f"order {order}", ours, native, order, reference, dtype, tally)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: f"{e.name}-{e.variant}".rstrip("-"))
def test_builtin_equals_native_on_opinfo_samples(entry: Entry, dtype: torch.dtype) -> None:
    tally = run(entry, dtype)
    assert not tally.failures, "\n".join(tally.failures[:20]) + f"\n({len(tally.failures)} failures)"
    assert tally.samples > 0 and tally.comparisons >= tally.samples
    listed = {reason for name, _, reason in OUTSIDE if name == entry.name}
    assert set(tally.outside) == listed, "samples outside the domain are listed, and listed reasons occur"


def _report() -> None:
    totals = Tally()
    print("| op | dtype | samples | comparisons | finite where PyTorch is not | outside the domain "
          "| failures |")
    print("|---|---|---|---|---|---|---|")
    for entry in ENTRIES:
        for dtype in DTYPES:
            tally = run(entry, dtype)
            outside = sum(tally.outside.values())
            print(f"| {entry.name} {entry.variant} | {str(dtype).removeprefix('torch.')} | {tally.samples} | "
                  f"{tally.comparisons} | {tally.finite_points} | {outside} | {len(tally.failures)} |")
            totals.samples += tally.samples
            totals.comparisons += tally.comparisons
            totals.finite_points += tally.finite_points
            for reason, count in tally.outside.items():
                totals.outside[reason] = totals.outside.get(reason, 0) + count
            totals.failures += tally.failures
    print(f"| all | | {totals.samples} | {totals.comparisons} | {totals.finite_points} | "
          f"{sum(totals.outside.values())} | {len(totals.failures)} |")
    for reason, count in totals.outside.items():
        print(f"- outside, {count} samples: {reason}")
    for failure in totals.failures:
        print(f"- FAILED {failure}")


if __name__ == "__main__":
    _report()

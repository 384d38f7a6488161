"""The built-in ops' test cases: each op and parameter combination of the issue's table, with its
native counterpart and inputs that mix regular points with the op's special points."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from autograd_groups import ops

INF = math.inf
DTYPES = [torch.float32, torch.float64]
ORDERS = [1.0, 2.0, 0.5, 3.0, INF]

Make = Callable[[torch.dtype, torch.Generator], tuple[Any, ...]]


@dataclass(frozen=True)
class Case:
    """``ours(*inputs, **kwargs)`` against ``native(*inputs, **kwargs)``.

    ``composite_breaks``: the plain composite's gradient is non-finite at these special points
    where the native one is finite (the case needs its rule); False where no rule is needed.
    """

    id: str
    ours: Callable[..., torch.Tensor]
    native: Callable[..., torch.Tensor]
    make: Make
    kwargs: dict[str, Any]
    composite_breaks: bool


def _randn(g: torch.Generator, dtype: torch.dtype, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype)


def _uniform(g: torch.Generator, dtype: torch.dtype, low: float, high: float, *shape: int) -> torch.Tensor:
    return (low + (high - low) * torch.rand(*shape, generator=g, dtype=torch.float64)).to(dtype)


def _rows_pair(batch: tuple[int, ...], n: int, m: int, d: int, grid: bool) -> Make:
    """x1, x2 with identical rows in every batch entry, and one equal coordinate (a zero difference)
    in a pair that is otherwise apart. ``grid``: values k/4, so a matrix product is exact."""

    def make(dtype: torch.dtype, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        if grid:
            x1 = (torch.randint(-8, 9, (*batch, n, d), generator=g) / 4).to(dtype)
            x2 = (torch.randint(-8, 9, (*batch, m, d), generator=g) / 4).to(dtype)
        else:
            x1, x2 = _randn(g, dtype, *batch, n, d), _randn(g, dtype, *batch, m, d)
        x2[..., 0, :] = x1[..., 1, :]
        x2[..., 2, :] = x1[..., 0, :]
        x2[..., 3, 0] = x1[..., 2, 0]
        return x1, x2

    return make


def _rows_broadcast(dtype: torch.dtype, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """x1 of shape (3, 1, 5, 4) against x2 of shape (6, 4), broadcast over x1's batch."""
    x1, x2 = _randn(g, dtype, 3, 1, 5, 4), _randn(g, dtype, 6, 4)
    x2[0] = x1[0, 0, 1]
    x2[2] = x1[2, 0, 4]
    x2[3, 0] = x1[1, 0, 2, 0]
    return x1, x2


def _duplicate_rows(dtype: torch.dtype, g: torch.Generator) -> tuple[torch.Tensor]:
    x = _randn(g, dtype, 7, 4)
    x[3] = x[1]
    x[5] = x[0]
    x[6, 2] = x[2, 2]
    return (x,)


def _equal_pair(dtype: torch.dtype, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    x = _randn(g, dtype, 3, 4)
    return x, x.clone()


def _partly_equal_pair(dtype: torch.dtype, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    x, y = _randn(g, dtype, 3, 4), _randn(g, dtype, 4)
    x[:, 1] = y[1]  # zero differences, broadcast
    return x, y


def _zero_slices(*batch: int) -> Make:
    def make(dtype: torch.dtype, g: torch.Generator) -> tuple[torch.Tensor]:
        x = _randn(g, dtype, *batch, 4, 5)
        x[..., 1, :] = 0
        x[..., 2, ::2] = 0
        return (x,)

    return make


def _all_zero(dtype: torch.dtype, g: torch.Generator) -> tuple[torch.Tensor]:
    return (torch.zeros(3, 4, dtype=dtype),)


def _cosine_inputs(broadcast: bool) -> Make:
    def make(dtype: torch.dtype, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        x1 = _randn(g, dtype, 5, 4)
        x1[1] = 0
        x1[3] = 0
        if broadcast:
            return x1, _randn(g, dtype, 4)
        x2 = _randn(g, dtype, 5, 4)
        x2[2] = 0
        x2[3] = 0
        return x1, x2

    return make


def _constant_slices(dtype: torch.dtype, g: torch.Generator) -> tuple[torch.Tensor]:
    x = _randn(g, dtype, 5, 6)
    x[1] = 0.5
    x[2] = -2.0
    x[4] = 0.1
    return (x,)


def _constant(dtype: torch.dtype, g: torch.Generator) -> tuple[torch.Tensor]:
    return (torch.full((3, 4), 0.75, dtype=dtype),)


#: pow's special point is input 0, with any exponent.
POW_AT_ZERO = [0.0, 1.5, 2.0, 3.0, -1.0, -0.5, 0.5, 1.0]


def _pow_inputs(dtype: torch.dtype, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    x, y = _uniform(g, dtype, 0.25, 2.0, 2, 8), _uniform(g, dtype, -1.0, 3.0, 2, 8)
    x[0] = 0
    y[0] = torch.tensor(POW_AT_ZERO, dtype=dtype)
    x[1, 0] = 0.0
    y[1, 0] = 0.0  # and 0 ** 0 once more, beside regular points
    return x, y


def _pow_scalar_exponent(exponent: float) -> Make:
    def make(dtype: torch.dtype, g: torch.Generator) -> tuple[Any, ...]:
        x = _uniform(g, dtype, 0.25, 2.0, 2, 5)
        x[:, 1] = 0
        return x, exponent

    return make


def _pow_scalar_base(dtype: torch.dtype, g: torch.Generator) -> tuple[Any, ...]:
    return 2.5, _uniform(g, dtype, -2.0, 2.0, 3, 4)


def _atan2_inputs(dtype: torch.dtype, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    y, x = _randn(g, dtype, 2, 12), _randn(g, dtype, 2, 12)
    special = torch.tensor([[0.0, 0.0], [-0.0, 0.0], [0.0, -0.0], [-0.0, -0.0], [0.0, 2.0], [-0.0, 2.0],
                            [0.0, -3.0], [-0.0, -3.0], [1.5, 0.0], [-1.5, 0.0], [2.0, -0.0], [-2.0, -0.0]],
                           dtype=dtype)
    y[0], x[0] = special[:, 0], special[:, 1]
    return y, x


def _xlogy_inputs(dtype: torch.dtype, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    x, y = _randn(g, dtype, 2, 8), _uniform(g, dtype, 0.25, 3.0, 2, 8)
    x[0, :6] = 0
    y[0, :6] = torch.tensor([0.0, 1.0, -1.0, 2.5, 0.3, -0.0], dtype=dtype)
    y[0, 6] = 0  # x != 0, y = 0: -inf, as torch.xlogy
    return x, y


def _xlogy_broadcast(dtype: torch.dtype, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    x, y = _randn(g, dtype, 3, 1), _uniform(g, dtype, 0.25, 3.0, 4)
    x[1] = 0
    y[2] = 0
    return x, y


def _xlogy_native(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``torch.xlogy`` with a double ``where`` at ``x = y = 0``, where ``ops.xlogy`` is exact and
    native is not: ``xlogy(0, y)`` is 0 for every ``y``, so ``y``'s gradient is 0 there, where
    ``torch.xlogy``'s is ``0 / 0`` (docs/builtins.md). Everywhere else it is ``torch.xlogy``."""
    return torch.xlogy(x, torch.where((x == 0) & (y == 0), 1.0, y))


def _cdist_native(x1: torch.Tensor, x2: torch.Tensor, p: float = 2.0, **kwargs: Any) -> torch.Tensor:
    return torch.cdist(x1, x2, p, **kwargs)


def _cases() -> list[Case]:
    cases: list[Case] = []
    breaks_for = {1.0: False, 2.0: True, 0.5: True, 3.0: True, INF: False}
    for p in ORDERS:
        cases += [
            Case(f"cdist-p{p}", ops.cdist, _cdist_native, _rows_pair((2,), 5, 6, 4, False), {"p": p},
                 breaks_for[p]),
            Case(f"cdist-p{p}-broadcast", ops.cdist, _cdist_native, _rows_broadcast, {"p": p}, breaks_for[p]),
            Case(f"pdist-p{p}", ops.pdist, torch.pdist, _duplicate_rows, {"p": p}, breaks_for[p]),
            Case(f"dist-p{p}-equal", ops.dist, torch.dist, _equal_pair, {"p": p}, breaks_for[p]),
            Case(f"dist-p{p}-partly-equal", ops.dist, torch.dist, _partly_equal_pair, {"p": p}, p == 0.5),
            Case(f"vector_norm-ord{p}", ops.vector_norm, torch.linalg.vector_norm, _zero_slices(2),
                 {"ord": p, "dim": -1}, breaks_for[p]),
            Case(f"vector_norm-ord{p}-keepdim", ops.vector_norm, torch.linalg.vector_norm, _zero_slices(),
                 {"ord": p, "dim": (1,), "keepdim": True}, breaks_for[p]),
            Case(f"vector_norm-ord{p}-all", ops.vector_norm, torch.linalg.vector_norm, _all_zero,
                 {"ord": p}, breaks_for[p]),
            Case(f"normalize-p{p}", ops.normalize, F.normalize, _zero_slices(), {"p": p}, breaks_for[p]),
        ]
    # p = 2 with more than 25 rows: the matmul form, as torch.cdist; grid values keep it exact.
    cases += [
        Case("cdist-p2-mm", ops.cdist, _cdist_native, _rows_pair((2,), 30, 6, 4, True), {}, True),
        Case("cdist-p2-mm-forced", ops.cdist, _cdist_native, _rows_pair((), 5, 6, 3, True),
             {"compute_mode": "use_mm_for_euclid_dist"}, True),
        Case("cdist-p2-direct-forced", ops.cdist, _cdist_native, _rows_pair((), 30, 27, 3, False),
             {"compute_mode": "donot_use_mm_for_euclid_dist"}, True),
        Case("normalize-dim-1", ops.normalize, F.normalize, _zero_slices(), {"dim": -1}, True),
        Case("cosine_similarity", ops.cosine_similarity, F.cosine_similarity, _cosine_inputs(False), {},
             True),
        Case("cosine_similarity-broadcast", ops.cosine_similarity, F.cosine_similarity, _cosine_inputs(True),
             {"dim": -1}, True),
    ]
    for correction in (0, 1):
        for name, ours, native in (("std", ops.std, torch.std), ("var", ops.var, torch.var)):
            rule = name == "std"
            cases += [
                Case(f"{name}-c{correction}", ours, native, _constant_slices,
                     {"dim": -1, "correction": correction}, rule),
                Case(f"{name}-c{correction}-keepdim", ours, native, _constant_slices,
                     {"dim": (1,), "correction": correction, "keepdim": True}, rule),
                Case(f"{name}-c{correction}-all", ours, native, _constant, {"correction": correction}, rule),
            ]
    cases += [
        Case("pow", ops.pow, torch.pow, _pow_inputs, {}, True),
        Case("pow-scalar-exponent-2.5", ops.pow, torch.pow, _pow_scalar_exponent(2.5), {}, True),
        Case("pow-scalar-exponent-0", ops.pow, torch.pow, _pow_scalar_exponent(0.0), {}, True),
        Case("pow-scalar-base", ops.pow, torch.pow, _pow_scalar_base, {}, False),
        Case("atan2", ops.atan2, torch.atan2, _atan2_inputs, {}, True),
        Case("xlogy", ops.xlogy, _xlogy_native, _xlogy_inputs, {}, True),
        Case("xlogy-broadcast", ops.xlogy, _xlogy_native, _xlogy_broadcast, {}, True),
    ]
    return cases


CASES = _cases()


def inputs(case: Case, dtype: torch.dtype, seed: int = 0) -> tuple[Any, ...]:
    """Fresh inputs of ``case``: its tensors as leaves that require grad."""
    made = case.make(dtype, torch.Generator().manual_seed(seed))
    return tuple(t.detach().clone().requires_grad_() if isinstance(t, torch.Tensor) else t for t in made)


def ordinary_inputs(case: Case, dtype: torch.dtype) -> tuple[Any, ...]:
    """Inputs of ``case`` moved off its special points: every tensor plus noise (no zero difference,
    no zero or constant slice, no tie), bases of pow and the second operand of xlogy positive."""
    g = torch.Generator().manual_seed(5)
    moved = [a.detach() + 0.3 * torch.randn(a.shape, generator=g, dtype=torch.float64).to(dtype)
             if isinstance(a, torch.Tensor) else a for a in inputs(case, dtype)]
    positive = {"pow": 0, "xlogy": 1}.get(case.id.split("-")[0])
    if positive is not None and isinstance(moved[positive], torch.Tensor):
        moved[positive] = moved[positive].abs() + 0.25
    return tuple(moved)


def upstream(out: torch.Tensor) -> torch.Tensor:
    """A non-uniform, nonzero upstream gradient, so a wrong mask cannot hide behind symmetry."""
    return (torch.arange(out.numel(), dtype=out.dtype) % 5 + 1).reshape(out.shape) / 2


def forward_backward(fn: Callable[..., torch.Tensor], args: tuple[Any, ...],
                     kwargs: dict[str, Any]) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """``fn``'s value and the gradients of its tensor arguments for :func:`upstream`."""
    leaves = [a for a in args if isinstance(a, torch.Tensor)]
    out = fn(*args, **kwargs)
    grads = torch.autograd.grad(out, leaves, upstream(out))
    return out.detach(), list(grads)

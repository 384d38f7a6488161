"""Distances: ``cdist``, ``pdist`` and ``dist``, each the p-norm of differences (see :mod:`.norms`).

Identical points give a zero distance, where the p-norm's derivative is singular; the groups' rules
give PyTorch's answer there: that pair contributes 0. ``cdist`` with ``p = 2`` follows
``torch.cdist`` in choosing between the direct form and the matrix-product form of ATen's
``_euclidean_dist``; both end in a ``sqrt``, so one rule covers both.
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F

from .. import compat
from ..groups.group import autograd_group
from .autocast import autocast_policy
from .norms import check_order, p_norm, reduce_dims

_MODES = ("use_mm_for_euclid_dist_if_necessary", "use_mm_for_euclid_dist", "donot_use_mm_for_euclid_dist")


def _use_mm(x1: torch.Tensor, x2: torch.Tensor, compute_mode: str) -> bool | torch.SymBool:
    if compute_mode not in _MODES:
        raise ValueError(f"ops.cdist: compute_mode={compute_mode!r} is not one of {', '.join(_MODES)}")
    if compute_mode == "use_mm_for_euclid_dist_if_necessary":
        return (x1.shape[-2] > 25) | (x2.shape[-2] > 25)  # torch.cdist's own threshold
    return compute_mode == "use_mm_for_euclid_dist"


def _squared_mm(x1: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:
    """``|x1|^2 + |x2|^2 - 2 x1.x2`` as ATen's ``_euclidean_dist`` computes it: one matrix product."""
    x1_norm = (x1 * x1).sum(-1, keepdim=True)
    x2_norm = (x2 * x2).sum(-1, keepdim=True)
    x1_ = torch.cat([x1 * -2, x1_norm, torch.ones_like(x1_norm)], -1)
    x2_ = torch.cat([x2, torch.ones_like(x2_norm), x2_norm], -1)
    return x1_.matmul(x2_.transpose(-2, -1))


def _squared_bmm(x1: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:
    """``|x1|^2 + |x2|^2 - 2 x1.x2`` as one ``baddbmm`` over the inputs' own columns: compiled code's form.

    Compiled, ATen's concatenated operands are two more matrices the backward keeps for its
    products, and the products read a gradient scaled by -2 that inductor recomputes for the norms'
    sums; here the products take the inputs and the square's gradient itself (``alpha`` scales their
    results), which is written once. Eagerly ATen's form stays, for torch.cdist's values bit for bit.
    """
    batch = torch.broadcast_shapes(x1.shape[:-2], x2.shape[:-2])
    a = x1.expand(*batch, *x1.shape[-2:]).reshape(-1, *x1.shape[-2:])
    b = x2.expand(*batch, *x2.shape[-2:]).reshape(-1, *x2.shape[-2:])
    squared = torch.baddbmm((a * a).sum(-1, keepdim=True), a, b.mT, alpha=-2)
    return (squared + (b * b).sum(-1, keepdim=True).mT).reshape(*batch, x1.shape[-2], x2.shape[-2])


def _root_of_clamped(squared: torch.Tensor) -> torch.Tensor:
    """``sqrt(clamp_min(squared, 0))`` with the clamp in place, outside autograd.

    A square clamped to 0 is a zero distance, where the sqrt rule gives the pair gradient 0: the
    clamp's own backward would only repeat that, and keep the whole unclamped matrix to do it.
    """
    with torch.no_grad():
        squared.clamp_min_(0)
    return squared.sqrt()


def _euclidean_mm(x1: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:
    """ATen's ``_euclidean_dist``: ``sqrt(clamp_min(|x1|^2 + |x2|^2 - 2 x1.x2, 0))``."""
    return _root_of_clamped(_squared_bmm(x1, x2) if compat.is_compiling() else _squared_mm(x1, x2))


@autocast_policy(cpu="fp32", cuda="fp32")
@autograd_group("ops.cdist")
def cdist(x1: torch.Tensor, x2: torch.Tensor, p: float = 2.0,
          compute_mode: str = "use_mm_for_euclid_dist_if_necessary") -> torch.Tensor:
    """``torch.cdist``, ``0 <= p <= inf``: p-norm distances between the rows of ``x1`` and ``x2``.

    >>> import torch, autograd_groups as ag
    >>> x = torch.tensor([[0.0, 1.0], [2.0, 3.0]], requires_grad=True)
    >>> ag.ops.cdist(x, x.detach()).sum().backward()
    >>> x.grad
    tensor([[-0.7071, -0.7071],
            [ 0.7071,  0.7071]])
    """
    if x1.dim() < 2 or x2.dim() < 2 or x1.shape[-1] != x2.shape[-1]:
        raise ValueError(f"ops.cdist: x1 and x2 must be at least 2-D with the same number of columns, "
                         f"got shapes {tuple(x1.shape)} and {tuple(x2.shape)}")
    p = check_order(p, "ops.cdist", negative=False)
    if p != 2:
        return _direct(x1, x2, p)
    use_mm = _use_mm(x1, x2, compute_mode)
    symbolic = torch.compiler.is_dynamo_compiling() or not isinstance(use_mm, bool)
    if compat.is_exporting() and symbolic:
        # A dynamic row count: export both forms and pick at run time, as torch.cdist does, rather
        # than a guard that would pin the dimension to one side of 25. (A strict export's Dynamo
        # shows a symbolic bool as a bool, so there both forms are exported whatever the shapes.)
        return torch.cond(use_mm, _euclidean_mm, _direct_euclidean, (x1, x2))  # type: ignore[arg-type]
    return _euclidean_mm(x1, x2) if use_mm else _direct(x1, x2, p)


# The bytes of differences one chunk of rows makes on the CPU per thread: about a core's L2 cache,
# where the chunk's squares and the backward's products stay, rather than the whole rows x rows x
# columns tensor (6.5 MB for 25 x 1024 x 64) going to memory several times over. Smaller chunks
# spent more on the per-chunk ops, and with two threads a chunk of 2 MB did too: each op over it
# is a parallel region, which costs more than its half of the chunk (docs/builtins.md#performance).
_CHUNK_BYTES = 2 << 20


def _direct(x1: torch.Tensor, x2: torch.Tensor, p: float) -> torch.Tensor:
    if p == math.inf:
        return _chebyshev(x1, x2)
    if p == 2 and not compat.is_compiling() and x1.device.type == "cpu" and (
            x1.is_floating_point() or x2.is_floating_point()):
        return _euclidean_in_chunks(x1, x2)
    # x1 + (-x2), not x1 - x2: the same numbers, but the backward negates x2's gradient after
    # summing it, not the whole rows x rows x columns gradient before. A compiled graph fuses this
    # into one loop, and a GPU has no use for smaller steps.
    return p_norm(x1.unsqueeze(-2) + x2.neg().unsqueeze(-3), p, (-1,), False)


def _chebyshev(x1: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:
    """``max_k |x1_ik - x2_jk|`` as ``|x1_ik - x2_jk|`` at the one coordinate ``k`` that attains it.

    The coordinate is found outside autograd, so only the ``(rows, rows)`` pairs it picks are in
    the graph: the backward scatters one gradient per pair into each input, where ``amax`` of the
    differences kept the ``(rows, rows, columns)`` differences and their ``abs``, and wrote a
    gradient of that size, shared among ties, for two sums. Ties give the whole gradient to their
    first coordinate (``amax`` shared it, ``torch.cdist`` gives it to each).
    """
    batch = torch.broadcast_shapes(x1.shape[:-2], x2.shape[:-2])
    x1, x2 = x1.expand(*batch, *x1.shape[-2:]), x2.expand(*batch, *x2.shape[-2:])
    with torch.no_grad():
        k = _first_largest((x1.unsqueeze(-2) - x2.unsqueeze(-3)).abs())
    return (x1.gather(-1, k) - x2.gather(-1, k.mT).mT).abs()


def _first_largest(x: torch.Tensor) -> torch.Tensor:
    """The index of the first largest element (or NaN) along the last dim, as ``argmax``."""
    if not compat.is_compiling():
        return x.argmax(-1)
    # Compiled, argmax reduces pairs of (value, index) vectors across each short row: 3.2 ms here
    # (256 x 256 pairs of 32 columns), against 0.9 ms for these two reductions of plain values.
    # x != x is isnan, which compiles to a scalar loop.
    top = x.amax(-1, keepdim=True)
    columns = torch.arange(x.shape[-1], dtype=torch.float32, device=x.device)  # exact to 2**24
    return torch.where((x == top) | (x != x), columns, x.shape[-1]).amin(-1).long()


def _pairs_of_matrices(a: torch.Size, b: torch.Size) -> int:
    """The number of matrices that batch shapes ``a`` and ``b`` broadcast to, in eager code.

    Not ``torch.broadcast_shapes(a, b).numel()``: its first call imports sympy, most of a second.

    >>> _pairs_of_matrices(torch.Size([3, 1]), torch.Size([4]))
    12
    >>> _pairs_of_matrices(torch.Size([0]), torch.Size([1]))
    0
    """
    n = max(len(a), len(b))
    pairs = list(zip((1,) * (n - len(a)) + tuple(a), (1,) * (n - len(b)) + tuple(b)))
    if any(i != j and 1 not in (i, j) for i, j in pairs):
        raise RuntimeError(f"ops.cdist: the batch shapes {tuple(a)} and {tuple(b)} do not broadcast")
    return math.prod(j if i == 1 else i for i, j in pairs)


def _euclidean_in_chunks(x1: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:
    """``sqrt(sum((x1_i - x2_j) ** 2))``, taking the side with more rows in chunks of equal rows,
    each of ``_CHUNK_BYTES`` to twice that of differences per thread.

    The other side's gradient is summed over the chunks, so it is the smaller one that is summed.
    ``mse_loss(reduction="none")`` gives the same numbers as ``d * d`` without a tensor of
    differences: the forward writes the squares only, and nothing of the chunk's size is saved.
    """
    batch = _pairs_of_matrices(x1.shape[:-2], x2.shape[:-2])
    split_x2 = x2.shape[-2] >= x1.shape[-2]
    small = x1 if split_x2 else x2
    rows = (x2 if split_x2 else x1).shape[-2]
    row_bytes = batch * small.shape[-2] * small.shape[-1] * torch.result_type(x1, x2).itemsize
    chunks = max(1, rows * row_bytes // (_CHUNK_BYTES * torch.get_num_threads()))
    step = max(1, -(-rows // chunks))
    # Split before broadcasting: split's backward then joins the chunks' small gradients, not full ones.
    if split_x2:
        whole, parts, joined = x1.unsqueeze(-2), x2.unsqueeze(-3).split(step, -2), -1
    else:
        whole, parts, joined = x2.unsqueeze(-3), x1.unsqueeze(-2).split(step, -3), -2
    squares = []
    for part in parts:
        a, b = torch.broadcast_tensors(whole, part)
        squares.append(F.mse_loss(a, b, reduction="none").sum(-1))
    # One sqrt after the cat, so that the rule's site is one node, chunks or not.
    return (squares[0] if len(squares) == 1 else torch.cat(squares, joined)).sqrt()


def _direct_euclidean(x1: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:
    return _direct(x1, x2, 2.0)


@autocast_policy(cpu="fallthrough", cuda="fp32")
@autograd_group("ops.pdist")
def pdist(input: torch.Tensor, p: float = 2.0) -> torch.Tensor:
    """``torch.pdist``: the upper triangle of ``cdist(input, input, p)``, row by row.

    With ``p = 2`` and more than 25 rows (torch.cdist's threshold), the squared distances come from
    the matrix-product form and the pairs are gathered before the square root, so the diagonal's
    zeros never reach it; otherwise, and in compiled code, each pair's difference is taken directly.

    >>> import torch, autograd_groups as ag
    >>> x = torch.tensor([[1.0, 1.0], [1.0, 1.0], [4.0, 5.0]], requires_grad=True)
    >>> ag.ops.pdist(x)
    tensor([0., 5., 5.], grad_fn=<SqrtBackward0>)
    """
    if input.dim() != 2:
        raise ValueError(f"ops.pdist: input must be 2-D, got shape {tuple(input.shape)}")
    p = check_order(p, "ops.pdist", negative=False)
    n = input.shape[0]
    rows, cols, flat = _upper_triangle(n, input.device)
    if p == 2 and n > 25 and not compat.is_compiling():
        # Compiled, the direct form below is one loop over the pairs that writes no difference, and
        # no matrix of them to gather from: 1.0x torch.pdist against 1.3x for this form (512 x 32).
        # |x_i|^2 + |x_j|^2 - 2 x_i.x_j, the norms added around a product over the input's own
        # columns: _squared_mm's cat would add two, which makes each of the backward's two products
        # a third slower (512 rows x 34 against 32 columns).
        norms = (input * input).sum(-1, keepdim=True)
        squared = torch.addmm(norms, input, input.T, alpha=-2).add_(norms.T)
        return _root_of_clamped(squared.flatten().index_select(0, flat))
    return p_norm(input.index_select(0, rows) - input.index_select(0, cols), p, (-1,), False)


def _upper_triangle(n: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The rows, columns and flat indices of an ``n x n`` matrix's upper triangle, row by row."""
    if compat.is_compiling() or compat.peek_interpreter_stack() is not None:
        # Made under a torch.func transform, the indices are that transform's tensors, which must
        # not outlive it in the cache: a later call would meet them "escaped" from a dead level.
        return _triangle(n, device)
    return _cached_triangle(n, device)


def _triangle(n: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    # int32 where the flat indices fit: half the bytes the backward's gathers keep, and compiled
    # code computes them without 64-bit vector arithmetic, which AVX2 emulates.
    dtype = torch.int32 if n * n <= torch.iinfo(torch.int32).max else torch.int64
    rows, cols = torch.triu_indices(n, n, 1, device=device, dtype=dtype)
    return rows, cols, rows * n + cols


# Building the indices costs as much as a 512-row pdist's whole backward; a training loop asks for
# the same few sizes again and again.
_cached_triangle = functools.lru_cache(maxsize=8)(_triangle)


@autocast_policy(cpu="fallthrough", cuda="fp32")
@autograd_group("ops.dist")
def dist(input: torch.Tensor, other: torch.Tensor, p: float = 2.0) -> torch.Tensor:
    """``torch.dist``: the p-norm of ``input - other`` (broadcast), a scalar; gradient 0 when equal.

    >>> import torch, autograd_groups as ag
    >>> x = torch.ones(3, requires_grad=True)
    >>> ag.ops.dist(x, torch.ones(3)).backward()
    >>> x.grad
    tensor([0., 0., 0.])
    """
    diff = input - other
    return p_norm(diff, check_order(p, "ops.dist"), reduce_dims(diff, None), False)

"""The numbers behind ``ag.verify``: limits of the automatic gradient at nearby points, and whether
a rule's gradient agrees with them.

Along a direction ``d`` the automatic gradient ``g(x + t d)`` is sampled at the step sizes
:data:`STEPS`, from ``1e-2`` down to ``1e-15`` times the input's scale (at an element, only the
steps that move it by at least :data:`RESOLVED` of its value). Near ``t = 0`` a piecewise smooth
function has ``g(x + t d) = L + c t + ...``, a cusp or a root ``L + c t^a``: each window of
neighbouring steps gives an estimate of ``L`` -- the sample itself, Richardson's extrapolation (exact
for ``a = 1``) and Aitken's (exact for any ``a``) -- and the estimate that changes least from the
previous window's is kept, with that change as its error (Ridders' choice of the best step). Large
steps cross other structure and small ones drown in rounding; choosing, element by element, copes
with both. Samples that are not finite are unusable: a direction with too few left leaves the
function's domain there and is dropped (one-sided limits at a boundary). Where no estimate
settles, a sequence that keeps growing by :data:`GROWTH` per step has the limit ``+-inf``; any other
has none, except along a direction that met a special point nearby (``special``): its samples are
cut short by the special point's rounding, and it is left out as well -- as long as one pair of
opposite directions remains, so that a kink is still seen from both sides.

The documentation's "Checking rules" page explains the tolerances.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

#: Step sizes, relative to each input's scale ``max(1, max |x|)``; each is a tenth of the previous.
STEPS = tuple(10.0 ** -k for k in range(2, 16))
#: Steps of the finite differences of a function's value (:func:`~.points.Probe.differences`): below
#: ``1e-8`` the rounding of the value, divided by the step, swamps them.
DIFFERENCE_STEPS = STEPS[:7]
#: The error of a difference quotient's limit is at least this many times the rounding of the value
#: divided by the step where extrapolation's truncation (``h^2``) and rounding (``eps |f| / h``) are
#: about equal, ``eps^(1/3)``: finite differences cannot resolve less.
DIFFERENCE_ROUNDING = 16.0
#: Finite differences whose rounding error exceeds this part of their limit (or of 1) are no
#: reference: the rule's value would pass within it.
RESOLUTION = 1e-3
#: A step is used at an element only where it moves the element by this part of its value or more.
RESOLVED = 1e-13
#: Random directions are drawn in pairs ``d, -d``: at a kink they see both sides of every element.
PAIRS = 3
#: A limit is accepted when its error estimate is below this part of its value ...
SETTLED = 1e-3
#: ... or of the samples estimates came from and those at the largest step, along any direction
#: (slow convergence to 0; one side of a kink near 0).
SETTLED_SCALE = 1e-5
#: The rule's value may differ from the limits' range by this part of their size ...
RTOL = 1e-6
#: ... plus this part of that size of the samples, plus twice the limits' own error estimate.
ATOL = 1e-9
#: Each step a diverging gradient grows by more than this factor (a tenfold smaller step).
GROWTH = 2.0
#: A change this many times the next one is not convergence but rounding noise (see _candidates).
NOISE = 100.0
#: Aitken's extrapolation is used only where each difference is at most this part of the previous.
AITKEN_RATIO = 2.0

CONVERGED, DIVERGED, NO_LIMIT, OUTSIDE = 0, 1, 2, 3


@dataclass
class Limits:
    """The limits of one gradient along each direction, element by element: ``value`` and
    ``error`` of shape (directions, elements); ``state`` one of CONVERGED, DIVERGED (``value`` is
    ``+-inf``), NO_LIMIT, OUTSIDE (too few finite samples: the direction leaves the domain);
    ``size``: the largest of the samples an estimate came from, which tolerances are measured by;
    ``special``: (directions, elements), where a
    direction met a special point nearby (see :func:`estimate`)."""

    value: torch.Tensor
    error: torch.Tensor
    state: torch.Tensor
    size: torch.Tensor
    special: torch.Tensor | None = None


def usable(point: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """Where a step moved an element by at least :data:`RESOLVED` of its value: below that, the
    float64 sum ``x + t d`` keeps too few digits of ``t d`` to say anything about the limit (at a
    zero element every step is usable). ``offsets``: (directions, steps, elements).

    >>> usable(torch.tensor([0.0, 1.0]), torch.tensor([[[1e-15, 1e-15], [1e-5, 1e-5]]])).tolist()
    [[[True, False], [True, True]]]
    """
    return offsets.abs() * (1 / RESOLVED) >= point.abs()


def estimate(samples: torch.Tensor, special: torch.Tensor | None = None) -> Limits:
    """The limits of ``samples`` (directions, steps, elements), the steps shrinking tenfold;
    ``special`` (directions, elements) marks where a direction met a special point nearby: without a
    limit there, it is left out (OUTSIDE) rather than NO_LIMIT.

    >>> t = torch.tensor(STEPS, dtype=torch.float64)
    >>> samples = torch.stack([1 + 3 * t, -1 + t * t, 1 / t, torch.sin(1 / t), t.log()], -1)[None]
    >>> limits = estimate(samples)
    >>> limits.value[0, :3].tolist(), limits.state[0].tolist()
    ([1.0, -1.0, inf], [0, 0, 1, 2, 2])
    """
    s = samples
    finite = torch.isfinite(s)
    estimates, changes, starts = _candidates(s)
    # The least error; of equal ones, the last candidate, from the smallest steps: a window at the
    # largest steps that happens to be exact (Richardson's of |x| + 1e12 x^2) would measure the
    # tolerance by samples as large as 2e10.
    best = changes.shape[1] - 1 - changes.flip(1).argmin(1, keepdim=True)
    error = changes.gather(1, best).squeeze(1)
    value = estimates.gather(1, best).squeeze(1)
    # What a tolerance is measured by: the samples the estimate came from. Not the largest
    # sample, which a diverging sequence, or a stiff smooth term at the large steps (|x| + 1e12 x^2),
    # makes as large as it likes.
    start = starts[best]
    used = torch.cat([s.gather(1, (start + k).clamp_max(s.shape[1] - 1)) for k in range(4)], 1)
    size = _largest(used)
    # What an error is small against: those samples and the one at the largest usable step, for a
    # slow convergence to 0; along every direction, as at a kink one side's limit can be near 0
    # while the others are not. Not along a diverging one, whose samples grow as large as they
    # like: every other direction would look settled beside it.
    steps = torch.arange(s.shape[1]).view(1, -1, 1)
    first = s.gather(1, torch.where(finite, steps, s.shape[1] - 1).amin(1, keepdim=True))
    diverging, sign = _diverging(s, finite)
    scale = torch.where(diverging, 0.0, torch.maximum(size, _largest(first))).amax(0)
    converged = torch.isfinite(error) & (error <= SETTLED * value.abs() + SETTLED_SCALE * scale)
    state = torch.full(value.shape, NO_LIMIT, dtype=torch.int8)
    state[finite.sum(1) < 3] = OUTSIDE
    state[diverging & ~converged] = DIVERGED
    state[converged] = CONVERGED
    if special is not None:
        state[special & (state == NO_LIMIT)] = OUTSIDE
    value = torch.where(state == DIVERGED, sign * math.inf, value)
    error = torch.where(state == CONVERGED, error, 0.0)
    return Limits(value, error, state, size, special)


def _largest(samples: torch.Tensor) -> torch.Tensor:
    """The largest finite ``|sample|`` along dimension 1 (0 where none is finite)."""
    return torch.where(torch.isfinite(samples), samples.abs(), 0.0).amax(1)


def _candidates(s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Estimates of the limit from windows of neighbouring steps, each with its change from the
    previous window's estimate (its error), and the first step of its window.

    Three sequences of estimates: the samples themselves (robust where rounding noise dominates);
    Richardson's extrapolation of two steps, exact for ``L + c t`` (a smooth point); Aitken's of
    three, exact for ``L + c t^a`` whatever the power ``a`` (a cusp, a root), where the differences
    at least halve.
    """
    step = s[:, 1:] - s[:, :-1]
    richardson = s[:, 1:] + step / 9
    before, after = step[:, :-1], step[:, 1:]
    aitken = torch.where(after == 0, s[:, 2:], s[:, 2:] - after * after / (after - before))
    # Only where the differences at least halve: then the limit lies within one difference of the
    # last sample. A slower ratio (a slowly diverging log) divides by a near-zero second difference.
    aitken = torch.where((after.abs() * AITKEN_RATIO <= before.abs()) | (after == 0), aitken, math.nan)
    estimates, changes, starts = [], [], []
    for sequence in (s, richardson, aitken):
        change = (sequence[:, 1:] - sequence[:, :-1]).abs()
        # An estimate's error is its change, or a hundredth of the change before it if that is
        # larger: convergence shrinks the changes tenfold a step, while two equal values among
        # rounding noise (0, 0 after -1e10) must not settle.
        estimates.append(sequence[:, 2:])
        changes.append(torch.maximum(change[:, 1:], change[:, :-1] / NOISE))
        starts.append(torch.arange(sequence.shape[1] - 2))
    change = torch.cat(changes, 1)
    return torch.cat(estimates, 1), torch.where(torch.isfinite(change), change, math.inf), torch.cat(starts)


def _diverging(s: torch.Tensor, finite: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Where the last three finite samples grow by :data:`GROWTH` per step with one sign, and
    that sign."""
    steps = torch.arange(s.shape[1]).view(1, -1, 1).expand_as(s)
    left = finite.clone()
    last = []
    for _ in range(3):
        k = torch.where(left, steps, -1).amax(1, keepdim=True)
        last.append(s.gather(1, k.clamp_min(0)).squeeze(1))
        left &= steps != k
    newest, middle, oldest = last
    sign = torch.sign(newest)
    grows = ((newest.abs() > GROWTH * middle.abs()) & (middle.abs() > GROWTH * oldest.abs())
             & (torch.sign(middle) == sign) & (torch.sign(oldest) == sign) & (sign != 0))
    return grows & (finite.sum(1) >= 3), sign


@dataclass
class Comparison:
    """A rule's gradient against the limits, at the elements where the rule fired.

    ``checked``, ``inconsistent``, and the elements not checked: ``no_limit`` (along some direction),
    ``outside`` (every direction leaves the domain), ``unbounded`` (a finite value where the limits
    are infinite towards one side only, or a NaN where they are infinite), ``special`` (a direction
    met a special point nearby and was left out, and no pair of opposite directions is left): masks
    over the elements;
    ``low``, ``high``: the range of the limits at each element; ``excess``: how far the rule's value
    lies outside it, and ``tolerance``: how far it may; ``kind``: "smooth", "kink" or "cusp" (a
    limit is infinite).
    """

    checked: torch.Tensor
    inconsistent: torch.Tensor
    no_limit: torch.Tensor
    outside: torch.Tensor
    unbounded: torch.Tensor
    special: torch.Tensor
    low: torch.Tensor
    high: torch.Tensor
    excess: torch.Tensor
    tolerance: torch.Tensor
    kind: str


def compare(rule: torch.Tensor, limits: Limits, elements: torch.Tensor) -> Comparison:
    """Check ``rule`` (the gradient the rules give) against ``limits`` at the ``elements`` (a mask).

    >>> limits = Limits(torch.tensor([[1.0, 2.0], [-1.0, 2.0]]), torch.zeros(2, 2),
    ...                 torch.zeros(2, 2, dtype=torch.int8), torch.ones(2, 2))
    >>> found = compare(torch.tensor([0.0, 5.0]), limits, torch.tensor([True, True]))
    >>> found.inconsistent.tolist(), found.low.tolist(), found.high.tolist(), found.kind
    ([False, True], [-1.0, 2.0], [1.0, 2.0], 'kink')
    """
    valid = (limits.state == CONVERGED) | (limits.state == DIVERGED)
    diverged = limits.state == DIVERGED
    up, down = (diverged & (limits.value > 0)).any(0), (diverged & (limits.value < 0)).any(0)
    no_limit = elements & (limits.state == NO_LIMIT).any(0)
    outside = elements & ~no_limit & ~valid.any(0)
    # A finite value where the automatic gradient grows without bound towards one side only: its
    # derivative is infinite there, or the directions missed the other side; no verdict either way.
    # Nor for a NaN where it grows without bound: the sum of infinite terms of both signs (a
    # Hessian-vector product over infinite second derivatives), PyTorch's own value there too.
    unbounded = elements & ~no_limit & ~outside & (
        (torch.isfinite(rule) & (up ^ down)) | (torch.isnan(rule) & (up | down)))
    special = torch.zeros_like(elements)
    if limits.special is not None:
        # Left out along a direction, the kink must still be seen from both sides of one.
        left_out = (limits.special & (limits.state == OUTSIDE)).any(0)
        paired = (valid[0::2] & valid[1::2]).any(0)
        special = elements & ~no_limit & ~outside & ~unbounded & left_out & ~paired
    checked = elements & ~no_limit & ~outside & ~unbounded & ~special
    low = torch.where(valid, limits.value, math.inf).amin(0)
    high = torch.where(valid, limits.value, -math.inf).amax(0)
    error = torch.where(valid, limits.error, 0.0).amax(0)
    reference = torch.where(valid, limits.size, 0.0).amax(0)
    size = torch.stack([low, high, rule]).abs()
    size = torch.where(torch.isfinite(size), size, 0.0).amax(0)
    tolerance = RTOL * size + ATOL * reference + 2 * error
    # Infinite ends bound nothing on their side; an infinite rule value must equal such an end.
    below = torch.where(torch.isfinite(low), low - tolerance, low)
    above = torch.where(torch.isfinite(high), high + tolerance, high)
    inconsistent = checked & ~((rule >= below) & (rule <= above))
    gap = torch.maximum(low - rule, rule - high)
    gap = torch.where((rule >= low) & (rule <= high), 0.0, torch.where(torch.isnan(gap), math.inf, gap))
    excess = torch.where(checked, gap, 0.0)
    spread = high - low
    infinite = (checked | unbounded) & ~(torch.isfinite(low) & torch.isfinite(high))
    wide = checked & torch.isfinite(spread) & (spread > tolerance)
    kind = "cusp" if bool(infinite.any()) else "kink" if bool(wide.any()) else "smooth"
    return Comparison(checked, inconsistent, no_limit, outside, unbounded, special, low, high, excess,
                      tolerance, kind)


_KINDS = ("smooth", "kink", "cusp")


def merge(first: Comparison, second: Comparison, where: torch.Tensor) -> Comparison:
    """``first``, with ``second``'s findings at the elements ``where`` (a mask): the comparison of
    the same rule's value against another reference there.

    >>> one = Limits(torch.tensor([[1.0, 0.0]]), torch.zeros(1, 2), torch.tensor([[0, 3]], dtype=torch.int8),
    ...              torch.ones(1, 2))
    >>> two = Limits(torch.tensor([[9.0, 2.0]]), torch.zeros(1, 2), torch.zeros(1, 2, dtype=torch.int8),
    ...              torch.ones(1, 2))
    >>> rule, both, second = torch.tensor([1.0, 5.0]), torch.tensor([True, True]), torch.tensor([False, True])
    >>> found = merge(compare(rule, one, both), compare(rule, two, second), second)
    >>> found.checked.tolist(), found.inconsistent.tolist(), found.high.tolist()
    ([True, True], [False, True], [1.0, 2.0])
    """
    fields = {}
    for name in ("checked", "inconsistent", "no_limit", "outside", "unbounded", "special", "low", "high",
                 "excess", "tolerance"):
        fields[name] = torch.where(where, getattr(second, name), getattr(first, name))
    kinds = [first.kind] + ([second.kind] if bool((second.checked | second.unbounded).any()) else [])
    return Comparison(**fields, kind=max(kinds, key=_KINDS.index))

"""The comparison behind one row of ``ag.verify``: the derivative the rules give, at the elements a
rule reaches, against a reference.

The reference is the limits of the automatic derivative at nearby points (:mod:`.limits`), without
the samples at and past a nearby point that is itself special (:meth:`~.points.Probe.nearby`). Where
the automatic gradient has no finite limit at an element -- the plain composite's gradient is NaN
on a whole neighbourhood, as at the self-pairs of a pairwise energy -- the reference there is the
function's value instead: its one-sided difference quotients along the element's coordinate,
extrapolated the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import limits
from .points import Probe

#: At most this many elements of one point are checked against finite differences (each costs two
#: runs of the function per step, :data:`~.limits.DIFFERENCE_STEPS`).
MAX_DIFFERENCES = 64


@dataclass
class Judged:
    """``compared``: the comparison, element by element; ``differences``: the elements compared
    against finite differences of the function's value; ``untried``: elements that would have been,
    past :data:`MAX_DIFFERENCES`; ``blurred``: elements whose finite differences, along one side or
    both, converged within a rounding too large to tell one value of the rule from another."""

    compared: limits.Comparison
    differences: torch.Tensor
    untried: torch.Tensor
    blurred: torch.Tensor


class Judge:
    """Compares the rules' derivative with the references of one :class:`~.points.Probe`, whose
    :meth:`~.points.Probe.nearby` gave ``samples``; the finite differences are computed only where
    an element needs them, once for every rule checked at the point."""

    def __init__(self, probe: Probe, samples: torch.Tensor) -> None:
        self.probe = probe
        self.limits: limits.Limits = self._estimate(samples)
        self.logarithmic: torch.Tensor = _logarithmic(samples)

    def _estimate(self, samples: torch.Tensor) -> limits.Limits:
        special = self.probe.special
        return limits.estimate(samples, special if special.numel() else None)

    def _unsettled(self, compared: limits.Comparison) -> torch.Tensor:
        """Where the automatic gradient has no finite limit to compare with: it has none along some
        direction, or every direction leaves the domain of the function or of the derivative (a
        coordinate may stay in it: a cross-entropy in its logits, not in its target). Not where it
        diverges like a logarithm along some direction (``-(log p + 1)`` at ``p = 0``): the value's
        one-sided slope is infinite there too, and finite differences would only cost runs."""
        return (compared.no_limit | compared.special | compared.outside) & ~self.logarithmic

    def compare(self, value: torch.Tensor, reached: torch.Tensor) -> Judged:
        """``value`` (the rules' derivative) at the elements ``reached``."""
        compared = limits.compare(value, self.limits, reached)
        none = torch.zeros_like(reached)
        wanted = self._unsettled(compared)
        if self.probe.order != 1 or not bool(wanted.any()):
            return Judged(compared, none, none, none)
        chosen = wanted & (wanted.cumsum(0) <= MAX_DIFFERENCES)
        quotients = limits.estimate(self.probe.differences(chosen))
        converged = quotients.state == limits.CONVERGED
        quotients.error = torch.where(converged, torch.maximum(quotients.error, self.probe.rounding),
                                      quotients.error)
        # Rounding this large beside the slope (an output far larger than its change) leaves
        # nothing to compare: any value of the rule would be within it.
        blurred = converged & (self.probe.rounding > limits.RESOLUTION * quotients.value.abs().clamp_min(1.0))
        quotients.state = torch.where(blurred, limits.NO_LIMIT, quotients.state)
        compared = limits.merge(compared, limits.compare(value, quotients, chosen), chosen)
        return Judged(compared, chosen & compared.checked, wanted & ~chosen, blurred.any(0))


def _logarithmic(samples: torch.Tensor) -> torch.Tensor:
    """The elements whose samples at the five largest steps, along some direction, change by about
    the same amount each step, with one sign (within a factor 2): a logarithm's divergence, where a
    converging sequence's changes shrink about tenfold.

    >>> t = torch.tensor(limits.STEPS, dtype=torch.float64)
    >>> _logarithmic(torch.stack([t.log(), 1 + t], -1)[None]).tolist()
    [True, False]
    """
    change = samples[:, 1:5] - samples[:, :4]
    ratio = (change[:, 1:] / change[:, :-1]).abs()
    steady = (ratio >= 0.5) & (ratio <= 2.0) & (change[:, 1:] * change[:, :-1] > 0)
    return steady.all(1).any(0)

"""The check behind :class:`~autograd_groups.errors.SecondOrderWarning`: the first time a second
derivative flows through a rule that fired at a call site, the group is run again on float64 copies
of that call's inputs and the rule is checked there as ``ag.verify(order=2)`` checks it
(sites/second_order.py tells the user what it found).

It runs inside the backward that differentiates through the rule, perhaps inside ``torch.func``
transforms: on the plain values under their wrappers, outside the transforms, unseen by trace
sessions, ``stats()`` and ``detect_nonfinite()``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from .. import levels
from ..errors import internal_error
from ..groups.group import autograd_group
from ..instance import GroupInstance
from ..observe import anomaly, counters, tracer
from ..rules.kinds import NanSafe, Subgradient
from ..sites.second_order import Batched, Verdict
from . import verify
from .points import point_of
from .verdict import CONSISTENT, INCONSISTENT, NOT_CHECKED


@contextlib.contextmanager
def unobserved() -> Iterator[None]:
    """Run a group again for a check: no trace session, count or non-finite check sees it."""
    with tracer.hidden(), anomaly.paused(), counters.kept(), levels.outside_transforms(), \
            torch.enable_grad():
        yield


def check_site(instance: GroupInstance, rule: Subgradient | NanSafe, index: int | None = None) -> Verdict:
    """Whether the second derivative ``rule`` gives at ``instance``'s call is the function's there:
    at the elements its rule site at member ``index`` reaches (None: at all its rule sites).

    >>> import torch, autograd_groups as ag
    >>> with ag.registry_scope():
    ...     _ = ag.register_rule("root", ag.NanSafe())
    ...     divide = ag.autograd_group("root")(lambda x, y: torch.where(x != 0, y / x, y))
    ...     with ag.trace() as t:
    ...         _ = divide(torch.zeros(1), torch.ones(1, requires_grad=True))
    ...     check_site(t.instances[0], t.instances[0].rules.nan_safe).status
    'consistent'
    """
    if instance.call is None:
        raise internal_error(f"group instance {instance.id} was checked without the call that made it")
    function, args, kwargs, wanted = instance.call
    fn = function()
    if fn is None:
        return Verdict(NOT_CHECKED, "the group's function no longer exists")
    if any(isinstance(v, Batched) for v in (*args, *kwargs.values())):
        return Verdict(NOT_CHECKED, "the group ran under vmap, on a batch of inputs: check one of "
                                    "them with ag.verify(fn, *args, order=2)")
    with unobserved():
        point = point_of(autograd_group(instance.name)(fn), args, kwargs,
                         lambda t: id(t) in wanted)
        if not point.inputs:
            return Verdict(NOT_CHECKED, "none of its tensor inputs requires grad")
        if not any(x.numel() for x in point.inputs):
            # A second derivative with respect to empty inputs has no element to be wrong.
            return Verdict(CONSISTENT)
        fired = verify.Fired(instance, rule, 0, rule.op if isinstance(rule, Subgradient) else "",
                             instance.where, index)
        row = verify.check_point(point, [fired], 2, by_id=False)[0]
    if row.status == CONSISTENT:
        return Verdict(CONSISTENT)
    if row.status == INCONSISTENT:
        return Verdict(INCONSISTENT, f"at {row.input} the rules give {row.rule_value:.6g} where the "
                                     f"automatic Hessian-vector product tends to "
                                     f"{_range(row.low, row.high)} (for a random vector, "
                                     f"ag.verify(order=2))")
    return Verdict(NOT_CHECKED, row.reason)


def _range(low: float | None, high: float | None) -> str:
    return f"{low:.6g}" if low == high else f"[{low:.6g}, {high:.6g}]"

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
from typing import Any

import torch

from .. import compat, flag, levels
from ..errors import internal_error
from ..groups import lifecycle
from ..groups.group import autograd_group
from ..instance import GroupInstance
from ..observe import anomaly, counters, tracer
from ..rules.kinds import NanSafe, Subgradient
from ..sites import second_order, tangents
from ..sites.second_order import Batched, Verdict
from . import verify
from .points import Point, point_of, seeded
from .verdict import CONSISTENT, INCONSISTENT, NOT_CHECKED, Row


@contextlib.contextmanager
def unobserved() -> Iterator[None]:
    """Run a group again for a check: no trace session, count, non-finite check or saved-tensor
    hook of the user's (``save_on_cpu``, a checkpoint's) sees it."""
    with tracer.hidden(), anomaly.paused(), counters.kept(), levels.outside_transforms(), \
            compat.legacy_vmap_suspended(), _without_saved_tensor_hooks(), torch.enable_grad():
        yield


@contextlib.contextmanager
def _without_saved_tensor_hooks() -> Iterator[None]:
    popped = []
    while (top := compat.top_saved_tensors_hooks()) is not None:
        compat.pop_saved_tensors_hooks()
        popped.append(top)
    try:
        yield
    finally:
        for pack, unpack in reversed(popped):
            compat.push_saved_tensors_hooks(pack, unpack)


def check_site(instance: GroupInstance, rule: Subgradient | NanSafe, index: int | None = None,
               forward: bool = False) -> Verdict:
    """Whether the second derivative ``rule`` gives at ``instance``'s call is the function's there:
    at the elements its rule site at member ``index`` reaches (None: at all its rule sites), taken
    by reverse mode over the backward, or by forward mode where ``forward``.

    >>> import torch, autograd_groups as ag
    >>> with ag.registry_scope():
    ...     _ = ag.register_rule("root", ag.NanSafe())
    ...     divide = ag.autograd_group("root")(lambda x, y: torch.where(x != 0, y / x, y))
    ...     with ag.trace() as t:
    ...         _ = divide(torch.zeros(1), torch.ones(1, requires_grad=True))
    ...     check_site(t.instances[0], t.instances[0].rules.nan_safe).status
    'consistent'
    """
    own = _second_order(_checked(instance, rule, index, 2, forward), "")
    if own.status != NOT_CHECKED or instance.outer is None:
        return own
    # The group's own inputs cannot decide (a kink whose second derivative diverges, which a smooth
    # function around it may cancel): the function that the transform differentiates can.
    found = _through(instance, rule, index, forward)
    if found is None:
        return own
    row, where = found
    whole = _second_order(row, f"through {where}, ")
    if whole.status != NOT_CHECKED:
        return whole
    return Verdict(NOT_CHECKED, f"{own.detail}; nor through {where}: {whole.detail}")


def _second_order(row: Row | Verdict, through: str) -> Verdict:
    """The verdict of ``ag.verify``'s row at order 2 (``through``: where it was checked, if not at
    the group's own inputs)."""
    if isinstance(row, Verdict):
        return row
    # What the rule changed reaches no input that is differentiated here: no second derivative the
    # caller takes goes through it, so none can be wrong.
    if row.status == CONSISTENT or (row.status == NOT_CHECKED and row.reason == verify.UNREACHED):
        return Verdict(CONSISTENT)
    if row.status == INCONSISTENT:
        return Verdict(INCONSISTENT, f"{through}at {row.input} the rules give {row.rule_value:.6g} where "
                                     f"the automatic Hessian-vector product tends to "
                                     f"{_range(row.low, row.high)} (for a random vector, "
                                     f"ag.verify(order=2))", row.origin)
    return Verdict(NOT_CHECKED, row.reason)


def _through(instance: GroupInstance, rule: Subgradient | NanSafe, index: int | None,
             forward: bool) -> tuple[Row | Verdict, str] | None:
    """``ag.verify``'s row at order 2 for ``rule`` through the function around ``instance`` that a
    transform differentiates, at its arguments, and that function's name and place; None where it
    cannot be run, or where its run does not call the group again at the same line on the same
    inputs (its parameters changed before the call)."""
    if instance.outer is None:
        raise internal_error(f"group instance {instance.id} was checked through a function it has not")
    function, args, kwargs, wanted = instance.outer
    fn = function()
    if fn is None or any(isinstance(v, Batched) for v in (*args, *kwargs.values())):
        return None
    code = fn.__code__
    where = f"the function differentiated, {fn.__qualname__} ({code.co_filename}:{code.co_firstlineno})"
    with unobserved(), lifecycle.apart(), tangents.apart():
        point = point_of(fn, args, kwargs, lambda t: id(t) in wanted)
        if not point.inputs:
            return None
        again = _again(point, instance)
        if again is None:
            return None
        fired = verify.Fired(again, rule, 0, rule.op if isinstance(rule, Subgradient) else "",
                             instance.where, index)
        return verify.check_point(point, [fired], 2, by_id=True, forward=forward)[0], where


def _again(point: Point, instance: GroupInstance) -> GroupInstance | None:
    """The instance of a run of ``point`` that is ``instance`` again: the first of its group, at its
    line, whose call had the same arguments (to the rounding of their dtype)."""
    xs = [x.clone().requires_grad_() for x in point.inputs]
    try:
        with tracer.trace() as session, flag.restored(flag.FlagState(True)), seeded():
            point.run(xs)
    except Exception:  # the user's function: it cannot be re-run, so it is not checked through
        return None
    if instance.call is None:
        raise internal_error(f"group instance {instance.id} was checked without the call that made it")
    for made in session.instances:
        if made.name == instance.name and made.site == instance.site and made.call is not None \
                and _same(made.call[1], instance.call[1]) and _same(tuple(made.call[2].values()),
                                                                    tuple(instance.call[2].values())):
            return made
    return None


def _same(found: tuple[Any, ...], kept: tuple[Any, ...]) -> bool:
    """Whether the tensors of a call ``found`` again in float64 are those ``kept``, to the rounding
    of the kept ones' dtype."""
    if len(found) != len(kept):
        return False
    for a, b in zip(found, kept):
        if isinstance(b, torch.Tensor) and b.is_floating_point():
            if not isinstance(a, torch.Tensor) or a.shape != b.shape:
                return False
            close = torch.finfo(b.dtype).eps ** 0.5
            if not torch.allclose(a.to(torch.float64), b.to(torch.float64), rtol=close, atol=close,
                                  equal_nan=True):
                return False
    return True


def check_first_order(instance: GroupInstance, rule: Subgradient | NanSafe,
                      index: int | None = None) -> Verdict:
    """Whether the gradient ``rule`` gave at ``instance``'s call is wrong where the function is
    smooth: "inconsistent" only there (at a kink, a subgradient is a choice the check does not
    second-guess; where nothing can be compared it is "not checked").

    >>> import torch, autograd_groups as ag
    >>> with ag.registry_scope():
    ...     _ = ag.register_rule("power", ag.NanSafe())
    ...     power = ag.autograd_group("power")(lambda x, y: torch.exp(y * torch.log(x)))
    ...     with ag.trace() as t:
    ...         _ = power(torch.zeros(1, requires_grad=True), torch.ones(1))
    ...     check_first_order(t.instances[0], t.instances[0].rules.nan_safe).status
    'inconsistent'
    """
    row = _checked(instance, rule, index, 1)
    if isinstance(row, Verdict):
        return row
    if row.status == INCONSISTENT and row.point == "smooth":
        return Verdict(INCONSISTENT, f"at {row.input} = {row.input_value:.6g} the rule gives a gradient "
                                     f"of {row.rule_value:.6g} where the function's is "
                                     f"{row.low:.6g} (for a random projection of the group's "
                                     f"outputs, as ag.verify computes it)", row.origin)
    return Verdict(CONSISTENT if row.status == CONSISTENT else NOT_CHECKED, row.reason)


def _checked(instance: GroupInstance, rule: Subgradient | NanSafe, index: int | None,
             order: int, forward: bool = False) -> Row | Verdict:
    """``ag.verify``'s row for ``rule`` at ``instance``'s own call, at ``order``; a verdict where
    there is nothing to check."""
    if instance.call is None:
        raise internal_error(f"group instance {instance.id} was checked without the call that made it")
    wanted = instance.call[3]
    made = second_order.recalled(instance.call)
    if made is None:
        return Verdict(NOT_CHECKED, "the group's function, or a module it was called with, no longer exists")
    fn, args, kwargs = made
    if any(isinstance(v, Batched) for v in (*args, *kwargs.values())):
        return Verdict(NOT_CHECKED, f"the group ran under vmap, on a batch of inputs: check one of "
                                    f"them with ag.verify(fn, *args{', order=2' if order == 2 else ''})")
    with unobserved():
        grouped = autograd_group(instance.name)(fn)
        point = point_of(grouped, args, kwargs, lambda t: id(t) in wanted)
        if not point.inputs:
            return Verdict(NOT_CHECKED, "none of its tensor inputs requires grad")
        if not any(x.numel() for x in point.inputs):
            # A derivative with respect to empty inputs has no element to be wrong.
            return Verdict(CONSISTENT)
        fired = verify.Fired(instance, rule, 0, rule.op if isinstance(rule, Subgradient) else "",
                             instance.where, index)
        recorded = point_of(grouped, args, kwargs, lambda t: id(t) in wanted, dtype=None)
        return verify.check_point(point, [fired], order, by_id=False, forward=forward, recorded=recorded)[0]


def _range(low: float | None, high: float | None) -> str:
    return f"{low:.6g}" if low == high else f"[{low:.6g}, {high:.6g}]"

"""``ag.verify``: check each rule that fired against the math, at the elements where it fired.

A run of the user's code, traced with a :class:`~autograd_groups.observe.recording.Recorder`, tells
which (group, rule, instance) fired, and keeps a copy of each decorator group's call. Each such
instance is checked at a :class:`~autograd_groups.verify.points.Point`: the group's function of its
own inputs; a ``with`` block or a ``tag`` is no function of its own, so its point is ``fn`` of
``fn``'s arguments. At the point, in float64 (:mod:`.points`, :mod:`.limits`):

1. the derivative the rules give, with the elements each rule changed at its rule sites;
2. for each rule, the input-gradient elements it reaches: the backward again with a NaN where the
   rule changed elements, right after its rule site; the elements that turn NaN are the rule's;
3. the automatic derivative, special cases off, at nearby points, its limits, and the comparison.

Where a rule's elements reach no input gradient but the rules made one finite, those elements are
compared; where a rule changes something only in the recorded dtype (a float32 overflow), its
derivative there is compared with float64's (:func:`_in_float64`).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from .. import nodes
from ..errors import GroupError
from ..frames import user_line
from ..groups.group import autograd_group
from ..instance import GroupInstance
from ..observe import counters, tracer
from ..observe.recording import Call, Recorder, recording
from ..rules.kinds import NanSafe, Override, Rule, Subgradient
from ..sites import second_order
from . import limits
from .compiled_check import compiled_row
from .judge import MAX_DIFFERENCES, Judge, Judged
from .origin import nonfinite_origin
from .points import (
    AtPoint,
    Point,
    Probe,
    differentiable,
    generator,
    outputs_of,
    point_of,
    same_values,
    seeded,
)
from .verdict import (
    CONSISTENT,
    DIFFERENCES,
    END_TO_END,
    FLOAT64,
    INCONSISTENT,
    LIMITS,
    NOT_CHECKED,
    Report,
    Row,
)

#: How many instances of each group where a rule fired are checked, by default.
MAX_INSTANCES = 5
#: Why a rule is not checked where nothing it changed reaches a gradient of the differentiated
#: inputs (an input that does not require grad took all of it).
UNREACHED = "the elements it changed reach no input gradient"
#: Why a rule that changed elements on the recorded inputs is not checked where it changes nothing
#: on their float64 copies, and the float64 derivative is no reference (:func:`_in_float64`).
ROUNDING = ("it changed elements on the recorded inputs but none on their float64 copies (a special "
            "point made by float32's rounding or range)")
#: What a row checked where the elements a rule changed reach no input gradient, but the rules
#: made the input gradient finite where the plain composite's is NaN.
STOPPED = ("compared where the rules made the input gradient finite (the plain composite's is NaN "
           "there): an exact zero factor on the way takes what the rule set (0 · x = 0)")


@dataclass
class Fired:
    """A rule that fired in a recorded instance: at how many elements (for an override, how many
    times), at which ops, and where the instance was created; ``site``, the rule site (a member of
    the instance, ``SiteHook.index``) to check it at, or None for all of them."""

    instance: GroupInstance
    rule: Rule
    changed: int
    ops: str
    where: str
    site: int | None = None


def verify(fn: Callable[..., Any], *args: Any, order: int = 1, max_instances: int = MAX_INSTANCES,
           **kwargs: Any) -> Report:
    """Run ``fn(*args, **kwargs)`` and check every rule that fired against the limits of the
    automatic gradient at nearby points, at the elements where it fired (documentation: "Checking rules").

    ``fn`` runs on copies of its tensor arguments; its outputs' gradient, for a fixed random
    projection, is taken with respect to its floating-point tensor arguments and every leaf that
    requires grad, with ``torch.autograd.grad``: no ``.grad`` is changed, nor ``ag.stats()``. Each
    decorator group and built-in is checked on its own inputs, ``with`` blocks and ``tag`` through
    ``fn``, in the first ``max_instances`` instances of each group where a rule fired; ``order=2``
    checks Hessian-vector products. ``order`` and ``max_instances`` are ``ag.verify``'s own: pass an
    ``fn`` argument of those names through a ``functools.partial``.

    >>> import torch, autograd_groups as ag
    >>> @ag.autograd_group("length")
    ... def length(v):
    ...     return v.pow(2).sum().sqrt()
    >>> with ag.registry_scope():
    ...     _ = ag.register_rule("length", ag.Subgradient(op="sqrt", when="result == 0", grad=0))
    ...     report = ag.verify(length, torch.zeros(3))
    >>> report.ok, [(row.status, row.point) for row in report.rows]
    (True, [('consistent', 'kink')])
    """
    _check_options(order, max_instances)
    with counters.kept():
        return _verify(fn, args, kwargs, order, max_instances)


def _verify(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], order: int,
            max_instances: int) -> Report:
    recorder = Recorder(copies=max_instances)
    copied_args = tuple(differentiable(a) for a in args)
    copied_kwargs = {k: differentiable(v) for k, v in kwargs.items()}
    with tracer.trace() as session, recording(recorder):
        with seeded():
            outputs = outputs_of(fn(*copied_args, **copied_kwargs))
        if not outputs:
            raise GroupError(f"ag.verify: {_name(fn)} returned no floating-point tensor that requires "
                             f"grad, so there is no gradient to check: return the loss, or the "
                             f"outputs whose gradient the rules change")
        weights = generator()
        projected = sum(((o * torch.randn(o.shape, generator=weights, dtype=torch.float64).to(o)).sum()
                         for o in outputs), torch.zeros(()))
        copies = [v for v in [*copied_args, *copied_kwargs.values()]
                  if isinstance(v, torch.Tensor) and v.requires_grad]
        wrt = list({id(t): t for t in [*_leaves(outputs), *copies]}.values())
        try:
            with second_order.untold():  # the report says what the rule sites' own checks would
                torch.autograd.grad(projected, wrt, allow_unused=True)
        except RuntimeError as e:
            raise GroupError(f"ag.verify: the backward of {_name(fn)}'s outputs failed ({e}): fn must "
                             f"return its outputs without calling backward() on them") from e
    point = point_of(fn, args, kwargs, lambda t: True)
    whole: Point | str = point
    if not point.inputs:
        whole = (f"a `with` block or tag() is checked through the function given to ag.verify, and "
                 f"{_name(fn)} has no floating-point tensor argument to differentiate: pass the "
                 f"tensors it reads as arguments")
    try:
        return check(session.instances, recorder, order, max_instances, whole, user_line())
    finally:
        recorder.close()


#: Told, before each check, how many checks are done, how many there are, and what is checked next.
Progress = Callable[[int, int, str], None]


def check(instances: Sequence[GroupInstance], recorder: Recorder, order: int, max_instances: int,
          whole: Point | str, called_at: str | None = None, progress: Progress | None = None) -> Report:
    """The report on the traced ``instances`` of a run that ``recorder`` recorded. ``whole`` is the
    point that checks ``with`` and ``tag`` groups, or why they cannot be checked; ``called_at`` is
    where an instance that ``ag.verify`` itself created (``fn`` is a group) was created;
    ``progress``, if given, is called before each check (a group instance, or ``fn`` as a whole)."""
    _check_options(order, max_instances)
    with second_order.untold():
        return _check(instances, recorder, order, max_instances, whole, called_at,
                      progress or (lambda done, total, what: None))


def _check(instances: Sequence[GroupInstance], recorder: Recorder, order: int, max_instances: int,
           whole: Point | str, called_at: str | None, progress: Progress) -> Report:
    rows: list[Row] = []
    through_whole: list[Fired] = []
    end_to_end: list[tuple[Fired, Row]] = []
    own_calls: list[tuple[GroupInstance, list[Fired], Call]] = []
    for name, group in _by_group(instances).items():
        rules = {rule.label: rule for instance in group for rule in instance.rules.rules}
        fired_per_rule = dict.fromkeys(rules, 0)
        for instance in group:
            fired = []
            for f in _fired(instance, called_at):
                fired_per_rule[f.rule.label] += 1
                if fired_per_rule[f.rule.label] <= max_instances:
                    fired.append(f)
            call = recorder.call(instance)
            if not fired:
                continue
            if call is not None:
                own_calls.append((instance, fired, call))
            elif id(instance) in recorder.batched:
                rows += [_row(f, order, NOT_CHECKED, "it ran under vmap, on a batch of inputs: check "
                                                     "one entry with ag.verify(fn, *args)") for f in fired]
            elif recorder.decorated(instance):
                rows += [_row(f, order, NOT_CHECKED, "its call was not recorded") for f in fired]
            else:
                through_whole += fired
        where = _created(group[0], called_at)
        for label, rule in rules.items():
            count = fired_per_rule[label]
            if count == 0:
                rows.append(_summary(name, where, rule, order, f"no rule fired in its {len(group)} "
                                                               f"instance(s)"))
            elif count > max_instances:
                rows.append(_summary(name, where, rule, order, f"{count - max_instances} more "
                                     f"instance(s) where it fired (max_instances={max_instances})"))
    at_whole = not isinstance(whole, str)
    total = len(own_calls) + (at_whole and bool(through_whole)) + (at_whole and bool(own_calls))
    for done, (instance, fired, call) in enumerate(own_calls):
        progress(done, total, instance.id)
        grouped = autograd_group(call.group)(call.fn)
        point = point_of(grouped, call.args, call.kwargs, lambda t: t.requires_grad)
        recorded = point_of(grouped, call.args, call.kwargs, lambda t: t.requires_grad, dtype=None)
        own = check_point(point, fired, order, by_id=False, recorded=recorded) if point.inputs else [
            _row(f, order, NOT_CHECKED, "none of its tensor inputs requires grad") for f in fired]
        rows += own
        end_to_end += [(f, row) for f, row in zip(fired, own)]
        if call.compile is not None:
            rows.append(compiled_row(call, instance.id, fired[0].where, order))
    if isinstance(whole, str):
        rows += [_row(f, order, NOT_CHECKED, whole) for f in through_whole]
    elif through_whole:
        progress(len(own_calls), total, "the function given to ag.verify")
        rows += check_point(whole, through_whole, order, by_id=True)
    if not isinstance(whole, str) and end_to_end:
        progress(total - 1, total, "the decorator groups' rules end to end")
        rows += _end_to_end(whole, end_to_end, order)
    rows.sort(key=lambda row: (row.group, row.instance == "", _number(row.instance), row.rule, row.scope))
    return Report(rows, order)


def _end_to_end(whole: Point, checked: list[tuple[Fired, Row]], order: int) -> list[Row]:
    """The rules of decorator groups checked on their own inputs, checked again through the whole
    ``fn``: a function that is smooth of a kink (a kernel of a distance) can be wrong where the
    group alone has no limit to compare with. A row is kept where it was checked and says what the
    group's own does not (its status differs)."""
    rows = check_point(whole, [f for f, _ in checked], order, by_id=True)
    return [dataclasses.replace(row, scope=END_TO_END) for row, (_, own) in zip(rows, checked)
            if row.status not in (NOT_CHECKED, own.status)]


def _check_options(order: int, max_instances: int) -> None:
    if isinstance(order, bool) or order not in (1, 2):
        raise GroupError(f"ag.verify: order must be 1 (gradients) or 2 (Hessian-vector products), "
                         f"not {order!r}")
    if isinstance(max_instances, bool) or not isinstance(max_instances, int) or max_instances < 1:
        raise GroupError(f"ag.verify: max_instances must be a positive int, not {max_instances!r}")


def _name(fn: Callable[..., Any]) -> str:
    return getattr(fn, "__qualname__", None) or repr(fn)


def _leaves(outputs: list[torch.Tensor]) -> list[torch.Tensor]:
    """The leaf tensors that require grad behind ``outputs``."""
    accumulators = [node for node in nodes.reachable(o.grad_fn for o in outputs)
                    if type(node) is nodes.ACCUMULATE_GRAD]
    return [leaf for leaf in map(tracer.leaf_tensor, accumulators) if leaf is not None]


def _by_group(instances: Sequence[GroupInstance]) -> dict[str, list[GroupInstance]]:
    groups: dict[str, list[GroupInstance]] = {}
    for instance in instances:
        groups.setdefault(instance.name, []).append(instance)
    for group in groups.values():
        group.sort(key=lambda i: _number(i.id))
    return dict(sorted(groups.items()))


def _number(instance_id: str) -> int:
    found = re.search(r"#(\d+)$", instance_id)
    return int(found.group(1)) if found else 0


def _created(instance: GroupInstance, called_at: str | None) -> str:
    """Where ``instance`` was created: ``called_at`` for one that ag.verify's own call made."""
    return called_at if called_at and instance.where.startswith(__file__ + ":") else instance.where


def _fired(instance: GroupInstance, called_at: str | None) -> list[Fired]:
    where = _created(instance, called_at)
    return [Fired(instance, rule, instance.hits[rule.label], _ops(instance, rule), where)
            for rule in instance.rules.rules if instance.hits.get(rule.label)]


def _ops(instance: GroupInstance, rule: Rule) -> str:
    if isinstance(rule, Subgradient):
        return rule.op
    if isinstance(rule, Override):
        return ""
    ops = {attrs["op"] for _, attrs in instance.graph.nodes(data=True) if attrs["hits"].get(rule.label)}
    return ", ".join(sorted(ops))


def _row(fired: Fired, order: int, status: str, reason: str = "", **numbers: Any) -> Row:
    instance, rule = fired.instance, fired.rule
    return Row(group=instance.name, instance=instance.id, where=fired.where, rule=rule.label,
               kind=rule.kind, op=fired.ops, order=order, status=status, reason=reason,
               changed=fired.changed, **numbers)


def _summary(name: str, where: str, rule: Rule, order: int, reason: str) -> Row:
    return Row(group=name, instance="", where=where, rule=rule.label, kind=rule.kind,
               op=rule.op if isinstance(rule, Subgradient) else "", order=order, status=NOT_CHECKED,
               reason=reason)


def check_point(point: Point, fired: list[Fired], order: int, by_id: bool,
                forward: bool = False, recorded: Point | None = None) -> list[Row]:
    """Rows for ``fired`` at ``point``: the recorded instances are found again in the point's run
    as its first instance (a decorator group's own call), or ``by_id`` (``fn`` as a whole).
    ``forward``: the rules' Hessian-vector product is taken by forward mode over the backward.
    ``recorded``: the point in the dtypes it was recorded in, for a rule that changes nothing in
    float64 (:func:`_in_float64`)."""
    probe = Probe(point, order, forward)
    try:
        at = probe.at_point()
    except Exception as e:  # the user's function: whatever it raises, the report says so
        return [_row(f, order, NOT_CHECKED, f"running it on float64 copies of its inputs raised {e!r}")
                for f in fired]
    try:
        samples = probe.nearby()
        if samples is None:
            return [_row(f, order, NOT_CHECKED, f"it raised at every nearby point: {probe.error!r}")
                    for f in fired]
        return _rows(point, fired, order, by_id, at, Judge(probe, samples), recorded)
    finally:
        at.recorder.release()


def _rows(point: Point, fired: list[Fired], order: int, by_id: bool, at: AtPoint,
          judge: Judge, recorded: Point | None) -> list[Row]:
    rows = []
    for f in fired:
        again = at.instances.get(f.instance.id) if by_id else at.first
        if again is None or again.name != f.instance.name:
            rows.append(_row(f, order, NOT_CHECKED, "its run on float64 copies made no such instance"))
            continue
        reached = _reached(f, again, at)
        if reached is None:
            # Compared with float64 only as _in_float64 does (a NaN-safe rule, the same outputs in
            # both dtypes): elsewhere the rule's condition does not hold in float64, and a rule that
            # is right where it holds (a length that underflows to 0) would be called wrong.
            found = _in_float64(f, order, point, recorded, at.value) if recorded is not None else None
            rows.append(found or _row(f, order, NOT_CHECKED, ROUNDING))
        elif not bool(reached.any()):
            rows.append(_unreached(f, order, point, at, judge, recorded))
        else:
            rows.append(_verdict(f, order, point, at, judge.compare(at.value, reached), reached,
                                     judge.probe))
    return rows


def _unreached(f: Fired, order: int, point: Point, at: AtPoint, judge: Judge,
               recorded: Point | None) -> Row:
    """The row of a rule none of whose changed elements reaches an input gradient at ``point``."""
    if bool(at.nan.any()):
        return _row(f, order, NOT_CHECKED, f"{UNREACHED} that is not NaN with the rules on (NaN e.g. "
                                           f"at {point.element(int(at.nan.nonzero()[0, 0]))[0]})")
    stopped = at.changed > 0
    if bool(stopped.any()):
        # The rules stopped the plain composite's NaN where it was made, and no value they set there
        # matters (a zero factor on the way takes it): what they changed is the input gradient
        # where that NaN went, and that is what is compared.
        row = _verdict(f, order, point, at, judge.compare(at.value, stopped), stopped, judge.probe)
        return dataclasses.replace(row, reason="; ".join(filter(None, [row.reason, STOPPED])))
    found = _in_float64(f, order, point, recorded, at.value) if recorded is not None else None
    return found or _row(f, order, NOT_CHECKED, ROUNDING if point.narrow else UNREACHED)


def _in_float64(f: Fired, order: int, point: Point, recorded: Point, value: torch.Tensor) -> Row | None:
    """The row of a NaN-safe rule that changes nothing at ``point`` (float64), checked at the
    ``recorded`` point in its own narrower dtypes, where the plain composite's derivative is not
    finite (an ``exp`` that overflows float32 only, in the branch a ``where`` does not take): there
    the rules' derivative
    must equal float64's ``value``, to the narrow dtype's precision (the square root of its
    machine epsilon, relative to the largest finite derivative element). None where there is nothing to
    compare: another rule than NaN-safe (its condition is the user's), float64 inputs, outputs
    that differ from float64's (:func:`~.points.same_values`: there the recorded point is another
    point, and a rule right for it would be called wrong), a run that raised, no element the rules
    changed, or a float64 derivative that is not finite there either."""
    narrow = [x.dtype for x in recorded.inputs if x.dtype != torch.float64]
    if not isinstance(f.rule, NanSafe) or not narrow:
        return None
    try:
        if not same_values(point, recorded):
            return None
    except Exception:  # the user's function, in its own dtypes: the row says it was not checked
        return None
    probe = Probe(recorded, order)
    try:
        at = probe.at_point()
    except Exception:  # the user's function, in its own dtypes: the row says it was not checked
        return None
    at.recorder.release()
    fixed = at.changed > 0
    if not bool(fixed.any()) or not bool(torch.isfinite(value[fixed]).all()):
        return None
    eps = max(torch.finfo(d).eps for d in narrow)
    # Over the finite elements: an infinite slope elsewhere (a sqrt at 0) must not make any value pass.
    scale = max(1.0, float(value[torch.isfinite(value)].abs().max()))
    excess = (at.value.to(torch.float64) - value).abs()
    tolerance = math.sqrt(eps) * scale
    k = int(torch.where(fixed, excess.nan_to_num(nan=math.inf), -1.0).argmax())
    status = CONSISTENT if float(excess[k]) <= tolerance else INCONSISTENT
    name, index, input_value = recorded.element(k)
    return _row(f, order, status, point="smooth", checked=int(fixed.sum()), difference=float(excess[k]),
                tolerance=tolerance, rule_value=float(at.value[k]), low=float(value[k]),
                high=float(value[k]), input=name, index=index, input_value=input_value,
                reference=FLOAT64)


def _reached(f: Fired, instance: GroupInstance, at: AtPoint) -> torch.Tensor | None:
    """The input-gradient elements ``f``'s rule reaches in ``instance`` of the point's run, from
    ``f.site``; None if it did not fire there."""
    rule = f.rule
    if isinstance(rule, Override):  # the whole gradient is the replacement's, NaN included
        return torch.ones_like(at.nan) if instance.hits.get(rule.label) else None
    runs = at.recorder.runs.get((id(instance), rule.label))
    if runs and f.site is not None:
        # A run that walked the group otherwise (other members) is checked at all its sites.
        runs = [r for r in runs if r.index == f.site] or runs
    # A NaN elsewhere in the rules' gradient hides whether the rule's elements reach it.
    return at.reach(runs) & ~at.nan if runs else None


def _verdict(f: Fired, order: int, point: Point, at: AtPoint, judged: Judged, reached: torch.Tensor,
             probe: Probe) -> Row:
    compared = judged.compared
    checked = int(compared.checked.sum())
    unchecked = int(reached.sum()) - checked
    inconsistent = bool(compared.inconsistent.any())
    status = INCONSISTENT if inconsistent else NOT_CHECKED if unchecked else CONSISTENT
    reason = ""
    if not inconsistent and unchecked:
        derivative = f"automatic {'gradient' if order == 1 else 'Hessian-vector product'}"
        k, what = next((int(mask.nonzero()[0, 0]), what) for mask, what in (
            (judged.untried, f"the {derivative} has no finite limit there, and finite differences of "
                             f"the function's value are taken at {MAX_DIFFERENCES} elements at most"),
            (judged.blurred, f"the {derivative} has no limit there along some direction, and finite "
                             f"differences of the function's value are lost in its rounding (an "
                             f"output far larger than its change)"),
            (compared.no_limit, f"the {derivative} has no limit there along some direction"
                                + (", nor do finite differences of the function's value"
                                   if order == 1 else "")),
            (compared.unbounded, f"the {derivative} grows without bound there (towards one side "
                                 f"only, or the rules give inf - inf of its infinite terms, NaN)"),
            (compared.special, f"along every pair of opposite directions, a nearby point is itself "
                               f"special (a rule fires there too), and the {derivative} has no "
                               f"limit without it"),
            (compared.outside & probe.plain_nonfinite,
             f"the function is finite nearby, but the plain composite's {derivative} is not"
             + (", and finite differences of its value along its coordinate leave its domain"
                if order == 1 else " (the rules' own is what order=2 compares with there)")),
            (compared.outside, "every direction leaves the function's domain there"
                               + (", and so do finite differences along its coordinate"
                                  if order == 1 else ""))) if bool(mask.any()))
        reason = (f"{unchecked} of the {unchecked + checked} elements it reaches cannot be checked, "
                  f"e.g. {point.element(k)[0]}: {what}"
                  + (f"; it is consistent at the other {checked}" if checked else ""))
    notes = []
    own = compared.checked & probe.own if probe.own.numel() else None
    if own is not None and bool(own.any()):
        notes.append(f"{int(own.sum())} element(s) checked against the rules' own derivative nearby, "
                     f"where the plain composite's is not finite")
    differences = int(judged.differences.sum())
    if differences:
        notes.append(f"{differences} element(s) checked against finite differences of the function's "
                     f"value, where the automatic gradient has no finite limit")
    reason = "; ".join([reason, *notes] if reason else notes)
    if not checked:
        return _row(f, order, status, reason)
    k = _worst(compared, at.changed)
    name, index, value = point.element(k)
    rule_value = float(at.value[k])
    origin = _origin(f, order, point) if status != CONSISTENT and not math.isfinite(rule_value) else ""
    return _row(f, order, status, reason, point=compared.kind, checked=checked,
                difference=float(compared.excess[k]), tolerance=float(compared.tolerance[k]),
                rule_value=rule_value, low=float(compared.low[k]), high=float(compared.high[k]),
                input=name, index=index, input_value=value, differences=differences, origin=origin,
                reference=DIFFERENCES if bool(judged.differences[k]) else LIMITS)


def _origin(f: Fired, order: int, point: Point) -> str:
    """Why the rules' derivative is not finite at ``point``: the op that made it so, and whether
    that op is the rule's own."""
    try:
        found = nonfinite_origin(point, order)
    except Exception:  # the user's function, run again: the row says what it found without this
        return ""
    if found is None:
        return ""
    op, place = found
    if isinstance(f.rule, Subgradient) and op == f.rule.op:
        return f"the non-finite value is made by {place}, at the rule's op"
    derivative = "second derivative" if order == 2 else "derivative"
    return (f"the non-finite value is made by {place}, an op the rule does not change, not by the "
            f"rule: write that op so that its {derivative} is finite there (or give the group an "
            f"override whose backward is)")


def _worst(compared: limits.Comparison, changed: torch.Tensor) -> int:
    """The element to show: the inconsistent one furthest outside the limits' range, for its
    tolerance; where none is, the one where the rules changed the derivative most."""
    if bool(compared.inconsistent.any()):
        ratio = (compared.excess / compared.tolerance).nan_to_num(nan=torch.inf)
        return int(torch.where(compared.inconsistent, ratio, -1.0).argmax())
    return int(torch.where(compared.checked, changed, -1.0).argmax())

"""A wrong rule at a smooth point, flagged at first order: when a user's subgradient or NaN-safe
rule fires in the first backward pass through a call site (the line that called the group), the
rule is checked there, as ``ag.verify`` checks it, and a
:class:`~autograd_groups.errors.FirstOrderWarning` is given if, and only if, the gradient it gave
is not the function's where the function is smooth.

What it costs: in the first backward pass that reaches a user's decorator group at a call site, each
of its rule sites reads whether its rules fired (one reduction of a mask, on the CPU); where one
did, the check (verify's, a few dozen runs of the group on float64 copies of its inputs) runs, once
per call site and rule. Later passes at that call site read nothing, so a rule that first fires in
a later pass is not checked there (``ag.verify`` checks it). It does not run for the built-ins
(``ag.ops``), ``with`` blocks and ``tag`` (no function to run again), nor where reading the mask
would make the host wait or cannot be done: on an accelerator, under ``torch.compile``, compiled
autograd and ``torch.func`` transforms. :func:`set_enabled` switches it off.

The check lives in ``verify/`` and is installed here with :func:`set_checker`, as the second-order
one is (sites/second_order.py).
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable
from typing import Any

import torch

from .. import compat, host_reads
from ..errors import FirstOrderWarning, internal_error
from ..instance import GroupInstance
from ..rules.kinds import NanSafe, Subgradient
from . import second_order
from .second_order import Verdict

#: ``(instance, rule, index) -> Verdict``: the check (verify/site_check.py), once installed.
Checker = Callable[[GroupInstance, Any, "int | None"], Verdict]
_checker: Checker | None = None
_enabled = True
_lock = threading.Lock()
#: Per group, call site and rule (by identity: a rule registered again is checked again), the rule
#: (which keeps its id from being reused) and the verdict, once the rule has fired there.
_verdicts: dict[tuple[str, tuple[str, int], int], tuple[Any, Verdict]] = {}
#: Per (group, call site), the backward pass (graph task) that first reached it, whose rule sites
#: look at what their rules changed.
_looked: dict[tuple[str, tuple[str, int]], int] = {}
#: The (group, call site) pairs past their first backward pass, or built-ins: nothing is read there.
_done: set[tuple[str, tuple[str, int]]] = set()
#: How many checks ran, for the tests and the benchmark that measure what they cost.
runs: int = 0


def set_checker(checker: Checker) -> None:
    """Install the check that a rule's first firing at a call site runs."""
    global _checker
    _checker = checker


def set_enabled(enabled: bool) -> None:
    """Switch the first-order check of users' rules on (the default) or off, process-wide.

    >>> set_enabled(False); is_enabled()
    False
    >>> set_enabled(True); is_enabled()
    True
    """
    global _enabled
    _enabled = bool(enabled)


def is_enabled() -> bool:
    """Whether the first-order check of users' rules is on."""
    return _enabled


def wanted(instance: GroupInstance) -> bool:
    """Whether a rule site of ``instance`` should look at what its rules changed: in the first
    backward pass that reaches a user's decorator group at its call site (every rule site of that
    pass), with the check and host reads on, outside ``ag.verify`` and the checks. Later passes at
    that call site read nothing: one lookup."""
    if not (_enabled and instance.call is not None and host_reads.enabled()) or second_order.quiet():
        return False
    key = (instance.name, instance.site)
    if key in _done:
        return False
    task = compat.current_graph_task_id()
    if _looked.setdefault(key, task) != task:
        with _lock:
            _done.add(key)
        return False
    return not _builtin(instance)


def _builtin(instance: GroupInstance) -> bool:
    if instance.call is None:
        raise internal_error(f"group instance {instance.id} was checked without the call that made it")
    module = getattr(instance.call[0](), "__module__", "") or ""
    if module.startswith("autograd_groups."):
        with _lock:
            _done.add((instance.name, instance.site))
        return True
    return False


def tell(instance: GroupInstance, op: str, rule: Subgradient | NanSafe, masks: list[torch.Tensor],
         index: int | None) -> None:
    """``rule`` ran at op ``op`` (member ``index``) of ``instance`` and changed the elements
    ``masks``: the first time it changed any at this call site, check it there and warn where it is
    wrong at a smooth point."""
    key = (instance.name, instance.site, id(rule))
    if key in _verdicts:
        return
    if not all(isinstance(m, torch.Tensor) and host_reads.allowed(m) for m in masks):
        return
    if not any(bool(m.any()) for m in masks):
        return
    verdict = _check(instance, rule, index)
    with _lock:
        _verdicts[key] = (rule, verdict)
    if verdict.status != "inconsistent":
        return
    file, line = instance.site
    warnings.warn_explicit(_message(instance, op, rule, verdict), FirstOrderWarning, file, line or 1,
                           registry=second_order.registry(file))


def _check(instance: GroupInstance, rule: Subgradient | NanSafe, index: int | None) -> Verdict:
    global runs
    if _checker is None:
        return Verdict("not checked", "ag.verify's check is not installed (import autograd_groups)")
    runs += 1
    with second_order.untold():
        try:
            return _checker(instance, rule, index)
        except Exception as e:  # the user's function, re-run: a failed check is no finding
            return Verdict("not checked", f"running the group again raised {e!r}")


def _message(instance: GroupInstance, op: str, rule: Subgradient | NanSafe, verdict: Verdict) -> str:
    return (f"rule {rule.label} of group {instance.name!r}, at op {op}, gave a gradient that is not "
            f"the function's, which is smooth there (group created at {instance.where}): "
            f"{verdict.detail}. A special case belongs where the automatic gradient fails; here the "
            f"function has a gradient the rule does not give: give group {instance.name!r} an "
            f"override whose backward gives it (documentation: 'Groups and rules'), or write the "
            f"function so that it is smooth there without a rule (a series near the point), and check "
            f"it with ag.verify(fn, *args). ag.set_rule_checks(False) turns this check off")

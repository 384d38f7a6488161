"""The registry: group name -> ordered rules, thread-safe, copy-on-write."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from .. import nodes
from ..errors import RuleError
from .kinds import NanSafe, Override, OverrideContext, Rule, Subgradient


@dataclass(frozen=True)
class RuleSet:
    """A group's rules in the form backward dispatch uses: an immutable snapshot."""

    rules: tuple[Rule, ...] = ()
    subgradients: dict[str, tuple[Subgradient, ...]] = field(default_factory=dict)
    nan_safe: NanSafe | None = None
    override: Override | None = None
    reads_saved: bool = False
    _by_class: dict[type, tuple[Subgradient, ...]] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def of(cls, rules: tuple[Rule, ...]) -> RuleSet:
        subgradients: dict[str, tuple[Subgradient, ...]] = {}
        for r in rules:
            if isinstance(r, Subgradient):
                subgradients[r.op_key] = subgradients.get(r.op_key, ()) + (r,)
        return cls(rules, subgradients,
                   next((r for r in rules if isinstance(r, NanSafe)), None),
                   next((r for r in rules if isinstance(r, Override)), None),
                   any(r.saved for r in rules if isinstance(r, Subgradient)))

    def __bool__(self) -> bool:
        return bool(self.rules)

    def at(self, node: object) -> tuple[Subgradient, ...]:
        """The subgradient rules for the op of ``node``, looked up once per node class."""
        found = self._by_class.get(type(node))
        if found is None:
            found = self._by_class[type(node)] = self.subgradients.get(nodes.node_key(node), ())
        return found


EMPTY = RuleSet()
_lock = threading.Lock()
_rules: dict[str, tuple[Rule, ...]] = {}
_sets: dict[str, RuleSet] = {}
# Bumped by every change: torch.compile guards on it, so a compiled group sees today's rules.
_generation = 0


def generation() -> int:
    """A number that changes whenever any group's rules change.

    >>> import autograd_groups as ag
    >>> before = generation()
    >>> with ag.registry_scope():
    ...     _ = ag.register_rule("tmp", ag.NanSafe())
    >>> generation() > before
    True
    """
    return _generation


def _changed() -> None:
    """Called with ``_lock`` held after every change of ``_rules``."""
    global _generation
    _generation += 1
    _sets.clear()


def _conflict(group: str, old: Rule, new: Rule) -> str | None:
    if old is new:
        return "is already registered"
    if isinstance(old, Override) and isinstance(new, Override):
        return f"conflicts with {old.label}: a group has at most one override"
    if isinstance(old, NanSafe) and isinstance(new, NanSafe):
        return "conflicts with the nan_safe rule already registered"
    if (isinstance(old, Subgradient) and isinstance(new, Subgradient) and old.op_key == new.op_key
            and str(old.when) == str(new.when)
            and (old.input is None or new.input is None or old.input == new.input)):
        return f"conflicts with {old.label}: same op, same condition, same input"
    return None


def register_rule(group: str, rule: Rule) -> Rule:
    """Register ``rule`` under ``group``; rules of one group apply in registration order.

    >>> import autograd_groups as ag
    >>> with ag.registry_scope():
    ...     _ = ag.register_rule("cdist", ag.Subgradient(op="sqrt", when="result == 0", grad=0))
    ...     [r.label for r in ag.list_rules()["cdist"]]
    ['subgradient(sqrt: result == 0 -> 0)']
    """
    if not isinstance(group, str) or not group:
        raise RuleError(f"a group name must be a non-empty string, not {group!r}")
    if not isinstance(rule, (Subgradient, NanSafe, Override)):
        raise RuleError(f"group {group!r}: {rule!r} is not a rule (Subgradient, NanSafe or Override)")
    if isinstance(rule, Override) and rule.backward_fn is None:
        raise RuleError(f"group {group!r}: {rule.label} has no backward; attach one with "
                        f"@{getattr(rule.check, '__name__', 'check')}.backward")
    with _lock:
        existing = _rules.get(group, ())
        for old in existing:
            problem = _conflict(group, old, rule)
            if problem:
                raise RuleError(f"group {group!r}: {rule.label} {problem}")
        _rules[group] = existing + (rule,)
        _changed()
    return rule


def unregister_rule(group: str, rule: Rule) -> None:
    """Remove ``rule`` from ``group``."""
    with _lock:
        remaining = tuple(r for r in _rules.get(group, ()) if r is not rule)
        if len(remaining) == len(_rules.get(group, ())):
            raise RuleError(f"group {group!r} has no rule {rule.label}")
        if remaining:
            _rules[group] = remaining
        else:
            del _rules[group]
        _changed()


def list_rules() -> dict[str, tuple[Rule, ...]]:
    """Every registered group and its rules, in registration order.

    >>> import autograd_groups as ag
    >>> isinstance(ag.list_rules(), dict)
    True
    """
    with _lock:
        return dict(_rules)


def has_rules(group: str) -> bool:
    """Whether ``group`` has rules. Read without the lock: torch.compile traces it."""
    return bool(_rules.get(group))


def breaks_graph(group: str) -> bool:
    """Whether ``group`` has an override whose check a compiled graph cannot trace, so that the
    group must run eagerly under torch.compile. Read without the lock: torch.compile traces it."""
    return any(isinstance(r, Override) and not r.traceable for r in _rules.get(group, ()))


def ruleset(group: str) -> RuleSet:
    """The current rules of ``group`` as an immutable :class:`RuleSet`."""
    found = _sets.get(group)
    if found is None:
        with _lock:
            found = _sets[group] = RuleSet.of(_rules[group]) if group in _rules else EMPTY
    return found


@contextlib.contextmanager
def registry_scope() -> Iterator[None]:
    """Undo every registration made inside the block (for tests and notebooks).

    >>> import autograd_groups as ag
    >>> with ag.registry_scope():
    ...     _ = ag.register_rule("tmp", ag.NanSafe())
    >>> "tmp" in ag.list_rules()
    False
    """
    with _lock:
        saved = dict(_rules)
    try:
        yield
    finally:
        with _lock:
            _rules.clear()
            _rules.update(saved)
            _changed()


class _SpecialCase(Override):
    """An override made by :func:`special_case`: registered under its group once it has a backward."""

    def __init__(self, check: Callable[[OverrideContext], Any], group: str) -> None:
        super().__init__(check)
        self.group = group

    def backward(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """Decorator: set the replacement backward and register the rule under its group."""
        super().backward(fn)
        register_rule(self.group, self)
        return fn


def special_case(group: str) -> Callable[[Callable[[OverrideContext], Any]], Override]:
    """Decorator that makes an override rule of ``group`` from its checker.

    Attach the replacement backward with ``@checker.backward``; the rule is registered then.

    >>> import torch, autograd_groups as ag
    >>> with ag.registry_scope():
    ...     @ag.special_case("safe_norm")
    ...     def is_zero(ctx):
    ...         return bool((ctx.outputs[0] == 0).any())
    ...     @is_zero.backward
    ...     def zero_grad(ctx, grad):
    ...         return torch.zeros_like(ctx.inputs[0])
    ...     [r.kind for r in ag.list_rules()["safe_norm"]]
    ['override']
    """

    def make(check: Callable[[OverrideContext], Any]) -> Override:
        return _SpecialCase(check, group)

    return make

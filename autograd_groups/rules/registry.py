"""The registry: group name -> ordered rules, thread-safe, copy-on-write.

Rules are compared by meaning (:func:`same_rule`): registering a rule the group already has is a
no-op, so a notebook cell can run again; a different rule at the same place is an error naming
both, unless ``replace=True`` swaps them.
"""

from __future__ import annotations

import contextlib
import difflib
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

from .. import nodes
from ..errors import InertRuleWarning, RuleError
from ..frames import user_line, warn
from .kinds import NanSafe, Override, OverrideContext, Rule, Subgradient

R = TypeVar("R", bound=Rule)


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
        return len(self.rules) > 0  # not bool(): Dynamo 2.11 cannot trace bool() of a tuple

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
# Where each rule was registered (file:line), for the message of a conflict.
_origins: weakref.WeakKeyDictionary[Rule, str] = weakref.WeakKeyDictionary()
# Group names used by autograd_group() or tag(), with or without rules.
_declared: set[str] = set()
# What each open registry_scope restores when it closes (see keep()).
_open_scopes: list[dict[str, tuple[Rule, ...]]] = []
# Group names already warned about rules under a close name (note_unruled).
_told: set[str] = set()
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


def same_rule(a: Rule, b: Rule) -> bool:
    """Whether two rules mean the same: subgradients with the same op, input, doc and, spelling
    aside, the same ``when`` and ``grad`` (callables are the same only if they are the same object);
    overrides with the same check, backward and doc; nan_safe rules with the same doc.

    >>> same_rule(Subgradient(op="sqrt", when="result == 0", grad=0),
    ...           Subgradient(op="sqrt", when="(0 == result)", grad=0.0))
    True
    """
    if isinstance(a, Subgradient) and isinstance(b, Subgradient):
        return a.key == b.key and a.doc == b.doc
    if isinstance(a, Override) and isinstance(b, Override):
        return a.check is b.check and a.backward_fn is b.backward_fn and a.doc == b.doc
    return isinstance(a, NanSafe) and isinstance(b, NanSafe) and a.doc == b.doc


def conflict(old: Rule, new: Rule) -> str | None:
    """Why ``new`` cannot sit beside ``old`` in one group, or None: two overrides, two nan_safe
    rules, or two subgradients for the same op, condition and input that are not the same rule."""
    if same_rule(old, new):
        return None
    if isinstance(old, Override) and isinstance(new, Override):
        return "a group has at most one override"
    if isinstance(old, NanSafe) and isinstance(new, NanSafe):
        return "a group has one nan_safe rule"
    if (isinstance(old, Subgradient) and isinstance(new, Subgradient) and old.key[:2] == new.key[:2]
            and (old.input is None or new.input is None or old.input == new.input)):
        differs = [what for what, differ in (("grad", old.key[2] != new.key[2]),
                                              ("input", old.input != new.input),
                                              ("doc", old.doc != new.doc)) if differ]
        return f"same op and condition, but a different {' and '.join(differs)}"
    return None


def _origin(rule: Rule) -> str:
    return _origins.get(rule, "an unknown place")


def _clash(group: str, old: Rule, new: Rule, where: str, problem: str) -> RuleError:
    return RuleError(
        f"group {group!r}: {new.label} (from {where}) conflicts with {old.label} (registered at "
        f"{_origin(old)}): {problem}. To swap them, pass replace=True (to register_rule, special_case or "
        f"load_spec); to keep both, give them different conditions")


def _add(group: str, rule: R, replace: bool, where: str) -> R:
    """Add ``rule`` to ``group`` with ``_lock`` held; return the rule now registered."""
    existing = _rules.get(group, ())
    found = next((old for old in existing if same_rule(old, rule)), None)
    if found is not None:
        return cast(R, found)  # same_rule holds only between rules of one class
    clashes = [k for k, old in enumerate(existing) if conflict(old, rule)]
    if clashes and not replace:
        old = existing[clashes[0]]
        raise _clash(group, old, rule, where, conflict(old, rule) or "")
    kept = [r for k, r in enumerate(existing) if k not in clashes]
    kept.insert(clashes[0] if clashes else len(kept), rule)
    _rules[group] = tuple(kept)
    _origins[rule] = where
    _changed()
    return rule


def _check(group: str, rule: Rule) -> None:
    if not isinstance(group, str) or not group:
        raise RuleError(f"a group name must be a non-empty string, not {group!r}")
    if not isinstance(rule, (Subgradient, NanSafe, Override)):
        raise RuleError(f"group {group!r}: {rule!r} is not a rule (Subgradient, NanSafe or Override)")
    if isinstance(rule, Override) and rule.backward_fn is None:
        raise RuleError(f"group {group!r}: {rule.label} has no backward; attach one with "
                        f"@{getattr(rule.check, '__name__', 'check')}.backward")


def register_rule(group: str, rule: R, *, replace: bool = False) -> R:
    """Register ``rule`` under ``group`` and return the registered rule; rules of one group apply in
    registration order.

    A rule the group already has (:func:`same_rule`) is not added again: the one registered is
    returned. A rule that conflicts with one of the group's rules is a :class:`RuleError`, unless
    ``replace`` is true: then it takes the place of the rules it conflicts with.

    >>> import autograd_groups as ag
    >>> with ag.registry_scope():
    ...     rule = ag.register_rule("cdist", ag.Subgradient(op="sqrt", when="result == 0", grad=0))
    ...     again = ag.register_rule("cdist", ag.Subgradient(op="sqrt", when="0 == result", grad=0))
    ...     [r.label for r in ag.list_rules()["cdist"]], again is rule
    (['subgradient(sqrt: result == 0 -> 0)'], True)
    """
    _check(group, rule)
    where = user_line()
    with _lock:
        return _add(group, rule, replace, where)


def same_rules(a: Sequence[Rule], b: Sequence[Rule]) -> bool:
    """Whether two ordered lists of rules mean the same, rule by rule."""
    return len(a) == len(b) and all(same_rule(x, y) for x, y in zip(a, b))


def set_groups(groups: Sequence[tuple[str, tuple[Rule, ...], tuple[str, ...]]],
               replace: bool) -> list[tuple[Rule, ...]]:
    """Make each ``(group, rules, wheres)`` the group's rules, all groups or none (``load_spec``).

    ``wheres`` says where each rule comes from (``file:line:col``). A group that has the same rules
    already keeps them; one that has other rules is a :class:`RuleError`, unless ``replace`` is true.
    Returns each group's rules as registered now.
    """
    for name, rules, _ in groups:
        for rule in rules:
            _check(name, rule)
    with _lock:
        for name, rules, wheres in groups:
            existing = _rules.get(name, ())
            if existing and not replace and not same_rules(existing, rules):
                raise RuleError(f"group {name!r} (from {wheres[0] if wheres else '?'}) already has other "
                                f"rules, registered at {', '.join(dict.fromkeys(map(_origin, existing)))}; "
                                f"pass replace=True to swap them")
        registered: list[tuple[Rule, ...]] = []
        changed = False
        for name, rules, wheres in groups:
            existing = _rules.get(name, ())
            if existing and same_rules(existing, rules):
                registered.append(existing)
                continue
            _rules[name] = rules
            _origins.update(zip(rules, wheres))
            registered.append(rules)
            changed = True
        if changed:
            _changed()
        return registered


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


def declare(group: str) -> None:
    """Note that code uses the group name ``group`` (``autograd_group``, ``tag``); the first time,
    warn if the group has no rules and rules sit under a close name that no group uses."""
    if group not in _declared:
        _declared.add(group)
        note_unruled(group)


def note_unruled(group: str) -> None:
    """Warn, once per name, when ``group`` has no rules while rules are registered under a close
    name that no group uses: a misspelling, in the code or in the rules, leaves those rules inert.
    Called when a group is created and when one runs without rules (rules may come in between)."""
    if group in _told or group in _rules:
        return
    with _lock:
        close = _close(group, [name for name in _rules if name not in _declared])
        where = {name: dict.fromkeys(map(_origin, _rules[name])) for name in close}
    if not close:
        return
    _told.add(group)
    named = "; ".join(f"{name!r} (registered at {', '.join(where[name])})" for name in close)
    warn(f"group {group!r} has no rules, but rules are registered under {named}, a name no group "
         f"uses: they never take effect. If they are this group's, register them under {group!r} "
         f"(or name the group {close[0]!r})", InertRuleWarning)


def unused() -> dict[str, list[str]]:
    """The names that have rules but that no group has used (``autograd_group``, ``tag``) in this
    process, each with the used names close to it: rules that never took effect.

    >>> import autograd_groups as ag
    >>> with ag.registry_scope():
    ...     _ = ag.register_rule("never_used_anywhere", ag.NanSafe())
    ...     unused()["never_used_anywhere"]
    []
    """
    with _lock:
        names = [name for name in _rules if name not in _declared]
        used = sorted(_declared)
    return {name: _close(name, used) for name in names}


def _close(name: str, candidates: list[str]) -> list[str]:
    return difflib.get_close_matches(name, candidates, n=3, cutoff=0.8)


def is_known(group: str) -> bool:
    """Whether ``group`` has rules or ``autograd_group``/``tag`` has used it. Read without the lock:
    a membership test."""
    return group in _rules or group in _declared


def known_groups() -> set[str]:
    """Every group name that has rules or that ``autograd_group``/``tag`` has used."""
    with _lock:
        return set(_rules) | _declared


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
    return len(_rules.get(group, ())) > 0  # not bool(): Dynamo 2.11 cannot trace bool() of a tuple


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
        _open_scopes.append(saved)
    try:
        yield
    finally:
        with _lock:
            _open_scopes.remove(saved)
            _rules.clear()
            _rules.update(saved)
            _changed()


def keep(groups: Iterable[str]) -> None:
    """Let the rules now registered under ``groups`` outlive every open :func:`registry_scope`.

    The built-in library registers its rules once, on first use of ``ag.ops``; that first use may
    be inside a scope, whose end would otherwise leave the built-ins without rules for good.

    >>> import autograd_groups as ag
    >>> with ag.registry_scope():
    ...     with ag.registry_scope():
    ...         rule = ag.register_rule("kept", ag.NanSafe())
    ...         keep(["kept"])
    ...     "kept" in ag.list_rules()
    True
    >>> ag.unregister_rule("kept", rule)  # it outlived the scopes: only this removes it
    """
    with _lock:
        for saved in _open_scopes:
            for name in groups:
                if name in _rules:
                    saved.setdefault(name, _rules[name])


class _SpecialCase(Override):
    """An override made by :func:`special_case`: registered under its group once it has a backward."""

    def __init__(self, check: Callable[[OverrideContext], Any], group: str, replace: bool) -> None:
        super().__init__(check)
        self.group = group
        self.replace = replace

    def backward(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """Decorator: set the replacement backward and register the rule under its group."""
        super().backward(fn)
        register_rule(self.group, self, replace=self.replace)
        return fn


def special_case(group: str, *,
                 replace: bool = False) -> Callable[[Callable[[OverrideContext], Any]], Override]:
    """Decorator that makes an override rule of ``group`` from its checker.

    Attach the replacement backward with ``@checker.backward``; the rule is registered then. Its
    functions are new objects each time the code runs, so running it again (a notebook cell)
    conflicts with the override registered the first time: ``replace=True`` swaps it.

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

    if not isinstance(group, str) or not group:
        hint = (" (to turn special cases on or off, use ag.special_cases(enabled), plural)"
                if isinstance(group, bool) else "")
        raise TypeError(f"special_case(group) is the decorator of an override rule and takes a group "
                        f"name, not {group!r}{hint}")

    def make(check: Callable[[OverrideContext], Any]) -> Override:
        return _SpecialCase(check, group, replace)

    return make

"""Loading spec files into the registry, all or nothing, and undoing a load.

A spec is checked completely before anything is registered: every error of every file is
collected, and one error means nothing is registered. Groups of several loads merge in the
registry; a group is owned by one source, so a spec may not add rules to a group that is already
registered (by another spec or from Python), unless it has the same rules already (loading a spec
again is a no-op) or ``replace=True`` swaps them.
"""

from __future__ import annotations

import dataclasses
import os
import weakref
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING

from .. import frames
from ..errors import RuleError, SpecError
from ..rules import compile_options, registry
from ..rules.kinds import Rule
from .group import SpecGroup, position

if TYPE_CHECKING:  # the reading modules, and PyYAML with them, are imported by the first spec checked
    from .document import Error, Source
    from .schema import Imports

_origins: weakref.WeakKeyDictionary[Rule, SpecGroup] = weakref.WeakKeyDictionary()


@dataclass(frozen=True)
class Checked:
    """The outcome of checking specs: the groups of each file, and every error."""

    files: tuple[tuple[str, tuple[SpecGroup, ...]], ...]
    errors: list[Error]


class SpecHandle:
    """What :func:`load_spec` registered; ``unload()`` (or leaving a ``with`` block) removes it.

    >>> import autograd_groups as ag
    >>> spec = "- name: tmp_pow(Tensor x) -> Tensor\\n  special_cases: [nan_safe: true]\\n"
    >>> with ag.load_spec(spec) as handle:
    ...     [g.name for g in handle.groups], "tmp_pow" in ag.list_rules()
    (['tmp_pow'], True)
    >>> "tmp_pow" in ag.list_rules()
    False
    """

    def __init__(self, source: str, groups: tuple[SpecGroup, ...]) -> None:
        self.source = source
        self.groups = groups

    def __repr__(self) -> str:
        return f"<SpecHandle {self.source}: {', '.join(g.name for g in self.groups) or 'no groups'}>"

    def unload(self) -> None:
        """Unregister this load's rules and its groups' ``compile:``; rules already gone (e.g. by a
        ``registry_scope``) are skipped."""
        for group in self.groups:
            for rule in group.rules:
                if rule in registry.list_rules().get(group.name, ()):
                    registry.unregister_rule(group.name, rule)
            if group.compile is not None and compile_options.declared(group.name) == group.compile:
                compile_options.declare(group.name, None)

    def __enter__(self) -> SpecHandle:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.unload()


def check(sources: list[Source], *, imports: Imports = "run", replace: bool = False) -> Checked:
    """Check specs together, as if loaded one after the other (with ``replace``); register nothing."""
    from .document import Document, read
    from .schema import groups

    files: list[tuple[str, tuple[SpecGroup, ...]]] = []
    errors: list[Error] = []
    first: dict[str, SpecGroup] = {}
    for source in sources:
        try:
            label, text = read(source)
        except SpecError as e:
            errors.extend(e.errors)
            continue
        document = Document(label, text)
        entries = groups(document, imports=imports, folder=_folder(source))
        registered = registry.list_rules()
        for entry in entries:
            seen = first.setdefault(entry.name, entry)
            if seen is not entry:
                document.error(position(entry.where)[1:], f"group {entry.name!r} is defined twice; first "
                                                          f"at {seen.where}")
            elif entry.name in registered and not replace and not registry.same_rules(
                    registered[entry.name], entry.rules):
                document.error(position(entry.where)[1:],
                               f"group {entry.name!r} is already registered {_owner(registered[entry.name])} "
                               f"with other rules; a group has one source, so unload that one first, rename "
                               f"this group, or pass replace=True to swap its rules")
        errors.extend(sorted(document.errors, key=lambda e: (e[1], e[2])))
        files.append((label, tuple(entries)))
    return Checked(tuple(files), errors)


def _folder(source: Source) -> str | None:
    """The folder of a spec file, whose modules its references may name; None for YAML text."""
    if isinstance(source, str) and "\n" in source:
        return None
    if isinstance(source, (str, os.PathLike)):
        return os.path.dirname(os.path.abspath(source))
    return None


def _owner(rules: tuple[Rule, ...]) -> str:
    group = next((_origins[r] for r in rules if r in _origins), None)
    return f"by the spec at {group.where}" if group else "from Python (register_rule or a decorator)"


def check_spec(*sources: Source, allow_imports: bool = True) -> list[Error]:
    """Every ``(file, line, col, message)`` error of these specs; nothing is registered.

    Checks the same things as :func:`load_spec`, including conflicts with the groups already
    registered; several sources are checked as if loaded together.

    >>> check_spec("- name: g(Tensor x) -> Tensor\\n  special_cases: [nan_save: true]\\n")
    [('<string>', 2, 19, "unknown kind of special case: 'nan_save'; the kinds are subgradient, \
nan_safe, override; did you mean 'nan_safe'?")]
    """
    return check(list(sources), imports="run" if allow_imports else "refuse").errors


def load_spec(source: Source, *, allow_imports: bool = True, replace: bool = False) -> SpecHandle:
    """Register every group of a spec; raise :class:`SpecError` with all its errors, registering nothing.

    ``source`` is a path (a ``str`` without a newline, a ``pathlib.Path``, or a package resource
    such as ``importlib.resources.files(pkg) / "groups.yaml"``) or YAML text (a ``str`` with a
    newline; errors then name the file ``<string>``). ``override`` rules import the modules they
    name, with the spec file's folder first on ``sys.path``; ``allow_imports=False`` refuses that,
    so the spec runs no code at all.

    A group that has the same rules already keeps them, so loading a spec again is a no-op (the
    handle holds the rules registered first). A group registered with other rules is an error,
    unless ``replace`` is true: then the spec's rules take the place of the group's rules.

    >>> import torch, autograd_groups as ag
    >>> spec = '''
    ... - name: safe_sqrt(Tensor x) -> Tensor
    ...   special_cases:
    ...     - subgradient: {op: sqrt, when: "result == 0", grad: 0}
    ... '''
    >>> with ag.registry_scope():
    ...     handle = ag.load_spec(spec)
    ...     x = torch.tensor([0.0, 4.0], requires_grad=True)
    ...     with ag.autograd_group("safe_sqrt"):
    ...         y = x.sqrt()
    ...     y.sum().backward()
    ...     x.grad
    tensor([0.0000, 0.2500])
    """
    checked = check([source], imports="run" if allow_imports else "refuse", replace=replace)
    if checked.errors:
        raise SpecError(checked.errors)
    label, entries = checked.files[0]
    if not entries:
        frames.warn(f"the spec {label} defines no group: it is empty, so it registers no rule", UserWarning)
    wanted = [(e.name, e.rules, e.rule_wheres) for e in entries]
    try:
        registered = registry.set_groups(wanted, replace)
    except RuleError as e:  # registered meanwhile from another thread; none of this load was
        now = registry.list_rules()
        clash = next((entry for entry in entries if entry.name in now), entries[0])
        raise SpecError([(*position(clash.where), str(e))]) from None
    loaded = tuple(dataclasses.replace(e, rules=rules) for e, rules in zip(entries, registered))
    for group in loaded:
        for rule in group.rules:
            _origins.setdefault(rule, group)
        if group.compile is not None:
            compile_options.declare(group.name, group.compile)
    return SpecHandle(label, loaded)


def unload_spec(handle: SpecHandle) -> None:
    """Undo :func:`load_spec`: the same as ``handle.unload()``."""
    handle.unload()


def origin(rule: Rule) -> SpecGroup | None:
    """The spec group a registered rule was loaded from, or None for rules registered from Python."""
    return _origins.get(rule)

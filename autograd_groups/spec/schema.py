"""The shape of a spec: a list of groups, each with a signature, a doc and its special cases.

Every problem is recorded with its position and checking goes on, so one run reports all of a
file's errors. A rule is built (:class:`~autograd_groups.rules.kinds.Subgradient` ...) only from parts that
passed their checks, so building it cannot fail on anything already reported.
"""

from __future__ import annotations

import contextlib
import difflib
import importlib
import importlib.machinery
import importlib.util
import re
import sys
from collections.abc import Callable, Iterator
from typing import Any, Literal

import yaml

from .. import nodes
from ..errors import ExpressionError, RuleError, internal_error
from ..rules import compile_options, expr, registry
from ..rules.kinds import NanSafe, Override, Rule, Subgradient, input_problem
from .document import Document, describe, scalar
from .group import SpecGroup
from .signature import SignatureError, parse_signature

Where = tuple[str, int, int]
#: What a ``module:function`` reference does while a spec is checked: ``run`` imports the module
#: (``load_spec``, ``check --imports``), ``find`` only looks for it without running anything
#: (``autograd-groups check``), ``refuse`` makes it an error (``allow_imports=False``).
Imports = Literal["run", "find", "refuse"]

GROUP_KEYS = {"name": True, "doc": False, "special_cases": True, "compile": False}
KINDS = ("subgradient", "nan_safe", "override")
SUBGRADIENT_KEYS = {"op": True, "when": True, "grad": False, "input": False, "doc": False}
NAN_SAFE_KEYS = {"doc": False}
OVERRIDE_KEYS = {"check": True, "backward": True, "doc": False}

_DOTTED = r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*"
_REFERENCE = re.compile(rf"(?P<module>{_DOTTED}):(?P<attr>{_DOTTED})")


def groups(document: Document, *, imports: Imports, folder: str | None) -> list[SpecGroup]:
    """Check a spec document, recording every error in it; return each group whose name line parses.

    ``folder`` is the spec file's folder, searched first for the modules its references name."""
    root = document.compose()
    if root is None or (isinstance(root, yaml.ScalarNode) and scalar(root) is None):
        return []
    if not isinstance(root, yaml.SequenceNode):
        document.error(root, f"a spec is a list of groups ('- name: group(Tensor x) -> Tensor'), "
                             f"not {describe(root)}")
        return []
    checker = _Checker(document, imports, folder)
    return [g for g in map(checker.group, root.value) if g is not None]


def _text(where: Where) -> str:
    return ":".join(map(str, where))


def _close(word: str, choices: list[str] | tuple[str, ...]) -> str:
    close = difflib.get_close_matches(word, choices, n=3, cutoff=0.6)
    return f"; did you mean {' or '.join(map(repr, close))}?" if close else ""


class _Checker:
    """Checks one document; a part is built only if checking it recorded no new error."""

    def __init__(self, document: Document, imports: Imports, folder: str | None) -> None:
        self.doc = document
        self.imports = imports
        self.folder = folder

    def _where(self, node: yaml.Node) -> Where:
        return self.doc.file, node.start_mark.line + 1, node.start_mark.column + 1

    def group(self, node: yaml.Node) -> SpecGroup | None:
        """The group, if its name line parses (its other parts may still have errors)."""
        fields = self._fields(node, "a group", GROUP_KEYS)
        signature = self._string(fields["name"], "'name'") if "name" in fields else None
        parsed = None
        if signature is not None:
            try:
                parsed = parse_signature(signature)
            except SignatureError as e:
                self._at_column(fields["name"], e.col, e.message)
        doc = self._string(fields["doc"], "'doc'") if "doc" in fields else ""
        compile = self._compile(fields["compile"]) if "compile" in fields else False
        rules = []
        if "special_cases" in fields:
            rules = self._special_cases(fields["special_cases"], parsed.name if parsed else "?")
        if parsed is None or signature is None:
            return None
        if not isinstance(fields["name"], yaml.ScalarNode):  # parsed from it above
            raise internal_error(f"group entry 'name' parsed, but it is a {type(fields['name']).__name__}")
        position, _ = self.doc.inner(fields["name"], 1 + len(signature) - len(signature.lstrip()))
        return SpecGroup(parsed.name, " ".join(signature.split()), parsed.params, parsed.returns, doc or "",
                         tuple(rule for rule, _ in rules), _text((self.doc.file, *position)),
                         tuple(_text(where) for _, where in rules),
                         compile_options.options_of(parsed.name, compile))

    def _compile(self, node: yaml.Node) -> bool | dict[str, Any]:
        """A group's ``compile:``: true, false, or a mapping of scalar options (False where wrong)."""
        value: Any = scalar(node)
        if isinstance(node, yaml.MappingNode):
            value = {scalar(k): scalar(v) for k, v in node.value}
            if any(v is ... or not isinstance(k, str) for k, v in value.items()):
                self.doc.error(node, "'compile' options are names with plain values, as in "
                                     "'compile: {backend: aot_eager, budget: 4}'")
                return False
        found = compile_options.problem(value) if value is not ... else f"is {describe(node)}"
        if found is not None:
            self.doc.error(node, f"'compile' {found}")
            return False
        return value

    def _special_cases(self, node: yaml.Node, group: str) -> list[tuple[Rule, Where]]:
        if isinstance(node, yaml.SequenceNode) and not node.value:
            self.doc.error(node, f"'special_cases' is empty: a group needs at least one rule "
                                 f"({', '.join(KINDS)}), as in '- nan_safe: true'")
            return []
        if not isinstance(node, yaml.SequenceNode):
            self.doc.error(node, "'special_cases' must be a non-empty list of rules "
                                 f"({', '.join(KINDS)}), not {describe(node)}")
            return []
        rules: list[tuple[Rule, Where]] = []
        for item in node.value:
            rule = self._rule(item)
            if rule is None:
                continue
            for old, old_where in rules:
                if registry.same_rule(old, rule):
                    self.doc.error(item, f"group {group!r}: {rule.label} is the rule of line {old_where[1]} "
                                         f"again; remove one of them")
                    continue
                problem = registry.conflict(old, rule)
                if problem:
                    self.doc.error(item, f"group {group!r}: {rule.label} conflicts with {old.label} "
                                         f"(line {old_where[1]}): {problem}")
            rules.append((rule, self._where(item)))
        return rules

    def _rule(self, node: yaml.Node) -> Rule | None:
        if not isinstance(node, yaml.MappingNode):
            self.doc.error(node, f"a special case is a mapping with one key, {', '.join(KINDS)} "
                                 f"(as in '- nan_safe: true'), not {describe(node)}")
            return None
        if len(node.value) != 1:
            keys = ", ".join(repr(k.value) for k, _ in node.value) or "none"
            self.doc.error(node, f"a special case has exactly one key, {', '.join(KINDS)} "
                                 f"(as in '- nan_safe: true'); this one has {keys}")
            return None
        key_node, value = node.value[0]
        kind = scalar(key_node)
        if kind == "subgradient":
            return self._subgradient(value)
        if kind == "nan_safe":
            return self._nan_safe(value)
        if kind == "override":
            return self._override(value)
        shown = repr(kind) if isinstance(kind, str) else describe(key_node)
        self.doc.error(key_node, f"unknown kind of special case: {shown}; the kinds are "
                                 f"{', '.join(KINDS)}{_close(str(kind), KINDS)}")
        return None

    def _subgradient(self, node: yaml.Node) -> Subgradient | None:
        before = len(self.doc.errors)
        fields = self._fields(node, "'subgradient'", SUBGRADIENT_KEYS)
        op = self._string(fields["op"], "'op'") if "op" in fields else None
        info = None
        if op is not None:
            try:
                info = nodes.resolve_op(op)
            except RuleError as e:
                self.doc.error(fields["op"], str(e))
        when = self._expression(fields["when"], "'when'", info, condition=True) if "when" in fields else None
        grad = self._expression(fields["grad"], "'grad'", info) if "grad" in fields else 0
        index = self._index(fields["input"], info) if "input" in fields else None
        doc = self._string(fields["doc"], "'doc'") if "doc" in fields else ""
        if len(self.doc.errors) > before or op is None or when is None or grad is None or doc is None:
            return None
        return self._build(node, lambda: Subgradient(op=op, when=when, grad=grad, input=index, doc=doc))

    def _nan_safe(self, node: yaml.Node) -> NanSafe | None:
        if scalar(node) is True:
            return NanSafe()
        if not isinstance(node, yaml.MappingNode):
            self.doc.error(node, f"'nan_safe' must be true or a mapping with a 'doc', not {describe(node)}")
            return None
        before = len(self.doc.errors)
        fields = self._fields(node, "'nan_safe'", NAN_SAFE_KEYS)
        doc = self._string(fields["doc"], "'doc'") if "doc" in fields else ""
        return NanSafe(doc=doc) if len(self.doc.errors) == before and doc is not None else None

    def _override(self, node: yaml.Node) -> Override | None:
        before = len(self.doc.errors)
        fields = self._fields(node, "'override'", OVERRIDE_KEYS)
        check = self._reference(fields["check"], "'check'") if "check" in fields else None
        backward = self._reference(fields["backward"], "'backward'") if "backward" in fields else None
        doc = self._string(fields["doc"], "'doc'") if "doc" in fields else ""
        if len(self.doc.errors) > before or check is None or backward is None or doc is None:
            return None
        return self._build(node, lambda: Override(check, backward=backward, doc=doc))

    def _build(self, node: yaml.Node, make: Callable[[], Any]) -> Any:
        try:
            return make()
        except RuleError as e:
            self.doc.error(node, str(e))
            return None

    def _fields(self, node: yaml.Node, what: str, keys: dict[str, bool]) -> dict[str, yaml.Node]:
        """The known keys of a mapping; unknown, duplicate and missing keys are recorded."""
        if not isinstance(node, yaml.MappingNode):
            self.doc.error(node, f"{what} must be a mapping with the keys {', '.join(keys)}, "
                                 f"not {describe(node)}")
            return {}
        found: dict[str, yaml.Node] = {}
        for key_node, value in node.value:
            key = scalar(key_node)
            if not isinstance(key, str):
                self.doc.error(key_node, f"the keys of {what} are strings, not {describe(key_node)}")
            elif key in found:
                self.doc.error(key_node, f"duplicate key {key!r} in {what}")
            elif key not in keys:
                self.doc.error(key_node, f"unknown key {key!r} in {what}; the keys are "
                                         f"{', '.join(keys)}{_close(key, list(keys))}")
            else:
                found[key] = value
        missing = [k for k, required in keys.items() if required and k not in found]
        if missing:
            needed = " and ".join(repr(k) for k, required in keys.items() if required)
            self.doc.error(node, f"{what} has no {' or '.join(map(repr, missing))}; it needs {needed}")
        return found

    def _string(self, node: yaml.Node, what: str) -> str | None:
        value = scalar(node)
        if not isinstance(value, str):
            self.doc.error(node, f"{what} must be a string, not {describe(node)}")
            return None
        return value

    def _index(self, node: yaml.Node, info: nodes.OpInfo | None) -> int | None:
        value = scalar(node)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            self.doc.error(node, f"'input' must be a non-negative integer (the op's input position), "
                                 f"not {describe(node)}")
            return None
        problem = None if info is None else input_problem(info, value)
        if problem:
            self.doc.error(node, f"'input': {problem}")
            return None
        return value

    def _at_column(self, node: yaml.Node, col: int, message: str) -> None:
        if isinstance(node, yaml.ScalarNode):
            position, suffix = self.doc.inner(node, col)
            self.doc.error(position, message + suffix)
        else:
            self.doc.error(node, message)

    def _expression(self, node: yaml.Node, what: str, info: nodes.OpInfo | None,
                    condition: bool = False) -> str | int | float | None:
        """An expression or a number; names are checked against the op's saved values when it is
        known, and a ``condition`` (``when``) must be an elementwise condition."""
        value = scalar(node)
        if not isinstance(value, (bool, int, float, str)):
            self.doc.error(node, f"{what} must be an expression string or a number, not {describe(node)}")
            return None
        lead = len(value) - len(value.lstrip()) if isinstance(value, str) else 0
        try:
            parsed = expr.parse(value)
        except ExpressionError as e:
            self._at_column(node, lead + e.col, f"{what}: {e.message}")
            return None
        problem = expr.condition_problem(parsed) if condition else expr.constant_problem(parsed)
        if problem:
            self._at_column(node, lead + 1, f"{what} {problem}")
            return None
        if info is None or not isinstance(value, str):
            return value
        for name in sorted(parsed.names - info.saved - {"grad"}):
            found = re.search(rf"(?<![\w.]){re.escape(name)}(?!\w)", value)
            self._at_column(node, found.start() + 1 if found else 1,
                            f"{what} names {name!r}, which {info.name} does not save; it saves "
                            f"{', '.join(sorted(info.saved)) or 'nothing'} (and every rule sees 'grad')"
                            f"{_close(name, sorted(info.saved | {'grad'}))}")
        return value

    def _reference(self, node: yaml.Node, what: str) -> Callable[..., Any] | None:
        """The callable named by ``module:function``: imported (``run``), a stand-in for it once its
        module is found without importing (``find``), or an error (``refuse``)."""
        text = self._string(node, what)
        if text is None:
            return None
        start = 1 + len(text) - len(text.lstrip())
        found = _REFERENCE.fullmatch(text.strip())
        if found is None:
            self._at_column(node, start, f"{what} must be 'module:function' (such as "
                                         f"'mypkg.rules:norm_is_zero'), not {text!r}")
            return None
        module, attr = found["module"], found["attr"]
        if any(part.startswith("__") for part in f"{module}.{attr}".split(".")):
            self._at_column(node, start, f"{what}: names starting with '__' are not allowed ({text!r})")
            return None
        if self.imports == "refuse":
            self._at_column(node, start, f"{what}: {text!r} would import module {module!r}, and this spec is "
                                         "loaded with allow_imports=False; load it with allow_imports=True "
                                         "if you trust it")
            return None
        if self.imports == "find":
            missing = _find(module, self.folder)
            if missing:
                self._at_column(node, start, f"{what}: {missing}")
                return None
            return _unimported(module, attr)
        try:
            with _first_on_path(self.folder):
                target: Any = importlib.import_module(module)
        except (Exception, SystemExit) as e:
            self._at_column(node, start, f"{what}: cannot import module {module!r}: {type(e).__name__}: {e}")
            return None
        for part in attr.split("."):
            try:
                target = getattr(target, part)
            except Exception:
                close = _close(part, [n for n in dir(target) if not n.startswith("_")])
                self._at_column(node, start + found.start("attr"),
                                f"{what}: module {module!r} has no {attr!r}{close}")
                return None
        if not callable(target):
            self._at_column(node, start, f"{what}: {text!r} is a {type(target).__name__}, not a function")
            return None
        fn: Callable[..., Any] = target
        return fn


@contextlib.contextmanager
def _first_on_path(folder: str | None) -> Iterator[None]:
    """Put the spec's folder first on ``sys.path`` while its modules are found or imported."""
    if folder is None:
        yield
        return
    sys.path.insert(0, folder)
    try:
        yield
    finally:
        sys.path.remove(folder)


def _find(module: str, folder: str | None) -> str | None:
    """Why ``module`` cannot be found, or None; nothing is imported, so no code runs.

    The top package is looked up by ``importlib.util.find_spec`` (which imports only the parents of
    a dotted name, and a top name has none), each submodule by ``PathFinder.find_spec`` in its
    parent's folders: both only read directories.
    """
    parts = module.split(".")
    with _first_on_path(folder):
        found = _spec_of(parts[0], None)
    for k in range(1, len(parts)):
        folders = found.submodule_search_locations if found is not None else None
        found = _spec_of(".".join(parts[:k + 1]), list(folders)) if folders is not None else None
    if found is not None:
        return None
    where = f"the spec's folder {folder} and sys.path" if folder else "sys.path"
    return (f"cannot find module {module!r} in {where} (looked up without importing it; "
            f"check with --imports to import it)")


def _spec_of(name: str, folders: list[str] | None) -> importlib.machinery.ModuleSpec | None:
    """The spec of module ``name``: loaded already, a top-level module, or in ``folders``."""
    loaded = sys.modules.get(name)
    if loaded is not None:
        return loaded.__spec__
    if folders is not None:
        return importlib.machinery.PathFinder.find_spec(name, folders)
    try:
        return importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None


def _unimported(module: str, attr: str) -> Callable[..., Any]:
    """A stand-in for the function ``module:attr`` that was found but not imported."""

    def unimported(*args: Any, **kwargs: Any) -> Any:
        raise RuleError(f"{module}:{attr} was checked without importing it; load the spec with "
                        f"load_spec to use it")

    unimported.__module__ = module
    unimported.__qualname__ = attr
    unimported.__name__ = attr.rpartition(".")[2]
    return unimported

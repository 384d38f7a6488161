"""Reading a spec into YAML nodes that know their ``file:line:column``, and collecting errors.

Only YAML's node graph is built (``yaml.compose``); scalars become Python values only through the
safe constructor, and tags other than YAML's standard ones (``!!python/object``, ``!custom``) are
refused, so a spec cannot make PyYAML construct anything else. Aliases (``*name``) are refused too:
they are the one way a small YAML text describes a huge document.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Union

import yaml

from ..errors import SpecError

if TYPE_CHECKING:
    from importlib.resources.abc import Traversable

#: A spec: a path (``str`` without a newline, ``os.PathLike`` or a package resource), or YAML text
#: (a ``str`` containing a newline).
Source = Union[str, "os.PathLike[str]", "Traversable"]
Error = tuple[str, int, int, str]

_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_BREAK = re.compile(r"\r\n|[\n\r\x85\u2028\u2029]")
_YAML_TAG = "tag:yaml.org,2002:"
_TAGS = {_YAML_TAG + t for t in ("null", "bool", "int", "float", "str", "seq", "map", "timestamp", "binary")}
_NAMES = {str: "a string", bool: "a boolean", int: "an integer", float: "a number", type(None): "null"}


def read(source: Source) -> tuple[str, str]:
    """``(file label, text)`` of a spec; a ``str`` with a newline is the text itself (``<string>``).

    >>> read("- name: g(Tensor x)\\n  special_cases: [nan_safe: true]\\n")[0]
    '<string>'
    """
    if isinstance(source, str) and "\n" in source:
        return "<string>", source
    if isinstance(source, str):
        source = Path(source)
    if not isinstance(source, os.PathLike) and not hasattr(source, "read_text"):
        raise TypeError(f"a spec is a path or YAML text (a str with a newline), not {type(source).__name__}")
    label = os.fspath(source) if isinstance(source, os.PathLike) else str(source)
    try:
        text: str = (Path(source) if isinstance(source, os.PathLike) else source).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecError([(label, 1, 1, "no such spec file (YAML text must contain a newline to be read "
                                       "as text rather than as a path)")]) from None
    except UnicodeDecodeError as e:
        raise SpecError([(label, 1, 1, f"a spec file must be UTF-8 text: {e}")]) from None
    except OSError as e:
        raise SpecError([(label, 1, 1, f"cannot read the spec file: {e.strerror or e}")]) from None
    return label, text


@dataclass
class Document:
    """One spec's text, its file label, and the errors found in it so far."""

    file: str
    text: str
    errors: list[Error] = field(default_factory=list)
    lines: list[str] = field(init=False)

    def __post_init__(self) -> None:
        self.lines = _BREAK.split(self.text)

    def error(self, where: Any, message: str) -> None:
        """Record ``message`` at a node, a YAML mark (Python's or libyaml's), or a 1-based ``(line, col)``."""
        if isinstance(where, yaml.Node):
            where = where.start_mark
        line, col = where if isinstance(where, tuple) else (where.line + 1, where.column + 1)
        self.errors.append((self.file, line, col, " / ".join(message.splitlines())))

    def compose(self) -> yaml.Node | None:
        """The document's root node (None for an empty file); syntax errors are recorded."""
        try:
            aliases = [e.start_mark for e in yaml.parse(self.text, Loader=_LOADER)
                       if isinstance(e, yaml.AliasEvent)]
            for mark in aliases:
                self.error(mark, "YAML aliases (*name) are not allowed in a spec; write the value out")
            root = None if aliases else yaml.compose(self.text, Loader=_LOADER)
            return root if root is None or self._plain(root) else None
        except yaml.MarkedYAMLError as e:
            # A scanner error's context is the token it was reading (a quoted scalar left open):
            # where that starts is where the problem is, not where the scanner gave up.
            scanning = isinstance(e, yaml.scanner.ScannerError) and e.context_mark is not None
            mark = e.context_mark if scanning else e.problem_mark or e.context_mark
            problem = ": ".join(p for p in (e.context, e.problem) if p)
            if scanning and "quoted scalar" in (e.context or "") and "end of stream" in (e.problem or ""):
                problem += " (the quote that starts here is never closed)"
            if e.problem_mark is not None and self._character(e.problem_mark) == "\t":
                mark = e.problem_mark
                problem = ("a tab character: YAML indents with spaces only, and a tab cannot start "
                           "a token; replace it with spaces")
            self.error(mark if mark is not None else (1, 1), f"YAML syntax error: {problem}")
        except yaml.reader.ReaderError as e:
            self.error(self._position(e.position), f"YAML syntax error: {e.reason} ({e.character!r})")
        except yaml.YAMLError as e:
            self.error((1, 1), f"YAML syntax error: {e}")
        except RecursionError:
            self.error((1, 1), "YAML syntax error: the document is nested too deeply")
        return None

    def _character(self, mark: Any) -> str:
        """The character of the text at a YAML mark ('' past its end)."""
        row = self.lines[mark.line] if mark.line < len(self.lines) else ""
        return row[mark.column] if mark.column < len(row) else ""

    def _plain(self, root: yaml.Node) -> bool:
        """Whether every node has a standard tag; a ``!!python/...`` or ``!custom`` tag is an error."""
        before = len(self.errors)
        stack = [root]
        while stack:
            node = stack.pop()
            if node.tag not in _TAGS:
                tag = node.tag.replace(_YAML_TAG, "!!")
                self.error(node, f"the YAML tag {tag!r} is not allowed in a spec; write a plain value")
            elif isinstance(node, yaml.SequenceNode):
                stack.extend(reversed(node.value))
            elif isinstance(node, yaml.MappingNode):
                stack.extend(n for pair in reversed(node.value) for n in reversed(pair))
        return len(self.errors) == before

    def inner(self, node: yaml.ScalarNode, col: int) -> tuple[tuple[int, int], str]:
        """The file position of 1-based column ``col`` of a scalar's value, and a suffix for messages.

        Exact where the value is written on one line exactly as it reads (plain or quoted without
        escapes); otherwise the scalar's start, with the column inside the value in the suffix.
        """
        start, end = node.start_mark, node.end_mark
        quote = 1 if node.style in ("'", '"') else 0
        if start.line == end.line and start.line < len(self.lines) and node.value.isascii():
            raw = self.lines[start.line][start.column:end.column]
            if raw[quote:len(raw) - quote] == node.value:
                return (start.line + 1, start.column + quote + col), ""
        return (start.line + 1, start.column + 1), f" (column {col} of the value)"

    def _position(self, index: int) -> tuple[int, int]:
        before = _BREAK.split(self.text[:index])
        return len(before), len(before[-1]) + 1


def scalar(node: yaml.Node) -> Any:
    """The Python value of a scalar node with a standard YAML tag; ``...`` for anything else."""
    if not isinstance(node, yaml.ScalarNode):
        return ...
    try:
        return yaml.constructor.SafeConstructor().construct_object(node)
    except (yaml.YAMLError, ValueError, OverflowError):
        return ...


def describe(node: yaml.Node) -> str:
    """How a value reads in an error message: ``a list``, ``an integer (3)``, ``a string``."""
    if isinstance(node, yaml.MappingNode):
        return "a mapping"
    if isinstance(node, yaml.SequenceNode):
        return "a list"
    value = scalar(node)
    kind = _NAMES.get(type(value), f"a YAML {node.tag.rsplit(':', 1)[-1]} value")
    shown = repr(value) if isinstance(value, (bool, int, float)) else repr(node.value)
    return kind if value is None else f"{kind} ({shown[:40]})"

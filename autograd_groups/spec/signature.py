"""The ``name:`` line of a spec group: ``cdist(Tensor x1, Tensor x2, float p=2.0) -> Tensor``.

Types and defaults are spelled as in PyTorch's ``native_functions.yaml``; they document the group
and are shown by ``autograd-groups list``. Only the shape of the line is checked, not the types.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import GroupError

_NAME = re.compile(r"\s*(?P<name>[A-Za-z_][\w.]*)\s*\(")
_TYPE = r"[A-Za-z_]\w*(?:\[\d*\])?\??"
_PARAM = re.compile(
    rf"\s*(?P<type>{_TYPE})\s+(?P<name>[A-Za-z_]\w*)"
    r"(?:\s*=\s*(?P<default>\[[^\]]*\]|\"[^\"]*\"|'[^']*'|[^\s,()\[\]\"']+))?\s*")
_ONE = rf"{_TYPE}(?:\s+\w+)?"
_RETURNS = re.compile(rf"\s*->\s*(?P<returns>{_TYPE}|\(\s*{_ONE}(?:\s*,\s*{_ONE})*\s*\))\s*")


class SignatureError(GroupError):
    """A malformed ``name:`` line; ``col`` is the 1-based column of the problem in the line."""

    def __init__(self, message: str, col: int) -> None:
        super().__init__(message)
        self.message = message
        self.col = col


@dataclass(frozen=True)
class Signature:
    """A parsed group signature: the group name, its ``(type, name)`` parameters, its return type."""

    name: str
    params: tuple[tuple[str, str], ...]
    returns: str


def parse_signature(text: str) -> Signature:
    """Parse ``group(Type name, ...) -> Type``; raise :class:`SignatureError` at the first problem.

    >>> parse_signature("cdist(Tensor x1, Tensor x2, float p=2.0) -> Tensor")
    Signature(name='cdist', params=(('Tensor', 'x1'), ('Tensor', 'x2'), ('float', 'p')), returns='Tensor')
    >>> try:
    ...     parse_signature("cdist(Tensor) -> Tensor")
    ... except SignatureError as e:
    ...     print(e.col, e.message)
    7 malformed group signature: expected a parameter 'Type name' (such as 'Tensor x')
    """
    head = _NAME.match(text)
    if head is None:
        raise _error("expected 'group_name(' at the start, as in 'cdist(Tensor x1, Tensor x2) -> Tensor'",
                     _skip_space(text, 0))
    pos = head.end()
    params: list[tuple[str, str]] = []
    if text[_skip_space(text, pos):].startswith(")"):
        pos = _skip_space(text, pos) + 1
    else:
        while True:
            param = _PARAM.match(text, pos)
            if param is None:
                raise _error("expected a parameter 'Type name' (such as 'Tensor x')", _skip_space(text, pos))
            if any(param["name"] == n for _, n in params):
                raise _error(f"parameter {param['name']!r} appears twice", param.start("name"))
            params.append((param["type"], param["name"]))
            pos = param.end()
            if text.startswith(")", pos):
                pos += 1
                break
            if not text.startswith(",", pos):
                raise _error("expected ',' or ')' after a parameter", pos)
            pos += 1
    returns = ""
    if text[pos:].strip():
        found = _RETURNS.fullmatch(text, pos)
        if found is None:
            raise _error("expected '-> Type' (such as '-> Tensor') after the parameters",
                         _skip_space(text, pos))
        returns = " ".join(found["returns"].split())
    return Signature(head["name"], tuple(params), returns)


def _skip_space(text: str, pos: int) -> int:
    return len(text) - len(text[pos:].lstrip())


def _error(message: str, pos: int) -> SignatureError:
    return SignatureError(f"malformed group signature: {message}", pos + 1)

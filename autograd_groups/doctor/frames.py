"""The user's code in a stack: the innermost frame that is neither PyTorch's, this library's, nor
Python's own, with its enclosing function -- for a NaN born inside ``nn.MultiheadAttention``, the
line that calls it."""

from __future__ import annotations

import itertools
import os
import sys
import sysconfig
import types
from dataclasses import dataclass, field

import torch

_PATHS = sysconfig.get_paths()
#: PyTorch, this library, the standard library and installed packages: code the user does not own.
_NOT_THE_USERS = tuple(sorted({os.path.abspath(p) + os.sep for p in (
    os.path.dirname(torch.__file__), os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    _PATHS["stdlib"], _PATHS["purelib"], _PATHS["platlib"])}))


@dataclass(frozen=True)
class Frame:
    """A line of the user's code: ``file``, ``line`` and the enclosing ``function``; ``code`` and
    ``offset``, the code object and the instruction running there, for :meth:`columns`."""

    file: str
    line: int
    function: str
    code: types.CodeType | None = field(default=None, compare=False, repr=False)
    offset: int = field(default=-1, compare=False, repr=False)

    def columns(self) -> tuple[int, int] | None:
        """Where on the line the call being made is: its first and last column (in UTF-8 bytes,
        as ``ast`` counts them), or None where Python does not say.

        >>> frame = user_frame()
        >>> frame.columns()[0]
        8
        """
        if self.code is None or self.offset < 0:
            return None
        position = next(itertools.islice(self.code.co_positions(), self.offset // 2, None), None)
        if position is None or position[2] is None or position[3] is None or position[0] != self.line:
            return None
        return position[2], position[3]


def is_users(filename: str) -> bool:
    """Whether a code object's file is the user's: not in PyTorch, this library, the standard
    library or installed packages (``<stdin>`` and doctests count as the user's).

    >>> is_users(torch.__file__), is_users("train.py")
    (False, True)
    """
    return not os.path.abspath(filename).startswith(_NOT_THE_USERS)


def user_frame(depth: int = 1) -> Frame | None:
    """The innermost frame of the user's code that calls this, or None when there is none.

    >>> user_frame().function
    '<module>'
    """
    frame: types.FrameType | None = sys._getframe(depth)
    while frame is not None and not is_users(frame.f_code.co_filename):
        frame = frame.f_back
    if frame is None:
        return None
    return Frame(frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name, frame.f_code, frame.f_lasti)

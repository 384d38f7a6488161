"""Where the user's code is: the innermost frame outside autograd-groups and PyTorch, which is the
line an error or a warning should name."""

from __future__ import annotations

import os
import sys
import warnings

import torch

_OURS = (os.path.dirname(os.path.abspath(__file__)) + os.sep,
         os.path.dirname(os.path.abspath(torch.__file__)) + os.sep)


def user_frame() -> tuple[str, int]:
    """``(file, line)`` of the innermost caller outside this package and PyTorch.

    >>> user_frame()[0]  # doctest: +ELLIPSIS
    '<doctest ...>'
    """
    frame = sys._getframe(1)
    while frame.f_back is not None and os.path.abspath(frame.f_code.co_filename).startswith(_OURS):
        frame = frame.f_back
    return frame.f_code.co_filename, frame.f_lineno


def user_line() -> str:
    """``file:line`` of :func:`user_frame`."""
    file, line = user_frame()
    return f"{file}:{line}"


def warn(message: str, category: type[Warning]) -> None:
    """``warnings.warn``, attributed to the line of :func:`user_frame` (its filters and "once per
    location" act on the user's line, not on this package's)."""
    frame, level = sys._getframe(1), 2
    while frame.f_back is not None and os.path.abspath(frame.f_code.co_filename).startswith(_OURS):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level)

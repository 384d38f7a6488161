"""Whether NaN-safe groups read values on the CPU to spare work: at close, the saved values of the
products the graph's structure could not clear (one sum), and in a hook, the sum of a gradient
before zeroing it. Both need a CPU tensor; on a GPU the same read would make the host wait, so
there the library decides from the structure alone.

:func:`off` turns the reads off in this process, so that a CPU run does what a GPU runs: for the
benchmarks' op counts and the tests that compare the two. It is a process-wide switch, not meant
to be flipped while another thread runs groups.

>>> enabled()
True
>>> with off():
...     enabled()
False
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

_on = [True]


def enabled() -> bool:
    """Whether CPU value reads are on (the default)."""
    return _on[0]


@contextlib.contextmanager
def off() -> Iterator[None]:
    """Inside the block, decide as a GPU does: from the structure, no value read."""
    before = _on[0]
    _on[0] = False
    try:
        yield
    finally:
        _on[0] = before

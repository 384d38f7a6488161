"""Reading a tensor's values on the host to skip work: only where that makes nobody wait.

On the CPU, one reduction read by Python can spare a group many passes (a NaN-safe node whose saved
values are finite needs no hook; a mask that is all false needs no fill). On an accelerator the same
read makes the host wait for the device and stalls its queue, so there the work is always done:
no rule kind or built-in reads a device tensor's value in its forward or backward. Compiled code
and ``torch.func`` transforms cannot branch on data either; their callers check that themselves.

:func:`off` switches the CPU reads off too, so that a test or a benchmark on the CPU runs what an
accelerator runs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

_on = True


def enabled() -> bool:
    """Whether host reads are on (the default): where no tensor is at hand yet to ask
    :func:`allowed` of.

    >>> enabled()
    True
    """
    return _on


def allowed(tensor: torch.Tensor) -> bool:
    """Whether the library may read ``tensor``'s values on the host to skip work: a plain CPU tensor,
    while reads are not switched :func:`off`. Not a subclass: a compiler's fake or functional
    tensor has no values (and torch 2.11 runs a compiled group's opaque call on fake tensors
    without ``torch.compiler.is_compiling()``).

    >>> import torch
    >>> allowed(torch.ones(2)), allowed(torch.ones(2, device="meta"))
    (True, False)
    """
    return _on and type(tensor) is torch.Tensor and tensor.is_cpu


@contextlib.contextmanager
def off() -> Iterator[None]:
    """Inside the block, read no value on the CPU either: run what an accelerator runs.

    Process-wide, since the backward may run on any thread.

    >>> import torch
    >>> with off():
    ...     allowed(torch.ones(2))
    False
    """
    global _on
    previous, _on = _on, False
    try:
        yield
    finally:
        _on = previous

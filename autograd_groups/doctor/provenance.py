"""Where the data of the watched step came from: the torch calls on data alone (no input requires
grad, or grad mode off) and the detached copies, each with whether its tensors were finite as it
ran and which call wrote each of its inputs. A non-finite value that enters the differentiated
step is followed back through them, to the call that computed it of finite values (born there),
to a value the differentiated calls made (detached), or out of the watched run (data: class E).

Only what a birth needs is kept of the tensors: a validation pass under ``torch.no_grad()`` in the
watched run leaves nothing alive.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeAlias

import torch

from .. import compat
from .calls import Call
from .frames import Frame
from .tensors import finite_flags


@dataclass
class DataCall:
    """One call on data: its op and line, whether a number it was given is infinite or NaN (a value
    put there: a fill, an assignment), whether each input and output was finite as it ran, where
    each input came from, and for a birth (finite inputs, a non-finite output) the call with its
    tensors, as a report shows it."""

    op: str
    frame: Frame | None
    given_nonfinite: bool
    finite_in: list[bool]
    finite_out: list[bool]
    sources: list[Source]
    birth: Call | None = None


#: Where an input of a data call came from: the data call that wrote it then (and which of its
#: outputs it was), the tensor itself where it requires grad (the differentiated calls made it), or
#: None (made outside the watched run).
Source: TypeAlias = tuple[DataCall, int] | torch.Tensor | None


@dataclass
class Provenance:
    """The data calls of a watched run, by the tensors they wrote (held weakly: a tensor that died
    cannot enter the step)."""

    written: dict[int, tuple[weakref.ref[torch.Tensor], DataCall, int]] = field(default_factory=dict)

    def source(self, tensor: torch.Tensor) -> Source:
        """Where ``tensor`` came from, as of now."""
        return tensor if tensor.requires_grad else self._writer(tensor)

    def _writer(self, tensor: torch.Tensor) -> tuple[DataCall, int] | None:
        """The data call that last wrote ``tensor``, and which of its outputs it was."""
        entry = self.written.get(id(tensor))
        return (entry[1], entry[2]) if entry is not None and entry[0]() is tensor else None

    def note(self, op: str, frame: Frame | None, numbers: Sequence[float], inputs: list[torch.Tensor],
             sources: list[Source], before: list[bool] | None, outputs: list[torch.Tensor]) -> None:
        """Keep a call that wrote ``outputs`` from ``inputs`` (``sources``, taken before it ran;
        ``before``: an in-place call's inputs' flags, taken then too). A view it wrote in place
        wrote its base too (``xb[:, 2:].div_(s)`` changes ``xb``)."""
        written = list(outputs)
        for output in outputs:
            base = compat.view_base(output)
            if base is not None and before is not None and not any(base is w for w in written):
                written.append(base)
        flags = finite_flags([*inputs, *written]) if before is None else before + finite_flags(written)
        finite_in, finite_out = flags[:len(inputs)], flags[len(inputs):]
        made = DataCall(op, frame, not all(map(math.isfinite, numbers)), finite_in, finite_out, sources)
        if all(finite_in) and not all(finite_out):
            made.birth = Call(op, frame, inputs, written, flags, made.given_nonfinite)
        for index, output in enumerate(written):
            self.written[id(output)] = (weakref.ref(output, self._forget(id(output))), made, index)

    def _forget(self, key: int) -> Callable[[weakref.ref[torch.Tensor]], None]:
        """Drop the entry of a tensor once it dies (its id may be reused; what wrote it no longer
        matters)."""
        def forget(ref: weakref.ref[torch.Tensor]) -> None:
            entry = self.written.get(key)
            if entry is not None and entry[0] is ref:
                del self.written[key]
        return forget

    def origin(self, tensor: torch.Tensor) -> tuple[Call, torch.Tensor] | torch.Tensor | None:
        """Where the non-finite ``tensor`` was made: the birth (a data call that computed it of
        finite values, with the output it made), a tensor the differentiated calls made, or None
        (it entered the watched run so, was put there, or changed after its last watched call)."""
        at = self._writer(tensor)
        seen: set[int] = set()
        while at is not None and id(at[0]) not in seen:
            made, index = at
            seen.add(id(made))
            if made.finite_out[index] or made.given_nonfinite:
                return None
            bad = [i for i, finite in enumerate(made.finite_in) if not finite]
            if not bad:
                return None if made.birth is None else (made.birth, made.birth.outputs[index])
            source = made.sources[bad[0]]
            if isinstance(source, torch.Tensor):
                return source
            at = source
        return None

    def clear(self) -> None:
        self.written.clear()


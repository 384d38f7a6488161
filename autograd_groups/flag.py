"""The special-cases flag: anomaly mode in reverse.

On by default. Off means no rule is applied and a group costs no more than its plain ops. Like
``torch.is_grad_enabled`` it is thread-local; a group instance reads it once, when it is created,
and keeps the decision, so the backward pass obeys it whatever thread the engine runs it on.

``during="backward"`` scopes the flag to the backward passes started inside the block instead. That
state is stashed in PyTorch's propagated thread-local state, which the autograd engine copies into
every thread that runs a node of the pass, so it holds on the engine's device threads too.
"""

from __future__ import annotations

import contextlib
import difflib
import threading
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

import torch

from . import compat
from .decorating import decorate
from .frames import user_frame
from .rules import compiled_groups, registry

F = TypeVar("F", bound=Callable[..., Any])

_BACKWARD_KEY = "autograd_groups.special_cases.backward"


@dataclass(frozen=True)
class FlagState:
    """The flag's value: a default plus per-group exceptions.

    ``key`` is the same value as a tuple of constants: what torch.compile guards on and passes into
    a compiled graph (see :mod:`autograd_groups.groups.compiled`). A group's setting equal to the
    default is left out of it: the same state, the same key.

    >>> FlagState(True, {"norm": True}).key == FlagState().key
    True
    """

    default: bool = True
    groups: Mapping[str, bool] = field(default_factory=dict)
    key: tuple[bool, tuple[tuple[str, bool], ...]] = field(init=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "key", (self.default, tuple(sorted(
            (name, on) for name, on in self.groups.items() if on != self.default))))

    @classmethod
    def from_key(cls, key: tuple[bool, tuple[tuple[str, bool], ...]]) -> FlagState:
        """The state whose :attr:`key` is ``key``."""
        return cls(key[0], dict(key[1]))

    def for_group(self, name: str) -> bool:
        """Whether special cases are on for group ``name``."""
        return self.groups.get(name, self.default)

    def with_setting(self, enabled: bool, groups: Iterable[str] | None) -> FlagState:
        """This state with ``enabled`` set for ``groups`` (all groups when None)."""
        if groups is None:
            return FlagState(enabled)
        return FlagState(self.default, {**self.groups, **dict.fromkeys(groups, enabled)})


_ON = FlagState()


class _Thread(threading.local):
    """This thread's forward-time state, always set: a compiled graph that read it is guarded on
    ``_local.state`` itself. Read as ``getattr(_local, "state", _ON)`` it was guarded through the
    global ``_ON`` instead, the object it first was, and a later ``special_cases(False)`` replayed
    the graph compiled with the rules on."""

    def __init__(self) -> None:
        self.state = FlagState()


_local = _Thread()
_warned: set[str] = set()  # the unknown group names already warned about


def _enabled(enabled: object) -> bool:
    # As torch.set_grad_enabled: "off" or 0 would otherwise pass as a truthy or falsy value.
    if not isinstance(enabled, bool):
        raise TypeError(f"special_cases(enabled): enabled must be True or False, not {enabled!r}")
    return enabled


def _group_names(groups: Iterable[str]) -> tuple[str, ...]:
    if isinstance(groups, str):
        raise TypeError(f"groups must be a list of group names, not the string {groups!r}; "
                        f"write groups=[{groups!r}]")
    names = tuple(groups)
    for name in names:
        if not isinstance(name, str):
            raise TypeError(f"groups must be a list of group names (strings), not one holding {name!r}")
        if name not in _warned and not registry.is_known(name):
            _warn_unknown(name)
    return names


def _warn_unknown(name: str) -> None:
    """Warn, once per name, about a name no group has: a typo there would turn nothing off."""
    _warned.add(name)
    close = difflib.get_close_matches(name, sorted(registry.known_groups()), n=3, cutoff=0.6)
    hint = f"; did you mean {' or '.join(map(repr, close))}?" if close else ""
    file, line = user_frame()
    warnings.warn_explicit(
        f"special_cases(..., groups=[...]): no group is named {name!r}: no rule is registered under "
        f"it and no autograd_group or tag has used it, so the setting changes nothing for it{hint}",
        UserWarning, file, line)


def current_state() -> FlagState:
    """The forward-time flag state of the calling thread."""
    state: FlagState = _local.state
    return state


def enabled_for(name: str) -> bool:
    """``current_state().for_group(name)`` in one call: what every call of a group reads first.

    >>> enabled_for("cdist")
    True
    """
    state: FlagState = _local.state
    return state.groups.get(name, state.default)


@contextlib.contextmanager
def restored(state: FlagState) -> Iterator[None]:
    """Run the block with this thread's forward-time state set to ``state``."""
    previous = current_state()
    _local.state = state
    try:
        yield
    finally:
        _local.state = previous


def _scoped() -> FlagState | None:
    """The state of the innermost ``special_cases(during="backward")`` around the running code."""
    state: FlagState | None = compat.stashed_in_engine_tls(_BACKWARD_KEY)
    return state


def backward_enabled(name: str) -> bool:
    """Whether a rule site of group ``name`` may run in the eager backward pass running now: the
    cheap form of ``backward_state().for_group(name)`` outside compilers, for every rule site.

    >>> backward_enabled("cdist")
    True
    """
    state = _scoped()
    return state is None or state.for_group(name)


def backward_state() -> FlagState:
    """The backward-scoped state a rule site obeys now: that of ``special_cases(during="backward")``
    around the running backward pass; all on outside any.

    Compiled autograd traces the backward with Dynamo in the thread that started it: there the
    Python mirror of the scope is read, which Dynamo guards on. AOTAutograd traces a compiled
    backward once, to run under any scope later: there all is on (see :class:`special_cases`).
    """
    if torch.compiler.is_dynamo_compiling():
        mirrored: FlagState = getattr(_local, "backward", _ON)
        return mirrored
    if compat.is_compiling():
        return _ON
    return _scoped() or _ON


def is_special_cases_enabled(group: str | None = None) -> bool:
    """Whether special cases are on in this thread (for ``group``, if given).

    >>> import autograd_groups as ag
    >>> ag.is_special_cases_enabled()
    True
    """
    state = current_state()
    return state.default if group is None else state.for_group(group)


def set_special_cases(enabled: bool, groups: Iterable[str] | None = None) -> None:
    """Turn special cases on or off in this thread, for all groups or only ``groups``.

    >>> import autograd_groups as ag
    >>> ag.set_special_cases(False, groups=["cdist"])
    >>> ag.is_special_cases_enabled("cdist"), ag.is_special_cases_enabled("other")
    (False, True)
    >>> ag.set_special_cases(True)
    """
    names = None if groups is None else _group_names(groups)
    _local.state = current_state().with_setting(_enabled(enabled), names)


class special_cases:
    """Context manager and decorator that sets the special-cases flag.

    ``during="forward"`` (default): group instances created inside the block record the setting
    and their backward obeys it wherever it runs. ``during="backward"``: backward passes started
    inside the block obey it, whatever the setting was at forward time; this can only turn off
    rules that a group installed at forward, never install new ones, and cannot reach the rules
    that torch.compile fused into a compiled backward (entering it warns when such groups exist).

    >>> import torch, autograd_groups as ag
    >>> with ag.special_cases(False, groups=["cdist"]):
    ...     ag.is_special_cases_enabled("cdist")
    False
    """

    def __init__(self, enabled: bool, groups: Iterable[str] | None = None,
                 during: Literal["forward", "backward"] = "forward") -> None:
        if during not in ("forward", "backward"):
            raise ValueError(f"special_cases(during={during!r}): use 'forward' or 'backward'")
        self.enabled: bool = _enabled(enabled)
        self.groups: tuple[str, ...] | None = None if groups is None else _group_names(groups)
        self.during = during
        self._saved: list[Any] = []

    def __enter__(self) -> None:
        if self.during == "forward":
            self._saved.append(current_state())
            set_special_cases(self.enabled, self.groups)
        else:
            previous = _scoped()
            self._saved.append(previous)
            state = (previous or _ON).with_setting(self.enabled, self.groups)
            compat.stash_in_engine_tls(_BACKWARD_KEY, state)
            _local.backward = state
            _warn_compiled(state)

    def __exit__(self, *exc: object) -> None:
        previous = self._saved.pop()
        if self.during == "forward":
            _local.state = previous
            return
        if previous is None:
            compat.unstash_from_engine_tls(_BACKWARD_KEY)
            del _local.backward
        else:
            compat.stash_in_engine_tls(_BACKWARD_KEY, previous)
            _local.backward = previous

    def __call__(self, fn: F) -> F:
        """``fn`` with the setting at each call; a generator function's body has it at each resume
        of the generator, its caller between resumes not (as ``torch.no_grad``)."""
        return decorate(lambda: special_cases(self.enabled, self.groups, self.during), fn)


def _warn_compiled(state: FlagState) -> None:
    """Say which groups this backward-scoped ``state`` turns off in vain: those torch.compile fused
    into a compiled backward, whose rules follow the flag at their compiled call."""
    fused = [name for name in sorted(compiled_groups.names()) if not state.for_group(name)]
    if fused:
        warnings.warn(
            f"special_cases(..., during='backward') cannot turn off the rules of "
            f"{', '.join(map(repr, fused))} inside torch.compile'd backward graphs: there they follow "
            f"the flag at the compiled call. Set it around the forward instead, "
            f"with ag.special_cases(False, groups=[...]) (documentation: 'torch.compile')", stacklevel=3)

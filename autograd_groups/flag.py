"""The special-cases flag: anomaly mode in reverse.

On by default. Off means no rule is applied and a group costs no more than its plain ops. Like
``torch.is_grad_enabled`` it is thread-local; a group instance reads it once, when it is created,
and keeps the decision, so the backward pass obeys it whatever thread the engine runs it on.

``during="backward"`` scopes the flag to the backward passes started inside the block instead. That
state is stashed in PyTorch's propagated thread-local state, which the autograd engine copies into
every thread that runs a node of the pass, so it holds on the engine's device threads too.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

import torch

F = TypeVar("F", bound=Callable[..., Any])

_BACKWARD_KEY = "autograd_groups.special_cases.backward"


@dataclass(frozen=True)
class FlagState:
    """The flag's value: a default plus per-group exceptions."""

    default: bool = True
    groups: Mapping[str, bool] = field(default_factory=dict)

    def for_group(self, name: str) -> bool:
        """Whether special cases are on for group ``name``."""
        return self.groups.get(name, self.default)

    def with_setting(self, enabled: bool, groups: Iterable[str] | None) -> FlagState:
        """This state with ``enabled`` set for ``groups`` (all groups when None)."""
        if groups is None:
            return FlagState(bool(enabled))
        return FlagState(self.default, {**self.groups, **dict.fromkeys(_group_names(groups), bool(enabled))})


_ON = FlagState()
_local = threading.local()


def _group_names(groups: Iterable[str]) -> tuple[str, ...]:
    if isinstance(groups, str):
        raise TypeError(f"groups must be a list of group names, not the string {groups!r}; "
                        f"write groups=[{groups!r}]")
    return tuple(groups)


def current_state() -> FlagState:
    """The forward-time flag state of the calling thread."""
    return getattr(_local, "state", _ON)


def in_backward_scope() -> bool:
    """Whether the running backward pass was started inside ``special_cases(during="backward")``."""
    return torch._C._is_key_in_tls(_BACKWARD_KEY)


def backward_state() -> FlagState | None:
    """The backward-scoped state of the running backward pass, or None outside any."""
    if torch._C._is_key_in_tls(_BACKWARD_KEY):
        state: FlagState | None = torch._C._get_obj_in_tls(_BACKWARD_KEY)
        return state
    return None


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
    _local.state = current_state().with_setting(enabled, groups)


class special_cases:
    """Context manager and decorator that sets the special-cases flag.

    ``during="forward"`` (default): group instances created inside the block record the setting
    and their backward obeys it wherever it runs. ``during="backward"``: backward passes started
    inside the block obey it, whatever the setting was at forward time; this can only turn off
    rules that a group installed at forward, never install new ones.

    >>> import torch, autograd_groups as ag
    >>> with ag.special_cases(False, groups=["cdist"]):
    ...     ag.is_special_cases_enabled("cdist")
    False
    """

    def __init__(self, enabled: bool, groups: Iterable[str] | None = None,
                 during: Literal["forward", "backward"] = "forward") -> None:
        if during not in ("forward", "backward"):
            raise ValueError(f"special_cases(during={during!r}): use 'forward' or 'backward'")
        self.enabled = bool(enabled)
        self.groups = None if groups is None else _group_names(groups)
        self.during = during
        self._saved: list[Any] = []

    def __enter__(self) -> None:
        if self.during == "forward":
            self._saved.append(current_state())
            set_special_cases(self.enabled, self.groups)
        else:
            previous = backward_state()
            self._saved.append(previous)
            torch._C._stash_obj_in_tls(
                _BACKWARD_KEY, (previous or _ON).with_setting(self.enabled, self.groups))

    def __exit__(self, *exc: object) -> None:
        previous = self._saved.pop()
        if self.during == "forward":
            _local.state = previous
        elif previous is None:
            torch._C._remove_obj_from_tls(_BACKWARD_KEY)
        else:
            torch._C._stash_obj_in_tls(_BACKWARD_KEY, previous)

    def __call__(self, fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with special_cases(self.enabled, self.groups, self.during):
                return fn(*args, **kwargs)

        return wrapper  # type: ignore[return-value]

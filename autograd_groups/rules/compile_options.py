"""What ``compile=`` may say of a group (``@autograd_group(name, compile=...)``, ``compile:`` in a
spec): ``torch.compile``'s options passed on, and the group's own budget of compiled graphs. Which
groups a loaded spec compiles, by name, while it is loaded."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import GroupError

#: The options passed on to ``torch.compile``, and the group's own budget.
TORCH_OPTIONS = ("backend", "mode", "dynamic", "options")
OPTIONS = (*TORCH_OPTIONS, "budget")
#: ``torch.compile``'s modes.
MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
#: Compiled graphs a group may keep (flag settings, dtypes, shapes, grad modes), at most Dynamo's
#: own limit per code object, past which Dynamo would raise under ``fullgraph=True``.
BUDGET = 8

#: The groups a loaded spec declares ``compile:``, and their options.
_declared: dict[str, dict[str, Any]] = {}


def problem(value: object) -> str | None:
    """What is wrong with a ``compile=`` value, or None.

    >>> problem({"backnd": "eager"})
    "has no option 'backnd': the options are backend, mode, dynamic, options, budget"
    """
    if isinstance(value, bool):
        return None
    if not isinstance(value, Mapping):
        return f"is {value!r}: give True, False, or a mapping of the options {', '.join(OPTIONS)}"
    unknown = sorted(set(value) - set(OPTIONS))
    if unknown:
        return f"has no option {', '.join(map(repr, unknown))}: the options are {', '.join(OPTIONS)}"
    budget = value.get("budget", BUDGET)
    if not isinstance(budget, int) or isinstance(budget, bool) or budget < 1:
        return f"has budget {budget!r}: the budget is a number of compiled graphs, an int of 1 or more"
    mode, dynamic, options = (value.get(k) for k in ("mode", "dynamic", "options"))
    if mode is not None and mode not in MODES:
        return f"has mode {mode!r}: torch.compile's modes are {', '.join(map(repr, MODES))}"
    if dynamic is not None and not isinstance(dynamic, bool):
        return f"has dynamic {dynamic!r}: give True, False or None"
    if options is not None and not isinstance(options, Mapping):
        return f"has options {options!r}: give a mapping of inductor's settings"
    if mode is not None and options is not None:
        return "has both mode and options: torch.compile takes one or the other"
    return None


def options_of(name: str, compile: bool | Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The options of group ``name`` declared with ``compile=``, or None for an eager group (None:
    ``compile=`` not given).

    >>> options_of("g", {"backend": "aot_eager"})
    {'backend': 'aot_eager'}
    >>> options_of("g", False) is None
    True
    """
    if compile is None:
        return None
    found = problem(compile)
    if found is not None:
        raise GroupError(f"group {name!r}: compile= {found} (documentation: 'Compiled groups')")
    if compile is False:
        return None
    return {} if compile is True else dict(compile)


def declare(name: str, options: dict[str, Any] | None) -> None:
    """Compile group ``name`` with ``options`` as a spec declares it (None: as the decorator says)."""
    if options is None:
        _declared.pop(name, None)
    else:
        _declared[name] = options


def declared(name: str) -> dict[str, Any] | None:
    """The options a loaded spec compiles group ``name`` with, if one does."""
    return _declared.get(name)

"""The exceptions autograd-groups raises, all derived from :class:`GroupError`, and the warnings it
gives, all derived from :class:`RuleWarning`."""

from __future__ import annotations


class GroupError(Exception):
    """Base class: something about a group, its rules or its spec is wrong."""


class RuleError(GroupError):
    """A rule is malformed, conflicts with another, or failed at backward time."""


class ExpressionError(RuleError):
    """A ``when``/``grad`` expression is malformed; ``col`` is its 1-based column."""

    def __init__(self, message: str, col: int = 1) -> None:
        super().__init__(message)
        self.message = message
        self.col = col


class SpecError(GroupError):
    """A spec file is invalid; ``errors`` holds every ``(file, line, col, message)``."""

    def __init__(self, errors: list[tuple[str, int, int, str]]) -> None:
        self.errors = errors
        super().__init__("\n".join(f"{f}:{line}:{col}: {msg}" for f, line, col, msg in errors))


class NonFiniteError(GroupError):
    """Inside ``detect_nonfinite()``, an op of a group produced a non-finite gradient from a finite
    one, or a non-finite forward value from inputs without one; ``group``, ``instance``, ``op`` and
    ``where`` say where: for a gradient, the forward line that created the instance; for a forward
    value, the line of the op."""

    def __init__(self, message: str, group: str, instance: str, op: str, where: str) -> None:
        super().__init__(message)
        self.group = group
        self.instance = instance
        self.op = op
        self.where = where


class UnsupportedRelease(GroupError, RuntimeError):
    """A feature needs a PyTorch internal that the installed release does not have."""


class InternalError(GroupError):
    """A bug of autograd-groups itself: something its own code guarantees did not hold. Raised by
    :func:`internal_error`'s checks where an ``assert`` would vanish under ``python -O``."""


def internal_error(what: str) -> InternalError:
    """The error for a broken guarantee of the library's own code, ``what``: it says that this is a
    bug of autograd-groups, not of the caller's code, and what to report.

    >>> raise internal_error("no grad_fn")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    autograd_groups.errors.InternalError: autograd-groups internal error: no grad_fn. This is a bug of ...
    """
    return InternalError(
        f"autograd-groups internal error: {what}. This is a bug of autograd-groups, not of your code: "
        f"please report it to the autograd-groups maintainers with this traceback, the code that "
        f"raised it, and the versions of autograd-groups and PyTorch (autograd_groups.__version__, "
        f"torch.__version__)")


class RuleWarning(UserWarning):
    """A rule may not do what its author meant; the message names group, rule and the fix."""


class InertRuleWarning(RuleWarning):
    """A rule never takes effect: it is registered under a name no group uses, or its op is in no
    node of its group's instances."""


class FirstOrderWarning(RuleWarning):
    """A subgradient or NaN-safe rule fired where the function is smooth and gave a gradient that is
    not the function's there (checked the first time it fires at a call site)."""


class SecondOrderWarning(RuleWarning):
    """A second derivative flowed through elements where a subgradient or NaN-safe rule fired:
    there it is the rule's own derivative (0 for a constant gradient), not the function's."""


class RegionWarning(UserWarning):
    """A group declared ``compile=True`` runs eagerly, with the same rules, at calls it cannot
    compile: past its recompile budget, or where the compiler refused it."""


class ForwardModeWarning(UserWarning):
    """A group's tangents could not use PyTorch's forward-mode formulas (an op has none in the
    running release): they are the transpose of the group's whole vjp, whose double backward may be
    NaN where the forward formulas are not. The message names the group and the op."""

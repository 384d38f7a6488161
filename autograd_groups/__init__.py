"""autograd-groups: special-case gradients for compound PyTorch ops, declared once per group.

>>> import torch, autograd_groups as ag
>>> ag.is_special_cases_enabled()
True
"""

from typing import TYPE_CHECKING

from .doctor.inprocess import doctor
from .errors import (
    ExpressionError,
    FirstOrderWarning,
    ForwardModeWarning,
    GroupError,
    InertRuleWarning,
    NonFiniteError,
    RegionWarning,
    RuleError,
    RuleWarning,
    SecondOrderWarning,
    SpecError,
    UnsupportedRelease,
)
from .flag import is_special_cases_enabled, set_special_cases, special_cases
from .groups.group import autograd_group
from .groups.tagging import tag
from .instance import GroupInstance
from .observe.anomaly import detect_nonfinite
from .observe.counters import reset_stats, stats
from .observe.tracer import Trace, trace
from .rules.kinds import NanSafe, Override, OverrideContext, Subgradient
from .rules.registry import list_rules, register_rule, registry_scope, special_case, unregister_rule
from .sites.first_order import is_enabled as rule_checks_enabled
from .sites.first_order import set_enabled as set_rule_checks
from .spec import SpecGroup, SpecHandle, check_spec, load_spec, unload_spec
from .verify.verdict import Report, Row
from .verify.verify import verify

if TYPE_CHECKING:  # type checkers see ``ag.ops``; at run time ``__getattr__`` loads it on first use
    from . import ops

__all__ = [
    "ExpressionError", "GroupError", "GroupInstance", "NanSafe", "Override", "OverrideContext",
    "RuleError", "SpecError", "Subgradient", "Trace", "autograd_group", "is_special_cases_enabled",
    "list_rules", "register_rule", "registry_scope", "reset_stats", "set_special_cases",
    "special_case", "special_cases", "stats", "tag", "trace", "unregister_rule",
    "SpecGroup", "SpecHandle", "check_spec", "load_spec", "unload_spec",
    "NonFiniteError", "detect_nonfinite", "ops", "RuleWarning", "InertRuleWarning", "SecondOrderWarning",
    "__version__", "Report", "Row", "verify", "UnsupportedRelease", "doctor", "FirstOrderWarning",
    "set_rule_checks", "rule_checks_enabled", "ForwardModeWarning", "RegionWarning",
]


def __getattr__(name: str) -> object:
    # ``ag.ops`` loads on first use: importing it registers the built-in library's spec, which a
    # bare ``import autograd_groups`` must not do (``autograd-groups check`` of that spec would clash).
    if name == "ops":
        from importlib import import_module

        return import_module(f"{__name__}.ops")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("autograd-groups")
    except PackageNotFoundError:  # a source tree that was never installed
        return "unknown (not installed)"


__version__ = _version()
del _version, TYPE_CHECKING

"""autograd-groups: special-case gradients for compound PyTorch ops, declared once per group.

>>> import torch, autograd_groups as ag
>>> ag.is_special_cases_enabled()
True
"""

from .counters import reset_stats, stats
from .errors import ExpressionError, GroupError, RuleError, SpecError
from .flag import is_special_cases_enabled, set_special_cases, special_cases
from .group import GroupInstance, autograd_group, tag
from .registry import list_rules, register_rule, registry_scope, unregister_rule
from .rules import NanSafe, Override, OverrideContext, Subgradient, special_case
from .tracer import Trace, trace

__all__ = [
    "ExpressionError", "GroupError", "GroupInstance", "NanSafe", "Override", "OverrideContext",
    "RuleError", "SpecError", "Subgradient", "Trace", "autograd_group", "is_special_cases_enabled",
    "list_rules", "register_rule", "registry_scope", "reset_stats", "set_special_cases",
    "special_case", "special_cases", "stats", "tag", "trace", "unregister_rule",
]

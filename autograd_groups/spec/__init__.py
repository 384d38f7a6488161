"""Declarative groups: spec files in YAML, their validation, and the ``check``/``list`` commands.

>>> import autograd_groups as ag
>>> ag.check_spec("- name: g(Tensor x) -> Tensor\\n  special_cases: [nan_safe: true]\\n")
[]
"""

from .group import SpecGroup
from .loader import SpecHandle, check_spec, load_spec, unload_spec

__all__ = ["SpecGroup", "SpecHandle", "check_spec", "load_spec", "unload_spec"]

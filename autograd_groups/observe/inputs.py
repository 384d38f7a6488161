"""While traced, whether a backward pass gives a group instance non-finite input gradients: the
gradients its nodes pass on to the nodes outside it (``stats`` calls such a group neither safe to
turn off nor fixed by its rules)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from .. import compat, levels
from ..instance import GroupInstance
from . import counters


class _InputCheck:
    """A post-hook on a member node that feeds the instance's boundary: checks the gradients of
    those edges, after the node's rule sites (registered before it) have set theirs."""

    __slots__ = ("instance", "edges")

    def __init__(self, instance: GroupInstance, edges: list[int]) -> None:
        self.instance = instance
        self.edges = edges

    def __call__(self, grad_inputs: Sequence[torch.Tensor | None],
                 grad_outputs: Sequence[torch.Tensor | None]) -> None:
        if compat.is_compiling():
            return
        instance = self.instance
        task = compat.current_graph_task_id()
        if instance.nonfinite_task == task:
            return
        for i in self.edges:
            grad = grad_inputs[i] if i < len(grad_inputs) else None
            if grad is not None and bool(levels.anywhere(~torch.isfinite(grad.detach())).any()):
                instance.nonfinite_task = task
                counters.count_nonfinite(instance.name, instance.site)
                return


def watch(instance: GroupInstance, members: list[Any], boundary: list[Any]) -> None:
    """Check, at every backward pass, the gradients ``members`` pass to ``boundary``."""
    outside = {id(node) for node in boundary}
    for node in members:
        edges = [i for i, (child, _) in enumerate(node.next_functions)
                 if child is not None and id(child) in outside]
        if edges:
            node.register_hook(_InputCheck(instance, edges))

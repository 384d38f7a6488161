"""A compiled group's backward differentiated again: the eager group's backward takes its place.

AOTAutograd's compiled backward has no derivative of its own: a backward through a gradient taken
with ``create_graph=True`` (a gradient penalty, ``torch.autograd.functional.hessian``) raises there.
So where a compiled group's backward runs with ``create_graph=True``, a hook on its node runs the
eager group again on the same inputs (under the flag of its forward) and gives the gradients of that,
with their graph: what the eager group would have given, differentiable again. An ordinary backward
pays one hook call. Where the node cannot be matched with the call's inputs, a backward through it
raises an error that names the group instead of AOTAutograd's, which names none.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from .. import compat, flag
from ..errors import GroupError
from ..nodes import ACCUMULATE_GRAD
from .lifecycle import tensors_of


def eagerly(name: str, out: Any, arguments: Any, eager: Callable[[], Any]) -> None:
    """Make a ``create_graph=True`` backward through the compiled call of group ``name`` (its
    outputs ``out``, its arguments ``arguments``, any nesting of them) run ``eager()``, the eager
    group's call, instead. One hook per call; what it needs is found only when it is needed."""
    outputs = tensors_of(out)
    nodes = {id(t.grad_fn): t.grad_fn for t in outputs if t.grad_fn is not None}
    for node in nodes.values():
        positions = [t.output_nr if t.grad_fn is node else None for t in outputs]
        node.register_hook(functools.partial(_differentiated_again, name, flag.current_state(), positions,
                                             len(nodes) == 1, arguments, eager))


def _differentiated_again(name: str, state: flag.FlagState, positions: list[int | None], alone: bool,
                          arguments: Any, eager: Callable[[], Any], grad_inputs: tuple[Any, ...],
                          grad_outputs: tuple[Any, ...]) -> tuple[Any, ...] | None:
    if not torch.is_grad_enabled():  # an ordinary backward: the compiled gradients stand
        return None
    node = compat.current_autograd_node()  # the compiled call's node: a hook that held it would leak it
    inputs = list({id(a): a for a in compat.tree_flatten(arguments)[0]
                   if isinstance(a, torch.Tensor) and a.requires_grad}.values())
    slots = _slots(node, inputs) if alone and node is not None else None
    if slots is None:
        for grad in grad_inputs:
            if isinstance(grad, torch.Tensor) and grad.grad_fn is not None:
                grad.grad_fn.register_prehook(functools.partial(_refuse, name))
        return None
    return _eager_backward(state, positions, inputs, slots, eager, grad_inputs, grad_outputs)


def _slots(node: Any, inputs: list[torch.Tensor]) -> dict[int, int | None] | None:
    """For each edge of ``node`` that leads anywhere, the input it leads to (None for a second edge
    to the same input: the eager gradient of an input is whole); None where an edge leads elsewhere
    (a tensor the function reads that is not an argument) or an input has no edge."""
    slots: dict[int, int | None] = {}
    for edge, (child, number) in enumerate(node.next_functions):
        if child is None:
            continue
        k = next((k for k, x in enumerate(inputs) if _leads_to(child, number, x)), None)
        if k is None:
            return None
        slots[edge] = None if k in slots.values() else k
    return slots if {k for k in slots.values() if k is not None} == set(range(len(inputs))) else None


def _leads_to(child: Any, number: int, x: torch.Tensor) -> bool:
    """Whether an edge to ``child``'s input ``number`` carries the gradient of ``x``."""
    if x.grad_fn is not None:
        return child is x.grad_fn and number == x.output_nr
    return isinstance(child, ACCUMULATE_GRAD) and child.variable is x  # type: ignore[attr-defined]


def _eager_backward(state: flag.FlagState, positions: list[int | None], inputs: list[torch.Tensor],
                    slots: dict[int, int | None], eager: Callable[[], Any], grad_inputs: tuple[Any, ...],
                    grad_outputs: tuple[Any, ...]) -> tuple[Any, ...]:
    """The eager group's gradients, with their graph, in the places of the compiled ones."""
    with flag.restored(state), torch.enable_grad():
        again = tensors_of(eager())
    pairs = [(o, grad_outputs[k]) for o, k in zip(again, positions)
             if k is not None and grad_outputs[k] is not None and o.requires_grad]
    found = torch.autograd.grad([o for o, _ in pairs], inputs, [g for _, g in pairs], create_graph=True,
                                allow_unused=True)
    picked: list[Any] = list(grad_inputs)
    for edge, k in slots.items():
        picked[edge] = None if k is None else found[k]
    return tuple(picked)


def _refuse(name: str, grad_outputs: tuple[Any, ...]) -> None:
    raise GroupError(
        f"group {name!r} (compile=True): a gradient of its compiled backward was asked for (a backward "
        f"through gradients taken with create_graph=True) where the group reads tensors other than its "
        f"arguments, so its eager backward cannot take the compiled one's place, and a compiled "
        f"backward has no derivative (PyTorch's AOTAutograd does not differentiate it again). Pass "
        f"those tensors as arguments, take second derivatives with torch.func (hessian, "
        f"jacrev(jacrev)), where the group runs eagerly, or declare it without compile= "
        f"(documentation: 'Compiled groups')")

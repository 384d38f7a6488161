"""Which op made a non-finite value in the derivative the rules give.

Where the rules' gradient or Hessian-vector product is NaN, the NaN is often born outside the rule:
at order 2 in the derivative formula of an op the rule does not touch (``torch.sinc``'s double
backward at 0 is NaN while its first derivative is 0 there). ``ag.verify`` and the
:class:`~autograd_groups.errors.SecondOrderWarning` name that op instead of blaming the rule.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from .. import compat, flag, nodes
from ..observe import tracer
from .points import Point, generator, outputs_of, projection, seeded


def nonfinite_origin(point: Point, order: int) -> tuple[str, str] | None:
    """Where the derivative the rules give at ``point`` (``order`` 1: the gradient, 2: a
    Hessian-vector product) first turns non-finite from finite values: the op whose backward did it
    (at order 2, the op whose derivative formula did), and a description of the place, as
    ``("sinc", "sinc's derivative formula (SincBackward0, at its MulBackward0)")``; None where no
    backward makes one.

    >>> import torch
    >>> point = Point(lambda xs: torch.sinc(xs[0]), [torch.zeros(1, dtype=torch.float64)], ["x"])
    >>> nonfinite_origin(point, 1) is None, nonfinite_origin(point, 2)[0]
    (True, 'sinc')
    """
    weights = generator()
    xs = [x.detach().clone().requires_grad_() for x in point.inputs]
    with torch.autograd.set_detect_anomaly(True, check_nan=False), flag.restored(flag.FlagState(True)), \
            tracer.hidden():
        with seeded():
            outputs = outputs_of(point.run(xs))
        if not outputs:
            return None
        projected = projection(outputs, weights)
        if order == 1:
            return _born([projected], lambda: torch.autograd.grad(projected, xs, allow_unused=True))
        grads = [g for g in torch.autograd.grad(projected, xs, create_graph=True, allow_unused=True)
                 if g is not None and g.requires_grad]
        if not grads:
            return None
        product = projection(grads, weights)
        return _born([product], lambda: torch.autograd.grad(product, xs, allow_unused=True))


def _born(roots: Sequence[torch.Tensor], run: Callable[[], Any]) -> tuple[str, str] | None:
    """Run the backward ``run`` of ``roots`` and name the first node whose finite incoming gradients
    gave a non-finite gradient (after the rules' own hooks at it)."""
    found: list[Any] = []

    def hook(grad_inputs: Sequence[torch.Tensor | None], grad_outputs: Sequence[torch.Tensor | None],
             node: Any) -> None:
        if not found and _finite(grad_outputs) and not _finite(grad_inputs):
            found.append(node)

    handles = [node.register_hook(lambda i, o, node=node: hook(i, o, node))
               for node in nodes.reachable(r.grad_fn for r in roots)
               if type(node) is not nodes.ACCUMULATE_GRAD]
    try:
        run()
    finally:
        for handle in handles:
            handle.remove()
    if not found:
        return None
    node = found[0]
    parent = compat.formula_parent(node)
    if parent is None:
        return _op(node), f"{_op(node)}'s backward ({node.name()})"
    return _op(parent), f"{_op(parent)}'s derivative formula ({parent.name()}, at its {node.name()})"


def _finite(grads: Sequence[torch.Tensor | None]) -> bool:
    return all(bool(torch.isfinite(g).all()) for g in grads
               if isinstance(g, torch.Tensor) and (g.is_floating_point() or g.is_complex()))


def _op(node: Any) -> str:
    return nodes.op_name_of_class(type(node).__name__)

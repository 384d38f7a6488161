"""Override rules: a checker over a group's inputs and outputs picks, at backward time, between a
replacement backward and the group's own chain (the fast-path/slow-path of ``prod_backward``).

The group's function runs inside an ``autograd.Function`` on detached inputs, so its subgraph is
separate: when the checker fires it is never executed; otherwise ``torch.autograd.grad`` runs it.
"""

from __future__ import annotations

from typing import Any

import torch

from . import counters, flag
from .errors import RuleError
from .instance import GroupInstance, close_instance, open_instances, pop_instance, tensors_of
from .rules import Override, OverrideContext


class _Run:
    """Everything the Function needs that is not a tensor input."""

    def __init__(self, instance: GroupInstance, fn: Any, args: tuple[Any, ...],
                 kwargs: dict[str, Any], named: dict[int, str]) -> None:
        self.instance = instance
        self.fn = fn
        self.args = args
        self.kwargs = kwargs
        self.named = named
        self.single = True


class _OverrideFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, run: _Run, *inputs: torch.Tensor) -> Any:
        inner = [x.detach().requires_grad_(x.requires_grad) for x in inputs]
        swap = {id(outer): new for outer, new in zip(inputs, inner)}
        args = tuple(swap.get(id(a), a) for a in run.args)
        kwargs = {k: swap.get(id(v), v) for k, v in run.kwargs.items()}
        named = {id(new) if new.grad_fn is None else id(new.grad_fn): run.named.get(
            id(outer.grad_fn) if outer.grad_fn is not None else id(outer), f"arg{i}")
            for i, (outer, new) in enumerate(zip(inputs, inner))}
        with torch.enable_grad():
            out = run.fn(*args, **kwargs)
        outputs = tensors_of(out)
        if not outputs or (not isinstance(out, torch.Tensor) and len(outputs) != len(out)):
            raise RuleError(f"group {run.instance.name!r} (created at {run.instance.where}) has an "
                            f"override rule, so it must return a tensor or a tuple of tensors, "
                            f"not {type(out).__name__}")
        close_instance(run.instance, [t.grad_fn for t in outputs if t.grad_fn is not None], named)
        run.single = isinstance(out, torch.Tensor)
        ctx.run = run
        ctx.inner = (inner, outputs)
        result = tuple(t.detach() for t in outputs)
        # Saved for autograd's version check only: an input or output modified in place before the
        # backward must raise, as with plain ops, rather than feed the check and the replacement.
        ctx.save_for_backward(*inputs, *result)
        return result

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> Any:
        _ = ctx.saved_tensors  # raises if an input or output was modified in place
        run: _Run = ctx.run
        instance = run.instance
        rule: Override = instance.rules.override  # type: ignore[assignment]
        inner, outputs = ctx.inner
        view = OverrideContext(instance.name, tuple(x.detach() for x in inner),
                               tuple(o.detach() for o in outputs))
        state = flag.backward_state()
        enabled = state is None or state.for_group(instance.name)
        instance.note_backward()
        try:
            fired = enabled and bool(rule.check(view))
        except Exception as e:
            raise RuleError(f"group {instance.name!r} (created at {instance.where}), rule "
                            f"{rule.label}: the check raised {e!r}") from e
        counters.count_rule(instance.name, rule.label, rule.kind, fired=fired)
        if instance.graph is not None:
            instance.record_hit(None, rule.label, int(fired))
        if fired:
            results = _replacement(rule, instance, view, grads)
        else:
            wanted = [x for x in inner if x.requires_grad]
            found = iter(torch.autograd.grad(outputs, wanted, grads, retain_graph=True, allow_unused=True))
            results = [next(found) if x.requires_grad else None for x in inner]
        if torch.is_grad_enabled():
            results = _once_differentiable(rule, run, grads, results)
        return (None, *results)


class _NotTwice(torch.autograd.Function):
    """Passes the first ``n`` tensors through unchanged; differentiating them (with respect to any
    of the tensors, the others being what they were computed from) raises ``message``."""

    @staticmethod
    def forward(ctx: Any, message: str, n: int, *tensors: torch.Tensor) -> Any:
        ctx.message = message
        return tuple(t.view_as(t) for t in tensors[:n])

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> Any:
        raise RuleError(ctx.message)


def _once_differentiable(rule: Override, run: _Run, grads: tuple[torch.Tensor, ...],
                         results: list[torch.Tensor | None]) -> list[torch.Tensor | None]:
    """The gradients of a create_graph backward, made to raise if differentiated again.

    The replacement sees detached inputs and the chain runs on a detached copy of the subgraph, so a
    second derivative through either would silently miss the inputs' part: an error instead.
    """
    instance = run.instance
    message = (f"group {instance.name!r} (created at {instance.where}), rule {rule.label}: the "
               f"backward of an override group is not differentiable, so a double backward "
               f"(create_graph=True, hessian, gradgradcheck) cannot go through it; to differentiate "
               f"this group twice, create it with special cases off: "
               f"ag.special_cases(False, groups=[{instance.name!r}])")
    present = [g.detach() for g in results if g is not None]
    sources = [t for t in (*run.args, *run.kwargs.values(), *grads)
               if isinstance(t, torch.Tensor) and t.requires_grad]
    if not present or not sources:
        return results
    wrapped = iter(_NotTwice.apply(message, len(present), *present, *sources))
    return [None if g is None else next(wrapped) for g in results]


def _replacement(rule: Override, instance: GroupInstance, view: OverrideContext,
                 grads: tuple[torch.Tensor, ...]) -> list[torch.Tensor | None]:
    where = f"group {instance.name!r} (created at {instance.where}), rule {rule.label}"
    try:
        result = rule.backward_fn(view, *grads)  # type: ignore[misc]
    except Exception as e:
        raise RuleError(f"{where}: the replacement backward raised {e!r}") from e
    results = list(result) if isinstance(result, (tuple, list)) else [result]
    if len(results) != len(view.inputs):
        raise RuleError(f"{where}: the replacement backward returned {len(results)} gradients "
                        f"for {len(view.inputs)} tensor inputs")
    for i, (g, x) in enumerate(zip(results, view.inputs)):
        if g is not None and (not isinstance(g, torch.Tensor) or g.shape != x.shape):
            got = tuple(g.shape) if isinstance(g, torch.Tensor) else type(g).__name__
            raise RuleError(f"{where}: gradient {i} has shape {got}, but input {i} has shape "
                            f"{tuple(x.shape)}")
    return results


def run_override(instance: GroupInstance, fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
                 inputs: list[torch.Tensor], named: dict[int, str]) -> Any:
    """Call ``fn`` as an override group: one autograd node that wraps the group's own subgraph."""
    run = _Run(instance, fn, args, kwargs, named)
    try:
        if torch._C._functorch.peek_interpreter_stack() is not None:
            label = instance.rules.override.label  # type: ignore[union-attr]
            raise RuleError(
                f"group {instance.name!r} (created at {instance.where}) has an override rule "
                f"({label}), which runs as a torch.autograd.Function that "
                f"torch.func transforms (grad, vjp, jacrev, vmap, ...) cannot trace: use "
                f"torch.autograd.grad or torch.autograd.functional.jacobian for this group, or create "
                f"it with special cases off: ag.special_cases(False, groups=[{instance.name!r}])")
        out = _OverrideFunction.apply(run, *inputs)
    except BaseException:

        if instance in open_instances():
            pop_instance(instance)
        raise
    return out[0] if run.single else out

"""Override rules: a checker over a group's inputs and outputs picks, at backward time, between a
replacement backward and the group's own chain (the fast-path/slow-path of ``prod_backward``).

The group's function runs inside an ``autograd.Function`` on detached inputs, so its subgraph is
separate: when the checker fires it is never executed; otherwise ``torch.autograd.grad`` runs it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from . import counters, flag
from .errors import RuleError
from .rules import Override, OverrideContext

if TYPE_CHECKING:
    from .group import GroupInstance


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
        from .group import _close, _tensors

        inner = [x.detach().requires_grad_(x.requires_grad) for x in inputs]
        swap = {id(outer): new for outer, new in zip(inputs, inner)}
        args = tuple(swap.get(id(a), a) for a in run.args)
        kwargs = {k: swap.get(id(v), v) for k, v in run.kwargs.items()}
        named = {id(new) if new.grad_fn is None else id(new.grad_fn): run.named.get(
            id(outer.grad_fn) if outer.grad_fn is not None else id(outer), f"arg{i}")
            for i, (outer, new) in enumerate(zip(inputs, inner))}
        with torch.enable_grad():
            out = run.fn(*args, **kwargs)
        outputs = _tensors(out)
        if not outputs or (not isinstance(out, torch.Tensor) and len(outputs) != len(out)):
            raise RuleError(f"group {run.instance.name!r} (created at {run.instance.where}) has an "
                            f"override rule, so it must return a tensor or a tuple of tensors, "
                            f"not {type(out).__name__}")
        _close(run.instance, [t.grad_fn for t in outputs if t.grad_fn is not None], named)
        run.single = isinstance(out, torch.Tensor)
        ctx.run = run
        ctx.inner = (inner, outputs)
        return tuple(t.detach() for t in outputs)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> Any:
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
            return (None, *_replacement(rule, instance, view, grads))
        wanted = [x for x in inner if x.requires_grad]
        found = iter(torch.autograd.grad(outputs, wanted, grads, retain_graph=True,
                                         create_graph=torch.is_grad_enabled(), allow_unused=True))
        return (None, *[next(found) if x.requires_grad else None for x in inner])


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
    from .group import _pop

    run = _Run(instance, fn, args, kwargs, named)
    try:
        out = _OverrideFunction.apply(run, *inputs)
    except BaseException:
        from .group import _stack

        if instance in _stack():
            _pop(instance)
        raise
    return out[0] if run.single else out

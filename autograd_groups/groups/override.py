"""Override rules: a checker over a group's inputs and outputs picks, at backward time, between a
replacement backward and the group's own chain (the fast-path/slow-path of ``prod_backward``).

The group's function runs inside an ``autograd.Function`` whose output is detached from the group's
own subgraph: when the checker fires that subgraph is never executed; otherwise
``torch.autograd.grad`` runs it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from .. import compat, flag, host_reads
from ..errors import RuleError
from ..instance import GroupInstance
from ..observe import counters
from ..rules.kinds import Override, OverrideContext
from ..sites import overriding, tangents
from .lifecycle import close_instance, open_instances, pop_instance, tensors_of


@dataclass
class _Run:
    """Everything the Function needs that is not a tensor input: the call, the names of its
    arguments (``named`` by tensor id, ``arguments`` by name) and the place of each tensor input
    (``positions``, by id)."""

    instance: GroupInstance
    fn: Any
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    named: dict[int, str]
    arguments: dict[str, Any]
    positions: dict[int, int]
    single: bool = True

    def context(self, inputs: tuple[torch.Tensor, ...], outputs: tuple[torch.Tensor, ...]) -> OverrideContext:
        """What the rule sees, with ``inputs`` standing for the call's tensor arguments."""
        arguments = {name: inputs[self.positions[id(value)]] if isinstance(value, torch.Tensor) else value
                     for name, value in self.arguments.items()}
        return OverrideContext(self.instance.name, inputs, outputs, arguments)


class _OverrideFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, run: _Run, *inputs: torch.Tensor) -> Any:
        # The group runs on its inputs themselves, so its own subgraph hangs off them: run by
        # torch.autograd.grad in the backward (with create_graph, twice differentiable), or skipped.
        with torch.enable_grad():
            out = run.fn(*run.args, **run.kwargs)
        outputs = tensors_of(out)
        if not outputs or (not isinstance(out, torch.Tensor) and len(outputs) != len(out)):
            raise RuleError(f"group {run.instance.name!r} (created at {run.instance.where}) has an "
                            f"override rule, so it must return a tensor or a tuple of tensors, "
                            f"not {type(out).__name__}")
        close_instance(run.instance, [t.grad_fn for t in outputs if t.grad_fn is not None], run.named)
        run.single = isinstance(out, torch.Tensor)
        ctx.run = run
        ctx.outputs = outputs
        result = tuple(t.detach() for t in outputs)
        # Also what autograd's version check needs: an input or output modified in place before the
        # backward must raise, as with plain ops, rather than feed the check and the replacement.
        ctx.save_for_backward(*inputs, *result)
        return result

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> Any:
        run: _Run = ctx.run
        saved = ctx.saved_tensors  # once: under torch.utils.checkpoint each unpack is single-use
        inputs, outputs = saved[:len(saved) - len(ctx.outputs)], saved[len(saved) - len(ctx.outputs):]
        instance = run.instance
        rule: Override = instance.rules.override  # type: ignore[assignment]
        create_graph = torch.is_grad_enabled()
        # Under create_graph the replacement sees the inputs and the outputs with their graphs, so
        # that what it computes with torch ops can be differentiated again. The outputs are this
        # Function's saved outputs, differentiable through the override itself, as a custom
        # Function's are: the group's own subgraph is the chain the override avoids.
        view = run.context(*(
            (tuple(inputs), tuple(outputs)) if create_graph
            else (tuple(x.detach() for x in inputs), tuple(o.detach() for o in outputs))))
        # Inside a compiled graph the check's answer is data the graph cannot branch on: both
        # backwards are computed and ``torch.where`` picks (the check must give a bool tensor).
        traced = compat.is_compiling()
        enabled = flag.backward_state().for_group(instance.name)
        hint = (" Under torch.compile the check must return its answer as a bool tensor, without "
                "bool() or .item() (documentation: 'torch.compile')" if traced else "")
        where = f"group {instance.name!r} (created at {instance.where}), rule {rule.label}"
        answer = overriding.ask(rule, view, where, hint) if enabled else False
        # So is a bool tensor on an accelerator, where bool() would make the host wait for the
        # device; under create_graph the branch not taken would meet the second derivative.
        picked = traced or (isinstance(answer, torch.Tensor) and not create_graph
                            and not host_reads.allowed(answer))
        try:
            fired = answer if picked else bool(answer)
        except Exception as e:
            raise RuleError(f"{where}: the check raised {e!r}.{hint}") from e
        if not traced:
            # ``fired`` may be a device tensor: the count stays on the device until stats() reads it.
            counters.note_backward(instance)
            counters.count_rule(instance.name, instance.site, rule.label, rule.kind, fired=fired)
            if instance.graph is not None:
                instance.record_hit(None, rule.label, int(fired))
        if picked and isinstance(fired, torch.Tensor):
            chosen = _replacement(rule, instance, view, grads)
            automatic = _automatic(ctx, inputs, grads, create_graph)
            return (None, *overriding.choose(fired, chosen, automatic))
        if fired:
            return (None, *_replacement(rule, instance, view, grads))
        return (None, *_automatic(ctx, inputs, grads, create_graph))


def _automatic(ctx: Any, inputs: tuple[torch.Tensor, ...], grads: tuple[torch.Tensor, ...],
               create_graph: bool) -> list[torch.Tensor | None]:
    """The gradients of the group's own subgraph, by the backward autograd generated for it."""
    wanted = [x for x in inputs if x.requires_grad]
    try:
        found = torch.autograd.grad(ctx.outputs, wanted, grads, retain_graph=True,
                                    create_graph=create_graph, allow_unused=True)
    except RuntimeError as e:
        if "backward through the graph a second time" not in str(e):
            raise
        # A backward through a gradient taken with create_graph that also reaches this group's
        # output (``grad(h * x, x, create_graph=True)`` then ``grad`` of that: it holds ``h``) runs
        # through the group's subgraph twice, as part of that gradient's graph and here, and the
        # first pass freed its saved values: the group runs again on the same inputs for a subgraph
        # of its own, as torch.utils.checkpoint recomputes a forward.
        run: _Run = ctx.run
        with torch.enable_grad():
            again = tensors_of(run.fn(*run.args, **run.kwargs))
        found = torch.autograd.grad(again, wanted, grads, create_graph=create_graph, allow_unused=True)
    given = iter(found)
    return [next(given) if x.requires_grad else None for x in inputs]


def _replacement(rule: Override, instance: GroupInstance, view: OverrideContext,
                 grads: tuple[torch.Tensor, ...]) -> list[torch.Tensor | None]:
    where = f"group {instance.name!r} (created at {instance.where}), rule {rule.label}"
    return rule.run_replacement(view, grads, where)


def run_override(instance: GroupInstance, fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
                 inputs: list[torch.Tensor], named: dict[int, str], arguments: dict[str, Any]) -> Any:
    """Call ``fn`` as an override group: one autograd node that wraps the group's own subgraph."""
    run = _Run(instance, fn, args, kwargs, named, arguments, {id(t): k for k, t in enumerate(inputs)})
    try:
        label = instance.rules.override.label  # type: ignore[union-attr]
        if tangents.running():
            # The outermost group under forward mode or torch.func builds its override's vjp
            # itself (sites/tangents.py); one nested in another group with rules cannot.
            raise RuleError(
                f"group {instance.name!r} (created at {instance.where}) has an override rule "
                f"({label}) and runs under forward-mode AD (jvp, jacfwd, hessian, forward_ad) or a "
                f"torch.func transform inside another group with rules, whose derivatives come from "
                f"torch.func transforms that an override cannot run in. Call it outside that group, "
                f"take derivatives with torch.autograd.grad, or turn its special cases off for this "
                f"pass: ag.special_cases(False, groups=[{instance.name!r}])")
        if compat.peek_interpreter_stack() is not None:
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

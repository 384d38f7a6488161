"""How a group enters a ``torch.compile``'d graph: one opaque call that AOTAutograd traces.

Dynamo cannot trace a group's own Python (it walks autograd nodes and hooks them), and it need not:
it records the group's call as one opaque call (Dynamo's ``nonstrict_trace``). AOTAutograd then
traces that call by running it -- the very code eager mode runs -- on its fake tensors with autograd
on: the group finds its nodes and hooks its rule sites as in eager mode, and when AOTAutograd
differentiates the joint graph, the hooks run and their select/fill is recorded into the compiled
backward, where inductor fuses it with the op's own derivative.

What a group decides at forward time is read here, in the frame Dynamo traces, and passed into the
call as constants: Dynamo guards on them, so a change of the flag or of any rule recompiles (once
per distinct setting) instead of replaying a stale decision.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .. import compat
from ..flag import current_state
from ..observe.anomaly import active as anomaly_active
from ..observe.tracer import active as trace_active
from ..rules.registry import breaks_graph, generation, has_rules
from .lifecycle import lost_rules

#: ``(flag key, registry generation, watched, args, kwargs) -> outputs``: a group's call as a
#: compiled graph traces it.
InGraph = Callable[[tuple[Any, ...], int, bool, tuple[Any, ...], dict[str, Any]], Any]


def needed(name: str) -> bool:
    """Whether a group's instance would do anything here: special cases on with rules to apply, or
    an observer to tell. Where not, compiled code runs the group as its plain ops, at no cost."""
    return (current_state().for_group(name) and has_rules(name)) or watched()


def watched() -> bool:
    return trace_active() is not None or anomaly_active()


def enter_group(name: str, in_graph: InGraph, eager: Callable[..., Any], plain: Callable[..., Any],
                args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Call a decorated group's function from the graph Dynamo is tracing: as one opaque call; as
    its ``plain`` ops where it has nothing to do, or under a strict ``torch.export``, which can
    carry no rule (an error if it has rules); or, where its override's check cannot be traced,
    eagerly (``eager``, which Dynamo does not trace: one graph break)."""
    if compat.is_exporting():
        refuse_export(name)
        return plain(*args, **kwargs)
    if not needed(name):
        return plain(*args, **kwargs)
    if current_state().for_group(name) and breaks_graph(name):
        # A graph break that says why: under fullgraph=True it is the error the user sees.
        compat.graph_break(untraceable_check(name))
        return eager(*args, **kwargs)
    return enter(in_graph, args, kwargs)


def untraceable_check(name: str) -> str:
    """Why a compiled graph cannot hold group ``name``, whose override's check answers with a
    Python bool, and how to fix it."""
    return (f"group {name!r} has an override whose check is not declared to return a tensor: it may "
            f"answer with bool() or .item(), which a compiled graph cannot branch on, so the group runs "
            f"eagerly, as a graph break (an error under fullgraph=True). To compile it into the graph, "
            f"declare the check `-> torch.Tensor` and return a bool tensor (`return (ctx.outputs[0] == 0)"
            f".any()`, without bool()): both backwards are then computed and torch.where picks "
            f"(documentation: 'torch.compile')")


def refuse_export(name: str) -> None:
    """Stop a strict ``torch.export`` at a group whose rules it would lose, saying why."""
    if current_state().for_group(name) and has_rules(name):
        compat.graph_break(lost_rules(name, "torch.export (strict)"))


def enter(in_graph: InGraph, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Call ``in_graph`` as one opaque call of the graph Dynamo is tracing.

    ``in_graph`` must be defined outside the compiled region (at decoration time).
    """
    call = compat.nonstrict_trace(in_graph)
    return call(current_state().key, generation(), watched(), args, kwargs)


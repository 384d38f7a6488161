"""How a group enters a ``torch.compile``'d graph: one opaque call that AOTAutograd traces.

Dynamo cannot trace a group's own Python (it walks autograd nodes and hooks them), and it need not:
it records the group's call as one opaque call (``torch._dynamo.nonstrict_trace``). AOTAutograd then
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

import torch

from .. import flag
from ..observe import anomaly, tracer
from ..rules import registry
from . import lifecycle

#: ``(flag key, registry generation, watched, args, kwargs) -> outputs``: a group's call as a
#: compiled graph traces it.
InGraph = Callable[[tuple[Any, ...], int, bool, tuple[Any, ...], dict[str, Any]], Any]


def enter_group(name: str, in_graph: InGraph, eager: Callable[..., Any], plain: Callable[..., Any],
                args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Call a decorated group's function from the graph Dynamo is tracing: as one opaque call, or,
    where its override's check cannot be traced, eagerly (``eager``, not traced by Dynamo: one graph
    break). Under a
    strict ``torch.export``, which can carry no rule, its ``plain`` ops, or an error if it has rules."""
    enabled = flag.current_state().for_group(name)
    if torch.compiler.is_exporting():
        refuse_export(name, enabled)
        return plain(*args, **kwargs)
    if enabled and registry.breaks_graph(name):
        return eager(*args, **kwargs)
    return enter(in_graph, args, kwargs)


def refuse_export(name: str, enabled: bool) -> None:
    """Stop a strict ``torch.export`` at a group whose rules it would lose, saying why."""
    if enabled and registry.has_rules(name):
        torch._dynamo.graph_break(msg=lifecycle.lost_rules(name, "torch.export (strict)"))


def enter(in_graph: InGraph, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Call ``in_graph`` as one opaque call of the graph Dynamo is tracing.

    ``in_graph`` must be defined outside the compiled region (at decoration time).
    """
    watched = tracer.active() is not None or anomaly.active()
    call = torch._dynamo.nonstrict_trace(in_graph)
    return call(flag.current_state().key, registry.generation(), watched, args, kwargs)

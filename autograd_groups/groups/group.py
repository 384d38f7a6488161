"""``autograd_group``: mark a region of the forward computation as a group, as a decorator or as
a context manager. The instance lifecycle itself lives in :mod:`autograd_groups.groups.lifecycle`."""

from __future__ import annotations

import functools
import inspect
import threading
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import torch
from torch.overrides import TorchFunctionMode

from .. import compat, flag, levels
from ..errors import GroupError
from ..instance import GroupInstance
from ..levels import graph_roots
from ..rules import compile_options, registry
from ..rules.kinds import OverrideContext
from ..sites import forward_sites, second_order, tangents
from . import compiled, region
from .lifecycle import COMPILED, caller, close_instance, lost_rules, open_instance, pop_instance, tensors_of
from .override import run_override

F = TypeVar("F", bound=Callable[..., Any])
_local = threading.local()

_Entry = tuple["autograd_group", "tuple[GroupInstance, _Collector] | None"]


def _entries() -> list[_Entry]:
    """The open ``with`` groups of this thread, innermost last."""
    entries: list[_Entry] | None = getattr(_local, "entries", None)
    if entries is None:
        entries = _local.entries = []
    return entries


def _named_inputs(signature: inspect.Signature | None, args: tuple[Any, ...], kwargs: dict[str, Any],
                  ) -> tuple[dict[int, str], list[torch.Tensor], dict[str, Any]]:
    """The tensor arguments of a call (by the id of the node or leaf that stands for each, and in
    order), and every argument by its parameter name."""
    names: list[str] = []
    values: list[Any] = []
    if signature is not None:
        try:
            bound = signature.bind(*args, **kwargs)
            names, values = list(bound.arguments), list(bound.arguments.values())
        except TypeError:
            pass
    if not names:
        names = [f"arg{i}" for i in range(len(args))] + list(kwargs)
        values = [*args, *kwargs.values()]
    named = _NodeNames()
    tensors: list[torch.Tensor] = []
    for name, value in zip(names, values):
        if isinstance(value, torch.Tensor):
            tensors.append(value)
            node = value.grad_fn
            if node is not None:
                named.held.append(node)
            named[id(node) if node is not None else id(value)] = name
    return named, tensors, dict(zip(names, values))


class _NodeNames(dict[int, str]):
    """Argument names by the id of their tensor's autograd node, holding those nodes: an id holds
    only while its node's Python object lives, and torch 2.11 keeps none alive."""

    def __init__(self) -> None:
        super().__init__()
        self.held: list[object] = []


def _enclosing() -> second_order.Call | None:
    """The call of the function around a group's call that a ``torch.func`` transform
    differentiates, kept for the second-order check (``second_order.enclosing``). Looked for only
    where such transforms can take a second derivative (two or more of them, with grad mode on):
    reading the frames and keeping the call costs about as much as keeping the group's own call."""
    if not torch.is_grad_enabled() or not levels.nested_derivatives():
        return None
    return second_order.enclosing()


class _Collector(TorchFunctionMode):
    """Collects what every torch call inside a ``with`` group made: its autograd nodes, or, while
    Dynamo traces the block, its output tensors (the nodes exist only when AOTAutograd runs it)."""

    def __init__(self) -> None:
        super().__init__()
        self.roots: list[Any] = []
        self.outputs: list[torch.Tensor] = []

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if torch.compiler.is_dynamo_compiling():
            self.outputs.extend(tensors_of(out))
        else:
            self.roots.extend(graph_roots(tensors_of(out)))
        return out


def _open_in_graph(flag_key: tuple[Any, ...], generation: int, watched: bool,
                   args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
    """A ``with`` group's entry as a compiled graph traces it (see compiled.py); the int is there
    because such a call must return something."""
    (name,) = args
    with flag.restored(flag.FlagState.from_key(flag_key)):
        instance = open_instance(name, flag.current_state().for_group(name), COMPILED)
    if instance is not None and instance.rules.override is not None:
        pop_instance(instance)
        raise _with_override(instance)
    _compiled_withs().append(instance)
    return 0


def _close_in_graph(flag_key: tuple[Any, ...], generation: int, watched: bool,
                    args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
    """A ``with`` group's exit as a compiled graph traces it: ``args`` are the block's outputs."""
    instance = _compiled_withs().pop()
    if instance is not None:
        close_instance(instance, list(reversed(graph_roots(list(args)))), {})
    return 0


def _compiled_withs() -> list[GroupInstance | None]:
    """The ``with`` groups open in the compiled graph this thread is tracing, innermost last."""
    found: list[GroupInstance | None] | None = getattr(_local, "compiled_withs", None)
    if found is None:
        found = _local.compiled_withs = []
    return found


def _with_override(instance: GroupInstance) -> GroupError:
    return GroupError(
        f"group {instance.name!r} has an override rule ({instance.rules.override.label}), which "  # type: ignore[union-attr]
        f"needs the group's inputs and outputs: use @autograd_group({instance.name!r}) on a "
        f"function instead of a `with` block (at {instance.where})")


class autograd_group:
    """Mark a region of the forward computation as the group ``name``.

    As a decorator, the function's tensor arguments are the group's inputs and its return values
    its outputs; as a context manager, the nodes made by torch calls inside the block are the
    group's, and the boundary is found from them. ``compile=True`` (or a dict of ``torch.compile``
    options and a ``budget``) makes a decorated function run as its own compiled region when eager
    code calls it (documentation: "Compiled groups").

    >>> import torch, autograd_groups as ag
    >>> @ag.autograd_group("norm2")
    ... def norm2(x):
    ...     return x.pow(2).sum(-1).sqrt()
    >>> with ag.registry_scope():
    ...     _ = ag.register_rule("norm2", ag.Subgradient(op="sqrt", when="result == 0", grad=0))
    ...     x = torch.zeros(3, requires_grad=True)
    ...     norm2(x).backward()
    ...     x.grad
    tensor([0., 0., 0.])
    """

    def __init__(self, name: str, compile: bool | Mapping[str, Any] | None = None) -> None:
        if not isinstance(name, str) or not name:
            raise GroupError(f"a group name must be a non-empty string, not {name!r}")
        self._compile = compile_options.options_of(name, compile)
        # Said, even as False, the decorator's compile= wins over a loaded spec's `compile:`.
        self._compile_said = compile is not None
        if not torch.compiler.is_dynamo_compiling():  # a set Dynamo need not trace into the graph
            registry.declare(name)
        self.name = name
        # The collectors of this block while Dynamo traces it (None under a strict torch.export).
        self._traced: list[_Collector | None] = []

    def __call__(self, fn: F) -> F:
        name = self.name
        try:
            signature: inspect.Signature | None = inspect.signature(fn)
        except (TypeError, ValueError):
            signature = None
        code = getattr(fn, "__code__", None)
        defined = (code.co_filename, code.co_firstlineno) if code is not None else ("<unknown>", 0)

        def run(args: tuple[Any, ...], kwargs: dict[str, Any], enabled: bool, where: tuple[str, int],
                override: bool = True, call: second_order.Call | None = None,
                outer: second_order.Call | None = None, body: Callable[..., Any] = fn,
                options: dict[str, Any] | None = None) -> Any:
            # ``body``: the group's function, or under forward mode one call of it that makes a
            # rule site (sites/forward_sites.py), an instance of the group on its own.
            instance = open_instance(name, enabled, where)
            if instance is None:
                return body(*args, **kwargs)
            instance.part = body is not fn
            # The caller's arguments (under forward mode, ``args`` are the transpose's own copies,
            # which all require grad, and ``call`` is the caller's): what a check of a second
            # derivative re-runs the group on. For the check of a second derivative through a
            # subgradient or NaN-safe rule (an override's is its own); a compiled graph's group is
            # not re-run.
            if (instance.rules.subgradients or instance.rules.nan_safe) and not torch.compiler.is_compiling():
                instance.call = call or second_order.remember(fn, args, kwargs)
                instance.outer = outer if call is not None else _enclosing()
            if instance.recorder is not None:  # ag.verify runs: it will call the group again
                instance.recorder.called(instance, fn, args, kwargs, options)
            if instance.rules.override is not None and override:
                named, inputs, arguments = _named_inputs(signature, args, kwargs)
                return run_override(instance, fn, args, kwargs, inputs, named, arguments)
            named = _named_inputs(signature if body is fn else None, args, kwargs)[0] \
                if instance.graph is not None else {}
            try:
                out = body(*args, **kwargs)
            except BaseException:
                pop_instance(instance)
                raise
            close_instance(instance, graph_roots(tensors_of(out)), named)
            return out

        def context(args: tuple[Any, ...], kwargs: dict[str, Any],
                    outputs: tuple[torch.Tensor, ...]) -> OverrideContext:
            _, inputs, arguments = _named_inputs(signature, args, kwargs)
            return OverrideContext(name, tuple(inputs), outputs, arguments)

        def in_graph(flag_key: tuple[Any, ...], generation: int, watched: bool,
                     args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            # The call as torch.compile traces it (see compiled.py): ``generation`` and ``watched``
            # are there for Dynamo to guard on; the flag is the one Dynamo saw at the call.
            with flag.restored(flag.FlagState.from_key(flag_key)):
                return run(args, kwargs, flag.current_state().for_group(name), defined)

        # What a compiled graph calls, as a graph break, when it cannot trace the group's rules.
        @compat.disable_dynamo
        def eager(*args: Any, **kwargs: Any) -> Any:
            return run(args, kwargs, flag.current_state().for_group(name), defined)

        def opaque(*args: Any, **kwargs: Any) -> Any:
            return compiled.enter(in_graph, args, kwargs)

        declared, said = self._compile, self._compile_said
        # The regions of this function, by the options (the decorator's, or a spec's ``compile:``).
        regions: dict[int, tuple[dict[str, Any], region.Region]] = {}
        @functools.wraps(fn)
        def grouped(*args: Any, **kwargs: Any) -> Any:
            options = declared if said else compile_options.declared(name)
            if torch.compiler.is_dynamo_compiling():
                return compiled.enter_group(name, in_graph, eager, fn, args, kwargs)
            if options is not None:
                where = caller(2)
                found = regions.get(id(options))
                if found is None or found[0] is not options:
                    found = regions[id(options)] = (options, region.Region(name, options, in_graph, fn))
                return found[1](args, kwargs, lambda: eager_group(args, kwargs, where, options))
            return eager_group(args, kwargs, caller(2))

        def eager_group(args: tuple[Any, ...], kwargs: dict[str, Any], where: tuple[str, int],
                        options: dict[str, Any] | None = None) -> Any:
            enabled = flag.enabled_for(name)
            if enabled and registry.has_rules(name):
                override = registry.ruleset(name).override
                if tangents.wanted(args, kwargs, override is not None):
                    # Kept here, at the caller's levels: inside the transpose its forward-mode
                    # levels are hidden, and with them which arguments carry a tangent.
                    kept = second_order.remember(fn, args, kwargs)
                    around = _enclosing()

                    def whole() -> Any:
                        return tangents.run(name, where, fn,
                                            lambda a, k: run(a, k, enabled, where, override=False, call=kept,
                                                             outer=around),
                                            args, kwargs, override, context)

                    # A NaN-safe rule is a group policy, transposed whole; so is an override
                    # under the reverse-mode transforms, and where its check fires; and a rule
                    # whose condition reads the incoming gradient (its vjp is not linear in it,
                    # so one call's vjp has no transpose of its own). Otherwise a group runs by
                    # its rule sites.
                    rules = registry.ruleset(name)
                    reverse_only = override is not None and not tangents.active(args, kwargs)
                    if rules.nan_safe is not None or reverse_only \
                            or any("grad" in rule.when_fn.names for ruled in rules.subgradients.values()
                                   for rule in ruled):
                        return whole()
                    settled = None if override is None else functools.partial(
                        tangents.declined, name, where, override, context, args, kwargs)
                    return forward_sites.run(
                        name, where, fn,
                        lambda f, a, k: run(a, k, enabled, where, override=False, call=kept, outer=around,
                                                body=f),
                        frozenset(rules.subgradients), args, kwargs, whole, settled)
            return run(args, kwargs, enabled, where, options=options)

        def prepare_scriptable() -> Callable[..., Any]:
            # torch.jit.script calls this on each function it compiles: TorchScript would compile
            # the plain ops and lose the rules, silently.
            if flag.current_state().for_group(name) and registry.has_rules(name):
                raise GroupError(lost_rules(name, "TorchScript (torch.jit.script)"))
            return fn

        grouped.__autograd_group__ = name  # type: ignore[attr-defined]
        grouped.__prepare_scriptable__ = prepare_scriptable  # type: ignore[attr-defined]
        return grouped  # type: ignore[return-value]

    def __enter__(self) -> GroupInstance | None:
        if self._compile is not None:
            raise GroupError(f"group {self.name!r}: compile= compiles a decorated function; a `with` block "
                             f"is compiled as part of the function around it (decorate that, or compile "
                             f"it with torch.compile)")
        if torch.compiler.is_dynamo_compiling():
            # The instance opens when AOTAutograd runs the graph; there is none to return here.
            if compat.is_exporting():
                compiled.refuse_export(self.name)
            if compat.is_exporting() or not compiled.needed(self.name):
                self._traced.append(None)
                return None
            compiled.enter(_open_in_graph, (self.name,), {})
            collector = _Collector()
            collector.__enter__()
            self._traced.append(collector)
            return None
        entries = _entries()
        enabled = flag.current_state().for_group(self.name)
        if enabled and tangents.active() and not tangents.running() and registry.has_rules(self.name):
            raise tangents.refuse_block(self.name, caller(2), "a `with` block")
        instance = open_instance(self.name, enabled, caller(2))
        if instance is None:
            entries.append((self, None))
            return None
        if instance.rules.override is not None:
            pop_instance(instance)
            raise _with_override(instance)
        collector = _Collector()
        collector.__enter__()
        entries.append((self, (instance, collector)))
        return instance

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        if torch.compiler.is_dynamo_compiling():
            collector = self._traced.pop()
            if collector is None:
                return
            collector.__exit__(exc_type, *exc)
            compiled.enter(_close_in_graph, tuple(collector.outputs), {})
            return
        entries = _entries()
        if not entries or entries[-1][0] is not self:
            raise GroupError(f"group {self.name!r} was closed out of order: groups must nest like "
                             f"`with` blocks")
        entry = entries.pop()[1]
        if entry is None:
            return
        instance, collector = entry
        collector.__exit__(exc_type, *exc)
        if exc_type is not None:
            pop_instance(instance)
            return
        close_instance(instance, list(reversed(collector.roots)), {})

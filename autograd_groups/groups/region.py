"""A group compiled as its own region: ``@autograd_group(name, compile=True)``.

Called from eager code, the group runs through its own ``torch.compile`` of one of two small entry
functions. With special cases on for it and rules registered, the entry makes the group's opaque
call (compiled.py), as a model compiled around the group does: AOTAutograd runs the group and
records the rules' compare and select into the compiled backward, and inductor fuses them with the
ops' derivatives, so no rule is realised a second way. Otherwise the entry runs the group's function
as plain ops.

Each entry of each group has a code object of its own, so each has a Dynamo cache of its own:
groups do not share one recompile limit. What the eager caller decided (the flag's setting, the
registry's generation, whether an observer or a transform needs the eager group) is decided before
the call; the first two are arguments Dynamo guards on by value: one graph per setting, and a
changed registry compiles once more. The entry reads no global state, so its guards are few.
Past the group's budget of compiled graphs, a call that would compile again runs eagerly
(``set_stance("eager_on_recompile")`` around the call: graphs already compiled still serve).

Where a compiled region cannot run, the eager group runs, with the same rules, and the reason is
counted for ``stats``: under a ``torch.func`` transform or forward mode (Dynamo refuses to trace
them from eager code), under a tracer (``torch.jit.trace``, ``torch.export``, another compiler's
trace), while an observer records instances, where the group's override check cannot be
traced, and where Dynamo or the backend refused to compile it (said once, by a warning).
"""

from __future__ import annotations

import contextlib
import threading
import types
import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch

from .. import compat
from ..errors import RegionWarning
from ..flag import current_state
from ..frames import user_frame
from ..observe import counters
from ..rules.compile_options import BUDGET, TORCH_OPTIONS
from ..rules.registry import breaks_graph, generation, has_rules
from . import compiled, differentiated_again


class Region:
    """Group ``name`` compiled as its own region: ``in_graph`` is its opaque call (compiled.py),
    ``plain`` its function, which runs as plain ops where the group has no rule to apply."""

    def __init__(self, name: str, options: Mapping[str, Any], in_graph: compiled.InGraph,
                 plain: Callable[..., Any]) -> None:
        self.name = name
        self._budget: int = options.get("budget", BUDGET)
        self._options = {"fullgraph": True, **{k: v for k, v in options.items() if k in TORCH_OPTIONS}}
        # The eager group for the call running now in this thread, which an entry runs when Dynamo
        # runs it without compiling.
        self._local = threading.local()
        self._in_graph, self._plain = in_graph, plain
        #: The compiled entries, with rules and plain, made at the first call (this imports Dynamo).
        self._entries: tuple[Callable[..., Any], Callable[..., Any]] | None = None
        self._codes: tuple[types.CodeType, ...] = ()
        #: Whether the group's caches hold its budget of graphs: a call that would compile runs eagerly.
        self._full = False
        #: Why Dynamo or the backend would not compile this group: it runs eagerly from then on.
        self.refused: str | None = None
        #: Bytes (distinct storages) its compiled region saved for backward at the last call counted.
        self.saved_bytes: int | None = None
        self._count_saved = True
        self._warned: set[str] = set()
        counters.add_region(name, self)

    @property
    def compiles(self) -> int:
        """How many compiled graphs the group's caches hold."""
        return sum(compat.compiled_entries(code) for code in self._codes)

    def declines(self) -> str | None:
        """Why this call must run eagerly, or None to run it compiled."""
        if compat.peek_interpreter_stack() is not None:
            return "torch.func transform"
        if compat.dual_level() >= 0:
            return "forward mode"
        if compat.is_jit_tracing():
            return "torch.jit.trace"
        if compat.is_exporting():
            return "torch.export"
        if compat.is_compiling():
            return "inside another compiler's trace"
        if compiled.watched():
            return "observed by trace or detect_nonfinite"
        if current_state().for_group(self.name) and breaks_graph(self.name):
            return "override check not traceable"
        return self.refused and "compile refused"

    def __call__(self, args: tuple[Any, ...], kwargs: dict[str, Any], eager: Callable[[], Any]) -> Any:
        """Run the call compiled, or ``eager()``, the eager group's call, for the reason
        :meth:`declines` gives."""
        reason = self.declines()
        if reason is not None:
            counters.count_region_call(self.name, reason)
            return eager()
        self._local.eager, self._local.ran_eagerly = eager, False
        if self._entries is None:
            self._entries = self._compile()
        with_rules, plain = self._entries
        state = current_state()
        graphs = compat.graphs_compiled()
        # The bytes it saves for backward, counted at the first call of each new graph, where no
        # hook of the user's (a checkpoint's, save_on_cpu) would be hidden by the counting one.
        counting = self._count_saved and torch.is_grad_enabled() and compat.top_saved_tensors_hooks() is None
        saved: dict[int, int] = {}
        stance = torch.compiler.set_stance("eager_on_recompile") if self._full else contextlib.nullcontext()
        try:
            with stance, _saved_bytes(saved) if counting else contextlib.nullcontext():
                # The flag's setting and the registry's generation are arguments: Dynamo guards on
                # their values, one graph per setting, and a changed registry compiles once more.
                if state.for_group(self.name) and has_rules(self.name):
                    # A str, which Dynamo guards by value: an int that changes is made dynamic
                    # after its second value, and the graph would serve every later registry.
                    out = with_rules(_relevant(state.key), str(generation()), *args, **kwargs)
                else:
                    out = plain(*args, **kwargs)
        except compat.compile_refusal() as error:
            # The eager group raises the user's own error, if that is what stopped the compiler.
            out = eager()
            # The backend's own error, where Dynamo wraps it ("backend='...' raised:" and no more).
            cause = getattr(error, "inner_exception", None) or error
            said = [line for line in str(cause).splitlines() if line.strip()]
            self.refused = f"{type(cause).__name__}: {said[0] if said else ''}"
            self._warn("refused", f"runs eagerly from now on: the compiler refused it ({self.refused})")
            counters.count_region_call(self.name, "compile refused")
            return out
        if counting and not self._local.ran_eagerly:
            self.saved_bytes, self._count_saved = sum(saved.values()), False
        if graphs != compat.graphs_compiled():  # this call compiled a graph (or another thread did)
            self._full = self.compiles >= self._budget
            self._count_saved = True
        if not self._local.ran_eagerly:
            counters.count_region_call(self.name, "compiled")
            if torch.is_grad_enabled():
                differentiated_again.eagerly(self.name, out, (args, kwargs), eager)
        return out

    def _compile(self) -> tuple[Callable[..., Any], Callable[..., Any]]:
        self._budget = min(self._budget, compat.recompile_limit())
        opaque = compat.nonstrict_trace(self._in_graph)
        plain = self._plain

        # Positional-only, so that the group's own keyword arguments may have any name.
        def with_rules(flag_key: tuple[Any, ...], generation: str, /, *args: Any, **kwargs: Any) -> Any:
            if torch.compiler.is_dynamo_compiling():
                return opaque(flag_key, int(generation), False, args, kwargs)
            return self._ran_eagerly()

        def without(*args: Any, **kwargs: Any) -> Any:
            if torch.compiler.is_dynamo_compiling():
                return plain(*args, **kwargs)
            return self._ran_eagerly()

        # A code object of its own per group and entry: a Dynamo cache of its own.
        entries = []
        for entry, kind in ((with_rules, "rules"), (without, "plain")):
            entry.__code__ = entry.__code__.replace(co_name=f"autograd_group_{kind}_{self.name}")
            entries.append(torch.compile(entry, **self._options))
        self._codes = (with_rules.__code__, without.__code__)
        return entries[0], entries[1]

    def _ran_eagerly(self) -> Any:
        # Dynamo ran the entry without compiling it: only the budget's stance makes it do that.
        self._local.ran_eagerly = True
        compiles = self.compiles
        self._full = compiles >= self._budget  # torch._dynamo.reset() empties the cache
        counters.count_region_call(self.name, "recompile budget spent")
        self._warn("budget", f"runs eagerly at calls that would compile it again: it has {compiles} "
                             f"compiled graphs, its recompile budget (compile={{'budget': N}} raises it, up "
                             f"to Dynamo's recompile_limit)")
        return self._local.eager()

    def _warn(self, key: str, why: str) -> None:
        if key in self._warned:
            return
        self._warned.add(key)
        file, line = user_frame()
        warnings.warn_explicit(
            f"group {self.name!r} (compile=True) {why}; the eager group has the same rules, and "
            f"`autograd-groups stats` counts its calls by how they ran",
            RegionWarning, file, line)


def _relevant(key: tuple[bool, tuple[tuple[str, bool], ...]]) -> tuple[bool, tuple[tuple[str, bool], ...]]:
    """The flag's ``key`` without the settings of groups that have no rules, which nothing in a
    compiled graph reads: a setting for such a name compiles no graph of its own."""
    default, groups = key
    return default, tuple((name, on) for name, on in groups if has_rules(name))


@contextlib.contextmanager
def _saved_bytes(storages: dict[int, int]) -> Iterator[None]:
    """Count into ``storages`` (by address) the bytes of the storages saved for backward in the block."""
    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
        # Detached: an output packed with its own node would hold that node, and the graph, in a
        # cycle through C++ that the collector cannot see.
        return t.detach()

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield

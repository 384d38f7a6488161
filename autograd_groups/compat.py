"""Every private PyTorch API the library touches, found once, at import, on the installed release.

The rest of the package reaches ``torch._C``, ``torch._functorch`` and ``torch._dynamo`` only
through this module (tests/test_compat.py checks it), so that a release that renames or drops one
breaks one line here, not a backward pass. Where a supported release (DESIGN.md §6: 2.11 to 2.15)
lacks a name, the feature it serves uses a public equivalent or raises :class:`UnsupportedRelease`
naming the feature and the release -- never an ``AttributeError`` from ``torch._C``.

Dynamo itself is imported lazily: importing it costs a second and changes how compiled autograd
treats saved values, so the library never imports it for a user who does not compile.
"""

from __future__ import annotations

import ctypes
import sys
from collections.abc import Callable
from typing import Any

import torch
from torch._C import _functorch
from torch._functorch.pyfunctorch import (
    retrieve_all_functorch_interpreters,
    temporarily_clear_interpreter_stack,
)

from .errors import UnsupportedRelease

__all__ = [
    "ACCUMULATE_GRAD", "NODE_CLASSES", "TransformType", "add_batch_dim", "compiled_autograd_may_run",
    "current_autograd_node", "current_graph_task_id", "disable_dynamo", "dynamo_imported", "find",
    "get_unwrapped", "graph_break", "has_storage", "is_batchedtensor", "is_compiling", "is_exporting",
    "is_functorch_wrapped_tensor", "is_jit_tracing", "maybe_get_bdim", "maybe_get_level",
    "nonstrict_trace", "peek_interpreter_stack", "pop_saved_tensors_hooks", "push_saved_tensors_hooks",
    "retrieve_all_functorch_interpreters", "sequence_nr", "stash_in_engine_tls", "stashed_in_engine_tls",
    "temporarily_clear_interpreter_stack", "top_saved_tensors_hooks", "unstash_from_engine_tls",
]


def find(owner: Any, name: str, feature: str) -> Any:
    """``owner.name``, or where this release lacks it a function that raises
    :class:`UnsupportedRelease` naming ``feature`` and the release when called.

    >>> find(torch._C, "_current_graph_task_id", "rule sites")()
    -1
    >>> find(torch._C, "_no_such_name", "the example")()
    Traceback (most recent call last):
    ...
    autograd_groups.errors.UnsupportedRelease: the example needs torch._C._no_such_name, ...
    """
    found = getattr(owner, name, None)
    if found is not None:
        return found
    where = f"{owner.__name__}.{name}"

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise UnsupportedRelease(
            f"{feature} needs {where}, which PyTorch {torch.__version__} does not have; "
            f"autograd-groups supports PyTorch 2.11 to 2.15: install one of those releases")

    return refuse


# torch.func: the transform stack and its wrapped tensors.
TransformType: Any = _functorch.TransformType
_FUNC = "a group under torch.func"
peek_interpreter_stack: Callable[[], Any] = find(_functorch, "peek_interpreter_stack", _FUNC)
add_batch_dim: Callable[..., torch.Tensor] = find(_functorch, "_add_batch_dim", _FUNC)
get_unwrapped: Callable[[torch.Tensor], torch.Tensor] = find(_functorch, "get_unwrapped", _FUNC)
is_batchedtensor: Callable[[torch.Tensor], bool] = find(_functorch, "is_batchedtensor", _FUNC)
is_functorch_wrapped_tensor: Callable[[torch.Tensor], bool] = find(
    _functorch, "is_functorch_wrapped_tensor", _FUNC)
maybe_get_bdim: Callable[[torch.Tensor], int] = find(_functorch, "maybe_get_bdim", _FUNC)
maybe_get_level: Callable[[torch.Tensor], int] = find(_functorch, "maybe_get_level", _FUNC)

# The autograd engine and its generated node classes.
NODE_CLASSES: Any = torch._C._functions
ACCUMULATE_GRAD: type = NODE_CLASSES.AccumulateGrad
_SITES = "a rule site"
current_graph_task_id: Callable[[], int] = find(torch._C, "_current_graph_task_id", _SITES)
current_autograd_node: Callable[[], Any] = find(torch._C, "_current_autograd_node", _SITES)
sequence_nr: Callable[[], int] = find(torch._C._autograd, "_get_sequence_nr", "a group instance")
has_storage: Callable[[torch.Tensor], bool] = find(torch._C, "_has_storage", _SITES)
is_jit_tracing: Callable[[], bool] = find(torch._C, "_is_tracing", "a group under torch.jit.trace")


_SAVED = "a rule that reads saved values under saved-tensor hooks"
_top_saved = find(torch._C._autograd, "_top_saved_tensors_default_hooks", _SAVED)
push_saved_tensors_hooks: Callable[[Callable[..., Any], Callable[..., Any]], None] = find(
    torch._C._autograd, "_push_saved_tensors_default_hooks", _SAVED)
pop_saved_tensors_hooks: Callable[[], None] = find(
    torch._C._autograd, "_pop_saved_tensors_default_hooks", _SAVED)


def top_saved_tensors_hooks() -> tuple[Callable[..., Any], Callable[..., Any]] | None:
    """The innermost saved-tensor hooks (pack, unpack) in force, or None.

    >>> top_saved_tensors_hooks() is None
    True
    """
    top: tuple[Callable[..., Any], Callable[..., Any]] | None = _top_saved(False)
    return top


# The Python objects the engine copies into every thread that runs a node of a backward pass.
_SCOPE = "special_cases(during='backward')"
_stash = find(torch._C, "_stash_obj_in_tls", _SCOPE)
_is_stashed = find(torch._C, "_is_key_in_tls", _SCOPE)
_get_stashed = find(torch._C, "_get_obj_in_tls", _SCOPE)


def _own(value: object) -> None:
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(value))


def _stash_takes_a_reference() -> bool:
    """Whether stashing an object takes a reference to it. torch 2.11's does not, yet drops one when
    the entry is replaced: each replacement then frees what Python still uses (the segmentation
    faults of the backward-scoped flag there). Asked once, of a probe, at import."""

    class Probe:
        pass

    key, probe = "autograd_groups.compat.probe", Probe()
    before = sys.getrefcount(probe)
    _stash(key, probe)
    taken = sys.getrefcount(probe) > before
    if not taken:
        _own(probe)  # the reference the replacement below drops
        _own(None)
    _stash(key, None)
    return taken


_STASH_TAKES_A_REFERENCE = _stash_takes_a_reference()


def stash_in_engine_tls(key: str, value: object) -> None:
    """Set ``key`` in the thread-local state the autograd engine propagates to its worker threads.

    >>> stash_in_engine_tls("autograd_groups.doc", 1); stashed_in_engine_tls("autograd_groups.doc")
    1
    >>> unstash_from_engine_tls("autograd_groups.doc"); stashed_in_engine_tls("autograd_groups.doc")
    """
    if not _STASH_TAKES_A_REFERENCE:
        _own(value)  # given to the entry, which drops it when replaced
    _stash(key, value)


def stashed_in_engine_tls(key: str) -> Any:
    """The value :func:`stash_in_engine_tls` set for ``key`` in this thread, or None."""
    return _get_stashed(key) if _is_stashed(key) else None


def _unstash_by_none(key: str) -> None:
    # 2.11 cannot erase a key: None reads as unset. The entry then lives as long as the thread.
    stash_in_engine_tls(key, None)


#: Remove ``key`` from the engine-propagated state (on releases that cannot, set it to None).
unstash_from_engine_tls: Callable[[str], None] = getattr(torch._C, "_remove_obj_from_tls", _unstash_by_none)


_FAKE = torch._C._TorchDispatchModeKey.FAKE


def is_compiling() -> bool:
    """Whether a compiler traces the code running now: ``torch.compiler.is_compiling()``, or fake
    tensors in force, as where torch 2.11 runs a compiled group's opaque call without that flag.

    >>> is_compiling()
    False
    """
    return torch.compiler.is_compiling() or torch._C._get_dispatch_mode(_FAKE) is not None


def is_exporting() -> bool:
    """Whether ``torch.export`` is tracing the code running now, asked of the flag itself: 2.11's
    Dynamo answers True for ``torch.compiler.is_exporting()`` under any ``torch.compile``.

    >>> is_exporting()
    False
    """
    if hasattr(torch.compiler, "_is_exporting_flag"):
        return torch.compiler._is_exporting_flag is True
    return torch.compiler.is_exporting()


# Dynamo, reached only once the user's program has imported it.
def dynamo_imported() -> bool:
    """Whether ``torch._dynamo`` is imported: before it is, nothing can be compiled.

    >>> isinstance(dynamo_imported(), bool)
    True
    """
    return "torch._dynamo" in sys.modules


def compiled_autograd_may_run() -> bool:
    """Whether a backward of the graph being built now may run under compiled autograd: it is
    enabled (``torch._dynamo.compiled_autograd._enable``) or configured
    (``torch._dynamo.config.compiled_autograd``). Neither can be before Dynamo is imported. Read
    with a default where a release lacks one of the two module globals.

    >>> compiled_autograd_may_run()
    False
    """
    if not dynamo_imported():
        return False
    state = sys.modules.get("torch._dynamo.compiled_autograd")
    config = sys.modules.get("torch._dynamo.config")
    return bool(getattr(state, "compiled_autograd_enabled", False)
                or getattr(config, "compiled_autograd", False))


def graph_break(msg: str) -> None:
    """Break the graph Dynamo is tracing, with ``msg`` as the reason (the error under fullgraph)."""
    import torch._dynamo

    torch._dynamo.graph_break(msg=msg)


def nonstrict_trace(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` as one opaque call that Dynamo records and AOTAutograd traces by running it."""
    import torch._dynamo

    wrapped: Callable[..., Any] = torch._dynamo.nonstrict_trace(fn)
    return wrapped


#: Keep Dynamo out of a function (it imports Dynamo only when first called, not at decoration).
disable_dynamo: Callable[[Callable[..., Any]], Callable[..., Any]] = torch._disable_dynamo

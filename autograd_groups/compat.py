"""Every private PyTorch API the library touches, found once, at import, on the installed release.

The rest of the package reaches ``torch._C``, ``torch._functorch``, ``torch._dynamo``,
``torch.utils._pytree`` -- any ``torch._*`` or ``torch.utils._*`` name -- only through this module
(tests/test_compat.py checks it), so that a release that renames or drops one breaks one line here,
not a backward pass, nor ``import autograd_groups``: every name is looked up with :func:`find`.
Where a supported release (2.11 to 2.15; documentation: "Guarantees") lacks a name, the feature it
serves uses a public equivalent or raises :class:`UnsupportedRelease` naming the feature and the
release -- never an ``AttributeError`` from ``torch._C``.

Dynamo itself is imported lazily: importing it costs a second and changes how compiled autograd
treats saved values, so the library never imports it for a user who does not compile.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import importlib
import inspect
import sys
import types
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.autograd.forward_ad as forward_ad

from .errors import UnsupportedRelease, internal_error

__all__ = [
    "ACCUMULATE_GRAD", "NODE_CLASSES", "TransformType", "add_batch_dim", "compile_refusal",
    "compiled_autograd_may_run", "compiled_entries", "graphs_compiled",
    "current_autograd_node", "current_graph_task_id", "disable_dynamo", "dual_level", "dynamo_imported",
    "find", "formula_parent", "get_unwrapped", "grad_transform_codes", "graph_break", "has_storage",
    "input_metadata", "is_batchedtensor",
    "in_torch_func_jvp", "is_compiling", "is_exporting", "is_functorch_wrapped_tensor", "is_jit_tracing",
    "is_zero_tensor",
    "legacy_vmap_suspended",
    "maybe_get_bdim",
    "maybe_get_level", "node_sequence_nr", "nonstrict_trace", "op_schema", "peek_interpreter_stack",
    "pop_saved_tensors_hooks", "recompile_limit",
    "push_saved_tensors_hooks", "retrieve_all_functorch_interpreters", "saved_attribute",
    "saved_names_of_class", "saved_value", "saves_as_tensor", "sequence_nr",
    "set_fwd_grad_enabled", "stash_in_engine_tls", "stashed_in_engine_tls",
    "temporarily_clear_interpreter_stack", "top_saved_tensors_hooks", "tree_flatten", "tree_unflatten",
    "unstash_from_engine_tls", "view_base",
]


def _refusal(feature: str, where: str) -> UnsupportedRelease:
    return UnsupportedRelease(
        f"{feature} needs {where}, which PyTorch {torch.__version__} does not have; "
        f"autograd-groups supports PyTorch 2.11 to 2.15: install one of those releases")


class _Missing:
    """Stands for a name this release lacks: calling it, or reading a name of it (a member of a
    missing enum), raises the refusal, so that only the feature that needs the name fails."""

    def __init__(self, feature: str, where: str) -> None:
        self._feature, self._where = feature, where

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise _refusal(self._feature, self._where)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):  # introspection (copy, pickle, inspect) asks for these
            raise AttributeError(name)
        raise _refusal(self._feature, f"{self._where}.{name}")


def _lookup(owner: Any, name: str) -> Any:
    """``owner.name`` for a dotted ``name``, or None where a part of it is missing."""
    for part in name.split("."):
        owner = getattr(owner, part, None)
        if owner is None:
            return None
    return owner


def find(owner: Any, name: str, feature: str) -> Any:
    """``owner.name`` (``name`` may be dotted), or where this release lacks it a stand-in that
    raises :class:`UnsupportedRelease` naming ``feature`` and the release when called or read.

    >>> find(torch._C, "_current_graph_task_id", "rule sites")()
    -1
    >>> find(torch._C, "_no_such_name", "the example")()
    Traceback (most recent call last):
    ...
    autograd_groups.errors.UnsupportedRelease: the example needs torch._C._no_such_name, ...
    >>> find(torch._C, "_no_such_enum", "the example").Member
    Traceback (most recent call last):
    ...
    autograd_groups.errors.UnsupportedRelease: the example needs torch._C._no_such_enum.Member, ...
    """
    found = _lookup(owner, name)
    return _Missing(feature, f"{owner.__name__}.{name}") if found is None else found


def _module(name: str) -> types.ModuleType:
    """The module ``name``, or where this release lacks it an empty one, in which :func:`find`
    then finds nothing."""
    try:
        return importlib.import_module(name)
    except ImportError:
        return types.ModuleType(name)


# torch.func: the transform stack and its wrapped tensors.
_FUNC = "a group under torch.func"
TransformType: Any = find(torch._C, "_functorch.TransformType", _FUNC)
peek_interpreter_stack: Callable[[], Any] = find(torch._C, "_functorch.peek_interpreter_stack", _FUNC)
add_batch_dim: Callable[..., torch.Tensor] = find(torch._C, "_functorch._add_batch_dim", _FUNC)
get_unwrapped: Callable[[torch.Tensor], torch.Tensor] = find(torch._C, "_functorch.get_unwrapped", _FUNC)
is_batchedtensor: Callable[[torch.Tensor], bool] = find(torch._C, "_functorch.is_batchedtensor", _FUNC)
is_functorch_wrapped_tensor: Callable[[torch.Tensor], bool] = find(
    torch._C, "_functorch.is_functorch_wrapped_tensor", _FUNC)
maybe_get_bdim: Callable[[torch.Tensor], int] = find(torch._C, "_functorch.maybe_get_bdim", _FUNC)
maybe_get_level: Callable[[torch.Tensor], int] = find(torch._C, "_functorch.maybe_get_level", _FUNC)
_pyfunctorch = _module("torch._functorch.pyfunctorch")
retrieve_all_functorch_interpreters: Callable[[], list[Any]] = find(
    _pyfunctorch, "retrieve_all_functorch_interpreters", _FUNC)
temporarily_clear_interpreter_stack: Callable[[], Any] = find(
    _pyfunctorch, "temporarily_clear_interpreter_stack", _FUNC)


# A module's parameters put in place for one call (torch.func.functional_call's own way), for any
# function that takes the module.
reparametrized: Callable[..., Any] = find(_module("torch.nn.utils.stateless"), "_reparametrize_module",
                                          "checking a rule on a module's method at its parameters")


# torch.autograd.functional's vectorized Jacobians run in the older vmap mode, which refuses random
# ops (a check's random vectors) for as long as it is on.
_LEGACY_VMAP = "a check inside torch.autograd.functional with vectorize=True"
_vmapmode_decrement: Callable[[], int] = find(torch._C, "_vmapmode_decrement_nesting", _LEGACY_VMAP)
_vmapmode_increment: Callable[[], int] = find(torch._C, "_vmapmode_increment_nesting", _LEGACY_VMAP)


@contextlib.contextmanager
def legacy_vmap_suspended() -> Iterator[None]:
    """Run the block outside the older vmap mode (``torch._vmap_internals``), however deep it is.

    >>> from torch._vmap_internals import _vmap
    >>> def noisy(x):
    ...     with legacy_vmap_suspended():
    ...         noise = torch.rand(1)
    ...     return x + 0 * noise
    >>> _vmap(noisy)(torch.ones(2, 1)).shape
    torch.Size([2, 1])
    """
    depth = 0
    # Its level reads only by changing it: step down to -1 (a no-op on the dispatch keys from 0).
    while _vmapmode_decrement() >= 0:
        depth += 1
    _vmapmode_increment()
    try:
        yield
    finally:
        for _ in range(depth):
            _vmapmode_increment()


# torch.func.grad's own backward, told apart from Python's frames (levels.py): functorch's
# grad_and_value_impl calls its _autograd_grad, which calls torch.autograd.grad.
_GRAD_OWN = "a group with rules under torch.func.grad"
_transforms = _module("torch._functorch.eager_transforms")


def in_torch_func_jvp() -> bool:
    """Whether a ``torch.func`` jvp transform is open (its dual level is then torch.func's own, and
    another jvp may nest in it), read from functorch's count of them; False where a release keeps
    no such count.

    >>> in_torch_func_jvp()
    False
    """
    return bool(getattr(_transforms, "JVP_NESTING", 0))


def _grad_codes() -> tuple[types.CodeType, types.CodeType] | None:
    """The code of grad_and_value_impl and of _autograd_grad, where this release has both and the
    first still calls the second by that name."""
    impl, inner = (_lookup(_transforms, n) for n in ("grad_and_value_impl", "_autograd_grad"))
    if not callable(impl) or not callable(inner):
        return None
    impl_code, inner_code = inspect.unwrap(impl).__code__, inspect.unwrap(inner).__code__
    return (impl_code, inner_code) if "_autograd_grad" in impl_code.co_names else None


_GRAD_CODES = _grad_codes()

#: The modules whose functions call the function a differentiation transform differentiates:
#: ``torch.func``'s transforms and ``torch.autograd.functional``'s.
_TRANSFORM_MODULES = frozenset({"torch._functorch.eager_transforms", "torch._functorch.apis",
                                "torch.autograd.functional"})


def transform_frame(frame: types.FrameType) -> bool:
    """Whether ``frame`` runs in one of PyTorch's differentiation transforms (``torch.func``'s,
    ``torch.autograd.functional``'s), which may call the function they differentiate.

    >>> import sys
    >>> transform_frame(sys._getframe())
    False
    """
    return frame.f_globals.get("__name__") in _TRANSFORM_MODULES


def transformed_function(frame: types.FrameType) -> types.FunctionType | None:
    """The function ``frame`` runs, where a differentiation transform called it directly (its caller
    is a :func:`transform_frame`): the transform's local variable that holds it, found by its code
    object (a bound method's function, whose first parameter the frame holds). None elsewhere, or
    where the transform holds it in another form (a partial)."""
    caller = frame.f_back
    if caller is None or not transform_frame(caller):
        return None
    for value in caller.f_locals.values():
        function = value.__func__ if isinstance(value, types.MethodType) else value
        if isinstance(function, types.FunctionType) and function.__code__ is frame.f_code:
            return function
    return None


def grad_transform_codes() -> tuple[types.CodeType, types.CodeType]:
    """The code objects of functorch's ``grad_and_value_impl`` and of the ``_autograd_grad`` that
    it calls to run ``torch.func.grad``'s own backward, found at import.

    >>> [code.co_name for code in grad_transform_codes()]
    ['grad_and_value_impl', '_autograd_grad']
    """
    if _GRAD_CODES is None:
        raise _refusal(_GRAD_OWN, f"{_transforms.__name__}.grad_and_value_impl calling _autograd_grad")
    return _GRAD_CODES


# Pytrees: no supported release (2.11 to 2.15) has a public torch.utils.pytree.
_FORWARD = "a group with rules under forward mode (jvp, jacfwd, forward_ad)"
_pytree = _module("torch.utils._pytree")
tree_flatten: Callable[[Any], tuple[list[Any], Any]] = find(_pytree, "tree_flatten", _FORWARD)
tree_unflatten: Callable[[list[Any], Any], Any] = find(_pytree, "tree_unflatten", _FORWARD)


def _accumulate_grad_class() -> type:
    """The class of the node that accumulates into a leaf's ``.grad``, asked of a leaf through the
    public graph: it holds on every release that has autograd at all."""
    with torch.inference_mode(False), torch.enable_grad():
        leaf = torch.empty(0, requires_grad=True)
        node = leaf.view(0).grad_fn
        if node is None:
            raise internal_error("a view of a leaf that requires grad has no grad_fn")
        return type(node.next_functions[0][0])


# Forward mode: the dual level open now (a module global of forward_ad, so read at each call) and
# the context that turns forward AD back on inside a Function's jvp.
set_fwd_grad_enabled: Callable[[bool], Any] = find(forward_ad, "_set_fwd_grad_enabled", _FORWARD)


def dual_level() -> int:
    """The innermost ``forward_ad`` dual level open now, -1 where none is.

    On a release without ``forward_ad._current_level`` every dual level reads as closed: there a
    group's rules do not correct the tangents of a ``forward_ad`` dual level (those of
    ``torch.func``'s jvp transforms, found on the transform stack, still are), which then carry
    the plain composite's NaN, never another number.

    >>> import torch.autograd.forward_ad as fwAD
    >>> with fwAD.dual_level():
    ...     dual_level()
    0
    >>> dual_level()
    -1
    """
    return getattr(forward_ad, "_current_level", -1)


# The autograd engine and its generated node classes.
NODE_CLASSES: Any = find(torch._C, "_functions", "naming an op in a rule (autograd's node classes)")
ACCUMULATE_GRAD: type = _accumulate_grad_class()
_SITES = "a rule site"
current_graph_task_id: Callable[[], int] = find(torch._C, "_current_graph_task_id", _SITES)
current_autograd_node: Callable[[], Any] = find(torch._C, "_current_autograd_node", _SITES)
sequence_nr: Callable[[], int] = find(torch._C, "_autograd._get_sequence_nr", "a group instance")
has_storage: Callable[[torch.Tensor], bool] = find(torch._C, "_has_storage", _SITES)
is_jit_tracing: Callable[[], bool] = find(torch._C, "_is_tracing", "a group under torch.jit.trace")
#: Whether a tensor is one of the immutable zeros some backward formulas return (a ZeroTensor).
is_zero_tensor: Callable[[torch.Tensor], bool] = find(torch.Tensor, "_is_zerotensor", _SITES)


_SAVED = "a rule that reads saved values under saved-tensor hooks"
_top_saved = find(torch._C, "_autograd._top_saved_tensors_default_hooks", _SAVED)
push_saved_tensors_hooks: Callable[[Callable[..., Any], Callable[..., Any]], None] = find(
    torch._C, "_autograd._push_saved_tensors_default_hooks", _SAVED)
pop_saved_tensors_hooks: Callable[[], None] = find(
    torch._C, "_autograd._pop_saved_tensors_default_hooks", _SAVED)


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


_get_dispatch_mode = _lookup(torch._C, "_get_dispatch_mode")
_FAKE = _lookup(torch._C, "_TorchDispatchModeKey.FAKE")
# Where a release lacks either, the public flag alone answers: the fake-tensor test is for 2.11.
_FAKE_READABLE = _get_dispatch_mode is not None and _FAKE is not None


def is_compiling() -> bool:
    """Whether a compiler traces the code running now: ``torch.compiler.is_compiling()``, or fake
    tensors in force, as where torch 2.11 runs a compiled group's opaque call without that flag.

    >>> is_compiling()
    False
    """
    return torch.compiler.is_compiling() or (_FAKE_READABLE and _get_dispatch_mode(_FAKE) is not None)


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


def compiled_entries(code: types.CodeType) -> int:
    """How many compiled graphs Dynamo's cache holds for ``code`` (0 before Dynamo is imported).

    >>> compiled_entries(compiled_entries.__code__)
    0
    """
    if not dynamo_imported():
        return 0
    listed = find(sys.modules["torch._dynamo.eval_frame"], "_debug_get_cache_entry_list",
                  "counting a compiled group's recompilations")
    return len(listed(code))


def graphs_compiled() -> int:
    """How many graphs Dynamo has compiled in this process, read cheaply (0 before it is imported)."""
    if not _dynamo_counters:
        if not dynamo_imported():
            return 0
        _dynamo_counters.append(find(sys.modules["torch._dynamo.utils"], "counters",
                                     "counting a compiled group's recompilations"))
    return int(_dynamo_counters[0]["stats"]["unique_graphs"])


_dynamo_counters: list[Any] = []


def recompile_limit() -> int:
    """Dynamo's own limit of compiled graphs per code object (``torch._dynamo.config``)."""
    import torch._dynamo

    limit: int = find(torch._dynamo.config, "recompile_limit", "a compiled group's recompile budget")
    return limit


def compile_refusal() -> type[Exception]:
    """The base class of what Dynamo and its backends raise when they cannot compile a frame."""
    import torch._dynamo

    refusal: type[Exception] = find(torch._dynamo.exc, "TorchDynamoException", "a compiled group's fallback")
    return refusal


def _disable_when_called(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` kept out of Dynamo by the public ``torch.compiler.disable``, applied at its first call
    where Dynamo is not imported yet: decorating would import it (see the module's docstring)."""
    disabled: Callable[..., Any] | None = torch.compiler.disable(fn) if dynamo_imported() else None
    if disabled is not None:
        return disabled

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        nonlocal disabled
        if disabled is None:
            disabled = torch.compiler.disable(fn)
        return disabled(*args, **kwargs)

    return call


#: Keep Dynamo out of a function (it imports Dynamo only when first called, not at decoration);
#: the public ``torch.compiler.disable``, applied lazily, where a release lacks the private one.
disable_dynamo: Callable[[Callable[..., Any]], Callable[..., Any]] = (
    _lookup(torch, "_disable_dynamo") or _disable_when_called)


def formula_parent(node: Any) -> Any:
    """The autograd node whose backward created ``node`` (a node of a derivative formula, made by a
    backward under ``create_graph`` while anomaly mode was on), or None: anomaly mode keeps it in
    the node's metadata under a key of its own, which a release may rename.

    >>> x = torch.ones(1, requires_grad=True)
    >>> with torch.autograd.set_detect_anomaly(True, check_nan=False):
    ...     (g,) = torch.autograd.grad(x.sin().sum(), x, create_graph=True)
    >>> formula_parent(g.grad_fn).name(), formula_parent(x.sin().grad_fn)
    ('SinBackward0', None)
    """
    metadata = getattr(node, "metadata", None)
    return metadata.get("parent_") if isinstance(metadata, dict) else None


# Private members of torch's objects: what an autograd node saved (``_saved_<name>``, and for a
# tensor ``_raw_saved_<name>`` beside it), its creation order and input metadata, an op overload's
# schema, a view's base. Not found at import: they live on instances and generated classes, and a
# release that renames one fails the feature that reads it with an AttributeError from here.
_SAVED, _RAW_SAVED = "_saved_", "_raw_saved_"
_NO_DEFAULT: Any = object()


def saved_attribute(name: str) -> str:
    """The attribute under which an autograd node keeps the value it saved as ``name`` (the name
    ``derivatives.yaml`` gives it), for a caller that reads it often with ``getattr``.

    >>> x = torch.ones(2, requires_grad=True)
    >>> getattr(x.exp().grad_fn, saved_attribute("result")).tolist()
    [2.7182817459106445, 2.7182817459106445]
    """
    return _SAVED + name


def saved_value(node: Any, name: str, default: Any = _NO_DEFAULT) -> Any:
    """The value ``node`` saved as ``name``; ``default`` where its class saves none by that name
    (without a default: AttributeError).

    >>> x = torch.ones(2, requires_grad=True)
    >>> saved_value((x ** 3).grad_fn, "exponent"), saved_value(x.exp().grad_fn, "exponent", None)
    (3, None)
    """
    if default is _NO_DEFAULT:
        return getattr(node, _SAVED + name)
    return getattr(node, _SAVED + name, default)


_saved_by_class: dict[type, tuple[str, ...]] = {}


def saved_names_of_class(cls: type) -> tuple[str, ...]:
    """The names of the values an autograd node class saves, sorted.

    >>> x = torch.ones(2, requires_grad=True)
    >>> saved_names_of_class(type(x.pow(3).grad_fn))
    ('exponent', 'self')
    """
    saved = _saved_by_class.get(cls)
    if saved is None:
        saved = _saved_by_class[cls] = tuple(sorted(
            a[len(_SAVED):] for a in dir(cls) if a.startswith(_SAVED)))
    return saved


def saves_as_tensor(owner: Any, name: str) -> bool:
    """Whether an autograd node, or its class, keeps its saved value ``name`` as a tensor (which a
    backward frees, and which may be left empty when no gradient needs it) rather than a number.

    >>> x = torch.ones(2, requires_grad=True)
    >>> node = x.pow(3).grad_fn
    >>> saves_as_tensor(node, "self"), saves_as_tensor(type(node), "exponent")
    (True, False)
    """
    return hasattr(owner, _RAW_SAVED + name)


def node_sequence_nr(node: Any) -> int:
    """The order in which autograd created ``node`` (its ``_sequence_nr``), comparable with
    :data:`sequence_nr` read before.

    >>> start = sequence_nr()
    >>> node_sequence_nr(torch.ones(1, requires_grad=True).exp().grad_fn) >= start
    True
    """
    return int(node._sequence_nr())


def input_metadata(node: Any) -> Any:
    """What ``node`` knows of the gradients it receives, one entry per output of its forward (each
    with a ``shape`` and a ``dtype``).

    >>> x = torch.ones(2, 3, requires_grad=True)
    >>> [tuple(m.shape) for m in input_metadata(x.exp().grad_fn)]
    [(2, 3)]
    """
    return node._input_metadata


def op_schema(overload: Any) -> Any:
    """The ``FunctionSchema`` of an ATen op overload (its ``arguments``, each with a ``name`` and a
    ``type``).

    >>> [a.name for a in op_schema(torch.ops.aten.pow.Tensor_Scalar).arguments]
    ['self', 'exponent']
    """
    return overload._schema


def view_base(tensor: torch.Tensor) -> torch.Tensor | None:
    """The tensor that ``tensor`` is a view of, or None where it is no view.

    >>> x = torch.zeros(4)
    >>> view_base(x[1:]) is x, view_base(x)
    (True, None)
    """
    base: torch.Tensor | None = tensor._base
    return base

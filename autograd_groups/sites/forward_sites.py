"""Forward mode by each op's own tangent formula: a group without a NaN-safe rule runs under
forward mode as its plain function, with each call that makes a rule site replaced by a
one-call op of the group (:class:`~autograd_groups.sites.tangents._Transposed`).

PyTorch computes every other op's tangent with that op's forward-mode formula, as it would without
the group, so an op the rules do not touch never needs a second derivative at first order
(``torch.sinc``'s double backward is NaN at 0; its forward formula is not). Only a call that makes
a node a rule applies to -- a ``sqrt`` under ``Subgradient(op="sqrt", ...)`` -- gets the rule's
tangent: the transpose of its own rule-corrected vjp, that call alone. Reverse levels inside or
around see the same ops: the plain ones' backward, and the call's vjp with the rules.

A torch function mode sees each call. Which calls make a rule site is read from the nodes the call
makes: once per function and kind of arguments, the call is run on plain copies of its inputs
outside every transform, and the ops of the nodes it made are remembered. Where that cannot run,
the function's name is used (``torch.sqrt`` and ``Tensor.sqrt_`` make ``sqrt``). An in-place
call that makes a rule site runs out of place on a copy of its input, and its result is copied in.

Where this cannot run, the group falls back to the transpose of its whole vjp
(:func:`~autograd_groups.sites.tangents.run`): a group with rules called inside (whose tangents are
its own), a ``with`` block or ``tag()`` with rules inside, an op without a forward-mode formula
in the running release (said by a :class:`~autograd_groups.errors.ForwardModeWarning` naming the
group and the op), or a call that forward AD refuses otherwise (an in-place op on an immutable
tangent); and an override group wherever its check fires.
"""

from __future__ import annotations

import contextlib
import re
import threading
import warnings
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from .. import levels, nodes
from ..compat import dual_level, tree_flatten, tree_unflatten
from ..errors import ForwardModeWarning
from . import tangents

#: ``(func, args, kwargs) -> outputs``: one call of a group's function with the group's rules.
Part = Callable[[Callable[..., Any], tuple[Any, ...], dict[str, Any]], Any]

_lock = threading.Lock()
#: Per function and kind of arguments, the op keys of the nodes a call makes.
_made: dict[tuple[Any, ...], frozenset[str]] = {}
#: The most kinds of call kept: a program calls few functions, but the cache must not grow unbounded.
_KEPT = 4096
#: The group functions that call a group with rules, a ``with`` block or ``tag()`` with rules, or an
#: op without a forward-mode formula: their tangents are their whole vjp's transpose.
_whole: weakref.WeakSet[Any] = weakref.WeakSet()
#: Names of dunder methods that differ from their op's (``a / b`` makes ``div``).
_ALIASES = {"truediv": "div", "rtruediv": "div", "itruediv": "div", "rmul": "mul", "radd": "add",
            "rpow": "pow", "ipow": "pow", "imul": "mul", "iadd": "add", "isub": "sub",
            "floordiv": "floor_divide"}
#: How PyTorch says that an op has no forward-mode formula.
_NO_FORMULA = re.compile(r"forward AD with (\S+?) that does not support it|"
                         r"[Tt]rying to use forward AD with (\S+?)[ ,]")


def run(name: str, where: tuple[str, int], plain: Callable[..., Any], part: Part, ops: frozenset[str],
        args: tuple[Any, ...], kwargs: dict[str, Any], whole: Callable[[], Any],
        declined: Callable[[Any], bool] | None = None) -> Any:
    """Call group ``name`` (subgradient rules on ``ops``, by op key) under forward mode:
    ``plain(*args, **kwargs)`` with every call that makes a rule site run as ``part``, the group's
    rules applied to that call alone; ``whole()`` is the fallback (see the module's docstring). A
    group with an override runs so only where ``declined(outputs)``: its check certainly does not
    fire on them; elsewhere its tangents are the transpose of its replacement, ``whole()``.

    >>> import torch
    >>> run("g", ("<doc>", 1), torch.sinc, lambda f, a, k: f(*a, **k), frozenset({"sqrt"}),
    ...     (torch.zeros(1),), {}, lambda: None)
    tensor([1.])
    """
    try:
        known = plain in _whole
    except TypeError:  # a callable that takes no weak reference is tried every time
        known = False
    if known:
        return whole()
    mode = _Sites(name, where, ops, part)
    try:
        with tangents.by_sites(), mode:
            out = plain(*args, **kwargs)
    except tangents.Nested:
        _remember(plain)
        return whole()
    except (RuntimeError, NotImplementedError) as e:
        found = _NO_FORMULA.search(str(e))
        if found is None:
            # Forward AD itself refused the function (an in-place op on a tangent PyTorch made
            # immutable, as ``masked_fill_`` under nested jvp): transposed whole, it runs without
            # tangents; an error of the function's own is raised there again.
            return whole()
        op = found.group(1) or found.group(2)
        _remember(plain)
        warnings.warn(ForwardModeWarning(
            f"group {name!r} (created at {tangents._at(where)}): op {op} has no forward-mode formula in "
            f"torch {torch.__version__}, so from now on the group's tangents are the transpose of its "
            f"whole vjp (a backward and a double backward of the group per call), NaN where an op's "
            f"double backward is NaN (documentation: 'Groups and rules', 'Forward mode')"), stacklevel=3)
        return whole()
    return out if declined is None or declined(out) else whole()


def _remember(plain: Callable[..., Any]) -> None:
    with _lock, contextlib.suppress(TypeError):  # a callable without weak references: tried again
        _whole.add(plain)


class _Sites(TorchFunctionMode):
    """Runs each call that makes a rule site of the group as a one-call op of the group."""

    def __init__(self, name: str, where: tuple[str, int], ops: frozenset[str], part: Part) -> None:
        super().__init__()
        self._name = name
        self._where = where
        self._ops = ops
        self._part = part

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if tangents.running() or not (self._ops & _ops_made(func, args, kwargs)):
            return func(*args, **kwargs)
        flat, spec = tree_flatten((args, kwargs))
        positions = [i for i, v in enumerate(flat) if isinstance(v, torch.Tensor)
                     and (tangents.varies(v) or not tangents.differentiable(v))]
        if not any(tangents.differentiable(flat[i]) for i in positions):
            return func(*args, **kwargs)
        outside = _out_of_place(func)
        if outside is not None:
            # A one-call op cannot change its input in place (``v.sqrt_()``): it runs out of place
            # on a copy (which it may save for its backward), and the result, with its tangent, is
            # copied into the input.
            copied = (args[0].clone(), *args[1:])
            return args[0].copy_(self.__torch_function__(outside, types, copied, kwargs))
        part = self._part

        def ruled(a: tuple[Any, ...], k: dict[str, Any]) -> Any:
            return part(func, a, k)

        call = tangents._Call(self._name, self._where, func, ruled, flat, spec, positions, None, _no_context)
        return tangents._Transposed.apply(call, *(flat[i] for i in positions))


def _out_of_place(func: Any) -> Any:
    """The out-of-place form of an in-place tensor method (``Tensor.sqrt`` for ``Tensor.sqrt_``),
    or None where ``func`` is not one."""
    name = getattr(func, "__name__", "")
    if not name.endswith("_") or name.startswith("_") or getattr(torch.Tensor, name, None) is not func:
        return None
    return getattr(torch.Tensor, name[:-1], None)


def _no_context(*_: Any) -> Any:
    raise AssertionError("a rule site's call has no override")


def _ops_made(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> frozenset[str]:
    """The op keys of the autograd nodes that ``func(*args, **kwargs)`` makes."""
    key = (func, *map(_kind, args), *kwargs, *map(_kind, kwargs.values()))
    found = _made.get(key)
    if found is None:
        found = _probe(func, args, kwargs, tree_flatten((args, kwargs))[0])
        with _lock:
            if len(_made) >= _KEPT:
                _made.clear()
            _made[key] = found
    return found


def _kind(value: Any) -> Any:
    """What of an argument may decide which nodes a call makes: a tensor's dtype and number of
    dimensions, a list's kinds (``torch.cat``), any other value's type."""
    if isinstance(value, torch.Tensor):
        return value.dtype, value.dim()
    if isinstance(value, (list, tuple)):
        return tuple(map(_kind, value))
    return type(value)


def _probe(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], flat: list[Any]) -> frozenset[str]:
    """Run the call once on plain copies of its tensors that require grad, outside every transform,
    and read the ops of the nodes it made; by the function's name where that fails."""
    spec = tree_flatten((args, kwargs))[1]
    # A random op draws on copies without moving the user's generators.
    devices = sorted({v.device.index or 0 for v in flat if isinstance(v, torch.Tensor) and v.is_cuda})
    try:
        copies = [_copy(v) if isinstance(v, torch.Tensor) else v for v in flat]
        with levels.outside_transforms(), torch.enable_grad(), torch.random.fork_rng(devices):
            leaves = [c.requires_grad_() if isinstance(c, torch.Tensor) and (
                c.is_floating_point() or c.is_complex()) else c for c in copies]
            a, k = tree_unflatten(leaves, spec)
            out = func(*a, **k)
    except Exception:  # a function that cannot run on copies: its name tells
        name = getattr(func, "__name__", "").strip("_")
        return frozenset({nodes.op_key(_ALIASES.get(name, name))})
    made: set[str] = set()
    stack: list[Any] = [t.grad_fn for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
    seen: set[int] = set()
    held: list[Any] = []
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen or type(node) is nodes.ACCUMULATE_GRAD:
            continue
        seen.add(id(node))
        held.append(node)
        made.add(nodes.node_key(node))
        stack.extend(n for n, _ in node.next_functions)
    return frozenset(made)


def _copy(t: torch.Tensor) -> torch.Tensor:
    """A plain tensor with ``t``'s values (random ones where ``t`` is a vmap batch: only the nodes
    count), detached from every graph and tangent."""
    plain = levels.unwrapped(t)[0]
    if plain is None:
        shape, dtype, device = t.shape, t.dtype, t.device
        with levels.outside_transforms():
            return (torch.rand(shape, dtype=dtype, device=device) if dtype.is_floating_point
                    else torch.zeros(shape, dtype=dtype, device=device))
    with levels.outside_transforms():
        if dual_level() >= 0:
            plain = torch.autograd.forward_ad.unpack_dual(plain).primal
        return plain.detach()

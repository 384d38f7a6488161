"""Second order through a rule (documentation: "Guarantees"): where a second derivative flows
through elements at which a subgradient or NaN-safe rule fired, it is the rule's own derivative. The
first time that happens at a call site (the line that called the group), the rule is checked there,
as ``ag.verify(order=2)`` checks it, and a :class:`~autograd_groups.errors.SecondOrderWarning` is
given if, and only if, the rule's second derivative is not the function's or could not be checked.
A call site is checked once per rule site the second derivative went through and per set of
arguments that require grad: the same line differentiated in another argument (``hessian`` in
``y``, then in ``x``) goes through other elements and is checked again, and the check covers the
elements of the rule sites this backward went through, not those of an argument it did not
differentiate. Where the group's own inputs cannot decide, the check runs the function around the
group that a ``torch.func`` transform differentiates (:func:`enclosing`, kept at forward time), and
where neither can, the warning says so without calling the result wrong.

The check itself lives in ``verify/`` (it re-runs the group), above this layer: it is installed
here with :func:`set_checker` when ``autograd_groups`` is imported. The warning goes through
``warnings`` with the call site as its location, so that the standard filters decide what repeats
(``"default"`` shows it once per call site, ``"always"`` and ``pytest.warns`` every time).
"""

from __future__ import annotations

import contextlib
import inspect
import sys
import threading
import types
import warnings
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from .. import compat, levels
from ..errors import SecondOrderWarning, internal_error
from ..instance import GroupInstance
from ..rules.kinds import NanSafe, Subgradient


@dataclass(frozen=True)
class Verdict:
    """What the check of a call site found: ``status`` is ``"consistent"``, ``"inconsistent"`` or
    ``"not checked"``; ``detail`` says where and by how much, or why it was not checked."""

    status: str
    detail: str = ""
    #: Where the rules' second derivative is not finite: the op that made it so (verify/origin.py).
    origin: str = ""


#: ``(instance, rule, index, forward) -> Verdict``: the check (verify/site_check.py), once installed;
#: ``index`` is the rule site's member (``SiteHook.index``); ``forward``: the second derivative is
#: taken in forward mode over the backward (``jacfwd(jacrev)``, ``jvp`` of ``grad``).
Checker = Callable[[GroupInstance, Any, "int | None", bool], Verdict]
_checker: Checker | None = None
#: Per group, call site, rule (by identity: a rule registered again is checked again), rule site,
#: arguments that require grad, the differentiated function around it (its code, where it is
#: known) and whether forward mode takes the second derivative: the rule (which keeps its id from
#: being reused) and the verdict.
_Key = tuple[str, tuple[str, int], int, int | None, tuple[int | str, ...], types.CodeType | None, bool]
_verdicts: dict[_Key, tuple[Any, Verdict]] = {}
#: Per call site and rule, the backward pass (graph task) that last told of it.
_told: dict[tuple[str, tuple[str, int], int], int] = {}
#: Per file, the registry that ``warnings`` keeps of what it has shown at each line there.
_registries: dict[str, dict[Any, Any]] = {}
_lock = threading.Lock()
_quiet = 0  # how many checks (or ag.verify runs) are running now, in any thread


class Batched:
    """Stands for an argument that was a vmap batch: its entries are not one point to check."""


class Held:
    """Stands for a module argument (a method's ``self``), held weakly: it leads to its class, its
    functions' globals and what they hold (a script's top-level output of the group)."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.ref: weakref.ref[torch.nn.Module] = weakref.ref(module)


#: A call as a check re-runs it: the function (a weak reference: called, it gives the function or
#: None), its arguments (tensors as plain, detached values under their torch.func wrappers, or
#: :class:`Batched`; modules :class:`Held`), and the ids of those that require grad.
Call = tuple[Callable[[], Any], tuple[Any, ...], dict[str, Any], frozenset[int]]


def remember(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Call:
    """The call ``fn(*args, **kwargs)`` of a decorator group, for its instance to keep.

    Nothing in it may lead back to the instance through autograd's graph, which the cycle
    collector cannot see: the arguments are detached (a traced boundary node, an argument the group
    changes in place, hold the instance), and the function and the modules among the arguments are
    held weakly (its globals or closure, a method's class, may hold the group's output:
    ``loss = f(x)``, ``fake = generator(z)`` at a script's top level). :func:`recalled` gives them
    back.

    >>> import torch
    >>> fn, args, _, wanted = remember(torch.sin, (torch.ones(2, requires_grad=True) * 2,), {})
    >>> fn() is torch.sin, args[0].grad_fn is None, id(args[0]) in wanted
    (True, True, True)
    """
    wanted: list[int] = []
    kept = tuple([_keep(a, wanted) for a in args])
    named = {k: _keep(v, wanted) for k, v in kwargs.items()} if kwargs else kwargs
    return _weak(fn), kept, named, frozenset(wanted)


def recalled(call: Call) -> tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]] | None:
    """The function and arguments of ``call`` as it was made, or None where the function or a
    module among its arguments no longer exists.

    >>> layer = torch.nn.Linear(2, 2)
    >>> fn, args, _ = recalled(remember(torch.nn.Linear.forward, (layer, torch.ones(2)), {}))
    >>> fn is torch.nn.Linear.forward, args[0] is layer
    (True, True)
    """
    fn = call[0]()
    values = [*call[1], *call[2].values()]
    if fn is None or any(isinstance(v, Held) and v.ref() is None for v in values):
        return None
    args = tuple(v.ref() if isinstance(v, Held) else v for v in call[1])
    kwargs = {k: v.ref() if isinstance(v, Held) else v for k, v in call[2].items()}
    return fn, args, kwargs


def enclosing() -> Call | None:
    """The call of the function that a PyTorch differentiation transform differentiates
    (``torch.func.hessian(f)``, ``jacfwd(jacrev(f))``, ``torch.autograd.functional.hessian(f, x)``),
    where the group called now runs inside it: read from Python's frames, as :func:`remember` keeps
    it. None outside such a transform, where the transform holds the function in a form that is not
    a plain function, and where a parameter no longer has a value.

    The outermost of the user's frames that the transform called directly is that function's; its
    parameters are read as they are now, which the check that uses the call confirms (it finds the
    group's own call again in a run of the function, with the same inputs).

    >>> enclosing() is None
    True
    """
    frame: types.FrameType | None = sys._getframe(1)
    user: types.FrameType | None = None
    while frame is not None:
        if compat.transform_frame(frame):
            if user is not None:
                # The first transform above the user's code: it called the function, or none.
                function = compat.transformed_function(user) if user.f_back is frame else None
                if function is None:
                    return None
                parameters = _parameters(user)
                return None if parameters is None else remember(function, *parameters)
        elif (frame.f_globals.get("__name__") or "").split(".", 1)[0] not in ("torch", "autograd_groups"):
            user = frame
        frame = frame.f_back
    return None


def _parameters(frame: types.FrameType) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
    """The arguments that ``frame``'s function was called with, as its parameters hold them now."""
    code, values = frame.f_code, frame.f_locals
    names, positional, named = code.co_varnames, code.co_argcount, code.co_kwonlyargcount
    try:
        args = [values[n] for n in names[:positional]]
        kwargs = {n: values[n] for n in names[positional:positional + named]}
        at = positional + named
        if code.co_flags & inspect.CO_VARARGS:
            args += list(values[names[at]])
            at += 1
        if code.co_flags & inspect.CO_VARKEYWORDS:
            kwargs.update(values[names[at]])
    except KeyError:  # deleted in the function's body
        return None
    return tuple(args), kwargs


def _weak(fn: Callable[..., Any]) -> Callable[[], Any]:
    if inspect.ismethod(fn):
        return weakref.WeakMethod(fn)
    try:
        return weakref.ref(fn)
    except TypeError:  # a builtin, which holds no globals of the user's
        return lambda: fn


def _keep(value: Any, wanted: list[int]) -> Any:
    """An argument as a check re-runs it (see :func:`remember`); the id of a tensor that requires
    grad (at some torch.func level) is added to ``wanted``. On every call of a group with rules:
    a tensor without wrappers, the usual case, costs one detach."""
    if not isinstance(value, torch.Tensor):
        return Held(value) if isinstance(value, torch.nn.Module) else value
    if compat.is_functorch_wrapped_tensor(value):
        plain, grad = levels.unwrapped(value)
        if plain is None:
            return Batched()
    else:
        plain, grad = value, value.requires_grad
    plain = plain.detach()
    if grad:
        wanted.append(id(plain))
    return plain


def set_checker(checker: Checker) -> None:
    """Install the check that a call site's first second derivative through a rule runs."""
    global _checker
    _checker = checker


@contextlib.contextmanager
def untold() -> Iterator[None]:
    """Inside the block, second derivatives through rules are neither checked nor told of:
    ``ag.verify`` and the check itself take them on purpose. Process-wide, as the autograd engine
    may run the hooks on its own threads."""
    global _quiet
    with _lock:
        _quiet += 1
    try:
        yield
    finally:
        with _lock:
            _quiet -= 1


def quiet() -> bool:
    """Whether a check or ``ag.verify`` runs now (see :func:`untold`): rule sites then tell of
    nothing."""
    return bool(_quiet)


def registry(file: str) -> dict[Any, Any]:
    """The registry that ``warnings`` keeps of what it has shown at each line of ``file``, for a
    warning located at a call site there."""
    with _lock:
        return _registries.setdefault(file, {})


def tell(instance: GroupInstance, op: str, rule: Subgradient | NanSafe, masks: list[torch.Tensor],
         index: int | None) -> None:
    """A second derivative flows through the elements ``masks`` where ``rule`` fired at op ``op``
    (member ``index``) of ``instance``: check the call site there the first time, and warn unless
    the rule is right there."""
    if _quiet:
        return
    elements = sum(int(levels.anywhere(m).sum()) for m in masks)
    if not elements:
        return
    site = (instance.name, instance.site, id(rule))
    # Forward mode over the backward meets each op's forward formula where reverse mode meets its
    # double backward: NaN in one need not be NaN in the other (torch.sinc's at 0), so each is
    # checked as it is taken.
    forward = levels.forward_mode_around()
    key = (*site, index, _differentiable(instance.call), _code(instance.outer), forward)
    found = _verdicts.get(key)
    if found is None:
        found = _verdicts[key] = (rule, _check(instance, rule, index, forward))
    verdict = found[1]
    if verdict.status == "consistent":
        return
    # Once per backward pass: the rule's other sites in the instance are the same finding.
    task = compat.current_graph_task_id()
    with _lock:
        if _told.get(site) == task:
            return
        _told[site] = task
    file, line = instance.site
    warnings.warn_explicit(_message(instance, op, rule, elements, verdict), SecondOrderWarning,
                           file, line or 1, registry=registry(file))


def _differentiable(call: Call | None) -> tuple[int | str, ...]:
    """The arguments of ``call`` that require grad, by position or name."""
    if call is None:
        return ()
    _, args, kwargs, wanted = call
    return (*(i for i, a in enumerate(args) if id(a) in wanted),
            *(k for k, v in kwargs.items() if id(v) in wanted))


def _code(call: Call | None) -> types.CodeType | None:
    """The code of the function of ``call`` (None: no call, or the function is gone)."""
    fn = None if call is None else call[0]()
    return getattr(fn, "__code__", None)


def _check(instance: GroupInstance, rule: Subgradient | NanSafe, index: int | None, forward: bool) -> Verdict:
    if instance.call is None:
        return Verdict("not checked", "a `with` block or tag() cannot be run again on its own inputs")
    if _checker is None:
        return Verdict("not checked", "ag.verify's check is not installed (import autograd_groups)")
    with untold():
        try:
            return _checker(instance, rule, index, forward)
        except Exception as e:  # the user's function, re-run: whatever it raises, the warning says
            return Verdict("not checked", f"running the group again on float64 copies of its inputs "
                                          f"raised {e!r}")


def _message(instance: GroupInstance, op: str, rule: Subgradient | NanSafe, elements: int,
             verdict: Verdict) -> str:
    own = ("0, since NaN-safe passes exactly 0 there" if isinstance(rule, NanSafe)
           else "0, since its grad is a constant" if rule.constant is not None
           else "the derivative of its grad expression")
    where = (f"group {instance.name!r} (created at {instance.where}), rule {rule.label}, at op {op}: "
             f"a second derivative flows through {elements} element(s) where the rule fired, and "
             f"there it is the rule's own derivative ({own})")
    if instance.call is None:
        return (f"{where}, which was not checked: {verdict.detail}. Check it with "
                f"ag.verify(fn, *args, order=2) on the function that contains the group")
    if verdict.origin:
        found = (f"group {instance.name!r} (created at {instance.where}), rule {rule.label}, at op {op}: "
                 f"a second derivative flows through {elements} element(s) where the rule fired, and "
                 f"it is not finite there ({verdict.detail}): {verdict.origin}")
    elif verdict.status == "inconsistent":
        found = f"{where}, which is not the function's: {verdict.detail}"
    else:
        # Not a finding that the result is wrong: say what decides, and what to do where it is.
        around = ("" if instance.outer is not None else
                  " (a torch.func transform of that function, such as torch.func.hessian(fn), is "
                  "checked through it; eager create_graph and torch.autograd.functional are not)")
        return (f"{where}; whether that is the function's could not be checked at the group's own "
                f"inputs ({verdict.detail}). It depends on the function around the group: where "
                f"that is smooth there (a kernel of a distance, cos(|v|) at v = 0) the result is "
                f"wrong, and where it does not take the group's second derivative there it is "
                f"right. ag.verify(fn, *args, order=2) on the function you differentiate "
                f"decides{around}. Where it is wrong: {_advice(instance)}")
    return f"{found}. {_advice(instance)}"


def _advice(instance: GroupInstance) -> str:
    """What the user can do: a built-in's own rules are not theirs to change."""
    if instance.call is None:
        raise internal_error(f"the second-order check of group instance {instance.id} has no call to name")
    module = getattr(instance.call[0](), "__module__", "") or ""
    if module.startswith("autograd_groups.ops"):
        kernel = (" (a kernel of a distance in the squared distance, e.g. exp(-d2 / (2 * l**2)) with "
                  "d2 = ((x[:, None] - y[None]) ** 2).sum(-1))" if "dist" in instance.name else "")
        return (f"{instance.name} is a built-in, whose rules are the library's: write the function "
                f"that uses it so that it is smooth there without the rule{kernel}, or wrap the whole "
                f"function in a group of your own with an override whose backward is right there "
                f"(documentation: 'Groups and rules', 'Second order through a rule'); check it with "
                f"ag.verify(fn, *args, order=2)")
    return (f"Give group {instance.name!r} an override whose replacement backward is differentiable "
            f"with the right derivative there (documentation: 'Groups and rules', 'Second order "
            f"through a rule'), and check it with ag.verify(fn, *args, order=2)")

"""Backward-time dispatch: the post-hooks that apply a group's rules at its rule sites.

A rule site is one autograd node of a group instance whose op has a rule. Its hook runs right after
the node computed its input gradients and before they flow on, so a rule's fix is applied exactly
at that op: a compare over the node's saved values and a fill of the gradient it produced. No
tensor is saved and no autograd node is added.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch.utils.checkpoint import CheckpointError

from .. import compat, flag, host_reads, levels, nodes
from ..errors import RuleError, internal_error
from ..instance import GroupInstance
from ..observe import counters
from ..rules.kinds import NanSafe, Subgradient
from ..zero_passing import ZERO_FACTORS, passes_zeros
from . import first_order, saved, second_order

Grads = list[torch.Tensor | None]


def _fail(instance: GroupInstance, label: str, op: str, problem: str) -> RuleError:
    return RuleError(f"group {instance.name!r} (created at {instance.where}), rule {label}, "
                     f"at op {op}: {problem}")


def _fits(shape: torch.Size, target: torch.Size) -> bool:
    if shape == target:
        return True
    try:
        return torch.broadcast_shapes(shape, target) == target
    except RuntimeError:
        return False


def _owned(grad: torch.Tensor, grad_outputs: Sequence[torch.Tensor | None]) -> bool:
    """Whether ``grad``, in a plain backward (see ``SiteHook.__call__``), may be filled in place: a
    fresh dense tensor no other gradient shares. Never for a tensor subclass, nor for batched
    gradients (``is_grads_batched``, ``jacobian(vectorize=True)``): they have no storage; nor for
    the immutable zeros some backward formulas return (a ZeroTensor, in a double backward)."""
    if (type(grad) is not torch.Tensor or compat.view_base(grad) is not None or not grad.is_contiguous()
            or not compat.has_storage(grad) or compat.is_zero_tensor(grad)):
        return False
    return grad.data_ptr() not in [g.data_ptr() for g in grad_outputs if g is not None]


def apply_subgradient(rule: Subgradient, site: SiteHook, node: Any | None, grads: Grads,
                      grad_outputs: Sequence[torch.Tensor | None], plain: bool) -> torch.Tensor:
    """Apply ``rule`` to ``grads`` (in place where ``plain`` allows it); return the mask of elements
    it set.

    ``node`` is the autograd node running the backward, or None where the backward runs without
    one (compiled autograd): then the values the rule reads are those ``site`` captured at forward.
    """
    count, only = len(grads), rule.input
    mask: torch.Tensor | None = None
    env: dict[str, Any] = {}
    may_set: bool | None = None  # counted once, for the first gradient filled in place
    for i in (range(count) if only is None else (only,) if only < count else ()):
        grad = grads[i]
        if grad is None:
            # No gradient to set (an undefined incoming gradient, or an input that needs none, whose
            # saved values autograd may not have kept): the rule has nothing to do here.
            continue
        if mask is None:
            env, mask = _when(rule, site, node, grad_outputs)
        if mask.shape != grad.shape:
            _check_shape(rule, site, "'when' gave a mask", mask.shape, i, grads, env)
        constant = rule.constant
        if constant is not None and plain and _owned(grad, grad_outputs):
            may_set = _may_set(mask) if may_set is None else may_set
            if may_set:
                grad.masked_fill_(mask, constant)
            continue
        value = constant if constant is not None else _value(rule, site, env)
        if isinstance(value, torch.Tensor) and value.shape != grad.shape:
            _check_shape(rule, site, "'grad' gave a value", value.shape, i, grads, env)
        _protect_formula(site.instance, node, grad, grad_outputs)
        grads[i] = torch.where(mask, value, grad)
    return _NOTHING if mask is None else mask


def _when(rule: Subgradient, site: SiteHook, node: Any | None,
          grad_outputs: Sequence[torch.Tensor | None]) -> tuple[dict[str, Any], torch.Tensor]:
    """The values ``rule`` reads, and its ``when`` over them: where it sets the gradient."""
    instance = site.instance
    if instance.transposed and not rule.transposable:
        raise _fail(instance, rule.label, site.op,
                    "a forward-mode pass (jvp, jacfwd, hessian, forward_ad) reached this rule, and "
                    "its 'grad' is not linear in grad, so it has no transpose to give the tangents "
                    "(documentation: 'Groups and rules', 'Forward mode'): write 'grad' as grad "
                    "times a factor (e.g. "
                    "'grad * c' for a local derivative c), or 0")
    env = _saved_values(rule, site, node) if rule.saved else {}
    env["grad"] = grad_outputs[0]
    try:
        mask = rule.when_fn.evaluate(env)
    except Exception as e:
        raise _fail(instance, rule.label, site.op, f"'when' raised {e!r}") from e
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
        got = f"a tensor of dtype {mask.dtype}" if isinstance(mask, torch.Tensor) else type(mask).__name__
        raise _fail(instance, rule.label, site.op, f"'when' must give a bool tensor, not {got}")
    return env, mask


#: What a rule that had no gradient to set reports as the elements it set.
_NOTHING = torch.zeros((), dtype=torch.bool)


def _saved_values(rule: Subgradient, site: SiteHook, node: Any | None) -> dict[str, Any]:
    """The saved values ``rule`` reads, by name: the node's, or where the backward runs without the
    node (compiled autograd) those ``site`` captured at forward."""
    env: dict[str, Any] = {}
    name = ""
    try:
        for name, attribute in rule.saved_attributes:
            value = env[name] = getattr(node, attribute) if node is not None else site.captured[name]
            if value is None and compat.saves_as_tensor(node, name):  # a tensor slot left empty
                raise _fail(site.instance, rule.label, site.op,
                            f"this {site.node_class.__name__} node did not keep {name!r}: autograd "
                            f"saves a value only for the gradients it computes, and {name!r} serves "
                            f"an input that needs none here. Write 'when' and 'grad' with values "
                            f"the gradients of the rule's inputs need (for a product, the other "
                            f"factor), or make that input need a gradient")
    except AttributeError:
        raise _fail(site.instance, rule.label, site.op,
                    f"this {site.node_class.__name__} node does not save {name!r}; it saves "
                    f"{', '.join(nodes.saved_names(node)) or 'nothing'}") from None
    except KeyError:
        raise _fail(site.instance, rule.label, site.op,
                    "this backward runs without the op's autograd node (compiled autograd), and "
                    "the op's saved values were not kept at forward, because compiled autograd was "
                    "neither enabled nor configured while the forward ran, or saved-tensor hooks "
                    "(torch.utils.checkpoint, save_on_cpu) were active: run the forward under "
                    "compiled autograd too (inside the same torch._dynamo.compiled_autograd._enable "
                    "block, or with torch._dynamo.config.compiled_autograd = True) and without "
                    "those hooks, or this backward without compiled autograd") from None
    except CheckpointError as e:
        raise _fail(site.instance, rule.label, site.op,
                    f"cannot read the op's saved {name!r} ({e}); torch.utils.checkpoint with "
                    f"use_reentrant=False lets autograd read a saved value once per backward pass, "
                    f"and the op's own backward has read it. Groups marked with @autograd_group or "
                    f"`with` allow the second read; tag() marks ops after they saved their values: "
                    f"mark this group with @autograd_group or `with`, or checkpoint it with "
                    f"use_reentrant=True") from None
    return env


#: The smallest mask worth counting before a fill (see _may_set).
_COUNTED = 4096


def _may_set(mask: torch.Tensor) -> bool:
    """False where ``mask`` is known to set nothing: a CPU mask with no true element.

    A rule usually fires nowhere, and on the CPU counting a large mask's true elements costs a
    fifth of a fill that changes nothing; below a few thousand elements the count costs as much
    as the fill (documentation: "Performance", "Per-call overhead"), so it is not made. On an accelerator
    the count would make the host wait for the device, so there the fill always runs.
    """
    return mask.numel() < _COUNTED or not host_reads.allowed(mask) or bool(torch.count_nonzero(mask))


def _check_shape(rule: Subgradient, site: SiteHook, what: str, shape: torch.Size, i: int, grads: Grads,
                 env: dict[str, Any]) -> None:
    """Raise unless a mask or value of ``shape`` may replace the gradient of input ``i`` elementwise.

    It may where it broadcasts to that gradient and is the shape of one of the op's inputs (a
    gradient or a saved value): then it was broadcast along exactly the dimensions along which the
    op broadcast that input itself. Any other broadcast (``(result == 0).any()``, a slice) would set
    elements the condition was not computed for.
    """
    target = grads[i]
    if target is None:
        raise internal_error(f"a rule site of op {site.op} filled gradient {i}, which its node did not "
                             "pass on")
    inputs = {g.shape for g in grads if g is not None}
    inputs.update(v.shape for name, v in env.items() if name != "grad" and isinstance(v, torch.Tensor))
    if shape in inputs and _fits(shape, target.shape):
        return
    raise _fail(site.instance, rule.label, site.op,
                f"{what} of shape {tuple(shape)}, but the gradient of input {i} it replaces has shape "
                f"{tuple(target.shape)}: a subgradient is elementwise, so 'when' and a tensor 'grad' "
                f"must have the shape of that gradient (or of an input the op broadcast to it). "
                f"For a condition on the whole group (such as .any()), use an override rule "
                f"(@ag.special_case({site.instance.name!r}))")


_FORMULA = NanSafe(doc="the derivative formula of a rule site, under create_graph")


def _protect_formula(instance: GroupInstance, node: Any | None, grad: torch.Tensor,
                     grad_outputs: Sequence[torch.Tensor | None]) -> None:
    """Make the graph of the op's own derivative formula NaN-safe (double backward only).

    When this backward is itself differentiated, the replaced elements still sit in the graph of the
    formula that produced ``grad`` (``grad / (2 * result)`` for sqrt), where their zero second-order
    gradient would meet the same infinities: ``0 * inf``. Those formula nodes were made by this
    node's backward, so they are exactly the nodes between ``grad`` and the tensors the formula
    read -- the node's saved values and its incoming gradients -- and they get the NaN-safe rule.
    """
    if node is None:  # compiled autograd: it does not differentiate its backward
        return
    if not torch.is_grad_enabled() and compat.peek_interpreter_stack() is None:  # a first-order backward
        return
    read: list[Any] | None = None
    for level in levels.differentiating_levels():
        tracked = levels.at_level(grad, level)
        if tracked is None or tracked.grad_fn is None:
            continue
        if read is None:  # read once, and only when a graph will differentiate this backward
            read = [*grad_outputs, *(compat.saved_value(node, n) for n in nodes.saved_names(node))]
        boundary = [t.grad_fn for t in (levels.at_level(v, level) for v in read) if t is not None]
        _protect_graph(instance, node, tracked.grad_fn, boundary)


def _protect_graph(instance: GroupInstance, node: Any, root: Any, boundary: list[Any]) -> None:
    # Python node wrappers die when unreferenced and their ids are reused: keep every one alive.
    held = [node, *(b for b in boundary if b is not None)]
    seen = {id(n) for n in held}
    stack: list[Any] = [root]
    while stack:
        current = stack.pop()
        if id(current) in seen or type(current) is nodes.ACCUMULATE_GRAD:
            continue
        seen.add(id(current))
        held.append(current)
        if not passes_zeros(current):
            current.register_hook(SiteHook(instance, (), _FORMULA, None, current))
        stack.extend(child for child, _ in current.next_functions if child is not None)


def _value(rule: Subgradient, site: SiteHook, env: dict[str, Any]) -> Any:
    try:
        value = rule.grad_fn.evaluate(env)
    except Exception as e:
        raise _fail(site.instance, rule.label, site.op, f"'grad' raised {e!r}") from e
    if not isinstance(value, (torch.Tensor, int, float)):
        raise _fail(site.instance, rule.label, site.op,
                    f"'grad' must give a tensor or a number, it gave {type(value).__name__}")
    return value


def apply_nan_safe(site: SiteHook, node: Any | None, grads: Grads,
                   grad_outputs: Sequence[torch.Tensor | None], traced: bool,
                   plain: bool) -> list[torch.Tensor]:
    """Zero every outgoing gradient element whose incoming gradients are all exactly zero; return
    the masks of the elements it changed (none for a gradient zeroed in place, which is done only
    where nobody counts or looks: not ``traced`` -- traced, or looked at by the first-order check --,
    no graph differentiating this backward).

    Outside a graph that differentiates this backward (``plain``) and untraced, a gradient the hook
    owns is zeroed in place: on the CPU (value reads on) by its bits times ``incoming.bool()``,
    elsewhere by ``masked_fill_(incoming == 0, 0)``, two kernels for the first gradient and one for
    each further one. No sum is read first to skip a gradient without a non-finite element: where
    the structure hooks a node, its zeros usually meet an infinity (documentation: "Groups and rules").
    """
    incoming = [g for g in grad_outputs if g is not None]
    changed: list[torch.Tensor] = []
    if not incoming:
        return changed
    bits = _may_look(incoming[0])
    elementwise = len(incoming) == 1 and site.elementwise
    zero: torch.Tensor | None = None  # where the one incoming gradient is 0, shared by the outputs
    nonzero: torch.Tensor | None = None  # its complement, for the gradients zeroed in place
    zeroed = site.zeroed
    for i, grad in enumerate(grads):
        if grad is None or (zeroed is not None and i not in zeroed):
            continue
        same = elementwise and grad.shape == incoming[0].shape
        if same and plain and not traced and _owned(grad, grad_outputs):
            if bits and grad.dtype in _BITS:  # the CPU's cheapest zeroing
                nonzero = incoming[0].bool() if nonzero is None else nonzero
                _keep_where(grad, nonzero)
            else:  # the fewest kernels, for a GPU: a compare shared by the gradients, and a fill
                zero = incoming[0] == 0 if zero is None else zero
                grad.masked_fill_(zero, 0)
            continue
        if same:
            zero = incoming[0] == 0 if zero is None else zero
            silent = zero
        elif elementwise and _fits(grad.shape, incoming[0].shape):
            silent = (incoming[0] != 0).sum_to_size(grad.shape) == 0
        else:
            silent = torch.stack([g.eq(0).all() for g in incoming]).all()
        # Only the non-zero elements: a gradient that is 0 already keeps its own derivative.
        fix = silent & (grad != 0)
        changed.append(fix)
        _protect_formula(site.instance, node, grad, grad_outputs)
        grads[i] = torch.where(fix, torch.zeros((), dtype=grad.dtype, device=grad.device), grad)
    if site.factors and node is not None:
        _zero_factors(site, node, grads, grad_outputs, changed)
    return changed


def _zero_factors(site: SiteHook, node: Any, grads: Grads, grad_outputs: Sequence[torch.Tensor | None],
                  changed: list[torch.Tensor]) -> None:
    """Zero each gradient of a product where its factor ``site.factors`` names is exactly zero
    (``t / p`` of ``xlogy(t, p)`` at ``t = p = 0``): the product is 0 there, ``0 · ∞`` included.
    Only where the factor has the gradient's shape or broadcasts to it; a gradient summed over a
    factor's broadcast dimensions is not elementwise in it."""
    for i, name in site.factors:
        grad = grads[i] if i < len(grads) else None
        factor = compat.saved_value(node, name, None)
        if grad is None or not isinstance(factor, torch.Tensor) or not _fits(factor.shape, grad.shape):
            continue
        fix = (factor == 0) & (grad != 0)
        changed.append(fix)
        _protect_formula(site.instance, node, grad, grad_outputs)
        grads[i] = torch.where(fix, torch.zeros((), dtype=grad.dtype, device=grad.device), grad)


def _counted(masks: list[torch.Tensor]) -> int | None:
    """The elements ``masks`` set, or None where one is a vmap batch."""
    plain = [levels.unwrapped(m)[0] for m in masks]
    return None if any(m is None for m in plain) else sum(int(m.sum()) for m in plain if m is not None)


def _may_look(grad: torch.Tensor) -> bool:
    """Whether a hook of a plain backward may zero gradients like ``grad`` the CPU's way (the bits
    times a bool mask, cheapest there): a CPU tensor with storage, host reads on."""
    return host_reads.allowed(grad) and compat.has_storage(grad)


#: Per floating dtype, the integer dtype of its bits.
_BITS = {torch.float64: torch.int64, torch.float32: torch.int32, torch.float16: torch.int16,
         torch.bfloat16: torch.int16}


def _keep_where(grad: torch.Tensor, nonzero: torch.Tensor) -> None:
    """Set ``grad`` to 0 where the bool ``nonzero`` is False, in place, NaN kept elsewhere.

    A floating gradient's bits are multiplied by the mask as integers: a bool mask made with
    ``.bool()`` and one integer product are two kernels that cost less than ``== 0`` and
    ``masked_fill_`` at every size on the CPU (``profile_call.py``'s kernels).
    """
    bits = _BITS.get(grad.dtype)
    if bits is None:
        grad.masked_fill_(nonzero.logical_not(), 0)
    else:
        grad.view(bits).mul_(nonzero)


def capture(node: Any, rules: tuple[Subgradient, ...]) -> dict[str, torch.Tensor]:
    """The saved values ``rules`` read of ``node``, read at forward for a backward that runs without the
    node: compiled autograd frees them before it traces the site's hook. Detached, so that a value
    that is the node's own output holds no reference back to the node. Nothing where reading them
    now would run saved-tensor hooks (checkpoint would recompute) or would be traced, nor where
    compiled autograd is neither enabled nor configured: a compiled-autograd backward of such a
    graph is told so by the rule site."""
    if not compat.compiled_autograd_may_run() or not saved.readable():
        return {}
    try:
        return {name: getattr(node, attribute).detach()
                for rule in rules for name, attribute in rule.saved_attributes}
    except (AttributeError, RuntimeError):
        # A value this node class does not save (said at backward), or one a backward inside a
        # ``with`` group has freed already: the backward has nothing to read in either case.
        return {}


class SiteHook:
    """The post-hook at one rule site: the rules of one instance that apply to one node.

    Each run counts one call per rule; the number of elements a rule changed costs a reduction per
    site, so it is counted only while the instance is traced. While a compiler traces the hook
    (torch.compile's joint graph, compiled autograd) nothing is counted: it runs once per
    compilation, not once per backward.
    """

    __slots__ = ("instance", "subgradients", "nan_safe", "rules", "vertex", "index", "node_class",
                 "elementwise", "captured", "zeroed", "factors")

    def __init__(self, instance: GroupInstance, subgradients: tuple[Subgradient, ...],
                 nan_safe: NanSafe | None, vertex: str | None, node: Any,
                 zeroed: tuple[int, ...] | None = None, index: int | None = None) -> None:
        self.instance: GroupInstance = instance
        #: The node's place in the walk of the instance's members: the same node in a run of the
        #: group on other values of the same inputs (the second-order check's).
        self.index: int | None = index
        #: The gradients a NaN-safe rule zeroes here (by input index), or None for all: a product
        #: zeroes only those multiplied by a saved value that may be non-finite (finiteness.py).
        self.zeroed: tuple[int, ...] | None = zeroed
        self.subgradients: tuple[Subgradient, ...] = subgradients
        self.nan_safe: NanSafe | None = nan_safe
        #: The rules that run here, in the order they run.
        self.rules: tuple[Subgradient | NanSafe, ...] = (
            subgradients if nan_safe is None else (*subgradients, nan_safe))
        self.vertex: str | None = vertex
        self.node_class: type = type(node)
        self.elementwise: bool = nan_safe is not None and nodes.is_pointwise_class(self.node_class)
        #: A NaN-safe product's gradients that an exactly zero factor makes 0 (ZERO_FACTORS).
        self.factors: tuple[tuple[int, str], ...] = (
            ZERO_FACTORS.get(self.node_class.__name__, ()) if nan_safe is not None else ())
        self.captured: dict[str, torch.Tensor] = capture(node, subgradients) if subgradients else {}

    @property
    def op(self) -> str:
        """The op name of the site's node, as rules and errors name it."""
        return nodes.op_name_of_class(self.node_class.__name__)

    def __call__(self, grad_inputs: Sequence[torch.Tensor | None],
                 grad_outputs: Sequence[torch.Tensor | None]) -> tuple[torch.Tensor | None, ...] | None:
        instance = self.instance
        if compat.is_compiling():
            if not flag.backward_state().for_group(instance.name):
                return None
            return self._run(list(grad_inputs), grad_outputs, False)
        if not flag.backward_enabled(instance.name):
            return None
        grads = list(grad_inputs)
        if (instance.graph is not None or torch.is_grad_enabled()
                or compat.peek_interpreter_stack() is not None):
            return self._run(grads, grad_outputs, True)
        # The usual backward: eager, first order, outside torch.func, and nobody counts elements.
        # Its gradients are plain tensors, which a rule may read and fill in place. Until a user's
        # rule has fired at this call site, what it changed is looked at (first_order.py).
        look = self.nan_safe is not _FORMULA and first_order.wanted(instance)
        node = compat.current_autograd_node() if self.subgradients or self.factors else None
        for rule in self.subgradients:
            mask = apply_subgradient(rule, self, node, grads, grad_outputs, True)
            if look:
                first_order.tell(instance, self.op, rule, [mask], self.index)
        if self.nan_safe is not None:
            masks = apply_nan_safe(self, node, grads, grad_outputs, look, True)
            if look:
                first_order.tell(instance, self.op, self.nan_safe, masks, self.index)
        counters.count_site(instance, self.rules)
        return tuple(grads)

    def _run(self, grads: Grads, grad_outputs: Sequence[torch.Tensor | None],
             counted: bool) -> tuple[torch.Tensor | None, ...]:
        """The site's rules in any other backward: traced, differentiated (``create_graph``, a
        ``torch.func`` transform), or traced by a compiler (not ``counted``)."""
        instance = self.instance
        graphed = torch.is_grad_enabled()
        if counted:
            # A NaN-safe site reads the node only for the formula a second derivative goes through.
            read = self.subgradients or self.factors or graphed
            node: Any = compat.current_autograd_node() if read else None
        else:
            counters.count_compiled(instance.name)
            # Compiled autograd traces the hook with Dynamo, without the node (see capture).
            node = None if torch.compiler.is_dynamo_compiling() else compat.current_autograd_node()
        traced = counted and instance.graph is not None
        # Read before the rules replace them: whether a graph will differentiate what they give
        # (never in a first-order backward, which runs with grad mode off).
        second = counted and graphed and any(
            g is not None and levels.differentiated(g, instance.linear_levels) for g in grads)
        eager = counted and compat.peek_interpreter_stack() is None
        # An eager first-order backward outside torch.func (here: a traced one).
        plain = eager and not graphed
        # Whether to look at what the rules changed, for the first-order check (first_order.py).
        look = eager and self.nan_safe is not _FORMULA and first_order.wanted(instance)
        ran: list[tuple[Subgradient | NanSafe, list[torch.Tensor]]] = []
        # A rule-site call of a group under forward mode is its own instance: its members' places
        # are not the whole group's, whose call a check re-runs (at all of the rule's sites).
        index = None if instance.part else self.index
        for rule in self.subgradients:
            mask = apply_subgradient(rule, self, node, grads, grad_outputs, plain)
            ran.append((rule, [mask]))
            if second:
                second_order.tell(instance, self.op, rule, [mask], index)
        if self.nan_safe is not None:
            masks = apply_nan_safe(self, node, grads, grad_outputs, traced or look, plain)
            ran.append((self.nan_safe, masks))
            if second and self.nan_safe is not _FORMULA:
                second_order.tell(instance, self.op, self.nan_safe, masks, index)
        if counted:
            self._count(ran, traced)
        if look:  # after the rules ran and were counted: the check runs the group again
            for ran_rule, ran_masks in ran:
                first_order.tell(instance, self.op, ran_rule, ran_masks, self.index)
        return tuple(grads)

    def _count(self, ran: list[tuple[Subgradient | NanSafe, list[torch.Tensor]]], traced: bool) -> None:
        """Count this run of the site's rules (and of a backward pass through its instance) at once;
        the elements each rule changed only where traced."""
        instance = self.instance
        if not traced:
            counters.count_site(instance, self.rules)
            return
        # Under vmap a mask is a batch, whose elements per entry are not there to count: the
        # counters say so, and the trace records where the rule fired for some entry of it.
        elements = [_counted(masks) for _, masks in ran]
        counters.count_site(instance, self.rules, elements)
        for (rule, masks), n in zip(ran, elements):
            instance.record_hit(self.vertex, rule.label,
                                sum(int(levels.anywhere(m).sum()) for m in masks) if n is None else n)
            if instance.recorder is not None:
                instance.recorder.changed(instance, rule, masks, self.index)

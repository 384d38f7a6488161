"""Where ``ag.verify`` checks rules: a *point*, a function of some float64 tensors at those tensors,
and what a :class:`Probe` measures there -- the derivative the rules give, the elements each rule
reaches, and the automatic derivative at nearby points.

The derivative is the gradient of a fixed random projection of the outputs (one number is weighted
by 1, so that its gradient is the one the user sees), or with ``order=2`` the Hessian-vector product
with a fixed random vector, through ``create_graph``. Every run of the function starts from the
same state of the CPU random generator (dropout, random augmentation).
"""

from __future__ import annotations

import contextlib
import inspect
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.autograd.forward_ad as forward_ad
from torch.overrides import TorchFunctionMode

from .. import compat, flag
from ..errors import GroupError
from ..instance import GroupInstance
from ..observe import tracer
from ..observe.recording import Recorder, RuleRun, recording
from ..rules.kinds import NanSafe
from . import limits

_SEED = 0
_SEEDED = torch.Generator().manual_seed(_SEED).get_state()


@contextlib.contextmanager
def seeded() -> Iterator[None]:
    """Run the block from the same state of the CPU random generator, and give the caller's back
    afterwards (a saved state: ``torch.manual_seed`` costs milliseconds)."""
    saved = torch.get_rng_state()
    torch.set_rng_state(_SEEDED)
    try:
        yield
    finally:
        torch.set_rng_state(saved)


def generator() -> torch.Generator:
    """A generator of the fixed random numbers (projections, vectors, directions)."""
    return torch.Generator().manual_seed(_SEED)


def outputs_of(out: Any) -> list[torch.Tensor]:
    """The floating-point tensors that require grad among a function's outputs."""
    values = out.values() if isinstance(out, dict) else out if isinstance(out, (tuple, list)) else [out]
    return [v for v in values
            if isinstance(v, torch.Tensor) and v.is_floating_point() and v.requires_grad]


def differentiable(value: Any) -> Any:
    """A copy of a floating-point tensor argument that requires grad (any other value as it is)."""
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        return value.detach().clone().requires_grad_()
    return value


def projection(tensors: list[torch.Tensor], weights: torch.Generator) -> torch.Tensor:
    """A fixed random linear combination of the elements of ``tensors`` (drawn from ``weights``, in
    their dtype): one scalar whose gradient stands for all of theirs."""
    return sum(((t * torch.randn(t.shape, generator=weights, dtype=t.dtype)).sum() for t in tensors),
               torch.zeros((), dtype=tensors[0].dtype))


@dataclass
class Point:
    """``run`` is a function of the tensors ``inputs`` (named ``names``); it is checked there.
    ``narrow``: some tensor it was made from is narrower than its copy here (a float32 argument
    checked in float64), so that the point as recorded may be special where this one is not."""

    run: Callable[[list[torch.Tensor]], Any]
    inputs: list[torch.Tensor]
    names: list[str]
    narrow: bool = False

    def element(self, k: int) -> tuple[str, list[int], float]:
        """The name (``x[1, 2]``), index and input value of flat element ``k`` of the inputs."""
        for name, x in zip(self.names, self.inputs):
            if k < x.numel():
                index = [int(i) for i in torch.unravel_index(torch.tensor(k), x.shape)]
                return f"{name}{index}" if index else name, index, float(x.reshape(-1)[k])
            k -= x.numel()
        raise IndexError(k)


def _parameter_names(fn: Callable[..., Any], count: int) -> list[str]:
    try:
        parameters = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        parameters = []
    positional = [p.name for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return [positional[i] if i < len(positional) else f"args[{i}]" for i in range(count)]


def point_of(fn: Callable[..., Any], args: Sequence[Any], kwargs: dict[str, Any],
             wanted: Callable[[torch.Tensor], bool], dtype: torch.dtype | None = torch.float64) -> Point:
    """``fn(*args, **kwargs)`` as a function of ``dtype`` copies of its floating-point tensor
    arguments that are ``wanted``; its other floating-point tensor arguments become ``dtype``
    constants. ``dtype=None`` keeps each tensor's own (the point as it was recorded). Where no
    tensor argument is wanted, the ``wanted`` parameters of its module arguments are the inputs
    (a module's forward on data).

    >>> layer = torch.nn.Linear(2, 1)
    >>> point = point_of(lambda m, x: m(x).sum(), [layer, torch.ones(1, 2)], {}, lambda t: t.requires_grad)
    >>> point.names
    ['m.weight', 'm.bias']
    """
    names = _parameter_names(fn, len(args))
    slots: list[int | str] = []
    inputs: list[torch.Tensor] = []
    input_names: list[str] = []
    base_args, base_kwargs = list(args), dict(kwargs)
    narrow = False
    keyed: list[tuple[int | str, Any, str]] = [*((i, a, names[i]) for i, a in enumerate(args)),
                                               *((k, v, k) for k, v in kwargs.items())]
    for key, value, name in keyed:
        if not isinstance(value, torch.Tensor) or not value.is_floating_point():
            continue
        copy = value.detach().to(dtype or value.dtype).clone()
        narrow = narrow or copy.dtype.itemsize > value.dtype.itemsize
        if wanted(value):
            slots.append(key)
            inputs.append(copy)
            input_names.append(name)
        elif isinstance(key, int):
            base_args[key] = copy
        else:
            base_kwargs[key] = copy
    # A module's method on data (a forward): what autograd differentiates there is the module's
    # parameters, put in place of its own for each run. Every module argument runs on copies of
    # its buffers, so that the runs leave its state as it was (a batch norm's statistics).
    held: list[tuple[torch.nn.Module, list[str]]] = []
    for _, value, name in keyed:
        if not isinstance(value, torch.nn.Module) or any(value is module for module, _ in held):
            continue
        own = [] if slots else \
            [(key, p) for key, p in value.named_parameters() if p.is_floating_point() and wanted(p)]
        held.append((value, [key for key, _ in own]))
        for key, p in own:
            copy = p.detach().to(dtype or p.dtype).clone()
            narrow = narrow or copy.dtype.itemsize > p.dtype.itemsize
            inputs.append(copy)
            input_names.append(f"{name}.{key}")

    def run(xs: list[torch.Tensor]) -> Any:
        call_args, call_kwargs = list(base_args), dict(base_kwargs)
        for key, x in zip(slots, xs):
            if isinstance(key, int):
                call_args[key] = x
            else:
                call_kwargs[key] = x
        with contextlib.ExitStack() as stack:
            rest = xs[len(slots):]
            for module, keys in held:
                buffers = {key: b.clone() for key, b in module.named_buffers()}
                stack.enter_context(compat.reparametrized(module, {**dict(zip(keys, rest)), **buffers},
                                                          tie_weights=True))
                rest = rest[len(keys):]
            stack.enter_context(Widened())
            return fn(*call_args, **call_kwargs)

    return Point(run, inputs, input_names, narrow)


class Widened(TorchFunctionMode):
    """In a run on float64 copies, a call that refuses float64 beside a narrower floating dtype (a
    matmul with a module's float32 weight, which the function reaches by closure and no copy
    replaces) is made again with all its floating tensors as float64: the function computed in
    float64, as the copies ask. The casts are differentiable. A call that mixes dtypes by itself
    (type promotion, a write into a float32 tensor) is left as it is.

    >>> w = torch.ones(2, 3)  # float32, as a module's weight
    >>> with Widened():
    ...     torch.nn.functional.linear(torch.ones(1, 3, dtype=torch.float64), w).dtype
    torch.float64
    """

    def __torch_function__(self, func: Any, types: Any, args: Sequence[Any] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        try:
            return func(*args, **kwargs)
        except RuntimeError:
            dtypes = {t.dtype for t in _tensors((args, kwargs)) if t.is_floating_point()}
            if torch.float64 not in dtypes or len(dtypes) == 1:
                raise
        return func(*_widened(args), **_widened(kwargs))


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _tensors(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _tensors(v)


def _widened(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(torch.float64) if value.is_floating_point() else value
    if isinstance(value, list):
        return [_widened(v) for v in value]
    if isinstance(value, tuple):
        items = [_widened(v) for v in value]
        return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)
    if isinstance(value, dict):
        return {k: _widened(v) for k, v in value.items()}
    return value


@dataclass
class AtPoint:
    """What the rules give at a point: ``value``, the derivative; ``changed``, how much it differs
    from the plain composite's there (inf where that is NaN); ``nan``, where the rules' gradient is
    NaN; the instances the run made, by id, and ``first``, the first one a decorator group made
    (the group's own call); and ``reach``, the elements that a NaN put at some rule sites reaches.
    Call ``recorder.release()`` when done with it."""

    value: torch.Tensor
    changed: torch.Tensor
    nan: torch.Tensor
    instances: dict[str, GroupInstance]
    first: GroupInstance | None
    recorder: Recorder
    reach: Callable[[list[RuleRun]], torch.Tensor]


class Probe:
    """The derivatives of one point, for one fixed random projection."""

    def __init__(self, point: Point, order: int, forward: bool = False) -> None:
        self.point = point
        self.order = order
        #: Take the rules' Hessian-vector product at the point by forward mode over the backward.
        self.forward = forward
        self.generator: torch.Generator = generator()
        self.projections: list[torch.Tensor] | None = None
        self.vector: torch.Tensor = torch.cat(
            [self._random(x.shape).to(x.device).reshape(-1) for x in point.inputs])
        self.error: Exception | None = None
        #: Elements whose derivative is not finite at some nearby point where the function is.
        self.plain_nonfinite: torch.Tensor = torch.zeros(0, dtype=torch.bool)
        #: Elements checked against the rules' own derivative nearby (order 2, see nearby).
        self.own: torch.Tensor = torch.zeros(0, dtype=torch.bool)
        #: (directions, elements): where a direction met a special point nearby (order 1, see
        #: nearby); its samples from there on are left out.
        self.special: torch.Tensor = torch.zeros(0, dtype=torch.bool)
        self._differences: torch.Tensor | None = None
        self._differenced = torch.zeros(0, dtype=torch.bool)
        #: Per element, the least error of its difference quotients' limit (their rounding).
        self.rounding: torch.Tensor = torch.zeros(0, dtype=torch.float64)

    def _random(self, shape: torch.Size) -> torch.Tensor:
        return torch.randn(shape, generator=self.generator, dtype=torch.float64)

    def _run(self, xs: list[torch.Tensor]) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """The projection of the outputs at ``xs``, and the outputs."""
        with seeded():
            outputs = outputs_of(self.point.run(xs))
        if self.projections is None:
            self.projections = [torch.ones_like(o) if o.numel() == 1 else self._random(o.shape).to(o)
                                for o in outputs]
        if [o.shape for o in outputs] != [p.shape for p in self.projections]:
            raise GroupError("its outputs changed shape from one run to the next")
        return _project(outputs, self.projections), outputs

    def _flat(self, grads: Sequence[torch.Tensor | None]) -> torch.Tensor:
        return torch.cat([(torch.zeros_like(x) if g is None else g).reshape(-1)
                          for g, x in zip(grads, self.point.inputs)])

    def _nan(self, projected: torch.Tensor, xs: list[torch.Tensor]) -> torch.Tensor:
        """The input-gradient elements that a NaN in ``projected``'s backward reaches: NaN survives
        a product with 0, so these are the elements that depend on it."""
        grads = torch.autograd.grad(projected, xs, retain_graph=True, allow_unused=True)
        return torch.isnan(self._flat(grads))

    def _derivative(self, projected: torch.Tensor, xs: list[torch.Tensor],
                    retain: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """The gradient, and the derivative checked (the gradient, or the Hessian-vector product)."""
        if not projected.requires_grad:
            zero = self._flat([None] * len(xs))
            return zero, zero
        second = self.order == 2
        grads = torch.autograd.grad(projected, xs, create_graph=second, retain_graph=retain or second,
                                    allow_unused=True)
        first = self._flat(grads)
        if not second:
            return first, first
        if not first.requires_grad:
            return first, torch.zeros_like(first)
        product = torch.autograd.grad((first * self.vector).sum(), xs, retain_graph=retain,
                                      allow_unused=True)
        return first.detach(), self._flat(product).detach()

    def _forward_over_reverse(self) -> torch.Tensor:
        """The rules' Hessian-vector product as ``jacfwd(jacrev)`` or ``jvp`` of ``grad`` takes it,
        along the probe's vector: ``torch.func.jvp`` of ``torch.func.grad``, or inside a
        ``forward_ad`` dual level of the user's (``torch.autograd.functional``'s forward mode), where
        no second one can open, the backward of inputs that carry the vector as their tangent."""
        xs = tuple(x.detach() for x in self.point.inputs)
        tangents = tuple(t.reshape(x.shape) for t, x in zip(self.vector.split([x.numel() for x in xs]), xs))
        if compat.dual_level() < 0 or compat.in_torch_func_jvp():
            gradient = torch.func.grad(lambda *ys: self._run(list(ys))[0], argnums=tuple(range(len(xs))))
            return self._flat(torch.func.jvp(gradient, xs, tangents)[1]).detach()
        leaves = self._leaves()
        projected, _ = self._run([forward_ad.make_dual(x, t) for x, t in zip(leaves, tangents)])
        if not projected.requires_grad:
            return self._flat([None] * len(xs))
        grads = torch.autograd.grad(projected, leaves, create_graph=True, allow_unused=True)
        return self._flat([None if g is None else forward_ad.unpack_dual(g).tangent for g in grads]).detach()

    def _leaves(self, offset: Sequence[torch.Tensor] | None = None) -> list[torch.Tensor]:
        with torch.no_grad():
            xs = ([x.clone() for x in self.point.inputs] if offset is None
                  else [x + o for x, o in zip(self.point.inputs, offset)])
        return [x.requires_grad_() for x in xs]

    def at_point(self) -> AtPoint:
        """The rules' derivative at the point (special cases on), with the sites each rule ran at."""
        recorder = Recorder(record_runs=True)
        xs = self._leaves()
        try:
            with tracer.trace() as session, recording(recorder), flag.restored(flag.FlagState(True)):
                projected, _ = self._run(xs)
            first, value = self._derivative(projected, xs, retain=True)
        except BaseException:
            recorder.release()
            raise
        recorder.stop()
        if self.order == 2 and self.forward:
            with flag.restored(flag.FlagState(True)):
                value = self._forward_over_reverse()

        def reach(runs: list[RuleRun]) -> torch.Tensor:
            handles = [run.node.register_hook(_poison(run)) for run in runs]
            try:
                return self._nan(projected, xs).cpu()
            finally:
                for handle in handles:
                    handle.remove()

        with flag.restored(flag.FlagState(False)), tracer.hidden():
            plain = self._sample(self._leaves())[0]
        changed = torch.where(plain == value, 0.0, (plain - value).abs().nan_to_num(nan=math.inf))
        made = {i.id: i for i in [*session.instances, *recorder.instances]}
        # The comparison runs on the CPU, where the samples are gathered.
        return AtPoint(value.cpu(), changed.cpu(), torch.isnan(first).cpu(), made,
                       recorder.instances[0] if recorder.instances else None, recorder, reach)

    def nearby(self) -> torch.Tensor | None:
        """The automatic derivative (special cases off) at the nearby points, (directions, steps,
        elements), NaN where a sample is unusable; None if the function raised at every one of
        them (the error is kept in ``error``).

        Where the function is finite at a nearby point but the plain composite's derivative is not
        (``where(x != 0, y / x, y)`` in ``x``, a softplus's overflowing branch), the sample is
        unusable at order 1 (``plain_nonfinite`` marks those elements), and so are the samples at
        the smaller steps along that direction (``special`` marks it). At order 2 it is the rules'
        own derivative there instead (``own`` marks them): the second derivative through a rule is
        the derivative of the rules' gradient, and it is that of the function wherever the rules
        fire at a whole neighbourhood as they do at the point (their first-order gradient is
        order 1's to check); where they fire at the point alone it differs, and is caught.
        """
        directions = self._directions()
        n = sum(x.numel() for x in self.point.inputs)
        shape = (len(directions), len(limits.STEPS), n)
        out = torch.full(shape, math.nan, dtype=torch.float64)
        left = torch.zeros(shape, dtype=torch.bool)
        offsets = torch.empty_like(out)
        ran = False
        with flag.restored(flag.FlagState(False)), tracer.hidden():
            for i, direction in enumerate(directions):
                for j, step in enumerate(limits.STEPS):
                    offset = [step * d for d in direction]
                    offsets[i, j] = torch.cat([o.reshape(-1) for o in offset]).cpu()
                    try:
                        out[i, j], left[i, j] = (t.cpu() for t in self._sample(self._leaves(offset)))
                        ran = True
                    except Exception as e:  # the function raises there: it is outside its domain
                        self.error = e
                        left[i, j] = True
        point = torch.cat([x.reshape(-1) for x in self.point.inputs]).cpu()
        resolved = limits.usable(point, offsets)
        broken = ~torch.isfinite(out) & ~left & resolved
        self.plain_nonfinite = broken.any(1).any(0)
        if self.order == 2 and bool(broken.any()):
            out = self._own_where(broken, directions, out)
        elif bool(broken.any()):
            out = self._cut(broken, out)
        return torch.where(resolved, out, math.nan) if ran else None

    def _cut(self, special: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """``out`` without the samples at and past a nearby point that is itself special, along
        each direction (``special``: directions, steps, elements). Past one, the steps are in the
        special point's rounding: acos of a cosine that rounds to exactly 1 at some steps and to one
        ulp below it at the next gives samples that shrink with the step, as if they tended to 0."""
        self.special = special.any(1)
        return torch.where(special.cumsum(1) > 0, math.nan, out)

    def differences(self, elements: torch.Tensor) -> torch.Tensor:
        """One-sided difference quotients of the projection of the outputs (special cases off) at
        each of ``elements`` (a mask over the flat inputs), along its coordinate: (2, steps,
        elements), forward then backward, at :data:`~.limits.DIFFERENCE_STEPS` times the input's
        scale ``max(1, max |x|)``; NaN elsewhere, and where the value is not finite (the step left
        the function's domain). Each quotient divides by the step the float64 sum actually took.
        Two runs of the function per element and step; each element's are kept for the next call.
        """
        n = sum(x.numel() for x in self.point.inputs)
        if self._differences is None:
            self._differences = torch.full((2, len(limits.DIFFERENCE_STEPS), n), math.nan,
                                           dtype=torch.float64)
            self._differenced = torch.zeros(n, dtype=torch.bool)
            self.rounding = torch.zeros(n, dtype=torch.float64)
        todo = elements & ~self._differenced
        if bool(todo.any()):
            with flag.restored(flag.FlagState(False)), tracer.hidden():
                base = self._outputs(self._leaves())
                for k in todo.nonzero().flatten().tolist():
                    self._differences[:, :, k], self.rounding[k] = self._quotients(k, base)
            self._differenced |= todo
        return torch.where(elements, self._differences, math.nan)

    def _outputs(self, xs: list[torch.Tensor]) -> list[torch.Tensor] | None:
        """The outputs at ``xs``, detached; None where one is not finite."""
        outputs = [o.detach() for o in self._run(xs)[1]]
        return outputs if all(bool(torch.isfinite(o).all()) for o in outputs) else None

    def _quotients(self, k: int, base: list[torch.Tensor] | None) -> tuple[torch.Tensor, float]:
        """(2, steps) difference quotients at flat element ``k`` (see :meth:`differences`) of the
        outputs from ``base``, their values at the point; and the least error of their limit.

        Each output element's change is taken before the projection, so that an output element
        that ``k`` does not move (a large constant beside the loss) adds no rounding. The error is
        :data:`~.limits.DIFFERENCE_ROUNDING` times the rounding of the elements that moved, divided
        by the step where truncation and rounding are about equal, and times what the elements that
        never moved could hide: a slope below half an ulp at the largest step."""
        which, local = 0, k
        while local >= self.point.inputs[which].numel():
            local -= self.point.inputs[which].numel()
            which += 1
        x = self.point.inputs[which]
        scale = _finite_scale(x)
        found = torch.full((2, len(limits.DIFFERENCE_STEPS)), math.nan, dtype=torch.float64)
        if base is None or self.projections is None:
            return found, 0.0
        moved = [torch.zeros_like(b, dtype=torch.bool) for b in base]
        for side, sign in enumerate((1.0, -1.0)):
            for j, step in enumerate(limits.DIFFERENCE_STEPS):
                offset = [torch.zeros_like(t) for t in self.point.inputs]
                offset[which].view(-1)[local] = sign * step * scale
                xs = self._leaves(offset)
                taken = float(xs[which].detach().reshape(-1)[local] - x.reshape(-1)[local])
                if taken == 0:
                    continue
                try:
                    outputs = self._outputs(xs)
                except Exception:  # as in nearby: it raises there, outside its domain
                    continue
                if outputs is None:
                    continue
                change = sum(float(((o - b) * w).sum()) for o, b, w in zip(outputs, base, self.projections))
                found[side, j] = change / taken
                for m, o, b in zip(moved, outputs, base):
                    m |= o != b
        size = [(w * b).abs() for w, b in zip(self.projections, base)]
        seen = sum(float(a[m].sum()) for a, m in zip(size, moved))
        unseen = sum(float(a[~m].sum()) for a, m in zip(size, moved))
        eps = torch.finfo(torch.float64).eps
        hidden = seen / eps ** (1 / 3) + unseen / limits.DIFFERENCE_STEPS[0]
        return found, limits.DIFFERENCE_ROUNDING * eps * hidden / scale

    def _own_where(self, broken: torch.Tensor, directions: list[list[torch.Tensor]],
                   out: torch.Tensor) -> torch.Tensor:
        """``out`` with the rules' own derivative where ``broken`` (see :meth:`nearby`)."""
        own = out.clone()
        with flag.restored(flag.FlagState(True)), tracer.hidden():
            for i, direction in enumerate(directions):
                for j, step in enumerate(limits.STEPS):
                    if not bool(broken[i, j].any()):
                        continue
                    try:
                        own[i, j] = self._sample(self._leaves([step * d for d in direction]))[0].cpu()
                    except Exception:  # as in nearby: it raises there, and the sample stays unusable
                        continue
        self.own = broken.any(1).any(0) & torch.isfinite(own).any(1).any(0)
        return torch.where(broken, own, out)

    def _sample(self, xs: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """The derivative at ``xs``, NaN where it depends on an output that is not finite (there
        the function has left its domain), and the mask of those elements."""
        projected, outputs = self._run(xs)
        broken = [~torch.isfinite(o.detach()) for o in outputs]
        left = any(bool(b.any()) for b in broken)
        value = self._derivative(projected, xs, retain=left)[1]
        if not left:
            return value, torch.zeros(value.shape, dtype=torch.bool, device=value.device)
        weights = [torch.where(b, math.nan, 0.0).to(o) for b, o in zip(broken, outputs)]
        domain = self._nan(_project(outputs, weights), xs)
        return torch.where(domain, math.nan, value), domain

    def _directions(self) -> list[list[torch.Tensor]]:
        """:data:`~.limits.PAIRS` random directions and their negatives; each input's part scaled by
        ``max(1, max |x|)`` over its finite entries, and the largest element of each direction 1."""
        scales = [_finite_scale(x) for x in self.point.inputs]
        found = []
        for _ in range(limits.PAIRS):
            parts = [self._random(x.shape).to(x.device) * scale
                     for x, scale in zip(self.point.inputs, scales)]
            largest = max((float(p.abs().max()) for p in parts if p.numel()), default=1.0)
            parts = [p / largest for p in parts]
            found += [parts, [-p for p in parts]]
        return found


def _finite_scale(x: torch.Tensor) -> float:
    """``max(1, max |x|)`` over ``x``'s finite entries: a ``-inf`` mask in an input must not make
    every step, or every direction, infinite."""
    finite = x[torch.isfinite(x)]
    return max(1.0, float(finite.abs().max())) if finite.numel() else 1.0


def same_values(wide: Point, narrow: Point) -> bool:
    """Whether the function's outputs at ``narrow`` (the point in its recorded, narrower dtypes) are
    its outputs at ``wide`` (float64 copies), each element within the square root of the narrow
    dtype's machine epsilon of float64's, relatively; infinities equal, no NaN. Where they are not
    (a length whose squares underflow float32 is 0 there), the recorded point is another point of
    the function than its float64 copies."""
    found = []
    for p in (wide, narrow):
        # Each from the same random state, as the probes run it.
        with flag.restored(flag.FlagState(False)), tracer.hidden(), seeded():
            found.append(outputs_of(p.run([differentiable(x) for x in p.inputs])))
    if len(found[0]) != len(found[1]):
        return False
    for exact, rounded in zip(*found):
        eps = torch.finfo(rounded.dtype).eps
        exact, rounded = exact.detach(), rounded.detach().to(exact.dtype)
        finite = torch.isfinite(exact)
        close = (rounded - exact).abs() <= math.sqrt(eps) * exact.abs()
        if not bool(torch.where(finite, close, rounded == exact).all()):
            return False
    return True


def _project(outputs: list[torch.Tensor], weights: list[torch.Tensor]) -> torch.Tensor:
    return sum(((o * w).sum() for o, w in zip(outputs, weights)), torch.zeros((), dtype=torch.float64))


def _poison(run: RuleRun) -> Callable[..., tuple[torch.Tensor | None, ...]]:
    """A post-hook for ``run``'s node, to run after its rule site's: NaN where the rule changed
    elements."""
    rule = run.rule

    def hook(grad_inputs: Sequence[torch.Tensor | None],
             grad_outputs: Sequence[torch.Tensor | None]) -> tuple[torch.Tensor | None, ...]:
        grads = list(grad_inputs)
        if isinstance(rule, NanSafe):  # one mask per gradient it set, in order
            targets = list(zip([i for i, g in enumerate(grads) if g is not None], run.masks))
        else:
            indices = range(len(grads)) if rule.input is None else (rule.input,)
            targets = [(i, run.masks[0]) for i in indices]
        for i, mask in targets:
            grad = grads[i] if i < len(grads) else None
            if grad is not None:
                grads[i] = torch.where(mask, math.nan, grad)
        return tuple(grads)

    return hook

"""The built-ins under ``torch.autocast``: each follows its native op's autocast policy.

Autocast picks a dtype per native op (``aten/src/ATen/autocast_mode.cpp``), and its lists differ
between the CPU and CUDA. A built-in is written from primitive ops, each of which autocast would
treat by its own list: ``ops.cdist``'s matrix product would run in bfloat16, where ``torch.cdist``
runs in float32, because ``|x1|^2 + |x2|^2 - 2 x1.x2`` cancels catastrophically in low precision.
So :func:`autocast_policy` does for a built-in what autocast does for its native op, in one step
at the group's boundary: it casts the floating-point tensor arguments to the dtype the native op
computes in, and runs the group with autocast off, as ``torch.amp.custom_fwd(cast_inputs=...)``
does. The group sees float32 (or unchanged) inputs, so its rules and gradients are the ones it has
without autocast, and the casts' backward hands each input its gradient in its own dtype, as
native's casts do. The policies, by their names in ``autocast_mode.cpp``:

- ``"fp32"``: float16 and bfloat16 tensors are cast to float32 (``torch.cdist``, and on CUDA the
  norms, ``pow``, ``logsumexp``, ...);
- ``"promote"``: all to the widest floating dtype among them (``torch.atan2`` on CUDA);
- ``"fallthrough"``: no cast; the op runs in its inputs' dtype (the ops on neither list).

As in ``autocast_mode.cpp``, only floating-point tensors on the autocast's device type are cast,
and never float64. Device types other than the CPU take the CUDA column: XPU and MPS list these
built-ins' native ops under the same policies.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Literal, TypeVar

import torch

from ..groups import lifecycle

Policy = Literal["fp32", "promote", "fallthrough"]
F = TypeVar("F", bound=Callable[..., Any])


def autocast_policy(*, cpu: Policy, cuda: Policy) -> Callable[[F], F]:
    """Run the decorated group under its native op's autocast policy on the ``cpu`` and ``cuda``.

    Outside autocast (for the arguments' device type), and on a device type without autocast
    (``meta``), the group is called unchanged. The policies are kept as ``__autocast_policy__``;
    ``__wrapped__`` stays the plain composite.

    >>> import torch, autograd_groups as ag
    >>> @autocast_policy(cpu="fp32", cuda="fp32")
    ... @ag.autograd_group("gram")
    ... def gram(x):
    ...     return x @ x.T
    >>> x = torch.ones(2, 2, dtype=torch.bfloat16)
    >>> with torch.autocast("cpu", dtype=torch.bfloat16):
    ...     gram(x).dtype, gram.__wrapped__(x.float()).dtype
    (torch.float32, torch.bfloat16)
    >>> gram.__autocast_policy__
    {'cpu': 'fp32', 'cuda': 'fp32'}
    """

    def decorate(group: F) -> F:
        @functools.wraps(group)
        def in_policy(*args: Any, **kwargs: Any) -> Any:
            device = _device_type(args, kwargs)
            if device is None or not _autocasting(device):
                return group(*args, **kwargs)
            cast = _caster(cpu if device == "cpu" else cuda, device, args, kwargs)
            with torch.autocast(device, enabled=False):
                return group(*[cast(a) for a in args], **{k: cast(v) for k, v in kwargs.items()})

        # As the group's own, ``__wrapped__`` is the plain composite (functools.wraps set the group).
        in_policy.__wrapped__ = getattr(group, "__wrapped__", group)
        in_policy.__autocast_policy__ = {"cpu": cpu, "cuda": cuda}  # type: ignore[attr-defined]
        return in_policy  # type: ignore[return-value]

    return decorate


def _device_type(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    """The device type of the first tensor argument (autocast dispatches on it), or None."""
    for a in (*args, *kwargs.values()):
        if isinstance(a, torch.Tensor):
            return a.device.type
    return None


def _autocasting(device: str) -> bool:
    """Whether autocast is on for ``device``; off on a device type autocast does not know (meta),
    for which ``torch.is_autocast_enabled`` raises and the native ops run as they are. Asked this
    way, not with ``torch.amp.is_autocast_available`` first: that is one more call per built-in,
    and torch 2.11's Dynamo cannot trace it."""
    try:
        return torch.is_autocast_enabled(device)
    except RuntimeError:
        return False


def _eligible(a: Any, device: str) -> bool:
    """Whether autocast would cast ``a``: a floating-point tensor on ``device``, not float64."""
    return (isinstance(a, torch.Tensor) and a.is_floating_point() and a.dtype != torch.float64
            and a.device.type == device)


def _caster(policy: Policy, device: str, args: tuple[Any, ...],
            kwargs: dict[str, Any]) -> Callable[[Any], Any]:
    """What ``policy`` does to one argument: cast it, if eligible, to the policy's dtype."""
    eligible = [a.dtype for a in (*args, *kwargs.values()) if _eligible(a, device)]
    if policy == "fallthrough" or not eligible:
        return lambda a: a
    dtype = torch.float32 if policy == "fp32" else functools.reduce(torch.promote_types, eligible)
    return lambda a: a.to(dtype) if _eligible(a, device) else a


# A group called through a policy is created where the policy's caller called it.
lifecycle.call_through(__name__)

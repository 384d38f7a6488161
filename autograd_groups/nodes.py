"""What PyTorch's autograd nodes are: op names, saved-value names, pointwise or not.

Everything is read from PyTorch itself (the generated node classes, :data:`compat.NODE_CLASSES` and
the ATen op tags), so the catalogue follows whatever PyTorch version is installed.
"""

from __future__ import annotations

import difflib
import functools
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

from . import compat
from .errors import RuleError

#: The node class that accumulates into a leaf tensor's ``.grad``: where every graph walk stops.
ACCUMULATE_GRAD: type = compat.ACCUMULATE_GRAD
_BACKWARD_SUFFIX = re.compile(r"Backward\d*$")
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")


def reachable(roots: Iterable[Any]) -> list[Any]:
    """Every autograd node reachable from the nodes ``roots`` (leaf accumulators included), in
    the order of one explicit depth-first walk. The list holds each node: a node's Python object
    dies once dropped, and a new one may then reuse its id (torch 2.11 keeps none alive).

    >>> x = torch.ones(2, requires_grad=True)
    >>> [type(n).__name__ for n in reachable([(x * 2).exp().grad_fn])]
    ['ExpBackward0', 'MulBackward0', 'AccumulateGrad']
    """
    found: list[Any] = []
    seen: set[Any] = {None}
    edges = [(root, 0) for root in roots]  # as next_functions gives them: (node, input number)
    while edges:
        node, _ = edges.pop()
        if node in seen:
            continue
        seen.add(node)
        found.append(node)
        edges += node.next_functions
    return found


@dataclass(frozen=True)
class OpInfo:
    """One op as autograd knows it: its name, the values its backward nodes save, whether it is
    elementwise, and how many inputs its nodes have at most (None: not known, or a list of tensors).

    ``inputs`` counts the tensor arguments of the op's ATen schemas, so it can exceed the inputs a
    node really has (``where``'s ``condition`` is a tensor without a gradient): it bounds a rule's
    ``input`` at registration, and the node itself bounds it at backward.
    """

    name: str
    saved: frozenset[str]
    pointwise: bool
    inputs: int | None


def op_key(name: str) -> str:
    """The spelling-insensitive key of an op name: ``clamp_min`` and ``ClampMin`` agree."""
    return name.replace("_", "").lower()


def op_name_of_class(class_name: str) -> str:
    """``ClampMinBackward0`` -> ``clamp_min``."""
    return _CAMEL.sub("_", _BACKWARD_SUFFIX.sub("", class_name)).lower()


def _schema_facts(name: str) -> tuple[bool, int | None]:
    """Whether the ATen op ``name`` is pointwise, and the most tensor inputs one of its overloads
    takes (None for an op that is not in ATen or takes a list of tensors)."""
    try:
        packet = getattr(torch.ops.aten, name)
    except (AttributeError, RuntimeError):
        return False, None
    overloads = [getattr(packet, o) for o in packet.overloads()]
    counts: list[int] = []
    for overload in overloads:
        types = [str(a.type) for a in compat.op_schema(overload).arguments if not a.is_out]
        if any("List[" in t and "Tensor" in t for t in types):
            return any(torch.Tag.pointwise in o.tags for o in overloads), None
        counts.append(sum(t in ("Tensor", "Optional[Tensor]") for t in types))
    pointwise = any(torch.Tag.pointwise in o.tags for o in overloads)
    return pointwise, (max(counts) or None) if counts else None


@functools.lru_cache(maxsize=1)
def _node_classes() -> dict[str, tuple[str, tuple[type, ...]]]:
    """Every op with a generated backward node, by :func:`op_key`: its name and node classes."""
    found: dict[str, tuple[str, list[type]]] = {}
    for class_name in dir(compat.NODE_CLASSES):
        if not _BACKWARD_SUFFIX.search(class_name) or "BackwardBackward" in class_name:
            continue
        name = op_name_of_class(class_name)
        found.setdefault(op_key(name), (name, []))[1].append(getattr(compat.NODE_CLASSES, class_name))
    return {key: (name, tuple(classes)) for key, (name, classes) in found.items()}


@functools.cache
def op_info(key: str) -> OpInfo | None:
    """The :class:`OpInfo` of the op with :func:`op_key` ``key``, or None if autograd has no node for it.

    Made per op when first asked: reading every node class and ATen schema at once takes longer than
    importing the package.

    >>> op_info(op_key("sqrt")).saved, op_info(op_key("no_such_op"))
    (frozenset({'result'}), None)
    """
    found = _node_classes().get(key)
    if found is None:
        return None
    name, classes = found
    saved = frozenset(s for cls in classes for s in compat.saved_names_of_class(cls))
    return OpInfo(name, saved, *_schema_facts(name))


def resolve_op(op: str) -> OpInfo:
    """The :class:`OpInfo` of ``op``, or a :class:`RuleError` naming the closest known ops."""
    info = op_info(op_key(op))
    if info is None:
        names = sorted(name for name, _ in _node_classes().values())
        node_name = op_name_of_class(op) if _BACKWARD_SUFFIX.search(op) else None
        if node_name in names:
            raise RuleError(f"{op!r} is the name of an autograd node (as anomaly mode and grad_fn show "
                            f"it), not of an op: did you mean {node_name!r}? Rules name the op, as in "
                            f"derivatives.yaml")
        close = difflib.get_close_matches(op, names, n=5, cutoff=0.6)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise RuleError(f"unknown op {op!r}: autograd has no backward node for it{hint} "
                        f"(op names are PyTorch's, as in derivatives.yaml: sqrt, clamp_min, pow, ...)")
    return info


_class_keys: dict[type, str] = {}


def _class_key(cls: type) -> str:
    key = _class_keys.get(cls)
    if key is None:
        key = _class_keys[cls] = op_key(op_name_of_class(cls.__name__))
    return key


def node_key(node: object) -> str:
    """The :func:`op_key` of the op that made an autograd node."""
    return _class_key(type(node))


def node_op(node: object) -> str:
    """The op name of an autograd node (``SqrtBackward0`` -> ``sqrt``)."""
    return op_name_of_class(type(node).__name__)


# Per node class, asked at every rule site a NaN-safe group installs.
_generated: dict[type, bool] = {}
_pointwise: dict[type, bool] = {}


def is_generated_class(node_class: type) -> bool:
    """Whether autograd generates this node class from an op's derivative formula (not a custom
    ``autograd.Function``): its backward is then a linear function of the incoming gradient."""
    found = _generated.get(node_class)
    if found is None:
        found = _generated[node_class] = getattr(compat.NODE_CLASSES, node_class.__name__, None) is node_class
    return found


def is_pointwise_class(node_class: type) -> bool:
    """Whether the op of an autograd node class is elementwise (ATen's ``pointwise`` tag)."""
    found = _pointwise.get(node_class)
    if found is None:
        info = op_info(_class_key(node_class))
        found = _pointwise[node_class] = info is not None and info.pointwise
    return found


def saved_names(node: object) -> tuple[str, ...]:
    """The names of the values this node's class saves, as ``derivatives.yaml`` spells them."""
    return compat.saved_names_of_class(type(node))

"""An override's decision at backward time, in both places that make it (the override's node in
reverse mode, groups/override.py; the transposed group under forward mode, sites/tangents.py): run
its check, and give each input the replacement's gradient where it fired, the group's own chain's
elsewhere -- a ``torch.where`` of both where the answer is a tensor that cannot become a bool."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ..errors import RuleError
from ..rules.kinds import Override, OverrideContext


def ask(rule: Override, view: OverrideContext, where: str, hint: str = "") -> Any:
    """``rule``'s check on ``view``; an error of the check's own raised as a :class:`RuleError` that
    names ``where`` (the group and rule) and adds ``hint`` (what the check must do there).

    >>> import torch, autograd_groups as ag
    >>> rule = ag.Override(check=lambda ctx: 1 / 0, backward=lambda ctx, g: (g,))
    >>> view = ag.OverrideContext("g", (torch.ones(1),), (torch.ones(1),), {})
    >>> ask(rule, view, "group 'g'")
    Traceback (most recent call last):
    ...
    autograd_groups.errors.RuleError: group 'g': the check raised ZeroDivisionError('division by zero').
    """
    try:
        return rule.check(view)
    except Exception as e:
        raise RuleError(f"{where}: the check raised {e!r}.{hint}") from e


def choose(fired: torch.Tensor, replaced: Sequence[torch.Tensor | None],
           automatic: Sequence[torch.Tensor | None]) -> list[torch.Tensor | None]:
    """Per input, the replacement's gradient where ``fired`` holds and the automatic one elsewhere;
    an input that one of them gives no gradient (None) has 0 from it.

    >>> import torch
    >>> choose(torch.tensor([True, False]), [torch.ones(2), None], [torch.zeros(2), torch.ones(2)])
    [tensor([1., 0.]), tensor([0., 1.])]
    """
    chosen: list[torch.Tensor | None] = []
    for r, a in zip(replaced, automatic):
        if a is None:
            a = None if r is None else torch.zeros_like(r)
        if r is None:
            r = None if a is None else torch.zeros_like(a)
        chosen.append(None if r is None or a is None else torch.where(fired, r, a))
    return chosen

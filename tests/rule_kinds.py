"""One small group per rule kind, for the checks that run each kind's forward and backward:
tests/test_host_sync.py on the CPU, scripts/gpu_check.py on a GPU. Each builder registers its rule
(call it inside a registry scope) and returns the group's function, with an input that holds the
rule's special point."""

from __future__ import annotations

from collections.abc import Callable

import torch

import autograd_groups as ag

Fn = Callable[[torch.Tensor], torch.Tensor]


def subgradient() -> Fn:
    @ag.autograd_group("kinds.norm")
    def norm(x: torch.Tensor) -> torch.Tensor:
        return (x * x).sum(-1).sqrt()

    ag.register_rule("kinds.norm", ag.Subgradient(op="sqrt", when="result == 0", grad=0))
    return norm


def nan_safe() -> Fn:
    @ag.autograd_group("kinds.entropy")
    def entropy(p: torch.Tensor) -> torch.Tensor:
        return -torch.where(p > 0, p * p.log(), 0).sum(-1)

    ag.register_rule("kinds.entropy", ag.NanSafe())
    return entropy


def override() -> Fn:
    @ag.autograd_group("kinds.safe_norm")
    def norm(x: torch.Tensor) -> torch.Tensor:
        return (x * x).sum(-1).sqrt()

    @ag.special_case("kinds.safe_norm")
    def at_zero(ctx: ag.OverrideContext) -> torch.Tensor:  # a tensor answer: no host read
        return (ctx.outputs[0] == 0).any()

    @at_zero.backward
    def zero_grad(ctx: ag.OverrideContext, grad: torch.Tensor) -> tuple[torch.Tensor]:
        return (torch.zeros_like(ctx.inputs[0]),)

    return norm


KINDS: dict[str, Callable[[], Fn]] = {"subgradient": subgradient, "nan_safe": nan_safe, "override": override}


def special_input(device: torch.device | str = "cpu") -> torch.Tensor:
    """Rows with a zero norm, a zero probability and none: each kind's special point and an ordinary one."""
    return torch.tensor([[0.0, 0.0, 0.0], [0.5, 0.25, 1.0], [0.0, 0.3, 0.7]], device=device)

"""Nested groups: rules of inner and outer groups both apply; the innermost wins on one op."""

from __future__ import annotations

import torch

import autograd_groups as ag


def test_inner_and_outer_rules_both_apply_and_innermost_wins():
    ag.register_rule("inner", ag.Subgradient(op="sqrt", when="result == 0", grad="grad * 7"))
    ag.register_rule("outer", ag.Subgradient(op="sqrt", when="result == 0", grad="grad * 3"))
    ag.register_rule("outer", ag.Subgradient(op="reciprocal", when="isinf(result)", grad="grad * 5"))

    @ag.autograd_group("inner")
    def inner(a, b):
        return a.sqrt() + b.reciprocal()

    @ag.autograd_group("outer")
    def outer(a, b, c):
        return inner(a, b) + c.sqrt()

    a, b, c = (torch.zeros(2, dtype=torch.float64, requires_grad=True) for _ in range(3))
    outer(a, b, c).sum().backward()
    assert torch.equal(a.grad, torch.full((2,), 7.0, dtype=torch.float64))  # inner wins on sqrt
    assert torch.equal(b.grad, torch.full((2,), 5.0, dtype=torch.float64))  # outer's rule, inner node
    assert torch.equal(c.grad, torch.full((2,), 3.0, dtype=torch.float64))  # outer's rule, own node


def test_nested_context_managers_and_trace_parent():
    ag.register_rule("inner", ag.Subgradient(op="sqrt", when="result == 0", grad="grad * 7"))
    ag.register_rule("outer", ag.NanSafe())
    x = torch.tensor([0.0, 4.0], dtype=torch.float64, requires_grad=True)
    with ag.trace() as t:
        with ag.autograd_group("outer"):
            with ag.autograd_group("inner"):
                y = x.sqrt()
            z = torch.where(x > 0, y * 2, torch.zeros_like(y))
        z.sum().backward()
    # inner: sqrt'(0) -> 7, but `where` sends 0 into that branch at x = 0.
    torch.testing.assert_close(x.grad, torch.tensor([0.0, 0.5], dtype=torch.float64))
    by_name = {i.name: i for i in t.instances}
    assert by_name["inner"].parent is by_name["outer"]
    inner_vertices = set(by_name["inner"].graph)
    assert inner_vertices <= set(by_name["outer"].graph)
    sqrt_vertex = next(v for v in inner_vertices if by_name["inner"].graph.nodes[v]["op"] == "sqrt")
    assert by_name["outer"].graph.nodes[sqrt_vertex]["group"] == by_name["inner"].id


def test_same_group_nested_in_itself():
    ag.register_rule("g", ag.Subgradient(op="sqrt", when="result == 0", grad="grad * 1"))

    @ag.autograd_group("g")
    def f(x, depth):
        return f(x, depth - 1).sqrt() if depth else x.sqrt()

    x = torch.zeros(1, dtype=torch.float64, requires_grad=True)
    f(x, 2).backward()
    assert torch.equal(x.grad, torch.ones(1, dtype=torch.float64))

"""The decorator, context-manager and tag forms of a group record the same subgraph and fix the
same gradients."""

from __future__ import annotations

import networkx as nx
import torch

import autograd_groups as ag


def tagged_cdist(x1: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:
    """The cdist composite with every differentiable op tagged, as the seed sketches it."""
    t = ag.tag
    x1_norm = t(t(x1.pow(2), "cdist").sum(-1, keepdim=True), "cdist")
    x2_norm = t(t(x2.pow(2), "cdist").sum(-1, keepdim=True), "cdist")
    x1_ = t(torch.cat([t(x1.mul(-2), "cdist"), x1_norm, torch.ones_like(x1_norm)], -1), "cdist")
    x2_ = t(torch.cat([x2, torch.ones_like(x2_norm), x2_norm], -1), "cdist")
    result = t(x1_.matmul(t(x2_.transpose(-2, -1), "cdist")), "cdist")
    return t(t(result.clamp_min(0), "cdist").sqrt(), "cdist")


def points():
    x1 = torch.tensor([[0.0, 1.0], [2.0, 3.0], [1.0, 1.0]], dtype=torch.float64, requires_grad=True)
    x2 = torch.tensor([[0.0, 1.0], [5.0, 5.0]], dtype=torch.float64, requires_grad=True)
    return x1, x2


def traced(fn):
    x1, x2 = points()
    with ag.trace() as t:
        fn(x1, x2).sum().backward()
    assert torch.isfinite(x1.grad).all() and torch.isfinite(x2.grad).all()
    assert len(t.instances) == 1
    return t.instances[0], (x1.grad, x2.grad)


def same_structure(a: nx.DiGraph, b: nx.DiGraph) -> bool:
    return nx.is_isomorphic(a, b, node_match=lambda u, v: (u["op"], u["kind"]) == (v["op"], v["kind"]))


def test_context_manager_and_tag_record_the_decorator_subgraph(cdist_example):
    decorated, grads = traced(cdist_example.grouped_cdist)

    def with_block(x1, x2):
        with ag.autograd_group("cdist"):
            return cdist_example.euclidean_cdist(x1, x2)

    for fn in (with_block, tagged_cdist):
        instance, form_grads = traced(fn)
        assert same_structure(instance.graph, decorated.graph)
        assert len(instance.inputs) == 2 and len(instance.outputs) == 1
        for ours, theirs in zip(form_grads, grads):
            assert torch.equal(ours, theirs)


def test_one_instance_per_entry(cdist_example):
    x1, x2 = points()
    with ag.trace() as t:
        cdist_example.grouped_cdist(x1, x2)
        cdist_example.grouped_cdist(x1, x2)
        with ag.autograd_group("cdist"):
            cdist_example.euclidean_cdist(x1, x2)
        tagged_cdist(x1, x2)
    assert [i.name for i in t.instances] == ["cdist"] * 4
    assert ag.stats()["cdist"]["instances"] == 4


def test_context_manager_without_rules_and_untraced_does_nothing():
    x = torch.zeros(2, requires_grad=True)
    with ag.autograd_group("nothing") as instance:
        y = x.sqrt()
    assert instance is None
    y.sum().backward()
    assert x.grad.isinf().all()  # plain autograd


def test_tag_on_a_tensor_without_grad_fn_returns_it():
    x = torch.ones(2)
    assert ag.tag(x, "g") is x

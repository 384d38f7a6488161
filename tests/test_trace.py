"""trace(): the recorded subgraph, its boundary, its hits; and no graph object without a session."""

from __future__ import annotations

import threading

import networkx as nx
import torch

import autograd_groups as ag
from autograd_groups.observe import tracer
from conftest import line_of


def points():
    x1 = torch.tensor([[0.0, 1.0], [2.0, 3.0]], dtype=torch.float64, requires_grad=True)
    x2 = torch.tensor([[0.0, 1.0], [5.0, 5.0], [2.0, 3.0]], dtype=torch.float64, requires_grad=True)
    return x1, x2


def test_cdist_graph_holds_the_composite_ops_and_its_boundary(cdist_example):
    x1, x2 = points()
    with ag.trace() as t:
        cdist_example.grouped_cdist(x1, x2).sum().backward()
    (instance,) = t.instances
    graph = instance.graph
    assert isinstance(graph, nx.DiGraph) and instance.name == "cdist" and instance.parent is None
    ops = {d["op"] for _, d in graph.nodes(data=True) if d["kind"] == "op"}
    # matmul of two matrices is recorded by autograd as an mm node.
    assert ops == {"pow", "sum", "mul", "cat", "transpose", "mm", "clamp_min", "sqrt"}
    assert [graph.nodes[v]["name"] for v in instance.inputs] == ["x1", "x2"]
    assert all(graph.nodes[v]["kind"] == "input" for v in instance.inputs)
    (output,) = instance.outputs
    assert graph.nodes[output]["op"] == "sqrt" and graph.nodes[output]["shape"] == [[2, 3]]
    assert graph.nodes[output]["saved"] == ["result"]
    assert graph.nodes[output]["rules"] == [
        {"label": cdist_example.SQRT_AT_ZERO.label, "kind": "subgradient", "group": "cdist#0"}]
    # Gradients flow from the output back to both inputs.
    assert all(nx.has_path(graph, output, v) for v in instance.inputs)
    assert graph.in_degree(output) == 0
    # Two pairs of identical rows: the rule set two elements.
    assert instance.hits == {cdist_example.SQRT_AT_ZERO.label: 2}
    assert graph.nodes[output]["hits"] == {cdist_example.SQRT_AT_ZERO.label: 2}
    assert ag.stats()["cdist"]["rules"][cdist_example.SQRT_AT_ZERO.label]["elements"] == 2


def test_vertex_ids_are_deterministic(cdist_example):
    graphs = []
    for _ in range(2):
        x1, x2 = points()
        with ag.trace() as t:
            cdist_example.grouped_cdist(x1, x2)
        graphs.append(t.instances[0].graph)
    assert list(graphs[0].nodes) == list(graphs[1].nodes)
    assert list(graphs[0].edges) == list(graphs[1].edges)


def test_no_graph_object_without_a_trace_session(cdist_example, monkeypatch):
    made = []
    original = nx.DiGraph.__init__

    def counting_init(self, *args, **kwargs):
        made.append(1)
        original(self, *args, **kwargs)

    monkeypatch.setattr(nx.DiGraph, "__init__", counting_init)
    # The first-order check of a rule that fired (once per call site) traces its own runs.
    monkeypatch.setattr(ag.sites.first_order, "_enabled", False)
    x1, x2 = points()
    cdist_example.grouped_cdist(x1, x2).sum().backward()
    with ag.autograd_group("cdist"):
        cdist_example.euclidean_cdist(x1, x2).sum().backward()
    assert made == []
    with ag.trace():
        cdist_example.grouped_cdist(x1, x2)
    assert made == [1]


def test_traced_instances_from_other_threads_are_recorded(cdist_example):
    import threading

    x1, x2 = points()
    with ag.trace() as t:
        thread = threading.Thread(target=lambda: cdist_example.grouped_cdist(x1, x2))
        thread.start()
        thread.join()
    assert [i.name for i in t.instances] == ["cdist"]


def test_groups_without_rules_are_traced(cdist_example):
    x = torch.ones(3, requires_grad=True)
    with ag.trace() as t:
        ag.autograd_group("plain")(lambda x: (x * 2).exp())(x)
    assert [d["op"] for _, d in t.instances[0].graph.nodes(data=True) if d["kind"] == "op"] == ["exp", "mul"]


def test_boundary_between_two_groups_is_shared(cdist_example):
    x = torch.ones(3, requires_grad=True)
    first = ag.autograd_group("first")(lambda x: x * 2)
    second = ag.autograd_group("second")(lambda y: y.exp())
    with ag.trace() as t:
        second(first(x))
    a, b = t.instances
    assert b.inputs == a.outputs


def test_hiding_one_threads_runs_leaves_another_threads_recorded() -> None:
    # ag.verify hides its own runs of a group from the open sessions: in its thread only, and a
    # session it opens inside records them.
    double = ag.autograd_group("hidden_double")(lambda x: x * 2)
    hiding, done = threading.Event(), threading.Event()
    seen: list[list[str]] = []

    def verifying() -> None:
        with tracer.hidden():
            double(torch.ones(1, requires_grad=True))
            with ag.trace() as inner:
                double(torch.ones(1, requires_grad=True))
            seen.append([i.name for i in inner.instances])
            hiding.set()
            done.wait(30)

    worker = threading.Thread(target=verifying)
    with ag.trace() as t:
        worker.start()
        assert hiding.wait(30)
        try:
            double(torch.ones(1, requires_grad=True))  # main-thread-call
        finally:
            done.set()
            worker.join()
    # The outer session has the main thread's instance, made while the worker hid its own.
    assert [i.where for i in t.instances] == [f"{__file__}:{line_of(__file__, '# main-thread-call')}"]
    assert seen == [["hidden_double"]]

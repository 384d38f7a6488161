"""Drawing traces: folding, DOT (parsed back with pydot), Mermaid, JSON round trips (pictures and
Jupyter's view: test_render.py)."""

from __future__ import annotations

import io
import json
import os
import stat

import networkx as nx
import pydot
import pytest
import torch
from rich.console import Console

import autograd_groups as ag
from autograd_groups import viz
from autograd_groups.errors import GroupError

pytestmark = pytest.mark.filterwarnings("ignore:'setParseAction' deprecated")


def points(n: int = 5, d: int = 3, same: int = 2, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x1 = torch.randn(n, d, generator=g, dtype=torch.float64)
    x2 = torch.randn(n, d, generator=g, dtype=torch.float64)
    x2[:same] = x1[:same]
    return x1.requires_grad_(), x2.requires_grad_()


def zero_distances(x1: torch.Tensor, x2: torch.Tensor) -> int:
    """The number of pairs at distance exactly 0, computed without the library."""
    return int((x1[:, None, :] == x2[None, :, :]).all(-1).sum())


def unquote(value: str | None) -> str:
    assert value is not None
    return value[1:-1].replace('\\"', '"').replace("\\n", "\n") if value.startswith('"') else value


def parse(dot: str) -> pydot.Dot:
    (graph,) = pydot.graph_from_dot_data(dot)
    return graph


def clusters(graph: pydot.Graph) -> list[tuple[pydot.Subgraph, int]]:
    """Every cluster subgraph with its nesting depth (1 = top level), top-down."""
    found = []
    stack = [(s, 1) for s in reversed(graph.get_subgraphs())]
    while stack:
        sub, depth = stack.pop()
        if sub.get_name().strip('"').startswith("cluster_"):
            found.append((sub, depth))
        stack.extend((s, depth + 1) for s in reversed(sub.get_subgraphs()))
    return found


def nodes_by_id(graph: pydot.Graph) -> dict[str, pydot.Node]:
    """DOT node name -> node, over the whole nesting."""
    found: dict[str, pydot.Node] = {}
    stack: list[pydot.Graph] = [graph]
    while stack:
        current = stack.pop()
        for node in current.get_nodes():
            if node.get_name() not in ("node", "graph", "edge"):
                found[node.get_name()] = node
        stack.extend(current.get_subgraphs())
    return found


def cluster_label(sub: pydot.Subgraph) -> str:
    return unquote(sub.get_label() or sub.get_attributes().get("label"))


def test_repeated_instances_fold_into_one_cluster_with_summed_hits(cdist_example) -> None:
    x1, x2 = points()
    with ag.trace() as t:
        for _ in range(3):
            cdist_example.grouped_cdist(x1, x2).sum().backward()
    folded = viz.fold(t.instances)
    (cluster,) = folded.clusters.values()
    assert (cluster.name, cluster.count, cluster.total) == ("cdist", 3, 3)
    label = cdist_example.SQRT_AT_ZERO.label
    assert cluster.hits == {label: 3 * zero_distances(x1, x2)}
    # One instance's vertices, not three.
    assert folded.graph.number_of_nodes() == t.instances[0].graph.number_of_nodes()
    (site,) = [d for _, d in folded.graph.nodes(data=True) if d["rules"]]
    assert site["op"] == "sqrt" and site["hits"] == {label: 3 * zero_distances(x1, x2)}


def test_different_structures_do_not_fold(cdist_example) -> None:
    with ag.trace() as t:
        cdist_example.grouped_cdist(*points(n=5)).sum().backward()
        cdist_example.grouped_cdist(*points(n=5)).sum().backward()
        cdist_example.grouped_cdist(*points(n=6)).sum().backward()  # other shapes
        with ag.special_cases(False):
            cdist_example.grouped_cdist(*points(n=5)).sum().backward()  # no rule site
    folded = viz.fold(t.instances)
    assert [(c.count, c.enabled) for c in folded.clusters.values()] == [(2, True), (1, True), (1, False)]


def test_dot_has_one_labelled_cluster_per_folded_group_and_marks_rule_sites(cdist_example) -> None:
    x1, x2 = points()
    with ag.trace() as t:
        for _ in range(4):
            cdist_example.grouped_cdist(x1, x2).sum().backward()
        with ag.special_cases(False):
            cdist_example.grouped_cdist(x1, x2).sum().backward()
    graph = parse(t.to_dot())
    found = clusters(graph)
    labels = [cluster_label(sub).splitlines()[0] for sub, _ in found]
    assert labels == ["cdist ×4", "cdist"]
    assert "special cases off" in cluster_label(found[1][0])
    nodes = nodes_by_id(graph)
    sites = [n for n in nodes.values() if "site" in unquote(n.get("class")).split()]
    (site,) = sites
    assert "subgradient" in unquote(site.get("class")).split()
    text = unquote(site.get_label())
    assert text.startswith("sqrt\n") and cdist_example.SQRT_AT_ZERO.label in text
    assert f"{4 * zero_distances(x1, x2)} elements changed" in text
    # The sqrt of the instances with special cases off is no rule site.
    sqrts = [n for n in nodes.values() if unquote(n.get_label()).startswith("sqrt")]
    assert len(sqrts) == 2


def test_dot_edges_follow_gradient_flow_and_inputs_stand_outside(cdist_example) -> None:
    x1, x2 = points()
    with ag.trace() as t:
        cdist_example.grouped_cdist(x1, x2).sum().backward()
    (instance,) = t.instances
    graph = parse(t.to_dot())
    names = {name: unquote(node.get("id")) for name, node in nodes_by_id(graph).items()}
    edges = {(names[e.get_source()], names[e.get_destination()]) for e in graph.get_edges()}
    assert edges == set(instance.graph.edges)
    output = instance.outputs[0]
    assert all(nx.has_path(instance.graph, output, v) for v in instance.inputs)
    top_level = {unquote(n.get("id")): n for n in graph.get_nodes()
                 if n.get_name() not in ("node", "graph", "edge")}
    assert set(top_level) == set(instance.inputs)
    assert all(unquote(n.get("class")) == "input" and n.get("shape") == "ellipse" for n in top_level.values())
    assert sorted(unquote(n.get_label()).split(":")[0] for n in top_level.values()) == ["x1", "x2"]
    inside = {unquote(n.get("id")): n for n in nodes_by_id(graph).values()}
    assert "output" in unquote(inside[output].get("class")).split()


@ag.autograd_group("inner")
def inner(x: torch.Tensor) -> torch.Tensor:
    return x.sqrt() * 2


@ag.autograd_group("outer")
def outer(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return (inner(x) + inner(y) + inner(x * y)).exp()


def nested_trace(steps: int = 2) -> ag.Trace:
    ag.register_rule("inner", ag.Subgradient(op="sqrt", when="result == 0", grad=0))
    x = torch.tensor([0.0, 1.0, 2.0], requires_grad=True)
    y = torch.tensor([1.0, 0.0, 3.0], requires_grad=True)
    with ag.trace() as t:
        for _ in range(steps):
            outer(x, y).sum().backward()
    return t


def test_nested_groups_are_nested_clusters() -> None:
    t = nested_trace()
    found = clusters(parse(t.to_dot()))
    described = [(cluster_label(sub).splitlines()[0], depth) for sub, depth in found]
    # inner(x) and inner(y) fold (leaf inputs); inner(x * y) reads a node of outer: another cluster.
    assert described == [("outer ×2", 1), ("inner ×2", 2), ("inner", 2)]
    outer_cluster = found[0][0]
    assert {s.get_name() for s in outer_cluster.get_subgraphs()} == {found[1][0].get_name(),
                                                                    found[2][0].get_name()}


def test_nested_input_made_by_the_parent_is_the_parents_vertex() -> None:
    t = nested_trace(steps=1)
    by_name: dict[str, list] = {}
    for instance in t.instances:
        by_name.setdefault(instance.name, []).append(instance)
    (parent,) = by_name["outer"]
    third = by_name["inner"][2]
    (source,) = third.inputs
    assert parent.graph.nodes[source]["op"] == "mul" and parent.graph.nodes[source]["group"] == parent.id
    assert set(third.graph.edges) <= set(parent.graph.edges)
    union = nx.compose_all([i.graph for i in t.instances])
    inputs = sorted(d.get("name", d["op"]) for _, d in union.nodes(data=True) if d["kind"] == "input")
    assert inputs == ["x", "y"]


def test_hits_of_nested_rules_add_up() -> None:
    t = nested_trace(steps=3)
    folded = viz.fold(t.instances)
    label = ag.list_rules()["inner"][0].label
    # x = [0, 1, 2], y = [1, 0, 3]: sqrt meets 0 once in inner(x), once in inner(y) (these two fold
    # into "inner ×2") and twice in inner(x * y); three steps.
    hits = {c.count: c.hits for c in folded.clusters.values() if c.name == "inner"}
    assert hits == {2: {label: 3 * (1 + 1)}, 1: {label: 3 * 2}}


def test_select_keeps_a_group_and_what_it_nests() -> None:
    t = nested_trace(steps=1)
    assert {i.name for i in viz.select(t.instances, "outer")} == {"outer", "inner"}
    assert {i.name for i in viz.select(t.instances, "inner")} == {"inner"}
    with pytest.raises(GroupError, match=r"no instance of group 'nope' was traced; traced groups: inner, "
                                         r"outer"):
        viz.select(t.instances, "nope")


def test_collapse_turns_the_biggest_clusters_into_boxes(cdist_example) -> None:
    with ag.trace() as t:
        cdist_example.grouped_cdist(*points()).sum().backward()
    outer_nested = nested_trace(steps=1)
    instances = [*t.instances, *outer_nested.instances]
    full = viz.draw(instances)
    small = viz.draw(instances, max_nodes=full.graph.number_of_nodes() - 1)
    boxes = [d for _, d in small.graph.nodes(data=True) if d["kind"] == "group"]
    assert [b["op"] for b in boxes] == ["cdist"]  # the biggest cluster goes first
    assert boxes[0]["size"] == 11 and boxes[0]["sites"] == 1
    tiny = viz.draw(instances, max_nodes=1)
    boxes = [d["op"] for _, d in tiny.graph.nodes(data=True) if d["kind"] == "group"]
    assert sorted(boxes) == ["cdist", "outer"]
    # Edges into a collapsed cluster still lead to its inputs.
    box = next(v for v, d in tiny.graph.nodes(data=True) if d["op"] == "cdist")
    assert {tiny.graph.nodes[v]["name"] for v in tiny.graph.successors(box)} == {"x1", "x2"}
    parse(viz.to_dot(tiny))


def test_thousands_of_instances_fold_to_a_small_graph(cdist_example) -> None:
    x1, x2 = points(n=3)
    with ag.trace() as t:
        for _ in range(200):
            cdist_example.grouped_cdist(x1, x2).sum().backward()
    folded = viz.fold(t.instances)
    assert [(c.name, c.count) for c in folded.clusters.values()] == [("cdist", 200)]
    assert folded.graph.number_of_nodes() == 13


def test_mermaid_nests_subgraphs_and_classes_rule_sites() -> None:
    text = nested_trace().to_mermaid()
    lines = [line.strip() for line in text.splitlines()]
    assert lines[0] == "flowchart TB"
    subgraphs = [line for line in lines if line.startswith("subgraph ")]
    assert len(subgraphs) == 3 and subgraphs[0].startswith('subgraph c0["outer ×2<br/>')
    assert lines.count("end") == 3
    # The two inner clusters sit inside the outer one: their subgraph lines come before its "end".
    first_end = lines.index("end")
    assert lines.index(subgraphs[1]) < first_end and "class" in text
    assert any(line.startswith("class ") and line.endswith(" fired") for line in lines)
    assert "#35;" not in "".join(subgraphs)


def test_save_load_round_trip_gives_equal_graphs(tmp_path) -> None:
    t = nested_trace()
    path = tmp_path / "trace.json"
    t.save(path)
    data = json.loads(path.read_text())
    assert data["schema"] == 1
    loaded = ag.Trace.load(path)
    assert len(loaded.instances) == len(t.instances)
    for a, b in zip(t.instances, loaded.instances):
        assert nx.utils.graphs_equal(a.graph, b.graph)
        assert (a.name, a.id, a.where, a.enabled, a.inputs, a.outputs, a.hits) == \
               (b.name, b.id, b.where, b.enabled, b.inputs, b.outputs, b.hits)
        assert (a.parent.id if a.parent else None) == (b.parent.id if b.parent else None)
    assert loaded.to_dot() == t.to_dot()


def test_load_refuses_other_schemas_and_other_files(tmp_path) -> None:
    t = nested_trace(steps=1)
    path = tmp_path / "trace.json"
    t.save(path)
    data = json.loads(path.read_text())
    data["schema"] = 2
    path.write_text(json.dumps(data))
    with pytest.raises(GroupError, match=r"trace schema 2; this version of autograd-groups reads schema 1"):
        ag.Trace.load(path)
    path.write_text("[1, 2]")
    with pytest.raises(GroupError, match=r"not an autograd-groups trace"):
        ag.Trace.load(path)
    path.write_text("{")
    with pytest.raises(GroupError, match=r"trace.json:1:2: not a trace file"):
        ag.Trace.load(path)


def test_tree_shows_clusters_ops_and_hits(cdist_example) -> None:
    x1, x2 = points()
    with ag.trace() as t:
        for _ in range(2):
            cdist_example.grouped_cdist(x1, x2).sum().backward()
    console = Console(file=io.StringIO(), width=200)
    console.print(viz.to_tree(viz.fold(t.instances)))
    out = console.file.getvalue()
    assert "cdist ×2" in out
    assert f"{cdist_example.SQRT_AT_ZERO.label}: {2 * zero_distances(x1, x2)} elements changed" in out
    assert "← x1: leaf [5, 3]" in out and "clamp_min [5, 5]" in out


def test_written_files_get_the_permissions_of_a_new_file(cdist_example, tmp_path) -> None:
    with ag.trace() as t:
        cdist_example.grouped_cdist(*points()).sum().backward()
    old = os.umask(0o027)
    try:
        viz.write(t.instances, tmp_path / "g.mmd")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "g.mmd").stat().st_mode) == 0o640     # 0o666 less the umask
    assert [p.name for p in tmp_path.iterdir()] == ["g.mmd"]               # no temporary file left


def test_writing_an_unknown_extension_is_refused(tmp_path) -> None:
    with pytest.raises(GroupError, match=r"the extension must be one of .dot, .mmd, .json"):
        viz.write([], tmp_path / "x.txt")


def test_the_summary_counts_in_the_singular_for_one(cdist_example) -> None:
    with ag.trace() as t:
        cdist_example.grouped_cdist(*points()).sum().backward()
    one = viz.to_mermaid(viz.fold(t.instances)).splitlines()[1]
    assert one.startswith("  %% 1 group instance in 1 cluster, ")
    with ag.trace() as t:
        for n in (5, 6):
            cdist_example.grouped_cdist(*points(n=n)).sum().backward()
    two = viz.to_mermaid(viz.fold(t.instances)).splitlines()[1]
    assert two.startswith("  %% 2 group instances in 2 clusters, ")


def test_importing_the_library_does_not_import_the_drawing_code() -> None:
    import subprocess
    import sys

    code = ("import sys, autograd_groups\n"
            "print('autograd_groups.viz' in sys.modules, 'networkx' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["False", "False"]

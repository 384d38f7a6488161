"""The package's layout shows its design: its modules import each other in layers, never in a circle
(imports inside functions and under ``TYPE_CHECKING`` count too)."""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

PACKAGE = Path(__file__).resolve().parent.parent / "autograd_groups"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, modules: set[str]) -> set[str]:
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = package
            for _ in range(node.level - 1):
                base = base.rpartition(".")[0]
            target = f"{base}.{node.module}" if node.level and node.module else (node.module or base)
            for alias in node.names:
                found.add(f"{target}.{alias.name}" if f"{target}.{alias.name}" in modules else target)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {m for m in found if m in modules and m != name}


def import_graph() -> nx.DiGraph:
    files = sorted(PACKAGE.rglob("*.py"))
    modules = {_module_name(f) for f in files}
    graph = nx.DiGraph()
    for f in files:
        graph.add_node(_module_name(f))
        graph.add_edges_from((_module_name(f), m) for m in _imports(f, modules))
    return graph


def test_no_import_cycles_between_modules() -> None:
    graph = import_graph()
    # A package's __init__ re-exports its modules (the top one all of them): leave those out.
    packages = [n for n in graph if (PACKAGE.parent / n.replace(".", "/") / "__init__.py").exists()]
    cycles = list(nx.simple_cycles(graph.subgraph(set(graph) - set(packages))))
    assert cycles == []


def test_rule_sites_stand_below_the_groups() -> None:
    """``sites/`` (what runs at backward) imports nothing from ``groups/`` (what opens instances and
    hooks the sites): the layers of docs/groups.md's module map."""
    graph = import_graph()
    upward = [(a, b) for a, b in graph.edges if a.startswith("autograd_groups.sites.")
              and b.startswith("autograd_groups.groups")]
    assert upward == []


def test_verify_stands_above_the_rest() -> None:
    """``verify/`` (``ag.verify`` and its command) re-runs groups and reads what ``observe/`` recorded:
    nothing below it (``groups/``, ``sites/``, ``observe/``, ``rules/``, the root's modules) imports it."""
    graph = import_graph()
    top = ("autograd_groups", "autograd_groups.cli")
    upward = [(a, b) for a, b in graph.edges if b.startswith("autograd_groups.verify")
              and not a.startswith(("autograd_groups.verify", "autograd_groups.doctor")) and a not in top]
    assert upward == []


def test_the_doctor_stands_above_verify() -> None:
    """``doctor/`` diagnoses with everything below it (``verify`` checks its proposals): only the
    package's top and the command line import it."""
    graph = import_graph()
    top = ("autograd_groups", "autograd_groups.cli")
    upward = [(a, b) for a, b in graph.edges if b.startswith("autograd_groups.doctor")
              and not a.startswith("autograd_groups.doctor") and a not in top]
    assert upward == []

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


#: The package's layers, lowest first. A module may import the modules of its own layer and of the
#: layers below it, never of one above. It belongs to the layer of the longest name that is it or a
#: package holding it ("" is the package's own ``__init__``, the public face over everything).
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("PyTorch's private API, errors, call sites, autograd's ops, torch.func levels, running a script",
     ("compat", "errors", "frames", "host_reads", "nodes", "levels", "script")),
    ("rules and the spec files that declare them", ("rules", "spec")),
    ("what a group instance decides at forward time",
     ("flag", "instance", "claims", "zero_passing", "decorating")),
    ("drawing a traced graph", ("viz",)),
    ("observing: traces, counts, non-finite checks, recordings", ("observe",)),
    ("the rule sites at backward time", ("sites", "finiteness")),
    ("groups: opening instances and hooking their sites", ("groups",)),
    ("on top of groups: the built-ins, verify", ("ops", "verify")),
    ("diagnosing a NaN in a training step, with verify to check its fixes", ("doctor",)),
    ("the commands and the package's face",
     ("", "__main__", "cli")),
)


def layer_of(module: str) -> int | None:
    """The index in :data:`LAYERS` of a module of the package, or None if no layer names it."""
    name = module.removeprefix("autograd_groups").removeprefix(".")
    found = [(len(prefix), k) for k, (_, prefixes) in enumerate(LAYERS) for prefix in prefixes
             if name == prefix or (prefix and name.startswith(prefix + "."))]
    return max(found)[1] if found else None


def test_every_module_has_a_layer() -> None:
    unplaced = sorted(m for m in import_graph() if layer_of(m) is None)
    assert unplaced == [], f"add these modules to a layer of LAYERS: {unplaced}"


def test_no_import_runs_back_up_a_layer() -> None:
    """Rule sites count into ``observe/``, never the other way; the flag reads the set of compiled
    groups from ``rules/``, not from the counters; ``levels.py`` (torch.func plumbing) sits beside
    ``compat.py``, below everything that reads it; nothing below ``verify/`` imports it."""
    graph = import_graph()
    upward = sorted(f"{a} ({LAYERS[layer_of(a) or 0][0]}) imports {b} ({LAYERS[layer_of(b) or 0][0]})"
                    for a, b in graph.edges if (layer_of(b) or 0) > (layer_of(a) or 0))
    assert upward == []


def test_layer_of_takes_the_longest_name() -> None:
    names = ("autograd_groups", "autograd_groups.viz.fold", "autograd_groups.cli.viz",
             "autograd_groups.levels", "autograd_groups.sites.levels")
    assert [layer_of(m) for m in names] == [9, 3, 9, 0, 5]

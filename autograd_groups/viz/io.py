"""A trace as JSON (``"schema": 1``), and files written whole or not at all.

The file holds every instance's fields and its graph (vertex attributes as the tracer records
them, edges in gradient-flow direction). Loading gives :class:`InstanceRecord` objects: the same
read-only fields as a live ``GroupInstance``, without the rules (which are code).
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import networkx as nx

from ..errors import GroupError
from .fold import InstanceLike

SCHEMA = 1
KIND = "autograd-groups trace"


@dataclass
class InstanceRecord:
    """A group instance read back from a saved trace."""

    name: str
    id: str
    where: str
    enabled: bool
    parent: InstanceRecord | None
    graph: Any
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    hits: dict[str, int] = field(default_factory=dict)

    def __repr__(self) -> str:
        return f"<InstanceRecord {self.id} at {self.where}>"


def atomic_write(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same folder, so ``path`` holds
    either its old content or all of ``data``, never a partial file. The file gets the permissions
    of any new file (0o666 less the umask), not ``mkstemp``'s private 0o600."""
    folder = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(folder, f".{os.path.basename(path)}.{uuid.uuid4().hex}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def dumps(instances: Sequence[InstanceLike]) -> str:
    """The JSON text of ``instances``."""
    records = []
    for inst in instances:
        graph = inst.graph
        records.append({
            "id": inst.id, "name": inst.name, "where": inst.where, "enabled": inst.enabled,
            "parent": inst.parent.id if inst.parent is not None else None,
            "inputs": list(inst.inputs), "outputs": list(inst.outputs), "hits": dict(inst.hits),
            "graph": {"attrs": dict(graph.graph), "nodes": [[v, d] for v, d in graph.nodes(data=True)],
                      "edges": [list(e) for e in graph.edges]},
        })
    return json.dumps({"schema": SCHEMA, "kind": KIND, "instances": records}, indent=1)


def save(instances: Sequence[InstanceLike], path: str | os.PathLike[str]) -> None:
    """Save ``instances`` (a trace's) to ``path`` as JSON.

    >>> import os, tempfile, torch, autograd_groups as ag
    >>> @ag.autograd_group("double")
    ... def double(x):
    ...     return x * 2
    >>> with ag.trace() as t:
    ...     double(torch.ones(2, requires_grad=True)).sum().backward()
    >>> path = os.path.join(tempfile.mkdtemp(), "trace.json")
    >>> save(t.instances, path)
    >>> [r.id for r in load(path)]
    ['double#0']
    """
    atomic_write(path, dumps(instances).encode())


def load(path: str | os.PathLike[str]) -> list[InstanceRecord]:
    """The instances saved in ``path``, in their saved order, parents linked."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except json.JSONDecodeError as e:
        raise GroupError(f"{path}:{e.lineno}:{e.colno}: not a trace file: {e.msg}") from None
    if not isinstance(data, dict) or data.get("kind") != KIND:
        raise GroupError(f"{path}: not an autograd-groups trace (save one with Trace.save)")
    if data.get("schema") != SCHEMA:
        raise GroupError(f"{path}: trace schema {data.get('schema')!r}; this version of "
                         f"autograd-groups reads schema {SCHEMA}: save the trace again with it")
    by_id: dict[str, InstanceRecord] = {}
    records: list[InstanceRecord] = []
    parents: list[str | None] = []
    for item in data["instances"]:
        graph = nx.DiGraph(**item["graph"]["attrs"])
        graph.add_nodes_from((v, d) for v, d in item["graph"]["nodes"])
        graph.add_edges_from(tuple(e) for e in item["graph"]["edges"])
        record = InstanceRecord(item["name"], item["id"], item["where"], item["enabled"], None, graph,
                                item["inputs"], item["outputs"], item["hits"])
        by_id[record.id] = record
        records.append(record)
        parents.append(item["parent"])
    for record, parent in zip(records, parents):
        record.parent = by_id.get(parent) if parent is not None else None
    return records

"""Seeing groups: fold a trace's instances into clusters and draw them (DOT, Mermaid, pictures
through pygraphviz or Graphviz's ``dot``, HTML, a terminal tree), save and load traces as JSON.

Nothing here is imported by ``import autograd_groups``; ``Trace``'s export methods import it on use.

>>> import torch, autograd_groups as ag
>>> from autograd_groups import viz
>>> @ag.autograd_group("double")
... def double(x):
...     return x * 2
>>> with ag.trace() as t:
...     double(torch.ones(2, requires_grad=True)).sum().backward()
>>> folded = viz.fold(t.instances)
>>> [(c.name, len(c.vertices)) for c in folded.clusters.values()]
[('double', 1)]
"""

from .dot import to_dot
from .export import DEFAULT_MAX_NODES, draw, mimebundle, write
from .fold import Cluster, FoldedGraph, collapse, fold, select
from .io import InstanceRecord, load, save
from .mermaid import to_mermaid
from .render import GraphvizNotFound, render_dot, renderer
from .tree import to_tree

__all__ = [
    "DEFAULT_MAX_NODES", "Cluster", "FoldedGraph", "GraphvizNotFound", "InstanceRecord", "collapse",
    "draw", "fold", "load", "mimebundle", "render_dot", "renderer", "save", "select", "to_dot",
    "to_mermaid", "to_tree", "write",
]

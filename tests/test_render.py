"""Pictures on a machine with no system Graphviz: pygraphviz lays out in process; else a `dot` on
PATH draws; else the install hint, and the formats that need no Graphviz."""

from __future__ import annotations

import base64
import shutil
import struct
import sys
import types
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import torch

import autograd_groups as ag
from autograd_groups import viz
from autograd_groups.viz import render

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
SVG = "{http://www.w3.org/2000/svg}"


@ag.autograd_group("inner_norm")
def inner_norm(x: torch.Tensor) -> torch.Tensor:
    return x.pow(2).sum(-1).sqrt()


@ag.autograd_group("outer_loss")
def outer_loss(x: torch.Tensor) -> torch.Tensor:
    return inner_norm(x).sum()


@pytest.fixture
def traced() -> ag.Trace:
    ag.register_rule("inner_norm", ag.Subgradient(op="sqrt", when="result == 0", grad=0))
    x = torch.tensor([[0.0, 0.0], [3.0, 4.0]], requires_grad=True)
    with ag.trace() as t:
        for _ in range(2):
            outer_loss(x).backward()
    return t


@pytest.fixture
def no_dot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No `dot` program anywhere on PATH."""
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    assert shutil.which("dot") is None


@pytest.fixture
def no_pygraphviz(monkeypatch: pytest.MonkeyPatch) -> None:
    """`import pygraphviz` fails, as where the viz extra is not installed."""
    monkeypatch.setitem(sys.modules, "pygraphviz", None)


def svg_texts(path: Path) -> list[str]:
    """The text of every <text> element of an SVG file (which must parse)."""
    root = ET.parse(path).getroot()
    assert root.tag == f"{SVG}svg"
    return [t.text or "" for t in root.iter(f"{SVG}text")]


def png_size(data: bytes) -> tuple[int, int]:
    assert data.startswith(PNG_SIGNATURE) and data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def test_pygraphviz_draws_every_picture_with_no_dot_on_path(traced: ag.Trace, tmp_path: Path,
                                                            no_dot: None) -> None:
    assert render.renderer() == "pygraphviz"
    viz.write(traced.instances, tmp_path / "g.svg")
    texts = svg_texts(tmp_path / "g.svg")
    assert "outer_loss ×2" in texts and "inner_norm" in texts          # both clusters, nested
    assert "subgradient(sqrt: result == 0 -> 0): 2" in texts         # the rule's hits, 1 per pass
    viz.write(traced.instances, tmp_path / "g.png")
    png = (tmp_path / "g.png").read_bytes()
    width, height = png_size(png)
    assert width > 150 and height > 300 and len(png) > 5000
    viz.write(traced.instances, tmp_path / "g.pdf")
    assert (tmp_path / "g.pdf").read_bytes().startswith(b"%PDF")
    viz.write(traced.instances, tmp_path / "g.html")
    page = (tmp_path / "g.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and "outer_loss ×2" in page and "<script" not in page


def test_jupyter_gets_svg_and_png_from_pygraphviz(traced: ag.Trace, no_dot: None) -> None:
    bundle = traced._repr_mimebundle_()
    assert set(bundle) == {"text/plain", "image/svg+xml", "image/png"}
    # 2 passes x 2 groups; vertices: pow, sum, sqrt of inner_norm, sum of outer_loss, and x.
    assert bundle["text/plain"] == ("<Trace: 4 group instances in 2 clusters, 5 vertices; gradients flow "
                                    "along the arrows>")
    root = ET.fromstring(bundle["image/svg+xml"].encode())
    assert "inner_norm" in [t.text for t in root.iter(f"{SVG}text")]
    assert base64.b64decode(bundle["image/png"]).startswith(PNG_SIGNATURE)


@pytest.mark.skipif(shutil.which("dot") is None, reason="no Graphviz `dot` program on this machine")
def test_a_dot_on_path_draws_when_pygraphviz_is_missing(traced: ag.Trace, tmp_path: Path,
                                                       no_pygraphviz: None) -> None:
    assert render.renderer() == shutil.which("dot")
    viz.write(traced.instances, tmp_path / "g.svg")
    assert "outer_loss ×2" in svg_texts(tmp_path / "g.svg")
    viz.write(traced.instances, tmp_path / "g.png")
    assert png_size((tmp_path / "g.png").read_bytes())[1] > 300


def test_with_neither_the_error_says_both_ways_to_install(traced: ag.Trace, tmp_path: Path, no_dot: None,
                                                          no_pygraphviz: None) -> None:
    assert render.renderer() is None
    with pytest.raises(viz.GraphvizNotFound) as raised:
        viz.write(traced.instances, tmp_path / "g.svg")
    message = str(raised.value)
    assert "pip install 'autograd-groups[viz]'" in message
    for os_package in ("apt-get install graphviz", "brew install graphviz", "conda install graphviz"):
        assert os_package in message
    assert list(tmp_path.iterdir()) == [tmp_path / "empty-bin"]       # nothing half-written
    viz.write(traced.instances, tmp_path / "g.dot")                   # text formats still work
    assert (tmp_path / "g.dot").read_text().startswith("digraph")
    bundle = traced._repr_mimebundle_()
    assert set(bundle) == {"text/plain", "text/markdown"}
    assert bundle["text/markdown"].startswith("```mermaid\nflowchart TB")


def test_pygraphviz_1_is_not_used(monkeypatch: pytest.MonkeyPatch, no_dot: None) -> None:
    # 1.x draws through Graphviz's programs, which are exactly what is missing here.
    monkeypatch.setitem(sys.modules, "pygraphviz", types.SimpleNamespace(__version__="1.14"))
    assert render.renderer() is None


def test_a_bad_dot_source_is_a_group_error_naming_the_renderer(no_dot: None) -> None:
    with pytest.raises(ag.GroupError, match=r"pygraphviz failed drawing svg"):
        render.render_dot("digraph { a -> ", "svg")

"""Pictures from DOT text, and the one-page HTML viewer.

One function, :func:`render_dot`, decides how a picture is drawn, in this order:

1. ``pygraphviz`` 2.x (the ``viz`` extra: ``pip install 'autograd-groups[viz]'``): its wheels bundle
   the Graphviz libraries and lay the graph out in process, so no system package is needed;
2. Graphviz's ``dot`` program on ``PATH`` (the OS package);
3. neither: :class:`GraphvizNotFound`, whose message says both ways to get one. Callers then write
   what needs no Graphviz (DOT, Mermaid, JSON) instead.
"""

from __future__ import annotations

import html
import importlib
import shutil
import subprocess
from types import ModuleType

from ..errors import GroupError, internal_error

INSTALL_HINT = ("to draw pictures, `pip install 'autograd-groups[viz]'` (pygraphviz, which bundles "
                "Graphviz) or install Graphviz's `dot`: `apt-get install graphviz` (Debian/Ubuntu), "
                "`brew install graphviz` (macOS) or `conda install graphviz`")
FORMATS = {".svg": "svg", ".png": "png", ".pdf": "pdf", ".html": "svg"}
PYGRAPHVIZ = "pygraphviz"


class GraphvizNotFound(GroupError):
    """Neither pygraphviz (2.x) nor Graphviz's ``dot`` program is installed."""


def _pygraphviz() -> ModuleType | None:
    try:
        module = importlib.import_module(PYGRAPHVIZ)
    except ImportError:
        return None
    # pygraphviz 1.x needs a system Graphviz and draws through its programs: not the bundled way.
    major = str(getattr(module, "__version__", "0")).split(".")[0]
    return module if major.isdigit() and int(major) >= 2 else None


def renderer() -> str | None:
    """How :func:`render_dot` would draw here: ``"pygraphviz"``, the path of a ``dot`` program, or
    None when neither is installed.

    >>> renderer() in (None, "pygraphviz") or renderer().endswith("dot")
    True
    """
    if _pygraphviz() is not None:
        return PYGRAPHVIZ
    return shutil.which("dot")


def render_dot(source: str, fmt: str) -> bytes:
    """``source`` (DOT text) laid out by Graphviz's dot algorithm and drawn as ``fmt`` (``svg``,
    ``png``, ``pdf``), through the first of pygraphviz or a ``dot`` on ``PATH`` that is installed;
    raises :class:`GraphvizNotFound` with both ways to install one when neither is.

    >>> render_dot("digraph { a -> b }", "svg").lstrip().startswith(b"<?xml")
    True
    """
    way = renderer()
    if way is None:
        raise GraphvizNotFound(f"no Graphviz to draw {fmt}: neither pygraphviz (2.x) nor a `dot` "
                               f"program on PATH is installed; {INSTALL_HINT}")
    if way == PYGRAPHVIZ:
        module = _pygraphviz()
        if module is None:  # renderer() found it
            raise internal_error("renderer() chose pygraphviz, which does not import")
        try:
            drawn: bytes = module.AGraph(string=source).draw(format=fmt, prog="dot")
        except (ValueError, TypeError) as e:
            raise GroupError(f"pygraphviz failed drawing {fmt}: {e}") from None
        return drawn
    done = subprocess.run([way, f"-T{fmt}"], input=source.encode(), capture_output=True, check=False)
    if done.returncode != 0:
        raise GroupError(f"Graphviz's dot ({way}) failed (exit {done.returncode}) drawing {fmt}: "
                         f"{done.stderr.decode(errors='replace').strip()}")
    return done.stdout


def html_page(svg: str, title: str) -> str:
    """One self-contained HTML page showing ``svg`` (no script, no external file)."""
    body = svg[svg.find("<svg"):] if "<svg" in svg else svg
    return ("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            f"<title>{html.escape(title)}</title>\n"
            "<style>body{margin:0;font-family:Helvetica,Arial,sans-serif}"
            "h1{font-size:15px;margin:12px 16px}main{overflow:auto;padding:0 16px 16px}"
            "svg{max-width:none;height:auto}</style>\n</head>\n<body>\n"
            f"<h1>{html.escape(title)}</h1>\n<main>\n{body}\n</main>\n</body>\n</html>\n")

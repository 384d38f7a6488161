"""Pictures from DOT text through Graphviz's ``dot`` program, and the one-page HTML viewer."""

from __future__ import annotations

import html
import shutil
import subprocess

from ..errors import GroupError

INSTALL_HINT = ("install Graphviz to get pictures: `apt-get install graphviz` (Debian/Ubuntu), "
                "`brew install graphviz` (macOS) or `conda install graphviz`")
FORMATS = {".svg": "svg", ".png": "png", ".pdf": "pdf", ".html": "svg"}


class GraphvizNotFound(GroupError):
    """Graphviz's ``dot`` program is not on ``PATH``."""


def find_dot() -> str:
    """The path of Graphviz's ``dot``; raises :class:`GraphvizNotFound` with an install hint."""
    found = shutil.which("dot")
    if found is None:
        raise GraphvizNotFound(f"Graphviz's `dot` program is not on PATH; {INSTALL_HINT}")
    return found


def run_dot(source: str, fmt: str) -> bytes:
    """``source`` (DOT text) drawn by Graphviz as ``fmt`` (``svg``, ``png``, ``pdf``).

    >>> run_dot("digraph { a -> b }", "svg").startswith(b"<?xml")
    True
    """
    done = subprocess.run([find_dot(), f"-T{fmt}"], input=source.encode(), capture_output=True,
                          check=False)
    if done.returncode != 0:
        raise GroupError(f"Graphviz's dot failed (exit {done.returncode}) drawing {fmt}: "
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

"""A Griffe extension for the docs site (mkdocs.yml): the docstrings' doctest examples as code.

The library's docstrings give their examples as bare ``>>>`` sessions, which the test suite runs;
Markdown would read each ``>>>`` line as a nested quote and ``[...]`` outputs as links. This fences
every session (its ``>>>`` and ``...`` lines and the output up to the next blank line) as Python
code before mkdocstrings renders the docstring.
"""

from __future__ import annotations

from typing import Any

import griffe


def fence_doctests(text: str) -> str:
    """``text`` with each run of doctest lines fenced as Python code."""
    out: list[str] = []
    inside = False
    for line in text.split("\n"):
        if not inside and line.lstrip().startswith(">>>"):
            out.append("```python")
            inside = True
        elif inside and not line.strip():
            out.append("```")
            inside = False
        out.append(line)
    if inside:
        out.append("```")
    return "\n".join(out)


class DoctestBlocks(griffe.Extension):
    """Fence the doctest sessions of every docstring Griffe loads."""

    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = fence_doctests(obj.docstring.value)

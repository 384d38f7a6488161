"""Repository-wide pytest setup: the package's doctests run with the tests (see pyproject.toml)."""

from __future__ import annotations

import pytest

from autograd_groups.viz.render import renderer


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Skip the doctest that draws a picture where neither pygraphviz nor Graphviz's ``dot`` is
    installed."""
    if renderer() is not None:
        return
    for item in items:
        if item.name.endswith("render.render_dot"):
            item.add_marker(pytest.mark.skip(reason="neither pygraphviz nor Graphviz's dot is installed"))

"""Repository-wide pytest setup: the package's doctests run with the tests (see pyproject.toml)."""

from __future__ import annotations

import shutil

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Skip the doctests that draw with Graphviz where its ``dot`` is not installed."""
    if shutil.which("dot") is not None:
        return
    for item in items:
        if item.name.endswith("render.run_dot"):
            item.add_marker(pytest.mark.skip(reason="Graphviz's dot is not installed"))

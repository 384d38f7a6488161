"""Shared fixtures: the cdist example as a module, and a clean flag/registry/read history for every
test."""

from __future__ import annotations

import contextlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

import autograd_groups as ag
from autograd_groups import finiteness

ROOT = Path(__file__).resolve().parents[1]
#: Training scripts that the doctor's tests run; collecting them as doctests would run them at import.
collect_ignore = ["doctor_corpus"]

# The built-in ops register their spec once, at import: do it before any test's registry scope.
with contextlib.suppress(ImportError):
    import autograd_groups.ops  # noqa: F401


def load_example(name: str) -> ModuleType:
    """Import ``examples/<name>.py`` as a module (examples are scripts, not a package)."""
    module_name = f"examples_{name}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, ROOT / "examples" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module


def line_of(file: str, marker: str) -> int:
    """The line of ``file`` that holds ``marker`` (a comment), so that a test can check a line the
    library reports."""
    lines = Path(file).read_text().splitlines()
    return next(i for i, text in enumerate(lines, 1) if marker in text and "line_of" not in text)


@pytest.fixture(autouse=True)
def _clean_state(monkeypatch: pytest.MonkeyPatch):
    # A structure's CPU-read history (its backoff after misses) is the process's: without a fresh
    # one, whether a test's group reads its values would depend on the tests run before it.
    monkeypatch.setattr(finiteness, "_plans", {})
    ag.set_special_cases(True)
    ag.reset_stats()
    with ag.registry_scope():
        yield
    ag.set_special_cases(True)


@pytest.fixture
def cdist_example() -> ModuleType:
    """examples/cdist.py with its rule registered for the test."""
    module = load_example("cdist")
    module.register()
    return module


@pytest.fixture
def direct_cdist() -> ModuleType:
    """tests/direct_cdist.py with its rule registered: a plain composite that is NaN at every zero
    distance on every supported release."""
    import direct_cdist

    direct_cdist.register()
    return direct_cdist


def assert_fits(text: str, columns: int, whole: list[str]) -> None:
    """``text``, printed for ``columns`` columns, has no line wider, no ellipsis, and each string of
    ``whole`` on one line, uncut."""
    lines = text.splitlines()
    wide = [line for line in lines if len(line.rstrip()) > columns]
    assert not wide, f"lines wider than {columns} columns: {wide}"
    assert "…" not in text and "..." not in text, "a cell was cut with an ellipsis"
    missing = [w for w in whole if not any(w in line for line in lines)]
    assert not missing, f"not on one line, uncut: {missing}"

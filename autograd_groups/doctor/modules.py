"""The user's own modules across the doctor's runs of a script: each run imports them anew (a model
at a module's top level starts over, as it does in a new process), and a run that checks a fix to
one of them imports the changed text in its place."""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Iterator, Sequence
from types import ModuleType
from typing import Any

from .frames import is_users


@contextlib.contextmanager
def fresh(folder: str, changed: dict[str, str] | None = None) -> Iterator[None]:
    """Run the block with the modules of ``folder`` (the script's) imported from ``changed`` where
    it holds their file's text (by absolute path); afterwards, forget the user's modules the block
    imported from the folder (not PyTorch's, this library's or an installed package's, wherever
    they are), so that the next run imports them anew.

    >>> import pathlib, tempfile
    >>> folder = tempfile.mkdtemp()
    >>> _ = (pathlib.Path(folder) / "helper.py").write_text("value = 1\\n")
    >>> sys.path.insert(0, folder)
    >>> with fresh(folder, {os.path.join(folder, "helper.py"): "value = 2\\n"}):
    ...     import helper
    >>> helper.value, "helper" in sys.modules
    (2, False)
    >>> sys.path.remove(folder)
    """
    before = set(sys.modules)
    finder = _Changed(changed or {})
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)
        for name in set(sys.modules) - before:
            file = getattr(sys.modules.get(name), "__file__", None)
            # Not a package installed there (a virtual environment in the project's folder): an
            # extension module cannot be imported twice in one process.
            if file and is_users(file) and _inside(os.path.abspath(file), folder):
                del sys.modules[name]


def _inside(path: str, folder: str) -> bool:
    folder = os.path.abspath(folder)
    return os.path.commonpath([folder, path]) == folder


class _Changed(importlib.abc.MetaPathFinder):
    """Finds the modules whose file ``texts`` holds a changed text of, and loads that text."""

    def __init__(self, texts: dict[str, str]) -> None:
        self.texts = texts

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if not self.texts:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.origin is None or os.path.abspath(spec.origin) not in self.texts:
            return None
        origin = os.path.abspath(spec.origin)
        loader = _Text(origin, self.texts[origin])
        # A package's __init__ keeps its folder, for its relative imports.
        return importlib.util.spec_from_file_location(
            fullname, origin, loader=loader, submodule_search_locations=spec.submodule_search_locations)


class _Text(importlib.abc.Loader):
    """Loads a module from a text, with its file's name in tracebacks."""

    def __init__(self, path: str, text: str) -> None:
        self.path, self.text = path, text

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Any:
        return None

    def exec_module(self, module: ModuleType) -> None:
        # Not with this library's own ``from __future__ import annotations``: the module's
        # annotations stay what they are in a run of its own.
        exec(compile(self.text, self.path, "exec", dont_inherit=True), module.__dict__)

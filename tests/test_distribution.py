"""What a user installs: the wheel and the sdist that ``python -m build`` makes from this checkout.

The wheel carries the license, metadata that names its authors and publishes no development extra,
a long description that reads whole on a package index (no link or image relative to the
repository), and ``python -m autograd_groups`` is the command line. The sdist ships no test suite
(it would not run outside the checkout: see CONTRIBUTING.md). The build runs once, from a copy of
the files the sdist may take, without build isolation (no download): a few seconds.
"""

from __future__ import annotations

import email
import email.message
import re
import shutil
import subprocess
import sys
import tarfile
import warnings
import zipfile
from pathlib import Path

import pytest
import torch

import autograd_groups as ag

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ["pyproject.toml", "MANIFEST.in", "README.md", "LONG_DESCRIPTION.md", "LICENSE",
           "autograd_groups", "tests"]
LINK = re.compile(r"!?\[[^\]]*\]\((?P<target>[^)\s]+)[^)]*\)|(?:src|href)=[\"'](?P<html>[^\"']+)")


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    source = tmp_path_factory.mktemp("source")
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, source / name,
                            ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", ".hypothesis"))
        else:
            shutil.copy2(ROOT / name, source / name)
    out = tmp_path_factory.mktemp("dist")
    done = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out),
                           str(source)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out


def _wheel(dist: Path) -> zipfile.ZipFile:
    (wheel,) = dist.glob("autograd_groups-*.whl")
    return zipfile.ZipFile(wheel)


def _metadata(dist: Path) -> email.message.Message:
    with _wheel(dist) as wheel:
        (name,) = [n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")]
        return email.message_from_string(wheel.read(name).decode("utf-8"))


def relative_links(markdown: str) -> list[str]:
    """The link and image targets of a Markdown text that are not absolute URLs."""
    targets = [m.group("target") or m.group("html") for m in LINK.finditer(markdown)]
    return [t for t in targets if not re.match(r"[a-z][a-z0-9+.-]*:", t)]


def test_relative_links_are_found() -> None:
    text = '[a](docs/a.md) ![b](img/b.png) [c](https://example.org/c) <img src="x.png"> [d](#top)'
    assert relative_links(text) == ["docs/a.md", "img/b.png", "x.png", "#top"]


def test_the_wheel_carries_the_license(dist: Path) -> None:
    with _wheel(dist) as wheel:
        licenses = [n for n in wheel.namelist() if re.search(r"\.dist-info/licenses/LICENSE$", n)]
        assert licenses, wheel.namelist()
        text = wheel.read(licenses[0]).decode()
    assert "BSD 3-Clause License" in text and "The autograd-groups authors" in text
    assert text == (ROOT / "LICENSE").read_text()


def test_the_wheel_holds_the_package_and_its_data_files(dist: Path) -> None:
    with _wheel(dist) as wheel:
        names = set(wheel.namelist())
    assert {"autograd_groups/__main__.py", "autograd_groups/ops/builtin.yaml",
            "autograd_groups/py.typed"} <= names
    assert not [n for n in names if n.startswith(("tests/", "examples/", "benchmarks/", "docs/"))]


def test_the_metadata_names_authors_license_classifiers_and_only_the_user_extra(dist: Path) -> None:
    meta = _metadata(dist)
    assert meta["License-Expression"] == "BSD-3-Clause"
    assert meta["Author"] == "The autograd-groups authors"
    assert meta["Keywords"] and "pytorch" in meta["Keywords"]
    classifiers = meta.get_all("Classifier") or []
    assert "Typing :: Typed" in classifiers and len(classifiers) >= 5
    assert meta.get_all("Provides-Extra") == ["viz"]
    requires = " ".join(meta.get_all("Requires-Dist") or [])
    assert "torch>=2.11" in requires
    assert not re.search(r"pytest|ruff|mypy|mkdocs|scikit-learn", requires), requires


def test_the_long_description_reads_without_the_repository(dist: Path) -> None:
    meta = _metadata(dist)
    assert meta["Description-Content-Type"].startswith("text/markdown")
    description = meta.get_payload()
    assert isinstance(description, str) and "pip install" in description
    assert relative_links(description) == []
    assert description.strip() == (ROOT / "LONG_DESCRIPTION.md").read_text().strip()


def test_the_long_description_examples_run() -> None:
    from test_docs import fenced_blocks

    blocks = [code for language, _, code in fenced_blocks((ROOT / "LONG_DESCRIPTION.md").read_text())
              if language == "python"]
    assert blocks
    namespace: dict[str, object] = {"__name__": "__main__"}
    try:
        with ag.registry_scope(), warnings.catch_warnings():
            warnings.simplefilter("error", ag.RuleWarning)
            for code in blocks:
                exec(compile(code, "LONG_DESCRIPTION.md", "exec"), namespace)
    finally:
        torch._dynamo.reset()


def test_python_m_autograd_groups_is_the_command_line_of_the_wheel(dist: Path, tmp_path: Path) -> None:
    with _wheel(dist) as wheel:
        wheel.extractall(tmp_path / "site")
    # PYTHONPATH comes before site-packages: the unpacked wheel's package is the one that runs.
    env = {"PYTHONPATH": str(tmp_path / "site"), "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-m", "autograd_groups", "--help"],
                          capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: autograd-groups")
    assert {"check", "list", "viz", "stats", "verify"} <= set(re.findall(r"^    (\w+)", done.stdout, re.M))


def test_the_sdist_ships_the_sources_and_no_test_suite(dist: Path) -> None:
    (sdist,) = dist.glob("autograd_groups-*.tar.gz")
    with tarfile.open(sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    assert {"LICENSE", "LONG_DESCRIPTION.md", "pyproject.toml", "autograd_groups/__init__.py",
            "autograd_groups/ops/builtin.yaml"} <= names
    assert not [n for n in names if n.startswith("tests")], sorted(n for n in names if n.startswith("tests"))


def repository_paths_in_strings(source: str) -> list[str]:
    """``docs/...`` paths in the string literals (messages, help texts, docstrings) of a module."""
    import ast

    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            found += re.findall(r"\bdocs/[\w./#-]+", node.value)
    return found


def test_messages_and_docstrings_point_at_what_a_wheel_user_has() -> None:
    """A wheel has no docs/ folder: messages name a docs page by its title, or help(...)."""
    assert repository_paths_in_strings('x = 1  # docs/a.md\nraise E(f"see docs/b.md, {x}")') == ["docs/b.md"]
    found = {f"{path.relative_to(ROOT)}: {hit}" for path in sorted((ROOT / "autograd_groups").rglob("*.py"))
             for hit in repository_paths_in_strings(path.read_text())}
    assert not found, sorted(found)

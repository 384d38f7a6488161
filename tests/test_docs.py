"""The docs cannot drift from the code: every ```python block in docs/*.md and README.md runs.

Each file's blocks run in order in one namespace (a page is one session), in a temporary working
directory, inside ``ag.registry_scope()`` so a page's rules do not leak into other tests. Links to
local files (and the headings they name) and the mkdocs navigation are checked too.
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import pytest
import torch
import yaml

import autograd_groups as ag

ROOT = Path(__file__).resolve().parents[1]
PAGES = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]
FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?P<info>[^\n`]*)\n(?P<body>.*?)^(?P=indent)```[ \t]*$",
                   re.MULTILINE | re.DOTALL)
LINK = re.compile(r"!?\[[^\]]*\]\((?P<target>[^)\s]+)[^)]*\)")


def _name(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def fenced_blocks(text: str) -> list[tuple[str, int, str]]:
    """(language, first line of the code, code) of every fenced block of a Markdown text."""
    blocks = []
    for match in FENCE.finditer(text):
        line = text.count("\n", 0, match.start("body")) + 1
        indent = len(match.group("indent"))
        body = "".join(row[indent:] for row in match.group("body").splitlines(keepends=True))
        blocks.append((match.group("info").strip().split(" ")[0], line, body))
    return blocks


def test_fenced_blocks_are_found_with_their_lines() -> None:
    text = "intro\n```python\nx = 1\n```\n\n- item\n\n  ```text\n  out\n  ```\n"
    assert fenced_blocks(text) == [("python", 3, "x = 1\n"), ("text", 9, "out\n")]


def test_there_are_pages_to_run() -> None:
    assert (ROOT / "README.md") in PAGES
    assert {"index.md", "tutorial.md", "flag.md", "comparison.md"} <= {p.name for p in PAGES}


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_python_blocks_run(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocks = [(line, code) for language, line, code in fenced_blocks(page.read_text())
              if language == "python"]
    if not blocks:
        pytest.skip(f"{_name(page)} has no python blocks")
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {"__name__": "__main__"}
    try:
        with ag.registry_scope(), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for line, code in blocks:
                # Padding with newlines makes tracebacks point at the line in the Markdown file.
                exec(compile("\n" * (line - 1) + code, str(page), "exec"), namespace)
        # A library warning a reader would see must be one the page shows them, in an output block
        # that names its class and starts its message as it does.
        shown = [code for language, _, code in fenced_blocks(page.read_text()) if language == "text"]
        unshown = {f"{w.category.__name__}: {w.message}" for w in caught
                   if issubclass(w.category, ag.RuleWarning) and not any(
                       w.category.__name__ in out and str(w.message)[:40] in out for out in shown)}
        assert not unshown, unshown
    finally:
        # A page that compiles leaves its group instances in Dynamo's cache, which the leak checks
        # of tests/test_memory.py would count if they ran next on this worker.
        torch._dynamo.reset()


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_python_blocks_are_marked_python(page: Path) -> None:
    """A block fenced as ```py or ```python3 would escape the run above: they must say python."""
    odd = [(line, language) for language, line, _ in fenced_blocks(page.read_text())
           if language.startswith(("py", "ipython")) and language != "python"]
    assert not odd, f"{_name(page)}: fence these as ```python (or ```text if not to be run): {odd}"


HEADING = re.compile(r"^#{1,6}[ \t]+(?P<title>.*?)[ \t]*$", re.MULTILINE)


def anchors(page: Path) -> set[str]:
    """The anchors of a Markdown page's headings, as GitHub and MkDocs' ``toc`` spell them."""
    found = set()
    for match in HEADING.finditer(FENCE.sub("", page.read_text())):
        title = match.group("title").replace("`", "").lower()
        found.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
        found.add(re.sub(r"[-\s]+", "-", re.sub(r"[^\w\s-]", "", title).strip()))
    return found


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_local_links_exist(page: Path) -> None:
    text = FENCE.sub("", page.read_text())
    missing = []
    for match in LINK.finditer(text):
        target, _, anchor = match.group("target").partition("#")
        if "://" in target or target.startswith("mailto:"):
            continue
        path = page.parent / target if target else page
        if target and not path.exists():
            missing.append(target)
        elif anchor and path.suffix == ".md" and anchor not in anchors(path):
            missing.append(match.group("target"))
    assert not missing, f"{_name(page)} links to files or headings that do not exist: {missing}"


def _nav_pages(nav: list[object]) -> list[str]:
    pages: list[str] = []
    stack = list(reversed(nav))
    while stack:
        entry = stack.pop()
        if isinstance(entry, str):
            pages.append(entry)
        elif isinstance(entry, dict):
            stack.extend(reversed(list(entry.values())))
        elif isinstance(entry, list):
            stack.extend(reversed(entry))
    return pages


def test_mkdocs_nav_lists_every_page_and_only_existing_ones() -> None:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    listed = _nav_pages(config["nav"])
    docs = ROOT / config.get("docs_dir", "docs")
    assert sorted(p for p in listed if not (docs / p).exists()) == []
    assert sorted(p.name for p in docs.glob("*.md") if p.name not in listed) == []

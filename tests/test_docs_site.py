"""The docs site: it builds in strict mode, its API reference covers the public API, and its pages
speak to users -- no issue number, commit hash, work history or path the repository lacks; every
figure of the performance page names the repository command that prints it and the day it was
taken.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

import autograd_groups as ag

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
# What the site shows: its pages, and the changelog that docs/changelog.md includes.
PAGES = [*sorted(DOCS.glob("*.md")), ROOT / "CHANGELOG.md"]
FENCE = re.compile(r"^[ \t]*```.*?^[ \t]*```[ \t]*$", re.MULTILINE | re.DOTALL)

# This project's issue numbers are small ("#12", "issue 23"); PyTorch's (#37354) are not flagged.
ISSUE = re.compile(r"(?<![\w/#&])#\d{1,3}\b|\bissues? \d+", re.IGNORECASE)
COMMIT = re.compile(r"(?<![\w/#.-])(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}(?![\w-])")
HISTORY = re.compile(r"\b(?:first|second|third|fourth|last|this|previous) round\b|later work|"
                     r"previous session|lent machine|DESIGN\.md", re.IGNORECASE)
# A figure measured by a script that is not in the repository cannot be made again.
UNREPRODUCIBLE = re.compile(r"ad-hoc|of mine|\btimeit\b", re.IGNORECASE)
PATH = re.compile(r"(?<![\w./-])(?:autograd_groups|tests|benchmarks|scripts|examples|docs|\.ci)/"
                  r"[\w./*-]*[\w/*]")


def _name(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def _hits(pattern: re.Pattern[str], text: str) -> list[str]:
    return [f"line {text.count(chr(10), 0, m.start()) + 1}: {m.group(0)}" for m in pattern.finditer(text)]


def test_the_patterns_find_what_they_are_for() -> None:
    text = ("Since issue 23, see #12 and Issue 7 (commit 480ac6c, `01767f2`). Second round: later work.\n"
            "PyTorch issue [#37354](https://github.com/pytorch/pytorch/issues/37354), pytorch#31829, "
            "pairwise#0, fill:#f8fafc, a 16384-element mask, 1024x1024, 2026-12-04, cafe")
    assert [h.split(": ", 1)[1] for h in _hits(ISSUE, text)] == ["issue 23", "#12", "Issue 7"]
    assert [h.split(": ", 1)[1] for h in _hits(COMMIT, text)] == ["480ac6c", "01767f2"]
    assert [h.split(": ", 1)[1] for h in _hits(HISTORY, text)] == ["Second round", "later work"]
    paths = "`tests/test_ops.py::test_x`, docs/verify.md:274, (sites/levels.py), benchmarks/bench_*.py"
    assert PATH.findall(paths) == [
        "tests/test_ops.py", "docs/verify.md", "benchmarks/bench_*.py"]


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_pages_name_no_issue_commit_or_history(page: Path) -> None:
    text = page.read_text()
    found = _hits(ISSUE, text) + _hits(COMMIT, text) + _hits(HISTORY, text) + _hits(UNREPRODUCIBLE, text)
    assert not found, f"{_name(page)} speaks of the project's history, not to its users: {found}"


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_pages_name_only_files_the_repository_has(page: Path) -> None:
    missing = []
    for match in PATH.finditer(page.read_text()):
        path = re.sub(r"(::.*|#.*|:\d+)$", "", match.group(0))
        if not any(ROOT.glob(path)):
            missing.append(match.group(0))
    assert not missing, f"{_name(page)} names paths that do not exist: {missing}"


def _sections(text: str) -> list[tuple[str, str]]:
    """(heading, body) of each section of a Markdown page, at every heading level."""
    parts = re.split(r"^(#{1,6} .*)$", FENCE.sub(lambda m: m.group(0).replace("#", ""), text), flags=re.M)
    return [("(top)", parts[0]), *zip(parts[1::2], parts[2::2])]


FIGURE = re.compile(r"\d(?:\.\d+)?\s?(?:µs|ms|s\b|×|x\b|%|MiB|GiB)")
# A command is inline code or a line of a console block that runs Python or make.
CODE = re.compile(r"`(?P<inline>[^`\n]+)`|^```console\n(?P<block>.*?)^\s*```", re.MULTILINE | re.DOTALL)
COMMAND = re.compile(r"(?:^|\s)(?:python3?|\.venv/bin/python)\s+(?:-\S+\s+)*(?P<script>[\w./-]+\.py)|"
                     r"(?:^|\s)(?:python3?|\.venv/bin/python) (?P<inline>-c |- <<)|"
                     r"(?:^|\s)make (?P<target>[a-z-]+)",
                     re.MULTILINE)
DATE = re.compile(r"\b2\d{3}-\d\d-\d\d\b")


def test_every_figure_of_the_performance_page_names_its_command_and_day() -> None:
    makefile = (ROOT / "Makefile").read_text()
    problems = []
    for heading, body in _sections((DOCS / "performance.md").read_text()):
        flush = re.sub(r"^ +", "", body, flags=re.M)
        code = "\n".join(m.group("inline") or m.group("block") for m in CODE.finditer(flush))
        commands = list(COMMAND.finditer(code))
        for c in commands:
            if c.group("script") and not (ROOT / c.group("script")).exists():
                problems.append(f"{heading}: {c.group('script')} is not in the repository")
            if c.group("target") and not re.search(rf"^{c.group('target')}:", makefile, re.M):
                problems.append(f"{heading}: make {c.group('target')} is not a Makefile target")
        if FIGURE.search(FENCE.sub("", body)):
            if not commands:
                problems.append(f"{heading}: figures without the command that prints them")
            if not DATE.search(body):
                problems.append(f"{heading}: figures without the day they were taken")
        problems += [f"{heading}: {hit}" for hit in _hits(UNREPRODUCIBLE, body)]
    assert not problems, problems


def test_the_performance_page_has_one_note_on_how_figures_were_taken() -> None:
    headings = [h for h, _ in _sections((DOCS / "performance.md").read_text())]
    assert headings.count("## How the figures were taken") == 1


def test_the_api_reference_lists_every_public_name() -> None:
    # A name whose module has the same name (ag.doctor, the package autograd_groups.doctor) is listed
    # by its full path, which the documentation tool resolves to the function.
    listed = {path.rsplit(".", 1)[-1] for path in re.findall(r"^::: autograd_groups\.(\S+)$",
                                                            (DOCS / "api.md").read_text(), re.M)}
    assert sorted(set(ag.__all__) - listed) == []
    assert sorted(listed - set(ag.__all__)) == []


@pytest.mark.slow
def test_the_site_builds_in_strict_mode_with_every_public_name(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    api = (tmp_path / "api" / "index.html").read_text()
    documented = {path.rsplit(".", 1)[-1] for path in re.findall(r'id="autograd_groups\.([\w.]+)"', api)}
    assert sorted(set(ag.__all__) - documented) == []
    changelog = (tmp_path / "changelog" / "index.html").read_text()
    assert "Built-in ops" in changelog and "--8&lt;--" not in changelog

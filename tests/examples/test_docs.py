"""Every Python fence of README.md and docs/**/*.md runs as written and prints what its comments say.

A fence runs unless the line before it (an HTML comment, invisible on the page) says otherwise:

    <!-- test: id NAME -->            names the fence, so that another can run after it
    <!-- test: runs after NAME -->    runs fence NAME first (and what NAME runs after), in the same `__main__`
    <!-- test: postgres -->           needs Postgres: its `postgresql://...` URLs name the test database and its
                                      `schema="..."` a schema of its own; skipped, saying why, without a server
    <!-- test: no (REASON) -->        does not run, for the reason given (required)

Several go in one comment, separated by `;`. A fence with `await` at its top level runs as the asyncio REPL
(`python -m asyncio`) runs it. Each fence runs in a fresh directory in a process of its own (forked from a server
that imported wfsub once: see `_fence_runner`), and each `print(...)  # text` line's text (unless it elides with
`...`) must be in what it printed. `test_every_python_fence_runs_or_says_why_not` holds every fence to a marker that
parses, so a fence is never skipped by accident.
"""

from __future__ import annotations

import importlib.util
import multiprocessing
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from ..stores import _pg
from . import _fence_runner

ROOT = Path(__file__).parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
README = (ROOT / "README.md").read_text(encoding="utf-8")
TIMEOUT = 60  # seconds a fence may run; each takes well under one

MARKER = re.compile(r"\s*<!-- test: (.*?) -->\s*")
POSTGRES_URL = re.compile(r"postgresql://[^\"'\s]*")
SCHEMA = re.compile(r"schema=\"[^\"]*\"")


@dataclass
class Fence:
    page: str  # relative to the repository root
    line: int  # of the opening ```python
    code: str
    name: str | None = None
    after: str | None = None
    postgres: bool = False
    no: str | None = None  # the reason it does not run
    problems: list[str] = field(default_factory=list)

    @property
    def label(self) -> str:
        return self.name or f"{self.page}:{self.line}"


def _directives(fence: Fence, text: str) -> None:
    for part in (p.strip() for p in text.split(";")):
        if match := re.fullmatch(r"id ([\w-]+)", part):
            fence.name = match.group(1)
        elif match := re.fullmatch(r"runs after ([\w-]+)", part):
            fence.after = match.group(1)
        elif part == "postgres":
            fence.postgres = True
        elif match := re.fullmatch(r"no \((.*\S.*)\)", part):
            fence.no = match.group(1)
        else:
            fence.problems.append(f"unknown test directive {part!r} (id NAME; runs after NAME; postgres; no (why))")


def _fences(page: str, text: str) -> list[Fence]:
    """The ```python fences of one page (indented ones in lists too), each with its marker's directives."""
    lines = text.splitlines()
    found: list[Fence] = []
    start: int | None = None
    indent = ""
    for i, line in enumerate(lines):
        if start is None:
            opening = re.fullmatch(r"([ \t]*)```([\w+-]*)[ \t]*", line)
            if opening:
                start, indent, lang = i, opening.group(1), opening.group(2)
        elif line.strip() == "```":
            if lang == "python":
                body = [raw[len(indent):] if raw.startswith(indent) else raw.lstrip() for raw in lines[start + 1:i]]
                fence = Fence(page, start + 1, "\n".join(body) + "\n")
                before = next((lines[j] for j in range(start - 1, -1, -1) if lines[j].strip()), "")
                if marker := MARKER.fullmatch(before):
                    _directives(fence, marker.group(1))
                found.append(fence)
            start = None
    return found


FENCES = [fence for page in PAGES for fence in _fences(str(page.relative_to(ROOT)), page.read_text(encoding="utf-8"))]
BY_NAME = {fence.name: fence for fence in FENCES if fence.name}
RUN = [fence for fence in FENCES if fence.no is None]


def _chain(fence: Fence) -> list[Fence]:
    """The fences to run, in order: what it runs after, then itself."""
    chain = [fence]
    while chain[0].after is not None:
        chain.insert(0, BY_NAME[chain[0].after])
    return chain


def _expected(code: str) -> list[str]:
    """The text each `print(...)  # text` comment promises."""
    said = []
    for line in code.splitlines():
        match = re.match(r"\s*print\(.*\)\s+#\s(.+)$", line)
        if match and "..." not in match.group(1):
            said.append(match.group(1).strip())
    return said


def test_the_readme_opens_with_make_demo_and_make_test() -> None:
    """The README's first two commands are `make demo` and `make test`."""
    assert README.startswith("# wfsub\n\n```\nmake demo\nmake test\n```\n")


def test_every_python_fence_runs_or_says_why_not() -> None:
    """Every ```python fence is found, its marker parses, and it either runs or carries `no (reason)`; every fence
    another runs after exists, runs, and no chain loops."""
    for page in PAGES:
        openings = len(re.findall(r"^[ \t]*```python\b", page.read_text(encoding="utf-8"), re.M))
        assert openings == sum(1 for f in FENCES if f.page == str(page.relative_to(ROOT))), page
    problems = [f"{f.label}: {problem}" for f in FENCES for problem in f.problems]
    names = [f.name for f in FENCES if f.name]
    problems += [f"fence id {name!r} is given twice" for name in set(names) if names.count(name) > 1]
    for fence in FENCES:
        seen = {fence.label}
        current = fence
        while current.after is not None:
            prior = BY_NAME.get(current.after)
            if prior is None or prior.no is not None:
                problems.append(f"{current.label} runs after {current.after!r}, which is no fence that runs")
                break
            if prior.label in seen:
                problems.append(f"{fence.label}: its chain of `runs after` loops at {prior.label}")
                break
            seen.add(prior.label)
            current = prior
    assert problems == []
    assert {f.label for f in RUN} | {f.label for f in FENCES if f.no} == {f.label for f in FENCES}
    assert len(RUN) >= 0.8 * len(FENCES), [f"{f.label}: {f.no}" for f in FENCES if f.no]


def test_a_marker_that_does_not_parse_is_a_problem() -> None:
    """A `no` without a reason and an unknown directive are problems; the directives a marker may hold are read."""
    page = "\n".join([
        "<!-- test: no () -->", "```python", "1", "```",
        "<!-- test: skip -->", "```python", "2", "```",
        "<!-- test: id b; runs after a; postgres -->", "  ```python", "  3", "  ```",
        "```python", "4", "```",
    ])
    no, unknown, chained, plain = _fences("page.md", page)
    assert no.no is None and no.problems and unknown.problems
    assert (chained.name, chained.after, chained.postgres, chained.code) == ("b", "a", True, "3\n")
    assert chained.problems == []
    assert (plain.line, plain.no, plain.problems) == (13, None, [])


def test_the_readme_quickstart_is_the_quickstart_page() -> None:
    """The README's Quickstart is the quickstart page's order flow, word for word, so the two never drift."""
    readme = [f for f in FENCES if f.page == "README.md"]
    assert readme and readme[0].code == BY_NAME["quickstart"].code


def test_the_recipes_are_among_the_fences_run() -> None:
    """The approve-or-reject recipe and the vm snippet are among the fences run."""
    codes = [fence.code for fence in RUN]
    assert any('wait("decision", model=Decision, timeout=' in code for code in codes)
    assert any("from wfsub.lowlevel import Machine" in code for code in codes)


def test_the_diagrams_page_draws_the_demo_as_to_mermaid_does() -> None:
    """The Mermaid drawing of the demo's order flow on the diagrams page is what `to_mermaid` draws today."""
    import wfsub
    from examples.order_flow import ORDER

    page = (ROOT / "docs" / "operations" / "diagrams.md").read_text(encoding="utf-8")
    drawn = re.search(r"```mermaid\n(.*?)```", page, re.S)
    assert drawn is not None
    assert drawn.group(1).strip() == wfsub.to_mermaid(ORDER).strip()


@pytest.mark.long
@pytest.mark.skipif(
    any(importlib.util.find_spec(name) is None for name in ("mkdocs", "material", "mkdocstrings_handlers.python")),
    reason="the docs tools are not installed (pip install -e '.[docs]', or the dev extra)",
)
def test_the_site_builds_with_no_warning(tmp_path: Path) -> None:
    """`mkdocs build --strict` (what `make docs` runs) builds the site: every link and anchor leads somewhere and
    mkdocstrings reads every docstring of the reference pages without a warning."""
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")], cwd=ROOT,
        capture_output=True, text=True, timeout=300, check=False, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert done.returncode == 0, done.stderr[-6000:]
    assert (tmp_path / "site" / "reference" / "api" / "index.html").exists()


def test_the_api_page_documents_every_public_name() -> None:
    """The `wfsub` reference page has a `::: wfsub.NAME` block for each name of `wfsub.__all__`, and no other."""
    import wfsub

    page = (ROOT / "docs" / "reference" / "api.md").read_text(encoding="utf-8")
    assert sorted(re.findall(r"^::: wfsub\.(\w+)$", page, re.M)) == sorted(wfsub.__all__)


def test_the_readme_maps_every_docs_page() -> None:
    """The README's map of the docs links every page under docs/, and every link there leads to a page."""
    linked = set(re.findall(r"\]\((docs/[^)#]+\.md)\)", README))
    pages = {str(page.relative_to(ROOT)) for page in PAGES if page.name != "README.md"}
    assert linked == pages


_SERVER = multiprocessing.get_context("forkserver")
_SERVER.set_forkserver_preload(["tests.examples._fence_runner", *_fence_runner.PRELOAD])


@pytest.mark.parametrize("fence", RUN, ids=[fence.label for fence in RUN])
def test_a_fence_runs_and_prints_what_it_says(fence: Fence, tmp_path: Path) -> None:
    """The fence (after those it runs after) runs to its end in a fresh directory and prints what it promises."""
    chain = _chain(fence)
    parts = [(f.label, f.code) for f in chain]
    if any(f.postgres for f in chain):
        if not _pg.ENABLED:
            pytest.skip(_pg.SKIP_REASON)
        dsn, schema = _pg.database_dsn(), _pg.new_schema()
        parts = [(label, SCHEMA.sub(f'schema="{schema}"', POSTGRES_URL.sub(dsn, code))) for label, code in parts]
    work, out, err = tmp_path / "work", tmp_path / "stdout", tmp_path / "stderr"
    work.mkdir()
    process = _SERVER.Process(target=_fence_runner.run, args=(parts, str(work), str(out), str(err)))
    process.start()
    try:
        process.join(TIMEOUT)
        if process.is_alive():
            process.kill()
            process.join()
            pytest.fail(f"{fence.label} still ran after {TIMEOUT} s: {err.read_text(encoding='utf-8')[-4000:]}")
        assert process.exitcode == 0, err.read_text(encoding="utf-8")[-4000:]
    finally:
        process.close()
    printed = out.read_text(encoding="utf-8")
    for text in _expected(fence.code):
        assert text in printed, (text, printed)

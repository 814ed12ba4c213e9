"""The README's Python recipes run as written and print what their comments say.

A fence marked `<!-- test: runs -->` runs on its own; `<!-- test: runs after the Quickstart -->` runs after the
Quickstart's code (it uses its `order`). Each `print(...)  # text` line's text (unless it elides with `...`) must be
in what the recipe printed.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")
FENCE = re.compile(r"<!-- test: (runs(?: after the (\w+))?) -->\n```python\n(.*?)```", re.S)
BLOCKS = [(m.group(1), m.group(2), m.group(3)) for m in FENCE.finditer(README)]
SECTIONS = {"Quickstart": re.search(r"## Quickstart\n\n<!-- test: runs -->\n```python\n(.*?)```", README, re.S)}


def _code(after: str | None, code: str) -> str:
    if after is None:
        return code
    found = SECTIONS.get(after)
    assert found is not None, f"no runnable section {after!r} in the README"
    return found.group(1) + "\n" + code


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


def test_the_recipes_are_marked() -> None:
    """The Quickstart, the approve-or-reject recipe and the low-level snippet are all marked to be run here."""
    codes = [code for _, _, code in BLOCKS]
    assert len(BLOCKS) >= 3
    assert any("wait(\"decision\", model=Decision, timeout=" in code for code in codes)
    assert any("from wfsub.lowlevel import Machine" in code for code in codes)


@pytest.mark.parametrize(("marker", "after", "code"), BLOCKS, ids=[f"block{i}" for i in range(len(BLOCKS))])
def test_a_readme_recipe_runs_and_prints_what_it_says(marker: str, after: str | None, code: str,
                                                      tmp_path: Path) -> None:
    """The recipe runs to its end in a fresh directory and prints each value its comments promise."""
    script = tmp_path / "recipe.py"
    script.write_text(_code(after, code), encoding="utf-8")
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    for text in _expected(code):
        assert text in done.stdout, (text, done.stdout)

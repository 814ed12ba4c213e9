"""The refusal of a store written by a newer wfsub says how to get a newer one the way this wfsub is installed:
`pip install -U wfsub` for an installed package, updating the checkout for one run from a checkout (an editable
install or a source tree on the path)."""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import sys
from contextlib import closing
from pathlib import Path

import pytest

import wfsub
from wfsub._errors import checkout_of
from wfsub._store._sqlite import APPLICATION_ID
from wfsub.stores import SqliteStore, StoreError

ROOT = Path(wfsub.__file__).resolve().parents[1]
EDITABLE = json.dumps({"url": "file:///src/wfsub", "dir_info": {"editable": True}})


def test_a_package_in_site_packages_is_installed() -> None:
    """A wfsub under site-packages or dist-packages is an installed package: no checkout."""
    assert checkout_of("/venv/lib/python3.11/site-packages/wfsub", EDITABLE) is None
    assert checkout_of("/usr/lib/python3/dist-packages/wfsub") is None


def test_an_editable_install_names_its_checkout() -> None:
    """An editable install's direct_url.json names the checkout; without one, the package's parent is it."""
    assert checkout_of("/src/wfsub/wfsub", EDITABLE) == "/src/wfsub"
    assert checkout_of("/home/me/code/wfsub/wfsub") == "/home/me/code/wfsub"
    assert checkout_of("/home/me/code/wfsub/wfsub", "not json") == "/home/me/code/wfsub"


def _newer_file(path: Path) -> None:
    """A SQLite store whose layout version is one past what this wfsub reads."""
    with closing(sqlite3.connect(path)) as conn:
        conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")  # wfsub's
        conn.execute("PRAGMA user_version = 999")
        conn.execute("CREATE TABLE t (x)")
        conn.commit()


async def test_this_checkout_is_told_to_update_itself(tmp_path: Path) -> None:
    """The tests run wfsub from this checkout: the refusal names it and says to update it, not pip install -U."""
    path = tmp_path / "s.db"
    _newer_file(path)
    with pytest.raises(StoreError) as caught:
        await SqliteStore(path).open(owner=True, owner_id="t")
    said = str(caught.value)
    assert "a newer wfsub wrote it" in said and "update the checkout" in said and str(ROOT) in said
    assert "pip install -U wfsub" not in said and "git pull" in said


def test_an_installed_package_is_told_to_pip_install(tmp_path: Path) -> None:
    """A wfsub imported from a site-packages directory (a copy of this one) says pip install -U wfsub."""
    site = tmp_path / "venv" / "lib" / "python3" / "site-packages"
    shutil.copytree(ROOT / "wfsub", site / "wfsub", ignore=shutil.ignore_patterns("__pycache__"))
    path = tmp_path / "s.db"
    _newer_file(path)
    script = (
        "import sys, anyio; sys.path.insert(0, sys.argv[1]); import wfsub\n"
        "assert wfsub.__file__.startswith(sys.argv[1]), wfsub.__file__\n"
        "from wfsub.stores import SqliteStore, StoreError\n"
        "async def main():\n"
        "    try:\n"
        "        await SqliteStore(sys.argv[2]).open(owner=True, owner_id='t')\n"
        "    except StoreError as exc:\n"
        "        print(exc)\n"
        "anyio.run(main)\n"
    )
    done = subprocess.run([sys.executable, "-c", script, str(site), str(path)], capture_output=True, text=True,
                          timeout=120, check=False, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    said = done.stdout
    assert "a newer wfsub wrote it" in said and "pip install -U wfsub" in said and "checkout" not in said

"""Bad paths and faulty files: each a StoreError that names the file, says what went wrong and how to fix it,
with the driver's error as __cause__ where there is one."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from wfsub._errors import StoreError
from wfsub._store import SCHEMA_VERSION
from wfsub.stores import Listing, SqliteStore

from ._helpers import first_write, opened

CHILD = str(Path(__file__).with_name("_child.py"))


def child(*args: str) -> dict[str, Any]:
    """Run _child.py and return the JSON it reports last."""
    done = subprocess.run([sys.executable, CHILD, *args], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    reported: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return reported


async def open_fails(path: Path | str, *, owner: bool = True) -> StoreError:
    store = SqliteStore(path)
    with pytest.raises(StoreError) as caught:
        await store.open(owner=owner, owner_id="fault-test")
    assert store._writer is None and store._lock is None  # nothing left behind
    assert str(path) in str(caught.value)
    return caught.value


async def make_store_file(path: Path) -> None:
    async with opened(SqliteStore(path)) as store:
        for i in range(50):
            await store.write(first_write(f"case-{i}", data={"pad": "x" * 500}))


async def test_a_directory_is_refused_with_a_file_path_to_use(tmp_path: Path) -> None:
    """A path that names a directory: StoreError suggesting a file inside it."""
    error = await open_fails(tmp_path)
    assert "is a directory" in str(error) and os.path.join(tmp_path, "wfsub.db") in str(error)


async def test_a_missing_directory_is_refused_with_mkdir(tmp_path: Path) -> None:
    """A path whose directory does not exist: StoreError saying to create it (mkdir -p)."""
    error = await open_fails(tmp_path / "missing" / "s.db")
    assert "does not exist" in str(error) and f"mkdir -p {tmp_path / 'missing'}" in str(error)
    assert not (tmp_path / "missing").exists()


async def test_a_file_in_place_of_the_directory_is_refused(tmp_path: Path) -> None:
    """A path under a regular file: StoreError saying the parent is not a directory."""
    (tmp_path / "plain").write_text("x")
    error = await open_fails(tmp_path / "plain" / "s.db")
    assert "is not a directory" in str(error)


async def test_a_file_that_is_not_sqlite_is_refused(tmp_path: Path) -> None:
    """A text file: StoreError saying it is not a SQLite database (cause: sqlite3.DatabaseError); untouched."""
    path = tmp_path / "notes.txt"
    path.write_text("these are my notes, not a database\n" * 200)
    error = await open_fails(path)
    assert "not a SQLite database" in str(error) and "new path" in str(error)
    assert isinstance(error.__cause__, sqlite3.DatabaseError)
    assert path.read_text().startswith("these are my notes")


async def test_a_corrupt_schema_page_is_refused_at_open(tmp_path: Path) -> None:
    """A store whose first page (the schema) is overwritten: StoreError saying it is damaged, with the way out."""
    path = tmp_path / "s.db"
    await make_store_file(path)
    with path.open("r+b") as f:
        f.seek(100)
        f.write(b"\xa5" * 3900)
    error = await open_fails(path)
    assert "damaged" in str(error) and "backup" in str(error) and ".recover" in str(error)
    assert isinstance(error.__cause__, sqlite3.DatabaseError)


async def test_a_corrupt_data_page_fails_the_read_that_meets_it(tmp_path: Path) -> None:
    """A store whose data pages are overwritten opens, and the read that meets them raises StoreError (damaged)."""
    path = tmp_path / "s.db"
    await make_store_file(path)
    with closing(sqlite3.connect(path)) as conn:  # every page but the schema's (it may span more than page 1)
        page_size = conn.execute("PRAGMA page_size").fetchone()[0]
        pages = [n for (n,) in conn.execute("SELECT pageno FROM dbstat WHERE name NOT IN ('sqlite_schema', "
                                            "'sqlite_master')")]
    with path.open("r+b") as f:
        for page in pages:
            f.seek((page - 1) * page_size)
            f.write(b"\xa5" * page_size)
    store = SqliteStore(path)
    await store.open(owner=False, owner_id="fault-test")  # the schema pages are intact: the damage is met later
    try:
        with pytest.raises(StoreError, match="damaged") as caught:
            await store.cases(Listing(limit=1000))
        assert isinstance(caught.value.__cause__, sqlite3.DatabaseError)
        assert str(path) in str(caught.value) and "listing cases failed" in str(caught.value)
    finally:
        await store.close()


async def test_another_applications_database_is_refused(tmp_path: Path) -> None:
    """A SQLite file with tables of its own, or another application_id: StoreError; wfsub writes nothing in it."""
    path = tmp_path / "app.db"
    with closing(sqlite3.connect(path)) as conn:
        conn.execute("CREATE TABLE customers (id INTEGER PRIMARY KEY)")
        conn.commit()
    error = await open_fails(path)
    assert "not a wfsub store" in str(error) and "file of its own" in str(error)
    other = tmp_path / "other.db"
    with closing(sqlite3.connect(other)) as conn:
        conn.execute("PRAGMA application_id = 42")
        conn.commit()
    error = await open_fails(other)
    assert "application_id 0x2a" in str(error)
    with closing(sqlite3.connect(path)) as conn:
        assert [name for (name,) in conn.execute("SELECT name FROM sqlite_master")] == ["customers"]


async def test_a_file_written_by_a_newer_wfsub_is_refused(tmp_path: Path) -> None:
    """A store whose layout version is above SCHEMA_VERSION: StoreError saying a newer wfsub wrote it, and (the
    tests run wfsub from its checkout) to update the checkout rather than pip install -U."""
    path = tmp_path / "s.db"
    await make_store_file(path)
    with closing(sqlite3.connect(path)) as conn:
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
        conn.commit()
    for owner in (True, False):
        error = await open_fails(path, owner=owner)
        assert f"layout version {SCHEMA_VERSION + 1}" in str(error) and "a newer wfsub wrote it" in str(error)
        assert "update the checkout" in str(error) and "pip install -U wfsub" not in str(error)
    with closing(sqlite3.connect(path)) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION + 1


async def test_a_read_only_file_is_refused(tmp_path: Path) -> None:
    """A 0400 store file (root's override dropped) gives a StoreError saying to make it writable."""
    path = tmp_path / "s.db"
    await make_store_file(path)
    path.chmod(0o400)
    try:
        found = child("readonly", str(path), "owner")
    finally:
        path.chmod(0o600)
    assert found["error_type"] == "StoreError" and str(path) in found["error"]
    assert found["errorname"].startswith("SQLITE_READONLY") and found["cause"] == "OperationalError"
    assert "read-only" in found["error"] and "chmod u+w" in found["error"]


@pytest.mark.parametrize("owner", ["owner", "cli"])
async def test_a_read_only_directory_is_refused(tmp_path: Path, owner: str) -> None:
    """A read-only directory (no -wal, -shm, -lock) gives a StoreError naming the directory's permissions."""
    folder = tmp_path / "ro"
    folder.mkdir()
    path = folder / "s.db"
    await make_store_file(path)
    folder.chmod(0o500)
    try:
        found = child("readonly", str(path), owner)
    finally:
        folder.chmod(0o700)
    assert found["error_type"] == "StoreError"
    assert "writable" in found["error"] and (str(path) in found["error"] or str(folder) in found["error"])


def test_a_full_disk_fails_the_writes_in_flight_keeps_none_of_them_and_the_store_goes_on(tmp_path: Path) -> None:
    """At the file size limit, a write and a group of 20 fail with StoreError, keep nothing, and the store goes on."""
    # In a child process: RLIMIT_FSIZE set, SIGXFSZ ignored, so writes past the limit fail with EFBIG.
    path = tmp_path / "s.db"
    found = child("full", str(path))
    assert found["error_type"] == "StoreError" and str(path) in found["error"]
    assert found["cause"] == "OperationalError" and found["errorname"] in ("SQLITE_FULL", "SQLITE_IOERR_WRITE")
    assert "ulimit -f" in found["error"] and "rolled back" in found["error"]
    assert found["written"] >= 1
    assert len(found["group"]) == 20 and all("ulimit -f" in outcome for outcome in found["group"])
    expected = ["after", "before", *(f"lone{i}" for i in range(found["written"]))]
    assert found["kept"] == sorted(expected)


async def test_a_file_with_wfsubs_id_but_no_version_is_refused_as_damaged(tmp_path: Path) -> None:
    """A file that carries wfsub's application_id but no layout version is refused as damaged, untouched."""
    path = tmp_path / "s.db"
    with closing(sqlite3.connect(path)) as conn:
        conn.execute("PRAGMA application_id = 2003202914")  # wfsub's, with user_version left at 0
        conn.commit()
    error = await open_fails(path)
    assert "no layout version" in str(error) and "backup" in str(error)


async def test_opening_an_open_store_object_again_is_refused(tmp_path: Path) -> None:
    """open() on a SqliteStore object that is already open raises StoreError saying to close it first."""
    store = SqliteStore(tmp_path / "s.db")
    async with opened(store):
        with pytest.raises(StoreError, match="already open: close"):
            await store.open(owner=False, owner_id="again")

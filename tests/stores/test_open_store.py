"""open_store(spec): what each kind of spec opens, and the errors that say what to write instead."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from wfsub._errors import StoreError
from wfsub.stores import MemoryStore, PostgresStore, SqliteStore, open_store


def test_none_is_no_store() -> None:
    """None means no store."""
    assert open_store(None) is None


@pytest.mark.parametrize("spec", ["cases.db", Path("cases.db"), "sqlite:///cases.db"])
def test_a_path_or_sqlite_url_opens_a_sqlite_store(spec: object) -> None:
    """A str path, a PathLike and sqlite:///relative all give a SqliteStore on that (absolute) path."""
    store = open_store(spec)
    assert isinstance(store, SqliteStore) and store.path == os.path.abspath("cases.db")
    assert store.synchronous == "full"


def test_a_sqlite_url_round_trips_through_url(tmp_path: Path) -> None:
    """sqlite:////absolute works, and a store's `url` opens a store on the same file."""
    store = SqliteStore(tmp_path / "x.db")
    assert store.url == f"sqlite:///{tmp_path}/x.db"
    again = open_store(store.url)
    assert isinstance(again, SqliteStore) and again.path == store.path


def test_synchronous_is_an_option_of_the_url() -> None:
    """sqlite:///x.db?synchronous=normal sets synchronous; another option is refused naming the one there is."""
    store = open_store("sqlite:///x.db?synchronous=normal")
    assert isinstance(store, SqliteStore) and store.synchronous == "normal"
    with pytest.raises(StoreError, match=r"unknown option\(s\) cache.*synchronous="):
        open_store("sqlite:///x.db?cache=shared")


@pytest.mark.parametrize("spec", ["sqlite:///:memory:", "sqlite://", "sqlite:///"])
def test_a_sqlite_store_in_memory_is_refused_pointing_at_memory_store(spec: str) -> None:
    """sqlite:///:memory: (or no path): a durable store needs a file; the error names MemoryStore and 'memory:'."""
    with pytest.raises(StoreError, match=r"durable store needs a file.*MemoryStore\(\).*'memory:'"):
        open_store(spec)


def test_a_sqlite_url_with_a_host_is_refused() -> None:
    """sqlite://host/x.db names a host: the error shows the two right spellings."""
    with pytest.raises(StoreError, match=r"sqlite:///relative/path\.db or sqlite:////absolute/path\.db"):
        open_store("sqlite://server/x.db")


def test_memory_opens_a_memory_store() -> None:
    """'memory:' gives a new MemoryStore each time."""
    first, second = open_store("memory:"), open_store("memory:")
    assert isinstance(first, MemoryStore) and isinstance(second, MemoryStore) and first is not second
    assert first.url == "memory:"


@pytest.mark.parametrize(
    "spec", ["postgresql://u:secret@db/wfsub?schema=orders&lease_seconds=4", "postgres://db/wfsub"]
)
def test_postgres_urls_give_a_postgres_store_with_its_options(spec: str) -> None:
    """postgresql:// and postgres:// give a PostgresStore, options from the query, no password in url."""
    store = open_store(spec)
    assert isinstance(store, PostgresStore) and store.shared
    assert "secret" not in store.url and "secret" not in repr(store)
    if "orders" in spec:
        assert (store.schema, store.lease_seconds) == ("orders", 4.0)
        assert store.url == "postgresql://u@db/wfsub?schema=orders"


def test_postgres_without_its_driver_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without asyncpg installed, open_store('postgresql://...') raises StoreError naming the extra to install."""
    monkeypatch.setitem(sys.modules, "asyncpg", None)  # `import asyncpg` now raises ImportError
    with pytest.raises(StoreError, match=r"pip install 'wfsub\[postgres\]'"):
        open_store("postgresql://u@db/wfsub")


def test_importing_wfsub_does_not_import_the_postgres_driver() -> None:
    """`import wfsub` (and wfsub.stores) leaves asyncpg unimported: it is an optional extra."""
    code = "import sys, wfsub, wfsub.stores; assert 'asyncpg' not in sys.modules, 'asyncpg imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_an_unknown_scheme_is_refused_listing_the_known_ones() -> None:
    """mysql://... raises StoreError naming the schemes there are."""
    with pytest.raises(StoreError, match=r"no store backend for 'mysql'.*sqlite://.*postgresql://.*memory:"):
        open_store("mysql://db/x")


def test_a_store_object_passes_through() -> None:
    """A store object is returned as it is."""
    store = MemoryStore()
    assert open_store(store) is store


@pytest.mark.parametrize("spec", [42, b"cases.db", ["cases.db"]])
def test_anything_else_is_a_type_error_with_the_fix(spec: object) -> None:
    """Other types raise TypeError listing what to pass."""
    with pytest.raises(TypeError, match=r"pass None, a path.*'sqlite:///path'.*'memory:'.*MemoryStore\(\)"):
        open_store(spec)


def test_a_bytes_path_like_or_an_empty_path_is_refused() -> None:
    """A PathLike giving bytes is a TypeError; an empty string a StoreError."""
    class BytesPath:
        def __fspath__(self) -> bytes:
            return b"cases.db"

    with pytest.raises(TypeError, match="decode it"):
        open_store(BytesPath())
    with pytest.raises(StoreError, match="empty store path"):
        open_store("")


@pytest.mark.parametrize("spec", ["cases.db", Path("cases.db"), "sqlite:///cases.db?synchronous=normal"])
def test_existing_opens_only_a_sqlite_file_that_is_there(spec: object) -> None:
    """existing=True gives a SqliteStore that will not create its file, with the URL's options kept."""
    store = open_store(spec, existing=True)
    assert isinstance(store, SqliteStore) and store.create is False and store.path == os.path.abspath("cases.db")
    fresh = open_store(spec)
    assert isinstance(fresh, SqliteStore) and fresh.create is True


def test_existing_opens_only_a_postgres_schema_that_is_there() -> None:
    """existing=True gives a PostgresStore that will not create its schema, its DSN options kept."""
    pytest.importorskip("asyncpg")
    store = open_store("postgresql://u:secret@db/app?schema=orders&lease_seconds=3", existing=True)
    assert isinstance(store, PostgresStore) and store.create is False
    assert store.schema == "orders" and store.lease_seconds == 3.0 and "secret" not in store.url


def test_existing_refuses_a_memory_store_saying_what_to_give() -> None:
    """existing=True on 'memory:' is a StoreError: a memory store lives inside one process; give the file or URL."""
    with pytest.raises(StoreError, match="memory store lives inside one process.*SQLite file"):
        open_store("memory:", existing=True)
    store = MemoryStore()
    assert open_store(store, existing=True) is store  # an object is itself, whatever `existing` says

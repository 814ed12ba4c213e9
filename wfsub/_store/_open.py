"""`open_store(spec)`: a store from what a user passes as `Substrate(store=...)` or `wfsub --store ...`.

    None                          no store: cases live in memory only
    "cases.db", Path("cases.db")  SqliteStore on that file
    "sqlite:///cases.db"          SqliteStore, relative path (three slashes, as SQLAlchemy spells it)
    "sqlite:////var/lib/x.db"     SqliteStore, absolute path (three slashes, then the absolute path)
    "sqlite:///x.db?synchronous=normal"   with the durability setting
    "memory:"                     MemoryStore
    "postgresql://...", "postgres://..."   PostgresStore (options in the query: ?schema=&lease_seconds=...)
    a store object                itself

A blank spec, and a backend's scheme written without its '//' ('sqlite:cases.db', 'memory:?x=1'), name no
store: they are refused, never taken for a file name.

`existing=True` (the `wfsub` command) opens only a store that is there already: a file or schema that a
Substrate created (a mistyped path is then an error, not a new empty store), never a memory store, which lives
inside one process. A backend is one entry of `BACKENDS`: its URL scheme and a factory.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import overload
from urllib.parse import parse_qs, urlsplit

from .._errors import StoreError
from ._base import Store
from ._memory import MemoryStore
from ._sqlite import SqliteStore


def _sqlite(spec: str, create: bool) -> Store:
    parts = urlsplit(spec)
    if parts.netloc:
        raise StoreError(
            spec,
            f"a sqlite URL names a file, not a host ({parts.netloc!r}): write sqlite:///relative/path.db or "
            "sqlite:////absolute/path.db",
        )
    path = parts.path[1:] if parts.path.startswith("/") else parts.path
    if path in ("", ":memory:"):
        raise StoreError(
            spec,
            "a durable store needs a file: sqlite:///:memory: would lose every case when the process ends; give a "
            "file (sqlite:///cases.db), or use MemoryStore() (the spec 'memory:') for a store in memory",
        )
    options = parse_qs(parts.query, keep_blank_values=True)
    unknown = sorted(set(options) - {"synchronous"})
    if unknown:
        raise StoreError(spec, f"unknown option(s) {', '.join(unknown)} in the URL: the only one is ?synchronous=")
    synchronous = options.get("synchronous", ["full"])[-1].lower()
    return SqliteStore(path, synchronous=synchronous, create=create)


def _postgres(spec: str, create: bool) -> Store:
    from ._postgres import PostgresStore  # its driver is imported only now (a StoreError if it is missing)

    return PostgresStore(spec, create=create)


def _memory(spec: str, create: bool) -> Store:
    if spec != "memory:":
        raise StoreError(spec, "a memory store takes no path or options: write 'memory:'")
    if not create:
        raise StoreError(
            spec, "a memory store lives inside one process, out of reach of any other: there is none to open "
            "here; give the SQLite file (or database URL) your Substrate uses as store="
        )
    return MemoryStore()


BACKENDS: dict[str, Callable[[str, bool], Store]] = {
    "sqlite": _sqlite,
    "memory": _memory,
    "postgresql": _postgres,
    "postgres": _postgres,
}


_FORMS = "a file path ('cases.db'), 'sqlite:///cases.db', 'postgresql://user@host/dbname' or 'memory:'"


@overload
def open_store(spec: None, *, existing: bool = False) -> None: ...
@overload
def open_store(spec: str | os.PathLike[str] | Store, *, existing: bool = False) -> Store: ...
@overload
def open_store(spec: object, *, existing: bool = False) -> Store | None: ...


def open_store(spec: object, *, existing: bool = False) -> Store | None:
    """The store `spec` names (not opened yet: the Substrate or the command opens it); None for None.

    `existing`: only a store that is there already (see the module docstring)."""
    if spec is None:
        return None
    create = not existing
    if isinstance(spec, str | os.PathLike):
        text = os.fspath(spec)
        if not isinstance(text, str):
            raise TypeError(f"a store path must be str, got bytes {text!r}: decode it (os.fsdecode) first")
        if not isinstance(spec, str):
            return SqliteStore(text, create=create)  # a Path is always a file path
        scheme = text.split(":", 1)[0].lower() if ":" in text else ""
        if scheme in BACKENDS:
            if text.lower().startswith(f"{scheme}://") or text.lower() == f"{scheme}:":
                return BACKENDS[scheme](text, create)
            raise StoreError(  # 'sqlite:cases.db' is a mistyped URL, not a file of that name
                repr(text), f"it names the {scheme} backend but is not one of its forms: write {_FORMS}"
            )
        if "://" in text:
            known = ", ".join(f"{name}://" for name in BACKENDS if name != "memory")
            raise StoreError(text, f"no store backend for {scheme!r}: use a file path, {known}, or memory:")
        if not text.strip():
            raise StoreError(
                repr(text), f"an empty store path names no store: write {_FORMS}, or pass None for no store"
            )
        return SqliteStore(text, create=create)
    if isinstance(spec, Store):
        return spec
    raise TypeError(
        f"store={spec!r} ({type(spec).__name__}) is not a store: pass None, a path (str or pathlib.Path), "
        "'sqlite:///path', 'memory:', 'postgresql://...', or a store object (wfsub.stores.SqliteStore(path), "
        "wfsub.stores.MemoryStore())"
    )

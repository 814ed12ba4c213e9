"""Stores (`wfsub.stores`): where durable cases keep their journals, case rows, snapshots and inbox.

    store = SqliteStore("cases.db")            # one file; WAL, group commit, one owning Substrate at a time
    store = open_store("sqlite:///cases.db")   # the same, from a spec (a path, a URL, "memory:", or a store)
    store = PostgresStore("postgresql://user@host/db")  # many nodes share it (extra: pip install 'wfsub[postgres]')
    store = MemoryStore()                      # the same rules in memory, for tests

`Store` is the interface a backend implements; `CaseRow`, `StoredCase` and `InboxRow` are what it returns, and
`Listing` the filters of one page of `Store.cases`.
Every failure is a `StoreError` (what happened, on which file, the fix), with the driver's exception as
`__cause__`.

`PostgresStore` is imported on first use, so a program on SQLite never loads the Postgres module.
"""

import typing

from ._errors import CommitUnknown as CommitUnknown
from ._errors import StoreConflict as StoreConflict
from ._errors import StoreError as StoreError
from ._store import CaseRow as CaseRow
from ._store import InboxRow as InboxRow
from ._store import Listing as Listing
from ._store import MemoryStore as MemoryStore
from ._store import Owner as Owner
from ._store import SqliteStore as SqliteStore
from ._store import Store as Store
from ._store import StoredCase as StoredCase
from ._store import open_store as open_store

if typing.TYPE_CHECKING:
    from ._store import PostgresStore as PostgresStore

__all__ = [
    "CaseRow",
    "CommitUnknown",
    "InboxRow",
    "Listing",
    "MemoryStore",
    "Owner",
    "PostgresStore",
    "SqliteStore",
    "Store",
    "StoreConflict",
    "StoreError",
    "StoredCase",
    "open_store",
]


def __getattr__(name: str) -> object:
    if name == "PostgresStore":
        from ._store import PostgresStore

        globals()["PostgresStore"] = PostgresStore
        return PostgresStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), "PostgresStore"})

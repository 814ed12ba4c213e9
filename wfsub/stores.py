"""Stores (`wfsub.stores`): where durable cases keep their journals, case rows, snapshots and inbox.

    store = SqliteStore("cases.db")            # one file; WAL, group commit, one owning Substrate at a time
    store = open_store("sqlite:///cases.db")   # the same, from a spec (a path, a URL, "memory:", or a store)
    store = PostgresStore("postgresql://user@host/db")  # many nodes share it (extra: pip install 'wfsub[postgres]')
    store = MemoryStore()                      # the same rules in memory, for tests

`Store` is the interface a backend implements; `CaseRow`, `StoredCase` and `InboxRow` are what it returns.
Every failure is a `StoreError` (what happened, on which file, the fix), with the driver's exception as
`__cause__`.
"""

from ._errors import CommitUnknown as CommitUnknown
from ._errors import StoreConflict as StoreConflict
from ._errors import StoreError as StoreError
from ._store import CaseRow as CaseRow
from ._store import InboxRow as InboxRow
from ._store import MemoryStore as MemoryStore
from ._store import Owner as Owner
from ._store import PostgresStore as PostgresStore
from ._store import SqliteStore as SqliteStore
from ._store import Store as Store
from ._store import StoredCase as StoredCase
from ._store import open_store as open_store

__all__ = [
    "CaseRow",
    "CommitUnknown",
    "InboxRow",
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

"""Stores: where durable cases keep their journals, case rows, snapshots and inbox (see `_base.py`)."""

from typing import TYPE_CHECKING

from ._base import SCHEMA_VERSION as SCHEMA_VERSION
from ._base import CaseRow as CaseRow
from ._base import CaseWrite as CaseWrite
from ._base import InboxRow as InboxRow
from ._base import Owner as Owner
from ._base import Record as Record
from ._base import Snapshot as Snapshot
from ._base import Store as Store
from ._base import StoredCase as StoredCase
from ._base import require_store as require_store
from ._memory import MemoryStore as MemoryStore
from ._open import open_store as open_store
from ._sqlite import SqliteStore as SqliteStore

if TYPE_CHECKING:
    from ._postgres import PostgresStore as PostgresStore


# PostgresStore is imported on first use: a program on SQLite or memory never loads the Postgres module.
def __getattr__(name: str) -> object:
    if name == "PostgresStore":
        from ._postgres import PostgresStore

        return PostgresStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

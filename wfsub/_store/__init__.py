"""Stores: where durable cases keep their journals, case rows, snapshots and inbox (see `_base.py`).

    _base.py       `Store`: all the runtime and the `wfsub` command use of a store; `StoreBase`: the open/close
                   checks and their errors, shared by every backend
    _group.py      group commit: the job, the queue, batching, the wake-up of waiters (SQLite and Postgres)
    _listing.py    what `cases()` filters by, and the listing query built from it
    _rows.py       JSON encoding of records and rows, the row rules, decoding what reads return
    _sql.py        SQL loading: `sql/<database>/queries.sql` and `sql/<database>/migrations/NNNN_*.sql`
    _open.py       `open_store(spec)`: a store from a path, URL or object; `BACKENDS`, by URL scheme
    _queueing.py   queued cases: the item, its states and limits, how a claim chooses (every backend's), the
                   table in memory (MemoryStore's, and a Substrate's without a store)
    _memory.py     MemoryStore (with `_single.py`: what a single-node store answers to the many-nodes calls),
                   and `ScheduleTable`, the schedules in memory (a Substrate without a store uses it too)
    _sqlite.py     SqliteStore (+ `_writer.py`: its writer thread; `_files.py`: its file and owner lock)
    _postgres.py   PostgresStore (+ `_pgdriver.py`: the driver, its loop thread, its errors)

A new backend is one module, its SQL and its tests: a class that subclasses `StoreBase` (mypy refuses to build it
while it lacks any of `Store`) and queues its writes on a `_group.GroupQueue`, executing each group its own way;
`sql/<database>/` with its named queries and its migrations, the only copy of its layout (a new store runs them
in order, an older one those it lacks, under a version it records); its URL scheme in `_open.BACKENDS`; and one
more kind in `tests/stores/_helpers.py`, which runs the contract suite `tests/stores/test_store_generic.py` on it.
"""

from typing import TYPE_CHECKING

from ._base import REFUSED_KEPT as REFUSED_KEPT
from ._base import SCHEMA_VERSION as SCHEMA_VERSION
from ._base import CaseRow as CaseRow
from ._base import CaseWrite as CaseWrite
from ._base import DamagedEntry as DamagedEntry
from ._base import InboxRow as InboxRow
from ._base import Owner as Owner
from ._base import ProgramSummary as ProgramSummary
from ._base import Record as Record
from ._base import ScheduleRow as ScheduleRow
from ._base import Snapshot as Snapshot
from ._base import Store as Store
from ._base import StoreBase as StoreBase
from ._base import StoredCase as StoredCase
from ._base import refused_for_good as refused_for_good
from ._base import require_store as require_store
from ._listing import Listing as Listing
from ._memory import MemoryStore as MemoryStore
from ._memory import ScheduleTable as ScheduleTable
from ._open import open_store as open_store
from ._queueing import CANCELLED as CANCELLED
from ._queueing import QUEUED as QUEUED
from ._queueing import RETRIED as RETRIED
from ._queueing import QueueItem as QueueItem
from ._queueing import QueueLimits as QueueLimits
from ._queueing import QueueTable as QueueTable
from ._queueing import retried_key as retried_key
from ._sqlite import SqliteStore as SqliteStore

if TYPE_CHECKING:
    from ._postgres import PostgresStore as PostgresStore


# PostgresStore is imported on first use: a program on SQLite or memory never loads the Postgres module.
def __getattr__(name: str) -> object:
    if name == "PostgresStore":
        from ._postgres import PostgresStore

        return PostgresStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

"""`SqliteStore`: a store in one SQLite file, for one Substrate (and the `wfsub` command beside it).

Durability. The file is in WAL mode and every write transaction is `BEGIN IMMEDIATE`. `synchronous` is set
explicitly on every connection:
- "full" (the default): the WAL is synced at every commit, so a write that `write()` acknowledged survives a
  process crash and a power loss or kernel crash.
- "normal": the WAL is synced only at checkpoints. An acknowledged write still survives a crash of the process
  (it is in the operating system's cache, and the kill tests run with both settings), but a power loss or
  kernel crash can lose the last acknowledged writes (never corrupt the file). Commits are several times
  cheaper; choose it when losing the last second of a power cut is acceptable.

Group commit. One writer thread owns the only write connection: see `_sqlite_writer.py` for the hand-off between the
thread and the event loop, the measurements that chose it, and how a failing write is kept from failing the
others of its group (a group's case writes are applied together by `_apply_writes`, and redone one at a time
by `_apply_write`, each in a savepoint, only when one of them breaks a rule). Reads run in anyio worker
threads, each on a reader connection from a small pool (at most `READERS` at once); WAL lets them run beside
the writer, and each read runs in one read transaction, so `load()` sees one committed state. The event loop
itself never waits for the disk: the only call it makes is `changed()`. The reads and the writes that are one
named query are `SqlStore`'s (`_sql_store.py`), run here over `_Connection` by `run_now`, on the reader's or the
writer's thread.

`changed()` runs `PRAGMA data_version` on a connection of its own: SQLite answers from the WAL index in shared
memory (the `-shm` file, mapped) without reading the database file and without a table scan; 3-4 us a call
(`python -m bench store`). It is true when any other connection committed since the last call (this store's own
writer included: SQLite cannot tell whose commit it was), so a Substrate that polls it also reads the inbox
after its own commits: an index read of an empty range.

The file. It is created 0600 by the store before SQLite opens it, and SQLite gives `-wal` and `-shm` the same
mode (see `_sqlite_files.py`). It is recognised by `PRAGMA application_id` (`APPLICATION_ID`, "wfsb") and versioned
by `PRAGMA user_version` (the layout version, `SCHEMA_VERSION`): a new file is built by the numbered files in
`sql/sqlite/migrations/`, run in order; a file of an older layout is moved forward by those it lacks, all in one
transaction, by an owner only (a `wfsub` command never changes the layout under a running Substrate of an older
version); a file of a newer layout is refused, as is a file of another application. Every statement is in
`sql/sqlite/queries.sql`, every value a bound parameter (`_sql.py`).

Ownership: an OS lock on `FILE-lock` plus an owner row (see `_sqlite_files.py`); a second owner, in this process or
another, gets a StoreError naming the owner. The owner's writer thread refreshes the row's heartbeat at most
every `HEARTBEAT_EVERY` seconds (with a group it commits anyway, or alone when idle).
"""

from __future__ import annotations

import contextlib
import math
import os
import platform
import re
import socket
import sqlite3
import threading
import time
from collections.abc import Coroutine, Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from functools import partial
from typing import Any, TypeVar

import anyio
import anyio.lowlevel
import anyio.to_thread
import msgspec

from .._errors import CaseExists, SchedulePaused, StoreError, newer_store, paused_slot
from ._base import CaseRow, CaseWrite, InboxRow, Owner
from ._listing import Listing
from ._queueing import (
    ENDED,
    RETRIED,
    STARTED,
    TOMBSTONE,
    Counts,
    QueueItem,
    QueueLimits,
    Running,
    choose,
    earliest,
    item_of,
    read_plan,
)
from ._rows import (
    HEADS,
    SNAPSHOTS_KEPT,
    EncodedWrite,
    case_gone,
    decode_row,
    encode_write,
    headless,
    inbox_text,
    loads,
    second_end,
    seq_taken,
    starts_case,
    to_json,
    waits_in_queue,
)
from ._single import SingleNode
from ._sql import LAYOUT, QUERIES, Layout
from ._sql_store import NO_PARAMS, Params, Row, SqlStore, Step
from ._sqlite_files import OwnerLock, check_path, create_private, fault
from ._sqlite_writer import Job, Redo, Refused, Writer

APPLICATION_ID = 0x77667362  # "wfsb": `PRAGMA application_id` of every wfsub store file
READERS = 4  # reader connections (and worker threads) at most at once
BUSY_TIMEOUT = 10.0  # seconds a connection waits for another process's lock
HEARTBEAT_EVERY = 30.0  # seconds between two refreshes of the owner row's heartbeat
SYNCHRONOUS = ("full", "normal")

Q = QUERIES
_CREATE_TABLE = re.compile(r"^\s*CREATE\s+TABLE\s+(?:IF\s+NOT\s+EXISTS\s+)?\"?(\w+)", re.IGNORECASE | re.MULTILINE)
T = TypeVar("T")

_X87 = frozenset({"x86_64", "i386", "i686"})  # (not "AMD64": Windows, where long double is double)
JSON_EACH = sqlite3.sqlite_version_info >= (3, 38, 0)
"""The SQLite library has `json_each` and `->>` built in: a group's records go in one statement (`records_append`);
before 3.38, one `executemany`."""
JSON_ROWS = JSON_EACH and (sqlite3.sqlite_version_info >= (3, 43, 0) or platform.machine() in _X87)
"""A group's case rows go in one statement too (`cases_put`) where SQLite reads a float's shortest text back to
the same double: from 3.43 (exact text-to-float conversion) or where its conversion has x87 long doubles."""
_array = msgspec.json.Encoder().encode  # a group's records or rows as one JSON array (str, int, None: exact)
_RECORD = ("case_id", "seq", "kind", "request_id", "record")
_ROW = ("case_id", "workflow", "fingerprint", "state", "started_at", "updated_at", "ended_at", "last_seq",
        "next_due", "live", "parked", "detail")  # the columns of `case_put` and `cases_put`, in order
_TIMES = ("started_at", "updated_at", "ended_at", "next_due")


def _exact(row: Mapping[str, Any]) -> bool:
    """The row's floats survive JSON (a NaN or an infinity would come back null)."""
    for name in _TIMES:
        value = row[name]
        if value is not None and not math.isfinite(value):
            return False
    return True


class _Connection:
    """The seam of `_sql_store.py` over a sqlite3 connection (a reader's, or the writer's on its thread): its
    methods never suspend, so `run_now` runs a method of the shared store to its end in one step."""

    __slots__ = ("conn",)

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    async def one(self, query: str, params: Params = NO_PARAMS) -> Row | None:
        return self.conn.execute(Q[query], params).fetchone()

    async def all(self, query: str, params: Params = NO_PARAMS) -> list[Row]:
        return self.conn.execute(Q[query], params).fetchall()

    async def value(self, query: str, params: Params = NO_PARAMS) -> Any:
        found = self.conn.execute(Q[query], params).fetchone()
        return None if found is None else found[0]

    async def execute(self, query: str, params: Params = NO_PARAMS) -> int:
        return self.conn.execute(Q[query], params).rowcount


def run_now(step: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine over a `_Connection` to its end at once, on this thread: it awaits only the connection's
    methods, which answer without suspending (they are coroutines only so that one method serves both databases)."""
    try:
        step.send(None)
    except StopIteration as done:
        result: T = done.value
        return result
    step.close()
    raise RuntimeError("a SQLite store step suspended: it may await only its connection's methods")


def _run_change(fn: Step[_Connection, T], conn: sqlite3.Connection) -> T:
    return run_now(fn(_Connection(conn)))


class SqliteStore(SqlStore[_Connection], SingleNode):
    """A durable store in one SQLite file (WAL, group commit, one owning Substrate at a time).

    `path` is the database file (created 0600 if missing; its directory must exist). `synchronous` is "full"
    (survives power loss) or "normal" (survives a process crash; see the module docstring). `create=False`
    opens only a file that is already a wfsub store (the `wfsub` command: a mistyped path is an error, not a new
    empty store).
    """

    _layout: Layout = LAYOUT  # what this library writes (tests substitute a future layout)

    def __init__(self, path: str | os.PathLike[str], *, synchronous: str = "full", create: bool = True) -> None:
        raw = os.fspath(path)
        if not isinstance(raw, str):
            raise TypeError(f"SqliteStore takes a str path, got {type(raw).__name__} {raw!r}: decode it first")
        if raw in ("", ":memory:") or raw.startswith("file::memory:"):
            raise StoreError(
                raw or "''",
                "a SqliteStore needs a file: a durable store in memory would lose everything when the process ends; "
                "give a file path, or use wfsub.stores.MemoryStore() for a store in memory (tests)",
            )
        if synchronous not in SYNCHRONOUS:
            raise ValueError(
                f"synchronous={synchronous!r}: use 'full' (survives power loss) or 'normal' (survives a process "
                "crash, may lose the last writes on power loss)"
            )
        self.path = self._name = os.path.abspath(raw)
        self.synchronous = synchronous
        self.create = create
        self.url = "sqlite:///" + self.path  # sqlite:////abs/path: three slashes, then the absolute path
        self._writer: Writer | None = None
        self._watch: sqlite3.Connection | None = None  # `changed()`'s connection
        self._data_version = 0
        self._wait_version = 0  # wait_changed's own mark (it never consumes changed())
        self._lock: OwnerLock | None = None
        self._epoch: int | None = None
        self._readers: list[sqlite3.Connection] = []
        self._readers_lock = threading.Lock()
        self._read_limiter: anyio.CapacityLimiter | None = None
        self._opening = False

    def __repr__(self) -> str:
        state = "closed" if self._writer is None else ("owner" if self._lock is not None else "open")
        return f"SqliteStore({self.path!r}, synchronous={self.synchronous!r}, {state})"

    @property
    def owner_epoch(self) -> int | None:
        """The owner epoch this store took at `open(owner=True)` (1, 2, ... one per owner); None otherwise."""
        return self._epoch

    # -- open and close --------------------------------------------------------------------------------------

    async def open(self, *, owner: bool, owner_id: str) -> None:
        self._refuse_second_open()
        if not isinstance(owner_id, str) or not owner_id:
            raise ValueError(f"owner_id={owner_id!r}: pass a non-empty str naming the opener (a Substrate id)")
        self._read_limiter = anyio.CapacityLimiter(READERS)
        self._opening = True
        try:
            with anyio.CancelScope(shield=True):  # half an open would leave a lock and a thread behind
                await anyio.to_thread.run_sync(self._open_sync, owner, owner_id)
        finally:
            self._opening = False

    async def close(self) -> None:
        writer, self._writer = self._writer, None  # on the loop's thread: no write can be queued after this
        if writer is None:
            return
        with anyio.CancelScope(shield=True):  # the writes in flight are committed, whatever cancels us
            await anyio.to_thread.run_sync(self._close_sync, writer)

    def _connect(self, *, check_same_thread: bool = True) -> sqlite3.Connection:
        conn = sqlite3.connect(
            self.path, timeout=BUSY_TIMEOUT, isolation_level=None, check_same_thread=check_same_thread
        )
        try:
            conn.execute(Q[f"pragma_synchronous_{self.synchronous}"])
        except BaseException:
            conn.close()
            raise
        return conn

    def _open_sync(self, owner: bool, owner_id: str) -> None:
        check_path(self.path)
        if not self.create and not os.path.exists(self.path):
            raise StoreError(
                self.path, "no store file here: check the path (a Substrate creates its store file when it first "
                "opens it with store=PATH)"
            )
        create_private(self.path)
        lock = OwnerLock(self.path) if owner else None
        if lock is not None and not lock.acquire():
            raise self._owned_error()
        watch: sqlite3.Connection | None = None
        try:
            try:
                watch = self._connect(check_same_thread=False)
            except sqlite3.Error as exc:
                raise fault(self.path, "opening the store", exc) from exc
            self._prepare(watch, owner)
            epoch = self._take_ownership(watch, owner_id) if owner else None
            heartbeat = None
            if epoch is not None:
                heartbeat = partial(_heartbeat, epoch)
            writer = Writer(
                self.path, self._writer_connection, heartbeat=heartbeat, heartbeat_every=HEARTBEAT_EVERY,
                batch=_apply_writes,
            )
            writer.start()
            try:
                self._data_version = self._wait_version = watch.execute(Q["pragma_data_version"]).fetchone()[0]
            except sqlite3.Error as exc:
                writer.stop()
                raise fault(self.path, "opening the store", exc) from exc
        except BaseException:
            if watch is not None:
                watch.close()
            if lock is not None:
                lock.release()
            raise
        self._watch, self._lock, self._epoch, self._writer = watch, lock, epoch, writer

    def _writer_connection(self) -> sqlite3.Connection:
        try:
            return self._connect()
        except sqlite3.Error as exc:
            raise fault(self.path, "opening the writer connection", exc) from exc

    def _close_sync(self, writer: Writer) -> None:
        try:
            writer.stop()  # commits what is queued, then closes the write connection
            with self._readers_lock:
                readers, self._readers = self._readers, []
            for conn in readers:
                conn.close()
            if self._watch is not None:
                self._watch.close()
        finally:
            self._watch = None
            if self._lock is not None:
                self._lock.release()  # last: the next owner may start as soon as this is released
                self._lock = None
            self._epoch = None

    # -- the layout ------------------------------------------------------------------------------------------

    def _header(self, conn: sqlite3.Connection) -> tuple[int, int, set[str]]:
        app = conn.execute(Q["pragma_application_id"]).fetchone()[0]
        version = conn.execute(Q["pragma_user_version"]).fetchone()[0]
        names = {str(name) for (name,) in conn.execute(Q["schema_names"])}
        return app, version, names

    def _check_header(self, app: int, version: int, tables: set[str]) -> None:
        """Refuse a file that is not a wfsub store of a layout this wfsub reads, or that lacks a table of it;
        `tables`: the names of what the file holds (its tables, indexes, ...)."""
        if app == 0 and version == 0 and not tables:
            if not self.create:
                raise StoreError(
                    self.path, "this file is empty, not a wfsub store: check the path (give the file a Substrate "
                    "opened with store=PATH)"
                )
            return  # a new file
        if app != APPLICATION_ID:
            whose = f"application_id {app:#x}" if app else "no application id, and tables of its own"
            raise StoreError(
                self.path,
                f"this SQLite file is not a wfsub store ({whose}; a wfsub store has application_id "
                f"{APPLICATION_ID:#x}): give the store a file of its own; wfsub never writes into another "
                "application's database",
            )
        if version > self._layout.version:
            raise newer_store(self.path, "the file", version, self._layout.version)
        if version == 0:
            raise StoreError(
                self.path, "the file carries wfsub's application id but no layout version: it was damaged or "
                "written by hand; restore it from a backup or start a new file",
            )
        made: list[str] = []  # the tables migrations 1..version create, in order
        for target in range(1, version + 1):
            for statement in self._layout.migrations[target].statements:
                created = _CREATE_TABLE.search(statement)
                if created and created.group(1) not in made:
                    made.append(created.group(1))
        missing = [name for name in made if name not in tables]
        if missing:
            listed = ", ".join(repr(name) for name in missing)
            raise StoreError(
                self.path,
                f"the file carries wfsub's application id and layout version {version} but lacks the table"
                f"{'s' if len(missing) > 1 else ''} {listed} of that layout (it has {', '.join(made)}): it was "
                "damaged or changed by hand; restore it from a backup or start a new file",
            )

    def _prepare(self, conn: sqlite3.Connection, owner: bool) -> None:
        """Check the file is ours and not newer, switch to WAL, build or migrate the layout."""
        try:
            self._check_header(*self._header(conn))
            mode = conn.execute(Q["pragma_wal"]).fetchone()[0]
        except sqlite3.Error as exc:
            raise fault(self.path, "opening the store", exc) from exc
        if str(mode).lower() != "wal":
            raise StoreError(
                self.path,
                f"SQLite kept journal_mode {mode!r} instead of WAL: WAL needs shared memory beside the file "
                "(not available on network file systems); put the store on a local disk",
            )
        action = "checking the store's layout"
        try:
            conn.execute(Q["begin_write"])
            app, version, tables = self._header(conn)  # again, under the write lock: another opener may have won
            self._check_header(app, version, tables)
            if version == 0:  # a new file: the header, then every migration below
                # header values: ints from this module, formatted (PRAGMAs take no bound parameters)
                conn.execute(f"PRAGMA application_id = {int(APPLICATION_ID)}")
            elif version < self._layout.version and not owner:
                raise StoreError(
                    self.path,
                    f"the file has store layout version {version}, older than this wfsub's "
                    f"{self._layout.version}: only an owner migrates a file (a running Substrate of the older "
                    "version may be using it); start the Substrate with this wfsub first, then use `wfsub`",
                )
            for target in range(version + 1, self._layout.version + 1):
                migration = self._layout.migrations[target]
                action = f"applying migration {migration.name} (layout {target - 1} to {target})"
                for statement in migration.statements:
                    conn.execute(statement)
                conn.execute(f"PRAGMA user_version = {int(target)}")
            conn.execute(Q["commit"])
        except BaseException as exc:
            if conn.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute(Q["rollback"])
            if isinstance(exc, sqlite3.Error):
                raise fault(self.path, action, exc) from exc
            raise

    def _take_ownership(self, conn: sqlite3.Connection, owner_id: str) -> int:
        params = {"owner_id": owner_id, "pid": os.getpid(), "host": socket.gethostname(), "now": time.time()}
        try:
            conn.execute(Q["begin_write"])
            conn.execute(Q["owner_take"], params)
            conn.execute(Q["queue_items_follow_owner"], params)
            epoch = int(conn.execute(Q["owner_get"]).fetchone()[3])
            conn.execute(Q["commit"])
        except sqlite3.Error as exc:
            if conn.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute(Q["rollback"])
            raise fault(self.path, "recording the owner", exc) from exc
        return epoch

    def _owned_error(self) -> StoreError:
        row = None
        try:
            conn = sqlite3.connect(self.path, timeout=1.0, isolation_level=None)
            try:
                row = conn.execute(Q["owner_get"]).fetchone()
            finally:
                conn.close()
        except sqlite3.Error:
            pass  # no owner row yet (the owner is still opening), or an unreadable file: say less
        if row is None:
            who, stop = "an owner that has not recorded itself yet (it is opening now)", "stop it"
        else:
            owner_id, pid, host, epoch, since, heartbeat = row
            who = (
                f"Substrate {owner_id!r} (pid {pid} on host {host!r}, owner since {_when(since)}, epoch {epoch}, "
                f"last heartbeat {_when(heartbeat)})"
            )
            here = " (this process)" if pid == os.getpid() and host == socket.gethostname() else ""
            stop = (
                "stop it (it releases the store when it closes, or when its process ends: "
                f"kill {pid} on {host}{here})"
            )
        return StoreError(
            self.path,
            f"cannot take ownership: the store is owned by {who}. One Substrate owns a store file at a time: {stop} "
            "and open again; or leave `standby` at its default (True) so that this Substrate waits as a standby "
            "(it sends inputs to the owner and takes over when the owner ends); or use `wfsub.Client(store)` to "
            "start, steer and read cases without owning the store; or give this Substrate another file",
        )

    async def take_ownership(self, owner_id: str) -> bool:
        """Become the owner if the OS lock is free (the owner closed or died): a new epoch, the layout migrated if
        it is older, and a writer that keeps the owner row's heartbeat."""
        self._running("take ownership")
        if self._lock is not None:
            return True
        if OwnerLock(self.path).held():  # cheap: no file is created, nothing is waited for
            return False
        with anyio.CancelScope(shield=True):  # half a takeover would hold the lock with no owner row
            taken: bool = await anyio.to_thread.run_sync(self._take_ownership_sync, owner_id)
        return taken

    def _take_ownership_sync(self, owner_id: str) -> bool:
        """On a worker thread, with a connection of its own: the event loop goes on polling `changed()` and the
        inbox on the watch connection meanwhile (one sqlite3 connection is never used by two threads at once)."""
        lock = OwnerLock(self.path)
        if not lock.acquire():
            return False  # another standby won
        old = self._writer
        try:
            assert old is not None
            try:
                conn = self._connect()
            except sqlite3.Error as exc:
                raise fault(self.path, "taking ownership", exc) from exc
            try:
                self._prepare(conn, True)
                epoch = self._take_ownership(conn, owner_id)
            finally:
                conn.close()
            writer = Writer(
                self.path, self._writer_connection, heartbeat=partial(_heartbeat, epoch),
                heartbeat_every=HEARTBEAT_EVERY, batch=_apply_writes,
            )
            writer.start()
        except BaseException:
            lock.release()
            raise
        self._lock, self._epoch, self._writer = lock, epoch, writer
        old.stop()  # commits what was queued on it, then closes its connection
        return True

    async def queue_case(self, change: CaseWrite) -> None:
        """A case started by a process that does not own the file: its `start` record and a row marked queued,
        for the owner to claim (`claim_queued`). StoreConflict if the case id is taken."""
        writer = self._running("queue a case")
        encoded = encode_write(self.path, change)
        if not encoded.records or encoded.records[0].seq != 0 or encoded.row is None:
            raise StoreError(
                self.path, f"queue_case for case {change.case_id!r} needs the case's start write: its `start` "
                "record (seq 0) and its row"
            )
        job = Job(partial(_apply_queue, encoded), f"queued case {encoded.case_id!r}", wait=True)
        writer.submit(job)
        await job.outcome()

    async def claim_queued(self, fingerprints: Sequence[str], limit: int) -> list[str]:
        writer = self._running("claim queued cases")
        if self._lock is None or not fingerprints or limit <= 0:
            return []  # only the owner runs cases
        params = {"fingerprints": to_json(self.path, "fingerprints", list(fingerprints)), "limit": limit}
        assert self._watch is not None
        try:  # on the calling thread: one step into a partial index, so an owner polls it at every change
            if self._watch.execute(Q["cases_queued_any"], params).fetchone() is None:
                return []
        except sqlite3.Error as exc:
            raise fault(self.path, "looking for queued cases", exc) from exc
        job = Job(partial(_apply_claim, params), "claiming queued cases", wait=True)
        writer.submit(job)
        claimed: list[str] = await job.outcome()
        return claimed

    async def queue_put(self, item: QueueItem, *, schedule: str | None = None) -> None:
        writer = self._running("queue a case")
        params = {
            "case_id": item.case_id, "queue": item.queue, "part": item.partition, "priority": item.priority,
            "dedup": item.dedup, "start": to_json(self.path, f"queued case {item.case_id!r}", item.start),
            "not_before": item.not_before, "enqueued_at": item.enqueued_at, "name": schedule,
            "store": self.path,  # (for a refusal's message)
        }
        job = Job(partial(_apply_queue_put, params), f"queued case {item.case_id!r}", wait=True)
        writer.submit(job)
        refused: CaseExists | SchedulePaused | None = await job.outcome()
        if refused is not None:
            raise refused

    async def queue_claim(
        self, queue: str, limits: QueueLimits, node: str, now: float, most: int
    ) -> tuple[list[QueueItem], float | None]:
        writer = self._running("claim queued cases")
        job = Job(partial(_apply_queue_claim, queue, limits, node, now, most), f"claiming from queue {queue!r}",
                  wait=True)
        writer.submit(job)
        claimed: tuple[list[QueueItem], float | None] = await job.outcome()
        return claimed

    async def queue_requeue(
        self, case_id: str, reopened: CaseWrite, start: Mapping[str, Any], key: str
    ) -> QueueItem | None:
        writer = self._running("put a retried case back in its queue")
        params = {"case_id": case_id, "key": key,
                  "start": to_json(self.path, f"queued case {case_id!r}", dict(start))}
        job = Job(partial(_apply_queue_requeue, params, encode_write(self.path, reopened)),
                  f"retried case {case_id!r} back in its queue", wait=True)
        writer.submit(job)
        found: QueueItem | CaseExists | None = await job.outcome()
        if isinstance(found, CaseExists):
            raise found
        return found

    async def queue_cancel(self, case_id: str, ended: CaseWrite) -> QueueItem | None:
        writer = self._running("cancel a queued case")
        what = f"cancelling case {case_id!r} if it waits in a queue"
        job = Job(partial(_apply_queue_cancel, case_id, encode_write(self.path, ended)), what, wait=True)
        writer.submit(job)
        cancelled: QueueItem | None = await job.outcome()
        return cancelled

    async def queue_orphans(self, node: str, *, own: bool = True) -> list[QueueItem]:
        if not own:  # the file's owner is its only claimer: no other live process claims from it
            return []
        writer = self._running("take over claimed queued cases")
        job = Job(partial(_apply_queue_orphans, node), "taking over claimed queued cases", wait=True)
        writer.submit(job)
        taken: list[QueueItem] = await job.outcome()
        return taken

    async def queue_register(self, name: str, spec: Mapping[str, Any], node: str) -> tuple[dict[str, Any], str] | None:
        writer = self._running("record a queue")
        params = {"name": name, "spec": to_json(self.path, f"queue {name!r}", dict(spec)), "node": node,
                  "now": time.time()}
        job = Job(partial(_apply_queue_register, params), f"queue {name!r}", wait=True)
        writer.submit(job)
        before: tuple[dict[str, Any], str] | None = await job.outcome()
        return before

    async def owner(self) -> Owner | None:
        """The owning Substrate, if one runs: its OS lock is held (exact, and free once its process is gone)."""
        return await anyio.to_thread.run_sync(self._owner_sync)

    def _owner_sync(self) -> Owner | None:
        if self._lock is not None:
            held = True
        else:
            held = OwnerLock(self.path).held()
        if not held:
            return None
        row = self._read_sync("reading the owner", lambda c: c.one("owner_get"))
        if row is None:
            return Owner("(opening)", None, None, None)
        owner_id, pid, host, _epoch, since, _heartbeat = row
        return Owner(str(owner_id), int(pid), str(host), float(since))

    # -- writes ----------------------------------------------------------------------------------------------

    def _is_open(self) -> bool:
        return self._writer is not None

    def _running(self, action: str) -> Writer:
        writer = self._writer
        if writer is None:
            raise self._not_open(action)
        return writer

    async def write(self, change: CaseWrite, *, wait: bool = True) -> list[bool]:
        writer = self._running("write")
        encoded = encode_write(self.path, change)
        job = Job(partial(_apply_write, encoded), f"case {encoded.case_id!r}", wait=wait, batch=encoded)
        writer.submit(job)
        if not wait:
            return []
        result: list[bool] = await job.outcome()
        return result

    async def inbox_put(
        self, case_id: str, kind: str, body: Mapping[str, Any], *, request_id: str | None, created_at: float
    ) -> int:
        writer = self._running("put an input in the inbox")
        params = {
            "case_id": case_id,
            "kind": kind,
            "body": inbox_text(self.path, case_id, kind, body, request_id),
            "request_id": request_id,
            "created_at": created_at,
        }
        job = Job(partial(_apply_inbox_put, params), f"an inbox input for case {case_id!r}", wait=True)
        writer.submit(job)
        inbox_id: int = await job.outcome()
        return inbox_id

    async def prune(self, ended_before: float, limit: int | None = None) -> int:
        writer = self._running("prune")
        job = Job(partial(_apply_prune, ended_before, limit), f"pruning cases ended before {ended_before}", wait=True)
        writer.submit(job)
        count: int = await job.outcome()
        return count

    async def delete(self, case_id: str, children: Sequence[str] = ()) -> bool:
        writer = self._running("delete a case")
        job = Job(partial(_apply_delete, [case_id, *children]), f"deleting case {case_id!r}", wait=True)
        writer.submit(job)
        deleted: bool = await job.outcome()
        return deleted

    async def _change(self, what: str, fn: Step[_Connection, T], *, doing: str = "recording") -> T:
        """On the writer thread, in its next group's transaction."""
        writer = self._running(f"{doing} {what}")
        job = Job(partial(_run_change, fn), what, wait=True)
        writer.submit(job)
        done: T = await job.outcome()
        return done

    # -- reads -----------------------------------------------------------------------------------------------

    async def _read(self, action: str, fn: Step[_Connection, T], *, consistent: bool = False) -> T:
        """On a worker thread, on a reader connection, in one read transaction (every read is `consistent`)."""
        self._running(action)
        return await anyio.to_thread.run_sync(self._read_sync, action, fn, limiter=self._read_limiter)

    def _read_sync(self, action: str, fn: Step[_Connection, T]) -> T:
        conn = self._take_reader(action)
        try:
            conn.execute(Q["begin_read"])
            try:
                return run_now(fn(_Connection(conn)))
            finally:
                if conn.in_transaction:
                    conn.execute(Q["rollback"])
        except sqlite3.Error as exc:
            raise fault(self.path, action, exc) from exc
        finally:
            self._give_back(conn)

    def _take_reader(self, action: str) -> sqlite3.Connection:
        with self._readers_lock:
            if self._readers:
                return self._readers.pop()
        try:
            conn = self._connect(check_same_thread=False)
        except sqlite3.Error as exc:
            raise fault(self.path, action, exc) from exc
        conn.execute(Q["pragma_query_only"])  # sets a flag on the connection: no I/O, cannot fail
        return conn

    def _give_back(self, conn: sqlite3.Connection) -> None:
        with self._readers_lock:
            if self._writer is not None:
                self._readers.append(conn)
                return
        conn.close()  # the store closed meanwhile

    def _decode_row(self, found: Row) -> CaseRow:
        return decode_row(found[0], found)

    def _listed(self, listing: Listing) -> Step[_Connection, list[CaseRow]]:
        sql, params = listing.sqlite()

        async def read(c: _Connection) -> list[CaseRow]:
            return [decode_row(found[0], found) for found in c.conn.execute(sql, params)]

        return read

    async def inbox_take(self, after: int = 0, limit: int = 1000) -> list[InboxRow]:
        watch = self._watch
        if watch is not None and limit > 0:
            try:  # on the calling thread: an owner looks at every change, and the inbox is empty most of the time
                empty = watch.execute(Q["inbox_any"], {"after": after}).fetchone() is None
            except sqlite3.Error as exc:
                raise fault(self.path, "reading the inbox", exc) from exc
            if empty:
                await anyio.lowlevel.checkpoint()
                return []
        return await super().inbox_take(after, limit)

    def inbox_waiting(self, case_id: str) -> bool | None:
        """On the calling thread, as `changed()`: one step into an index, answered from the page cache."""
        self._running("read the inbox")
        assert self._watch is not None
        try:
            return self._watch.execute(Q["inbox_waits"], {"case_id": case_id}).fetchone() is not None
        except sqlite3.Error as exc:
            raise fault(self.path, f"reading the inbox of case {case_id!r}", exc) from exc

    def changed(self) -> bool:
        version = self._data_version_now("poll for changes")
        changed = version != self._data_version
        self._data_version = version
        return changed

    def _store_name(self) -> str:
        return self.path

    def _poll_changed(self) -> bool:
        version = self._data_version_now("wait for changes")
        changed = version != self._wait_version
        self._wait_version = version
        return changed

    def _data_version_now(self, action: str) -> int:
        """SQLite's data_version: it moves when another connection (another process's too) commits."""
        self._running(action)
        assert self._watch is not None
        try:
            version: int = self._watch.execute(Q["pragma_data_version"]).fetchone()[0]
        except sqlite3.Error as exc:
            raise fault(self.path, "polling for changes", exc) from exc
        return version


# -- what the writer thread runs, inside the group's transaction ---------------------------------------------


def _apply_write(change: EncodedWrite, conn: sqlite3.Connection) -> list[bool]:
    appended: list[bool] = []
    _refuse_second_start(change, conn)
    if headless(change) and conn.execute(Q["case_exists"], {"case_id": change.case_id}).fetchone() is None:
        raise Refused(case_gone(change.case_id))
    for record in change.records:
        params = {
            "case_id": change.case_id,
            "seq": record.seq,
            "kind": record.kind,
            "request_id": record.request_id,
            "record": record.text,
        }
        try:
            cursor = conn.execute(Q["record_append"], params)
        except sqlite3.IntegrityError as exc:
            text = str(exc)
            if "journal.seq" in text:
                raise Refused(seq_taken(change.case_id, record.seq)) from exc
            if record.kind == "end" and ("journal.case_id" in text or "journal_one_end" in text):
                raise Refused(second_end(change.case_id, record.seq)) from exc
            raise
        appended.append(cursor.rowcount == 1)
    _compact(change, conn)
    if change.row is not None:
        conn.execute(Q["case_put"], change.row.params)
    if change.snapshot is not None:
        conn.execute(Q["snapshot_put"], change.snapshot.params)
        conn.execute(Q["snapshot_trim"], {"case_id": change.case_id, "keep": SNAPSHOTS_KEPT})
    for inbox_id in change.inbox_done:
        conn.execute(Q["inbox_done"], {"id": inbox_id})
    for inbox_id, reason in change.inbox_refused:
        conn.execute(Q["inbox_refuse"], {"id": inbox_id, "reason": reason})
    return appended


def _apply_writes(conn: sqlite3.Connection, changes: list[EncodedWrite]) -> list[list[bool]]:
    """Several case writes in one pass: every record in one statement, every row in another.

    Equivalent to `_apply_write` on each in turn when every record is appended: the tables do not depend on
    each other, and records and rows keep their order. When a record is skipped (a retried request_id) the
    count says so but not which: `Redo` asks for the writes one at a time, where each record says.
    """
    records = [
        (change.case_id, record.seq, record.kind, record.request_id, record.text)
        for change in changes
        for record in change.records
    ]
    starting = [record[0] for record in records if record[2] == "start"]
    if starting and conn.execute(Q["cases_existing"], {"ids": _array(starting).decode()}).fetchone() is not None:
        raise Redo  # a case id taken: each write alone, where its own refusal is said
    if any(change.schedule is not None and _schedule_paused(conn, change.schedule) for change in changes):
        raise Redo  # a paused schedule's slot: as above
    heads = [change.case_id for change in changes if starts_case(change)]
    if heads and conn.execute(Q["queue_items_waiting_for"], {"ids": _array(heads).decode()}).fetchone() is not None:
        raise Redo  # an id a queue item waits for: as above
    needed = {change.case_id for change in changes if headless(change)}
    if needed:
        needed -= {record[0] for record in records if record[2] in HEADS}  # started (or forked) in this batch
        found = conn.execute(Q["cases_existing"], {"ids": _array(sorted(needed)).decode()}).fetchall()
        if len(found) < len(needed):
            raise Redo  # a case gone (deleted meanwhile): each write alone, where its own refusal is said
    if records:
        if JSON_EACH:  # one call: each sqlite3 call (and each row of an executemany) is a round trip of the GIL
            appended = conn.execute(Q["records_append"], {"records": _array(records).decode()}).rowcount
        else:
            named = (dict(zip(_RECORD, record, strict=True)) for record in records)
            appended = conn.executemany(Q["record_append"], named).rowcount
        if appended != len(records):
            raise Redo
    rows = [change.row.params for change in changes if change.row is not None]
    if rows:
        if JSON_ROWS and all(_exact(row) for row in rows):
            conn.execute(Q["cases_put"], {"rows": _array([[row[c] for c in _ROW] for row in rows]).decode()})
        else:
            conn.executemany(Q["case_put"], rows)
    outcomes = []
    for change in changes:
        _compact(change, conn)
        if change.snapshot is not None:
            conn.execute(Q["snapshot_put"], change.snapshot.params)
            conn.execute(Q["snapshot_trim"], {"case_id": change.case_id, "keep": SNAPSHOTS_KEPT})
        for inbox_id in change.inbox_done:
            conn.execute(Q["inbox_done"], {"id": inbox_id})
        for inbox_id, reason in change.inbox_refused:
            conn.execute(Q["inbox_refuse"], {"id": inbox_id, "reason": reason})
        outcomes.append([True] * len(change.records))
    return outcomes


def _compact(change: EncodedWrite, conn: sqlite3.Connection) -> None:
    """A compaction, in the write's transaction, after its `snapshot` record was appended: what precedes it goes."""
    if change.compact is not None:
        params = {"case_id": change.case_id, "seq": change.compact}
        conn.execute(Q["journal_compact"], params)
        conn.execute(Q["snapshots_compact"], params)


def _schedule_paused(conn: sqlite3.Connection, name: str) -> bool:
    found = conn.execute(Q["schedule_get"], {"name": name}).fetchone()
    return found is not None and bool(found[4])


def _refuse_second_start(change: EncodedWrite, conn: sqlite3.Connection) -> None:
    """A `start` record for a case the store holds is refused as its seq 0 would be: a compaction removed that
    record, never the case's row, so the row says the id is taken. A write that starts a case whose id a queue
    item waits for is refused too, unless it is that item's own (`CaseWrite.from_queue`); and the start of a
    paused schedule's slot (`CaseWrite.schedule`)."""
    if change.schedule is not None and _schedule_paused(conn, change.schedule):
        raise Refused(paused_slot(change.schedule, change.case_id), SchedulePaused)
    if any(record.kind == "start" for record in change.records) and conn.execute(
        Q["case_exists"], {"case_id": change.case_id}
    ).fetchone() is not None:
        raise Refused(seq_taken(change.case_id, 0))
    if starts_case(change) and conn.execute(
        Q["queue_items_waiting_for"], {"ids": _array([change.case_id]).decode()}
    ).fetchone() is not None:
        raise Refused(waits_in_queue(change.case_id))


def _apply_queue(change: EncodedWrite, conn: sqlite3.Connection) -> None:
    _refuse_second_start(change, conn)
    start = change.records[0]
    params = {"case_id": change.case_id, "seq": 0, "kind": start.kind, "request_id": None, "record": start.text}
    try:
        conn.execute(Q["record_append"], params)
    except sqlite3.IntegrityError as exc:
        raise Refused(seq_taken(change.case_id, 0)) from exc
    assert change.row is not None
    conn.execute(Q["case_queue"], change.row.params)


def _apply_claim(params: dict[str, Any], conn: sqlite3.Connection) -> list[str]:
    return [str(case_id) for (case_id,) in conn.execute(Q["cases_claim"], params).fetchall()]


def _items(conn: sqlite3.Connection, query: str, params: dict[str, Any]) -> list[QueueItem]:
    return [item_of(found, loads(found[5])) for found in conn.execute(Q[query], params).fetchall()]


def _apply_queue_put(params: dict[str, Any], conn: sqlite3.Connection) -> CaseExists | SchedulePaused | None:
    """None: queued; else the refusal (returned, not raised: the writer would make a raised one a StoreConflict)."""
    if params["name"] is not None and _schedule_paused(conn, params["name"]):
        return SchedulePaused.refused(params["store"], params["name"], params["case_id"])
    if conn.execute(Q["queue_id_taken"], params).fetchone() is not None:
        return CaseExists(params["case_id"])
    if params["dedup"] is not None:
        conn.execute(Q["queue_sweep"], params)
        holder = conn.execute(Q["queue_dedup_holder"], params).fetchone()
        if holder is not None:
            return CaseExists.dedup(params["case_id"], params["queue"], params["dedup"], str(holder[0]))
    conn.execute(Q["queue_put"], params)
    return None


def _apply_queue_claim(
    queue: str, limits: QueueLimits, node: str, now: float, most: int, conn: sqlite3.Connection
) -> tuple[list[QueueItem], float | None]:
    """Claim what the queue has room for (see `_queueing.read_plan`: only due items that may start are read)."""
    params: dict[str, Any] = {"queue": queue, "now": now}
    conn.execute(Q["queue_sweep"], params)
    conn.execute(Q["queue_promote"], params)
    running = [Running(part, owner) for part, owner in conn.execute(Q["queue_running"], params)]
    since = now - (limits.rate[1] if limits.rate is not None else 0.0)
    recent = [(part, float(at)) for part, at in conn.execute(Q["queue_recent"], {"queue": queue, "since": since})]
    counts = Counts(limits, node, now, running, recent)
    parts = [p or None for (p,) in conn.execute(Q["queue_ready_parts"], params)] if limits.partitioned else None
    plan = read_plan(counts, most, parts)
    if parts is None:
        ready = _items(conn, "queue_ready", {"queue": queue, "limit": plan.per_key}) if plan.per_key else []
    else:  # (one small indexed read per partition with room: in-process, cheaper than one statement for all)
        ready = [item for part in plan.parts
                 for item in _items(conn, "queue_ready_in_part", {"queue": queue, "part": part or "",
                                                                  "limit": plan.per_key})]
        ready.sort(key=lambda item: (item.priority, item.order))
    chosen, wake = choose(limits, node, now, ready, running, recent, most)
    claimed = []
    for item in chosen:
        conn.execute(Q["queue_start"], {"case_id": item.case_id, "now": now, "node": node})
        if item.start.get(RETRIED) is not None:  # a retried case back from its queue: live again
            conn.execute(Q["cases_dequeued"], {"case_id": item.case_id, "state": "running"})
        claimed.append(replace(item, state=STARTED, started_at=now, node=node))
    delayed = conn.execute(Q["queue_next_due"], params).fetchone()[0]
    return claimed, earliest(wake, plan.wake, None if delayed is None else float(delayed))


def _apply_queue_register(params: dict[str, Any], conn: sqlite3.Connection) -> tuple[dict[str, Any], str] | None:
    found = conn.execute(Q["queue_spec_get"], params).fetchone()
    conn.execute(Q["queue_register"], params)
    return None if found is None else (loads(found[0]), str(found[1]))


def _apply_queue_orphans(node: str, conn: sqlite3.Connection) -> list[QueueItem]:
    conn.execute(Q["queue_orphans_take"], {"node": node})
    return _items(conn, "queue_orphans", {"node": node})


def _apply_queue_requeue(
    params: dict[str, Any], reopened: EncodedWrite, conn: sqlite3.Connection
) -> QueueItem | CaseExists | None:
    """See Store.queue_requeue (a refusal is returned, not raised: the writer would make it a StoreConflict)."""
    found = _items(conn, "queue_get", params)
    if not found or found[0].state not in (STARTED, ENDED):
        return None
    item = found[0]
    conn.execute(Q["queue_sweep"], {"queue": item.queue})
    if item.dedup is not None:
        holder = conn.execute(Q["queue_dedup_other"], {"queue": item.queue, "dedup": item.dedup,
                                                        "case_id": item.case_id}).fetchone()
        if holder is not None:
            return CaseExists.dedup(item.case_id, item.queue, item.dedup, str(holder[0]))
    conn.execute(Q["queue_keep_start"], params)
    conn.execute(Q["queue_requeue"], params)
    _apply_write(reopened, conn)  # (Refused: the job's savepoint undoes the item's change too)
    return _items(conn, "queue_get", params)[0]


def _apply_queue_cancel(case_id: str, ended: EncodedWrite, conn: sqlite3.Connection) -> QueueItem | None:
    if conn.execute(Q["queue_cancel"], {"case_id": case_id}).rowcount == 0:
        return None
    _apply_write(ended, conn)  # (Refused: the job's savepoint undoes the cancel too)
    found = _items(conn, "queue_get", {"case_id": case_id})
    return found[0] if found else None


def _apply_inbox_put(params: dict[str, Any], conn: sqlite3.Connection) -> int:
    cursor = conn.execute(Q["inbox_put"], params)
    assert cursor.lastrowid is not None
    return cursor.lastrowid


PRUNED = ("prune_journal", "prune_snapshots", "prune_inbox", "prune_case", "prune_item_started", "prune_item")


def _apply_prune(ended_before: float, limit: int | None, conn: sqlite3.Connection) -> int:
    params = {"before": ended_before, "limit": -1 if limit is None else limit}  # LIMIT -1: no limit
    gone = [case_id for (case_id,) in conn.execute(Q["prune_select"], params).fetchall()]
    for case_id in gone:
        for query in PRUNED:
            conn.execute(Q[query], {"case_id": case_id, "tombstone": TOMBSTONE})
    return len(gone)


def _apply_delete(case_ids: list[str], conn: sqlite3.Connection) -> bool:
    """Delete the cases (a case and the ended children it waited for) all, or none (each checked first)."""
    for case_id in case_ids:
        if conn.execute(Q["delete_select"], {"case_id": case_id}).fetchone() is None:
            return False
    for case_id in case_ids:
        for query in PRUNED:
            conn.execute(Q[query], {"case_id": case_id, "tombstone": TOMBSTONE})
    return True


def _heartbeat(epoch: int, conn: sqlite3.Connection) -> None:
    conn.execute(Q["owner_heartbeat"], {"now": time.time(), "epoch": epoch})


def _when(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")

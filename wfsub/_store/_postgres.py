"""`PostgresStore`: a store in one Postgres schema, shared by several Substrates (nodes) at once.

The driver: asyncpg, chosen by measurement. On this machine (2 cores, PostgreSQL 15 on loopback, fsync on,
`synchronous_commit = on`), each figure the best and worst of two runs that alternated the drivers:

    per call                                   asyncpg 0.32            psycopg 3.3 (binary), async
    INSERT + COMMIT (3 round trips), p50/p99   0.3-1.3 / 7.6-8.0 ms     0.7-1.0 / 6.1-6.2 ms   (the fsync rules)
    point read by primary key, p50/p99         28-42 / 68-1014 us       55-57 / 1231-2886 us
    1,000 small rows in one transaction        99-105 k rows/s (executemany), 127-152 k (unnest)
                                                                        63-68 k (executemany), 70-84 k (unnest)
    LISTEN/NOTIFY delivery, p50/p99            59-80 us / 2.7-3.7 ms    91-94 us / 1.2-3.8 ms

Commits cost the same on both (the disk's fsync is most of it, and it varies run to run by 3x); asyncpg reads
twice as fast and moves half again as many rows per second, and `fetchmany` pipelines one statement per write
of a group with a single Sync, so a whole group commit is one round trip and one transaction (below). So
asyncpg, with `asyncpg-stubs` for mypy. It is an optional dependency (`pip install 'wfsub[postgres]'`):
`import wfsub` never imports it; constructing a PostgresStore without it raises a StoreError saying so.

Where the driver runs: an asyncio event loop in a thread of its own, one per store object, on asyncio and trio
alike. Neither driver runs on trio (both need an asyncio loop: "RuntimeError: no running event loop"), so a
trio program needs that thread anyway; using it on asyncio too gives one code path, tested on both, and makes the
synchronous reads (`read_row`, `read_cases`: `Substrate.status`, `data`, `cases` are synchronous) sound: they
hand the query to the driver thread and block for its answer, bounded by `sync_timeout`, as SqliteStore reads on
the calling thread. The price, measured with asyncpg in the same run: a point read goes from 29-42 us (driver on
the caller's asyncio loop) to 80-101 us (driver thread, caller on asyncio or trio), a synchronous read from the
caller's thread takes 67-70 us; a commit pays the same hand-offs, less than its fsync. Results come back to the
caller's loop through `anyio.lowlevel.current_token()` (as in `_sqlite_writer.py`), never blocking the driver thread.

What it costs (`python -m bench postgres`, two runs, each figure beside bare asyncpg in the same run):

    one write at a time (a record + the case row), p50   397-401 us    bare autocommit INSERT 144-159 us (2.5-2.8x)
      the same on trio                                   413-429 us
    group commit, 1,000 writers x 10 writes            17.5-17.8 k/s   bare executemany, one transaction 239-253 k/s
    inbox_put until the other node's wait_changed, p50   472-480 us    bare pg_notify to a callback 49-52 us

A write pays two thread hand-offs (about 100 us), and `write_case` locks the case row, checks owner and epoch
and replaces the row besides appending (about 40 us in the server). A group commit runs about 20 us of PL/pgSQL
per write and some 35 us of Python across the two threads, which share one GIL. A NOTIFY travels inside the
inbox row's commit (an fsync; a bare `pg_notify` transaction writes no WAL) and crosses both threads.

The reads and the writes that are one named query are `SqlStore`'s (`_sql_store.py`), run here over `_Named` on a
pooled connection: their `:name` parameters are numbered `$n` once, at load (`_sql.py`), and bound in that order.

Group commit. Every write (`write`, `queue_case`) and every `inbox_put` goes to one writer task on the driver
loop (the job, the queue and the wake-up of waiters are `_group.py`'s, shared with the SQLite writer). It takes
everything queued while its previous commit ran and sends one `SELECT ... FROM write_case(...)` per write with
`fetchmany`: one round trip, one implicit transaction, one fsync. `write_case` (a PL/pgSQL function, in the
migrations) locks the case row (`FOR UPDATE`), checks its owner and epoch (fencing), and runs the write in an
exception block: a write that breaks a rule (a seq written twice, a second `end`) or that is fenced is undone
alone and reported as StoreConflict, while the rest of the group commits. A write that starts a case whose id a
queue item waits for is refused so too (not its item's own start): it looks under an advisory lock on the case id,
which `queue_put` takes before it looks for a case of the id, so the two never both commit. A start then holds
that lock until its group commits: a queueing of the same id waits for it. An error the function does not catch
(a value Postgres refuses) aborts the group's transaction; the writer then runs each write of that
group alone, so it fails alone.

Connection loss. A connection that dropped (a restarted server, `pg_terminate_backend`) is replaced, with
backoff (50 ms doubling to 1 s), for up to `retry_for` seconds; calls made meanwhile wait, then fail with a
StoreError that says the database could not be reached. `open()` waits an outage out the same way, starting
again from its first connection. Reads are retried whatever failed (a connection lost mid-read included). A
write is retried only when it provably did not commit: the connection was closed before it was sent, or the
server answered with an error (an aborted transaction). When the connection is lost after a group was sent
and before its answer, the store ends the server process that ran it and looks up the group's commit token
(written in its transaction): absent, the group did not commit and is sent again; present, each write of a
case is answered as it went, read back (its records found at their seqs), or run again alone when it changed
nothing or has no records (a row, a snapshot, inbox rows: idempotent). Only when the database cannot be asked
within `retry_for` (and for an inbox input, whose id is not known then) does a write fail with `CommitUnknown`
(a StoreError), so the caller retries with its `request_id` (applied once) or reads the case back. Nothing
acknowledged is lost: a write returns only after Postgres confirmed its commit. `take_over`, `claim_queued` and
`prune` are not retried after an unknown outcome either (it is reported the same way); cases taken or claimed by
such a call are this node's and show up in `live()`, `due()` and `row()` (the runtime's sweep of its live cases
brings them back).

Notifications. One connection LISTENs on `<schema>_changed`. The writes that others must see send a NOTIFY in
their own transaction (delivered at commit): an inbox row (naming the case's owner, so only it wakes), an `end`,
a queued case (naming its fingerprint), a takeover. `wait_changed()` returns on a relevant one (not on this
store object's own: it knows what it wrote) and right after the listener (re)subscribes, since notifications
are lost while it is disconnected: the caller re-reads then. A lost connection that the operating system does
not report (no RST) is noticed only by polling: the runtime should wait at most about a second at a time.

Nodes, leases, fencing. `open(owner=True, owner_id=NODE)` registers NODE with a lease until database now +
`lease_seconds` (refused only when another live process holds the same node id: its lease holds and its
connections are open, named after its node id, pid and host); `renew_lease()` extends it;
`close()` gives it up at once so that other nodes may take its cases over without waiting. Lease expiry is
database time, so node clocks may drift. A case row names its owner node and an epoch (1 when started, 0 while
queued, +1 at each takeover); every write for an existing case checks both under the row lock and fails alone
with StoreConflict (naming the owner and epoch now) when this node lost the case. Journal rows keep the epoch
they were appended at. `take_over()` and `claim_queued()` use `FOR UPDATE SKIP LOCKED`, so two nodes never take
the same case. On a shared store `live()`, `due()`, `next_due()` and `inbox_take()` answer for this node's cases
(and the inbox rows of no case), since those are what it must run; a store opened with owner=False sees all.

Time on a shared store. Due times, acceptance times and leases should all be database time:
`database_time()` reads it, and `renew_lease()` returns it, so the runtime can keep `now = time.time() + offset`
with the offset refreshed at every renewal.

Inbox order. Inbox ids increase, but with several writers a smaller id may commit after a larger one was read;
on a shared store read the inbox with `after=0` (pending rows only stay until moved or refused) and skip the ids
already being moved, rather than keeping a cursor.

Delete and the inbox. `delete` removes an ended case only when no input for it waits in the inbox, so an input
put for the case and a delete of it must serialize: an input put holds a shared advisory lock on its case's key
(`inbox_lock_key`, migration 10) until its group commits, and a delete locks the case row, then takes that key
exclusively, then checks and deletes in a statement of its own (whose snapshot sees every input put before). A
lock on the case row would make every input put wait for the owner's writes of that case (and two nodes' groups
that each write a case and put an input for the other's could deadlock). A delete that finds the key held lets
the row go and waits for the key alone before trying again: a group that puts an input for a case and then
writes it would otherwise wait for the row while the delete waited for the key.

The schema. Everything lives in one schema (`schema=`, default "wfsub"), created by the store; `meta` records
('application', 'wfsub') and the layout version. A new schema is built by running the numbered files in
`sql/postgres/migrations/` in order (one path to build a layout, the one that is tested); an older schema is
moved forward by an owner only; a newer one is refused. Openers serialize on an advisory lock. Every statement
is in `sql/postgres/queries.sql` with bound parameters; the schema name (a checked identifier) is the only text
formatted into SQL, in CREATE SCHEMA, and each connection's `search_path` points at it.

Names and secrets: `url` and messages show the DSN without its password.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import hashlib
import json
import os
import re
import secrets
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, NamedTuple, TypeVar
from urllib.parse import urlsplit

import anyio
import anyio.lowlevel
from anyio.lowlevel import EventLoopToken

from .._errors import CaseExists, CommitUnknown, SchedulePaused, StoreConflict, StoreError, newer_store, paused_slot
from .._trace import get_logger
from ._base import (
    CaseRow,
    CaseWrite,
    Owner,
)
from ._group import GroupQueue, Job, by_key, call_soon_on
from ._listing import Listing
from ._postgres_driver import (
    FIXES,
    UNREACHABLE,
    DriverLoop,
    classify,
    driver,
    fault,
    fenced,
    redact_dsn,
    split_options,
    sqlstate,
)
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
    SNAPSHOTS_KEPT,
    EncodedWrite,
    case_gone,
    decode_row,
    decode_tags,
    encode_write,
    inbox_text,
    loads,
    second_end,
    seq_taken,
    to_json,
    waits_in_queue,
)
from ._sql import load_dialect
from ._sql_store import NO_PARAMS, Params, Row, SqlStore, Step

_log = get_logger("wfsub.store")

T = TypeVar("T")
_SCHEMA = re.compile(r"^[a-z_][a-z0-9_]{0,39}$")
BACKOFF_FIRST, BACKOFF_MAX = 0.05, 1.0
LEASE_MIN = 0.5  # seconds: the shortest lease_seconds (renewed every third, so every 0.17 s at least)
MAX_SECONDS = 1e9  # the longest lease_seconds, retry_for or connect_timeout (about 31 years): finite
ENDED_KEPT = 10_000  # case ids `drain_ended()` keeps between two calls before it says "re-read everything"
COMMITS_KEPT = 3600.0  # seconds a group's commit token is kept (long past any retry_for)
APPLICATION = "wfsub"

# A migration runs whole (its functions are $$-quoted); asyncpg binds by position (`:name` numbered: see _sql.py).
POSTGRES = load_dialect("postgres", split=False, numbered=True)
QUERIES: Mapping[str, str] = POSTGRES.queries
PARAMS = POSTGRES.params
SCHEMA_VERSION = POSTGRES.layout.version
"""The Postgres layout version this library writes (its own numbering, beside SQLite's)."""

Q = QUERIES

# The nodes this process holds open, by (database, schema, node id): the lease tells processes apart by pid and
# host, so two stores of one process opened as the same node would both get it; this set refuses the second.
_OPEN_NODES: set[tuple[str, str, str]] = set()
_OPEN_NODES_LOCK = threading.Lock()


# -- jobs of the group commit ----------------------------------------------------------------------------------


class _NotDeleted(Exception):  # noqa: N818 (not an error: rolls back a delete that cannot remove every case)
    """Internal: one of the cases a `delete` removes together cannot be removed: none is."""


class _Statement(NamedTuple):
    """What a job of the group commit runs: one statement per write (the group's share one `query`)."""

    query: str
    args: tuple[Any, ...]
    decode: Callable[[Any], Any]  # the statement's row -> the write's result (or a StoreError)


def _write_query(change: EncodedWrite) -> str:
    """The statement of a case write: `start_group` when it starts a case (refused if the case exists: after a
    compaction its seq 0 is gone, not its row), else `write_group`."""
    return Q["start_group"] if any(record.kind == "start" for record in change.records) else Q["write_group"]


def _query(job: Job) -> str:
    statement: _Statement = job.work
    return statement.query


class _Named:
    """The seam of `_sql_store.py` over an asyncpg connection, on the driver loop: a named query with its named
    parameters, bound in the order `_sql.py` numbered them."""

    __slots__ = ("conn",)

    def __init__(self, conn: Any) -> None:
        self.conn = conn

    async def one(self, query: str, params: Params = NO_PARAMS) -> Row | None:
        return await self.conn.fetchrow(Q[query], *[params[name] for name in PARAMS[query]])

    async def all(self, query: str, params: Params = NO_PARAMS) -> list[Row]:
        found: list[Row] = await self.conn.fetch(Q[query], *[params[name] for name in PARAMS[query]])
        return found

    async def value(self, query: str, params: Params = NO_PARAMS) -> Any:
        return await self.conn.fetchval(Q[query], *[params[name] for name in PARAMS[query]])

    async def execute(self, query: str, params: Params = NO_PARAMS) -> int:
        status = await self.conn.execute(Q[query], *[params[name] for name in PARAMS[query]])
        return int(str(status).rpartition(" ")[2] or 0)  # "UPDATE 1", "INSERT 0 1", "DELETE 3": the last is rows


async def _named(fn: Step[_Named, T], consistent: bool, conn: Any) -> T:
    if not consistent:
        return await fn(_Named(conn))
    async with conn.transaction(isolation="repeatable_read", readonly=True):
        return await fn(_Named(conn))


@dataclass(slots=True)
class _Conns:
    """What lives on the driver loop (touched only there)."""

    pool: Any = None  # asyncpg.Pool for reads and single statements
    writer: Any = None  # asyncpg.Connection of the group commit
    writer_backend: Any = None  # its server process: (pid, backend_start)
    listener: Any = None  # asyncpg.Connection that LISTENs
    queue: GroupQueue | None = None  # jobs for the writer (rung by setting `kick` on the driver loop)
    kick: asyncio.Event = field(default_factory=asyncio.Event)  # wakes the writer (set on the driver loop only)
    writer_task: asyncio.Task[None] | None = None
    listen_task: asyncio.Task[None] | None = None


class PostgresStore(SqlStore[_Named]):
    """A durable store in one Postgres schema, shared by several nodes (see the module docstring).

    `dsn`: a libpq-style URL (postgresql://user:password@host:port/database?sslmode=...). wfsub's own options
    may be given as keyword arguments or in the DSN's query string: `schema` (default "wfsub": the schema that
    holds the store's tables), `lease_seconds` (10.0, at least 0.5: how long a node's lease lasts unless renewed),
    `connect_timeout` (5.0: seconds to open one connection), `retry_for` (30.0: how long calls wait for a lost
    connection to come back before they fail). `readers`: pooled connections for reads; `sync_timeout`: the
    bound on a synchronous read (`read_row`, `read_cases`), which never waits out a long reconnect; `create=False`
    refuses a schema that does not exist yet (the `wfsub` command: a mistyped schema is an error, not a new store).
    """

    shared = True

    def __init__(
        self,
        dsn: str,
        *,
        schema: str | None = None,
        lease_seconds: float | None = None,
        connect_timeout: float | None = None,
        retry_for: float | None = None,
        readers: int = 4,
        sync_timeout: float = 2.0,
        create: bool = True,
    ) -> None:
        if not isinstance(dsn, str) or not dsn.lower().startswith(("postgresql://", "postgres://")):
            raise StoreError(
                redact_dsn(str(dsn)), "a PostgresStore takes a postgresql://user@host:port/database URL"
            )
        driver_dsn, options = split_options(dsn)
        name = redact_dsn(driver_dsn)
        self._asyncpg = driver(name)
        self.schema = schema if schema is not None else options.get("schema", "wfsub")
        if not _SCHEMA.match(self.schema):
            raise StoreError(
                name, f"schema={self.schema!r}: a schema name is 1-40 characters of a-z, 0-9 and _, not starting "
                "with a digit (it names the store's schema and its NOTIFY channel)"
            )
        self.lease_seconds = _number(name, "lease_seconds", lease_seconds, options, 10.0)
        self.connect_timeout = _number(name, "connect_timeout", connect_timeout, options, 5.0)
        self.retry_for = _number(name, "retry_for", retry_for, options, 30.0)
        if readers < 1:
            raise ValueError(f"readers={readers!r}: at least 1 pooled connection for reads")
        self.readers = readers
        self.sync_timeout = sync_timeout
        self.create = create
        self.dsn = dsn  # as given (it may hold a password: never shown)
        self._driver_dsn = driver_dsn
        sep = "&" if urlsplit(name).query else "?"
        self.url = name if self.schema == "wfsub" else f"{name}{sep}schema={self.schema}"
        self._name = self.url
        self._loop: DriverLoop | None = None
        self._c = _Conns()
        self._node: str | None = None  # this node's id when opened as an owner
        self._sender = ""  # who this store object's NOTIFYs come from
        self._pid, self._host = os.getpid(), socket.gethostname()
        self._app = "wfsub"  # the application_name of its connections (a node's names its process: node_register)
        self._flag_lock = threading.Lock()
        self._changed_flag = False
        self._wait_flag = False
        self._waiters: dict[object, tuple[EventLoopToken, anyio.Event]] = {}
        self._ended: set[str] | None = set()  # `end`s notified since drain_ended() (None: some were lost)
        self._fingerprints: frozenset[str] | None = None  # the last claim_queued's: which queued cases wake us
        self._opening = False
        self._closing = False
        self._held: tuple[str, str, str] | None = None  # this store's entry in _OPEN_NODES while open as a node
        self._next_trim = 0.0  # monotonic time of the next trim of old commit tokens

    def __repr__(self) -> str:
        state = "closed" if self._loop is None else (f"node {self._node!r}" if self._node else "open")
        return f"PostgresStore({self.url!r}, {state})"

    @property
    def node_id(self) -> str | None:
        """This node's id while open as an owner (None otherwise)."""
        return self._node

    # -- open and close --------------------------------------------------------------------------------------

    async def open(self, *, owner: bool, owner_id: str) -> None:
        self._refuse_second_open()
        if not isinstance(owner_id, str) or not owner_id or len(owner_id) > 200:
            raise ValueError(f"owner_id={owner_id!r}: pass a non-empty str of at most 200 characters naming the "
                             "opener (a node id)")
        self._opening = True
        self._app = _process_name(owner_id, self._pid, self._host) if owner else "wfsub"
        self._closing = False
        self._c = _Conns()
        self._ended = set()
        loop = DriverLoop(self.url)
        loop.start()
        try:
            with anyio.CancelScope(shield=True):  # half an open would leave a thread and connections behind
                await loop.call(self._open_async(owner, owner_id))
        except BaseException:
            with anyio.CancelScope(shield=True):
                await loop.call(self._close_async())
            loop.stop()
            self._node = None
            self._release_node_id()
            raise
        finally:
            self._opening = False
        self._node = owner_id if owner else None
        self._sender = owner_id
        self._loop = loop

    async def close(self) -> None:
        loop, self._loop = self._loop, None
        if loop is None:
            return
        self._closing = True
        with anyio.CancelScope(shield=True):  # the writes in flight are committed, whatever cancels us
            try:
                await loop.call(self._close_async())
            finally:
                loop.stop()
                self._node = None
                self._release_node_id()
                with self._flag_lock:
                    waiters = list(self._waiters.values())
                for _token, event in waiters:
                    event.set()  # on this loop (the only one a store is used from at a time)

    def _hold_node_id(self, owner_id: str) -> None:
        """The database lets this process have the node id (its lease, or an expired one): refuse it when another
        store of this process holds it open."""
        held = (redact_dsn(self._driver_dsn), self.schema, owner_id)
        with _OPEN_NODES_LOCK:
            if held in _OPEN_NODES:
                raise StoreError(
                    self._name, f"cannot open as node {owner_id!r}: another store of this process holds that node "
                    "id open (two Substrates as one node would run the same cases). Each node needs its own id: "
                    "give this Substrate another one, or close the other first"
                )
            _OPEN_NODES.add(held)
        self._held = held

    def _release_node_id(self) -> None:
        held, self._held = self._held, None
        if held is not None:
            with _OPEN_NODES_LOCK:
                _OPEN_NODES.discard(held)

    async def _connect(self) -> Any:
        return await self._asyncpg.connect(
            self._driver_dsn,
            timeout=self.connect_timeout,
            server_settings={"search_path": self.schema, "application_name": self._app},
        )

    async def _connect_retrying(self, action: str, deadline: float) -> Any:
        delay = BACKOFF_FIRST
        while True:
            try:
                return await self._connect()
            except Exception as exc:
                if classify(exc) == "fatal" and not isinstance(exc, OSError):
                    raise fault(self._name, action, exc) from exc
                if not await _backoff(delay, deadline):
                    raise self._unreachable(action, exc) from exc
                delay = min(delay * 2, BACKOFF_MAX)

    def _unreachable(self, action: str, exc: BaseException) -> StoreError:
        error = StoreError(
            self._name,
            f"{action} failed: the database could not be reached for {self.retry_for:g} s (last error: "
            f"{type(exc).__name__}: {exc}); {UNREACHABLE} (retry_for= sets how long calls wait)",
        )
        error.__cause__ = exc
        return error

    async def _open_async(self, owner: bool, owner_id: str) -> None:
        """Open, waiting out an outage met on the way (a lost connection, a server restarting) for `retry_for`:
        what was opened is dropped and the open starts again; any other error fails it at once."""
        deadline = time.monotonic() + self.retry_for
        delay = BACKOFF_FIRST
        while True:
            try:
                await self._open_once(owner, owner_id, deadline)
                return
            except Exception as exc:
                cause = exc.__cause__ if isinstance(exc, StoreError) else exc
                if cause is None or classify(cause) == "fatal" or not await _backoff(delay, deadline):
                    raise
                _log.warning("store_open_retrying", store=self._name, error=str(exc))
                await self._drop_opened()
                delay = min(delay * 2, BACKOFF_MAX)

    async def _drop_opened(self) -> None:
        """What a failed open attempt left behind, dropped (the lease stays: the next attempt registers again)."""
        c, self._c = self._c, _Conns()
        if c.writer_task is not None and c.queue is not None:
            c.queue.stop()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(c.writer_task), self.connect_timeout)
        for conn in (c.listener, c.writer):
            if conn is not None:
                with contextlib.suppress(Exception):
                    conn.terminate()
        if c.pool is not None:
            with contextlib.suppress(Exception):
                c.pool.terminate()
        self._node = None
        self._release_node_id()

    async def _open_once(self, owner: bool, owner_id: str, deadline: float) -> None:
        conn = await self._connect_retrying("opening the store", deadline)
        try:
            await self._prepare(conn, owner)
            if owner:
                await self._register(conn, owner_id)
                self._node = owner_id  # from here on, a failed open gives the lease back
        except BaseException:
            conn.terminate()  # (a close would wait on a connection that may be broken)
            raise
        await conn.close()
        c = self._c
        try:
            c.pool = await self._asyncpg.create_pool(
                self._driver_dsn, min_size=1, max_size=self.readers, timeout=self.connect_timeout,
                server_settings={"search_path": self.schema, "application_name": self._app},
            )
            c.writer = await self._connect()
            c.writer_backend = await c.writer.fetchrow(Q["backend_me"])
        except Exception as exc:
            raise fault(self._name, "opening the store's connections", exc) from exc
        driver_loop = asyncio.get_running_loop()
        c.queue = GroupQueue(self._name, partial(driver_loop.call_soon_threadsafe, c.kick.set))
        c.writer_task = driver_loop.create_task(self._writer_loop(c.queue))
        self._fingerprints = None
        await self._listen(first=True)
        c.listen_task = None

    async def _prepare(self, conn: Any, owner: bool) -> None:
        """Check the schema is ours and not newer; create it or migrate it (one opener at a time)."""
        action = f"checking the store's schema {self.schema!r}"
        try:
            async with conn.transaction():
                await conn.execute(Q["lock_layout"], f"wfsub layout {self.schema}")
                if not await conn.fetchval(Q["schema_exists"], self.schema):
                    if not self.create:
                        raise StoreError(
                            self._name, f"there is no schema {self.schema!r} in this database, so no wfsub store: "
                            "check the DSN and ?schema= (a Substrate creates its schema when it first opens it)"
                        )
                    action = f"creating the schema {self.schema!r}"
                    await conn.execute(f'CREATE SCHEMA "{self.schema}"')  # a checked identifier (_SCHEMA)
                version = await self._version(conn)
                if version > SCHEMA_VERSION:
                    raise newer_store(
                        self._name, f"the schema {self.schema!r}", version, SCHEMA_VERSION, "'wfsub[postgres]'"
                    )
                if 0 < version < SCHEMA_VERSION and not owner:
                    raise StoreError(
                        self._name,
                        f"the schema has store layout version {version}, older than this wfsub's {SCHEMA_VERSION}: "
                        "only an owner migrates a schema; start a Substrate with this wfsub first, then use `wfsub`",
                    )
                for target in range(version + 1, SCHEMA_VERSION + 1):
                    migration = POSTGRES.layout.migrations[target]
                    action = f"applying migration {migration.name} (layout {target - 1} to {target})"
                    await conn.execute(migration.script)  # a whole script of the package: no parameters
                    if target == 1:
                        await conn.execute(Q["meta_put"], "application", APPLICATION)
                    await conn.execute(Q["meta_put"], "version", str(target))
        except StoreError:
            raise
        except Exception as exc:
            raise fault(self._name, action, exc) from exc

    async def _version(self, conn: Any) -> int:
        tables = await conn.fetchval(Q["count_tables"], self.schema)
        if tables == 0:
            return 0
        if not await conn.fetchval(Q["meta_table_exists"], self.schema):
            raise StoreError(
                self._name,
                f"the schema {self.schema!r} holds tables but is not a wfsub store (no meta table): give the store "
                "a schema of its own (?schema=NAME); wfsub never writes into another application's tables",
            )
        app = await conn.fetchval(Q["meta_get"], "application")
        raw = await conn.fetchval(Q["meta_get"], "version")
        if app != APPLICATION or raw is None or not str(raw).isdigit():
            raise StoreError(
                self._name,
                f"the schema {self.schema!r} has a meta table that is not wfsub's (application {app!r}, version "
                f"{raw!r}): give the store a schema of its own (?schema=NAME)",
            )
        return int(raw)

    async def _register(self, conn: Any, owner_id: str) -> None:
        try:
            got = await conn.fetchval(Q["node_register"], owner_id, self._pid, self._host, self.lease_seconds)
            row = None if got is not None else await conn.fetchrow(Q["node_get"], owner_id)
        except Exception as exc:
            raise fault(self._name, f"registering node {owner_id!r}", exc) from exc
        if row is None:
            self._hold_node_id(owner_id)  # (refuses a second opener in this process before anything changes)
            try:  # ours: fence an earlier process of this node id before loading any of its cases
                await conn.execute(Q["node_fence_earlier"], owner_id)
            except Exception as exc:
                self._release_node_id()
                raise fault(self._name, f"registering node {owner_id!r}", exc) from exc
            return
        _, pid, host, _since, left = row
        raise StoreError(
            self._name,
            f"cannot open as node {owner_id!r}: another live process holds that node id (pid {pid} on host "
            f"{host!r}, lease for {left:.1f} s more). Each node needs its own id: give this Substrate another "
            "one, or stop that process (its lease then expires)",
        )

    async def _close_async(self) -> None:
        c = self._c
        if c.writer_task is not None and c.queue is not None:
            c.queue.stop()
            await asyncio.shield(c.writer_task)  # commits what was queued
        if c.listen_task is not None:
            c.listen_task.cancel()
            await asyncio.wait({c.listen_task}, timeout=self.connect_timeout)  # its connection closed, not dropped
        if self._node is not None and c.pool is not None:
            try:
                async with c.pool.acquire(timeout=self.connect_timeout) as conn:
                    await conn.execute(Q["node_release"], self._node, self._pid, self._host)
            except Exception as exc:  # it expires by itself within a lease
                _log.warning("store_lease_release_failed", store=self._name, error=str(exc))
        for conn in (c.listener, c.writer):
            if conn is not None:
                try:
                    await asyncio.wait_for(conn.close(), self.connect_timeout)
                except Exception:
                    conn.terminate()
        if c.pool is not None:
            try:
                await asyncio.wait_for(c.pool.close(), self.connect_timeout)
            except Exception:
                c.pool.terminate()
        self._c = _Conns()

    # -- running statements on the driver loop ---------------------------------------------------------------

    def _store_name(self) -> str:
        return self._name

    def _is_open(self) -> bool:
        return self._loop is not None

    def _running(self, action: str) -> DriverLoop:
        loop = self._loop
        if loop is None:
            raise self._not_open(action)
        return loop

    async def _pooled(
        self, action: str, fn: Callable[[Any], Awaitable[T]], *, idempotent: bool = True, within: float | None = None
    ) -> T:
        """Run fn(conn) on a pooled connection, on the driver loop, retrying a lost connection (see module doc)."""
        deadline = time.monotonic() + (self.retry_for if within is None else within)
        delay = BACKOFF_FIRST
        while True:
            pool = self._c.pool
            if pool is None:
                raise self._closing_error(action)
            try:
                conn = await pool.acquire(timeout=self.connect_timeout)
            except Exception as exc:  # connecting: nothing was sent
                if sqlstate(exc) in FIXES and classify(exc) == "fatal":
                    raise fault(self._name, action, exc) from exc
                if not await _backoff(delay, deadline):
                    raise self._unreachable(action, exc) from exc
                delay = min(delay * 2, BACKOFF_MAX)
                continue
            try:
                return await fn(conn)
            except StoreError:
                raise
            except Exception as exc:
                kind = classify(exc)
                if kind == "fatal":
                    raise fault(self._name, action, exc) from exc
                # Broken: the pool opens a new one at the next acquire. A connection lost mid-statement may have
                # been released to the pool by the driver already, and then refuses terminate() (InterfaceError).
                with contextlib.suppress(Exception):
                    conn.terminate()
                if kind == "unknown" and not idempotent:
                    raise CommitUnknown(
                        self._name,
                        f"{action}: the connection was lost before the outcome was known ({type(exc).__name__}: "
                        f"{exc}); it may or may not have been applied: read back to see",
                    ) from exc
                if time.monotonic() >= deadline:
                    raise self._unreachable(action, exc) from exc
            finally:
                with contextlib.suppress(Exception):  # a broken connection: the pool replaces it at next acquire
                    await pool.release(conn)
            await _backoff(delay, deadline)
            delay = min(delay * 2, BACKOFF_MAX)

    async def _read(self, action: str, fn: Step[_Named, T], *, consistent: bool = False) -> T:
        """On a pooled connection, on the driver loop; `consistent`: in one read-only repeatable-read transaction."""
        loop = self._running(action)
        return await loop.call(self._pooled(action, partial(_named, fn, consistent)))

    def _read_sync(self, action: str, fn: Step[_Named, T]) -> T:
        loop = self._running(action)
        try:
            step = self._pooled(action, partial(_named, fn, False), within=self.sync_timeout)
            return loop.call_sync(step, self.sync_timeout + 1.0)
        except concurrent.futures.TimeoutError as exc:
            raise StoreError(
                self._name, f"{action} took longer than sync_timeout={self.sync_timeout:g} s (a synchronous read "
                f"does not wait out a reconnect); {UNREACHABLE}"
            ) from exc

    async def _change(self, what: str, fn: Step[_Named, T], *, doing: str = "recording") -> T:
        """On a pooled connection, on the driver loop, on its own (not in the group commit): a lost connection is
        retried, so the shared writes are each idempotent."""
        action = f"{doing} {what}"
        loop = self._running(action)
        return await loop.call(self._pooled(action, partial(_named, fn, False)))

    def _decode_row(self, found: Row) -> CaseRow:
        return _row(found)

    def _listed(self, listing: Listing) -> Step[_Named, list[CaseRow]]:
        sql, args = listing.postgres()

        async def read(c: _Named) -> list[CaseRow]:
            return [_row(found) for found in await c.conn.fetch(sql, *args)]

        return read

    # -- the group commit ------------------------------------------------------------------------------------

    def _submit(self, job: Job) -> None:
        """Queue a job for the writer (from the caller's thread). The writer is woken only when it sleeps: a
        burst of writes costs one cross-thread wake-up, not one per write."""
        self._running("write")
        queue = self._c.queue
        if queue is None:
            raise self._closing_error("write")
        try:
            queue.submit(job)
        except RuntimeError as exc:  # the driver loop has stopped
            raise self._closing_error("write") from exc

    async def _writer_loop(self, queue: GroupQueue) -> None:
        kick = self._c.kick
        while True:
            taken = queue.take()
            if taken is None:  # asleep: the next submit (or stop) rings
                await kick.wait()
                kick.clear()
                continue
            group, stop = taken
            for query, batch in by_key(group, _query):  # one transaction per statement
                try:
                    await self._commit(str(query), batch)
                except Exception as exc:  # never leave a caller waiting, nor the writer dead
                    for job in batch:
                        if job.error is None and job.result is None:
                            job.error = fault(self._name, f"committing {job.label}", exc)
            queue.deliver(group)
            if stop:
                return

    @property
    def groups(self) -> int:
        """Groups the writer took: one transaction per statement in each (for tests and benchmarks)."""
        return 0 if self._c.queue is None else self._c.queue.groups

    @property
    def jobs(self) -> int:
        return 0 if self._c.queue is None else self._c.queue.jobs

    async def _writer_conn(self, deadline: float) -> Any:
        c = self._c
        if c.writer is None or c.writer.is_closed():
            c.writer = None
            conn = await self._connect_retrying("reconnecting the writer", deadline)
            try:
                c.writer_backend = await conn.fetchrow(Q["backend_me"])
            except BaseException:
                conn.terminate()
                raise
            c.writer = conn
        return c.writer

    def _drop_writer(self) -> None:
        c = self._c
        if c.writer is not None:
            c.writer.terminate()
            c.writer = None

    async def _commit(self, query: str, group: list[Job]) -> None:
        """One transaction for the group (fetchmany: one round trip); see the module docstring for failures.

        The first write carries a fresh token that the transaction records in `commits`: when the connection is
        lost with no answer, the token says whether the group committed (after the old backend is gone)."""
        deadline = time.monotonic() + self.retry_for
        delay = BACKOFF_FIRST
        others = f" (one transaction with {len(group) - 1} other writes)" if len(group) > 1 else ""
        while True:
            try:
                conn = await self._writer_conn(deadline)
            except StoreError as exc:
                for job in group:
                    job.error = StoreError(self._name, f"committing {job.label}: {exc.args[0]}")
                    job.error.__cause__ = exc.__cause__
                return
            token = secrets.token_hex(16)
            args = [(*job.work.args, token if i == 0 else None) for i, job in enumerate(group)]
            backend = tuple(self._c.writer_backend)  # (pid, started): names this server process for good
            try:
                rows = await conn.fetchmany(query, args)
            except Exception as exc:
                kind = classify(exc)
                if kind != "fatal":
                    self._drop_writer()
                if kind == "unknown":
                    committed = await self._committed(token, backend, deadline)
                    if committed is False:
                        kind = "retry"  # provably not committed: the same group again
                    elif committed and query in (Q["write_group"], Q["compact_group"], Q["start_group"],
                                                 Q["start_scheduled"]):
                        await self._resolve(query, group, deadline)
                        return
                    else:
                        what = (
                            "it committed, but its answer was lost with the connection"
                            if committed
                            else "the connection was lost after the write was sent and before its commit was "
                            "confirmed, and the database could not be asked since"
                        )
                        for job in group:
                            job.error = CommitUnknown(
                                self._name,
                                f"committing {job.label}{others}: {what} ({type(exc).__name__}: {exc}); the write "
                                "may or may not have been applied (one that broke a rule was not). Retry it with "
                                "the same request_id (applied once), or read the case back (load(), journal())",
                            )
                            job.error.__cause__ = exc
                        return
                if kind == "retry" and await _backoff(delay, deadline):
                    delay = min(delay * 2, BACKOFF_MAX)
                    continue
                if kind == "fatal" and len(group) > 1:
                    for job in group:  # the group's transaction was aborted: each write again, alone
                        await self._commit(query, [job])
                    return
                for job in group:
                    job.error = (
                        fault(self._name, f"committing {job.label}", exc)
                        if kind == "fatal"
                        else self._unreachable(f"committing {job.label}", exc)
                    )
                return
            for job, row in zip(group, rows):
                try:
                    job.result = job.work.decode(row)
                except StoreError as exc:
                    job.error = exc
            await self._trim_commits(conn)
            return

    async def _resolve(self, query: str, group: list[Job], deadline: float) -> None:
        """Each write of a group that committed with its answer lost: what it did, read back. A write's records
        are all appended or none (its subtransaction): found at their seqs with the same text, it was applied (a
        record skipped for its request_id is absent); with none found, it changed nothing (refused: fenced or a
        broken rule, or each record a repeated request_id), and it is run again, alone, to get its own answer.
        A write with no records (a row, a snapshot, inbox rows) is idempotent: run again, alone."""
        again: list[Job] = []
        for job in group:
            args = job.work.args
            case_id, seqs, texts = args[1], args[4], args[7]
            if not seqs:
                again.append(job)
                continue
            try:
                conn = await self._writer_conn(deadline)
                found = {seq: text for seq, text in await conn.fetch(Q["journal_at"], case_id, seqs)}
            except Exception as exc:  # the server is gone again: the outcome stays unknown to the caller
                self._drop_writer()
                job.error = CommitUnknown(
                    self._name,
                    f"committing {job.label}: its group committed, but its answer was lost and the write's own "
                    f"outcome could not be read back ({type(exc).__name__}: {exc}); retry it with the same "
                    "request_id (applied once), or read the case back (load(), journal())",
                )
                job.error.__cause__ = exc
                continue
            appended = [found.get(seq) == text for seq, text in zip(seqs, texts, strict=True)]
            if any(appended):
                job.result = appended
            else:
                again.append(job)
        for job in again:
            await self._commit(query, [job])

    async def _committed(self, token: str, backend: tuple[Any, ...], deadline: float) -> bool | None:
        """Whether the group that carried `token` committed: True, False, or None (cannot tell by the deadline).

        The backend that ran it is ended first (pg_terminate_backend: a transaction it still runs is aborted)
        and awaited, so a False is final: the group cannot commit later."""
        delay = BACKOFF_FIRST
        while time.monotonic() < deadline:
            try:
                conn = await self._writer_conn(deadline)
                await conn.fetchval(Q["backend_end"], *backend)
                while await conn.fetchval(Q["backend_alive"], *backend):
                    if time.monotonic() > deadline:
                        return None
                    await asyncio.sleep(0.01)
                found: bool = await conn.fetchval(Q["commit_known"], token)
                return found
            except StoreError:
                return None
            except Exception:
                self._drop_writer()
                await asyncio.sleep(delay)
                delay = min(delay * 2, BACKOFF_MAX)
        return None

    async def _trim_commits(self, conn: Any) -> None:
        """Forget commit tokens older than COMMITS_KEPT seconds (at most once a minute)."""
        if time.monotonic() < self._next_trim:
            return
        self._next_trim = time.monotonic() + 60.0
        try:
            await conn.execute(Q["commits_trim"], COMMITS_KEPT)
        except Exception as exc:  # the next trim tries again
            _log.warning("store_commits_trim_failed", store=self._name, error=str(exc))

    # -- writes ----------------------------------------------------------------------------------------------

    def _write_args(self, change: EncodedWrite, epoch: int | None, queue: bool) -> tuple[Any, ...]:
        records = change.records
        row = change.row.params if change.row is not None else None
        snap = change.snapshot.params if change.snapshot is not None else None
        return (
            self._node, change.case_id, epoch, queue,
            [r.seq for r in records], [r.kind for r in records], [r.request_id for r in records],
            [r.text for r in records],
            row is not None,
            *(
                (row["workflow"], row["fingerprint"], row["state"], float(row["started_at"]),
                 float(row["updated_at"]), _float(row["ended_at"]), row["last_seq"], _float(row["next_due"]),
                 bool(row["live"]), bool(row["parked"]), row["detail"])
                if row is not None else (None,) * 11
            ),
            *(
                (snap["seq"], snap["format"], snap["bytecode"], snap["state"], SNAPSHOTS_KEPT)
                if snap is not None else (None, None, None, None, SNAPSHOTS_KEPT)
            ),
            change.inbox_done, [i for i, _ in change.inbox_refused], [r for _, r in change.inbox_refused],
        )

    def _write_result(self, case_id: str, epoch: int | None, found: Any, *, schedule: str | None = None) -> list[bool]:
        status, appended, info, at_seq, owner, now_epoch = found
        if status == "ok":
            return list(appended)
        if status == "fenced":
            raise StoreConflict(self._name, fenced(case_id, self._node, epoch, owner, now_epoch))
        if status == "gone":
            raise StoreConflict(self._name, case_gone(case_id))
        if info == "journal_one_end":
            raise StoreConflict(self._name, second_end(case_id, at_seq))
        if info in ("journal_pkey", "cases_case_id_key"):
            raise StoreConflict(self._name, seq_taken(case_id, 0 if at_seq is None else at_seq))
        if info == "queue_item_waiting":
            raise StoreConflict(self._name, waits_in_queue(case_id))
        if info == "schedule_paused":
            raise SchedulePaused(self._name, paused_slot(schedule or "?", case_id))
        raise StoreConflict(self._name, f"the write for case {case_id!r} broke the constraint {info!r}")

    async def write(self, change: CaseWrite, *, wait: bool = True) -> list[bool]:
        self._running("write")
        encoded = encode_write(self._name, change)
        epoch = change.epoch
        query, args = _write_query(encoded), self._write_args(encoded, epoch, False)
        if query == Q["start_group"]:  # (its $29: whether it is its queue item's own start)
            args = (*args, encoded.from_queue)
            if encoded.schedule is not None:  # (its $30: the schedule whose slot it is)
                query, args = Q["start_scheduled"], (*args, encoded.schedule)
        if encoded.compact is not None:  # its own statement: the write, then the deletes, in one transaction
            query, args = Q["compact_group"], (*args, encoded.compact)
        answer = partial(self._write_result, encoded.case_id, epoch, schedule=encoded.schedule)
        job = Job(_Statement(query, args, answer), f"case {encoded.case_id!r}", wait=wait)
        self._submit(job)
        if not wait:
            return []
        result: list[bool] = await job.outcome()
        return result

    async def queue_case(self, change: CaseWrite) -> None:
        self._running("queue a case")
        encoded = encode_write(self._name, change)
        if not encoded.records or encoded.records[0].seq != 0 or encoded.row is None:
            raise StoreError(
                self._name, f"queue_case for case {change.case_id!r} needs the case's start write: its `start` "
                "record (seq 0) and its row"
            )
        query, args = _write_query(encoded), self._write_args(encoded, None, True)
        if query == Q["start_group"]:
            args = (*args, False)
        job = Job(
            _Statement(query, args, partial(
                self._write_result, encoded.case_id, None)), f"queued case {encoded.case_id!r}", wait=True,
        )
        self._submit(job)
        await job.outcome()

    async def inbox_put(
        self, case_id: str, kind: str, body: Mapping[str, Any], *, request_id: str | None, created_at: float
    ) -> int:
        self._running("put an input in the inbox")
        text = inbox_text(self._name, case_id, kind, body, request_id)
        args = (self._sender, case_id, kind, text, request_id, float(created_at))
        job = Job(_Statement(Q["inbox_put"], args, _first), f"an inbox input for case {case_id!r}", wait=True)
        self._submit(job)
        inbox_id: int = await job.outcome()
        self._signal(own=True)
        return inbox_id

    async def delete(self, case_id: str, children: Sequence[str] = ()) -> bool:
        # The rows first, then the cases' inbox keys, then the check in a statement of its own (a snapshot taken
        # once both are held sees every input put for the case: migration 10). A key is only tried while the
        # rows are held: a group commit that put an input for a case and then writes it would wait for the row
        # while this waited for the key. On failure the rows go and the key is waited for alone, then again.
        # With `children`, all the cases go or none (the transaction is rolled back).
        ids = [case_id, *sorted(set(children) - {case_id})]

        async def run(conn: Any) -> bool:
            while True:
                busy: str | None = None
                try:
                    async with conn.transaction():
                        for one in ids:
                            if await conn.fetchval(Q["delete_lock_case"], one) is None:
                                return False
                        for one in ids:
                            if not await conn.fetchval(Q["delete_hold_inbox"], one):
                                busy = one
                                break
                        else:
                            for one in ids:
                                if await conn.fetchval(Q["delete"], one, self._sender, TOMBSTONE) == 0:
                                    raise _NotDeleted  # (rolls back those already deleted)
                            return True
                except _NotDeleted:
                    return False
                await conn.fetchval(Q["delete_wait_inbox"], busy)

        loop = self._running("delete a case")
        return await loop.call(self._pooled(f"deleting case {case_id!r}", run, idempotent=False), cancel=False)

    async def prune(self, ended_before: float, limit: int | None = None) -> int:
        async def run(conn: Any) -> int:
            count: int = await conn.fetchval(Q["prune"], float(ended_before), limit, TOMBSTONE)
            return count

        action = f"pruning cases ended before {ended_before}"
        loop = self._running("prune")
        return await loop.call(self._pooled(action, run, idempotent=False), cancel=False)

    # -- nodes -----------------------------------------------------------------------------------------------

    def _owner_node(self, action: str) -> str:
        if self._node is None:
            raise StoreError(
                self._name, f"cannot {action}: this store was opened without a lease (owner=False); a node opens "
                "it with owner=True and its node id"
            )
        return self._node

    async def renew_lease(self) -> float:
        loop = self._running("renew the lease")
        node = self._owner_node("renew the lease")

        async def run(conn: Any) -> float:
            now = await conn.fetchval(Q["node_renew"], node, self._pid, self._host, self.lease_seconds)
            if now is None:
                raise StoreError(
                    self._name, f"cannot renew the lease of node {node!r}: another process took that node id "
                    "after this node's lease expired; this node owns nothing now: close it and start again"
                )
            return float(now)

        within = min(self.retry_for, self.lease_seconds / 3)
        return await loop.call(self._pooled(f"renewing the lease of node {node!r}", run, within=within), cancel=False)

    async def take_ended(self, case_id: str) -> CaseRow | None:
        loop = self._running("take an ended case")
        node = self._owner_node("take an ended case")

        async def run(conn: Any) -> CaseRow | None:
            found = await conn.fetchrow(Q["take_ended"], case_id, node)
            return None if found is None else _row(found)

        return await loop.call(self._pooled(f"taking ended case {case_id!r}", run, idempotent=False), cancel=False)

    async def take_over(self, limit: int = 1000) -> list[CaseRow]:
        loop = self._running("take cases over")
        node = self._owner_node("take cases over")

        async def run(conn: Any) -> list[CaseRow]:
            return [_row(found) for found in await conn.fetch(Q["take_over"], node, limit)]

        return await loop.call(
            self._pooled("taking over the cases of expired nodes", run, idempotent=False), cancel=False
        )

    async def claim_queued(self, fingerprints: Sequence[str], limit: int) -> list[str]:
        loop = self._running("claim queued cases")
        node = self._owner_node("claim queued cases")
        wanted = [str(f) for f in fingerprints]
        self._fingerprints = frozenset(wanted)
        if not wanted or limit <= 0:
            return []

        async def run(conn: Any) -> list[str]:
            return [found[0] for found in await conn.fetch(Q["claim_queued"], node, wanted, limit)]

        return await loop.call(self._pooled("claiming queued cases", run, idempotent=False), cancel=False)

    async def take_ownership(self, owner_id: str) -> bool:
        await anyio.lowlevel.checkpoint()
        raise StoreError(
            self._name, "take_ownership is for a store one Substrate owns (SQLite): on Postgres every node owns "
            "cases under its lease; open a Substrate on it as a node instead"
        )

    # -- queues (each claim, dedup check and register under the queue's lock, across nodes) ------------------

    async def queue_put(self, item: QueueItem, *, schedule: str | None = None) -> None:
        start = to_json(self._name, f"queued case {item.case_id!r}", item.start)

        async def run(conn: Any) -> CaseExists | SchedulePaused | None:
            async with conn.transaction():
                # (a schedule's slot: refused while it is paused, its row held as start_scheduled holds it)
                if schedule is not None and await conn.fetchval(Q["schedule_paused"], schedule):
                    return SchedulePaused.refused(self._name, schedule, item.case_id)
                if item.dedup is not None:  # (its check and its insert under the queue's lock: one holder a key)
                    await conn.execute(Q["queue_lock"], item.queue)
                await conn.execute(Q["case_id_lock"], item.case_id)  # (a start of the id waits, or is seen)
                if await conn.fetchval(Q["queue_id_taken"], item.case_id) is not None:
                    return CaseExists(item.case_id)
                if item.dedup is not None:
                    await conn.execute(Q["queue_sweep"], item.queue)
                    holder = await conn.fetchval(Q["queue_dedup_holder"], item.queue, item.dedup)
                    if holder is not None:
                        return CaseExists.dedup(item.case_id, item.queue, item.dedup, str(holder))
                await conn.execute(Q["queue_put"], item.case_id, item.queue, item.partition, item.priority,
                                   item.dedup, start, item.not_before, item.enqueued_at)
                return None

        loop = self._running("queue a case")
        refused = await loop.call(self._pooled(f"queueing case {item.case_id!r}", run, idempotent=False))
        if refused is not None:
            raise refused

    async def queue_claim(
        self, queue: str, limits: QueueLimits, node: str, now: float, most: int
    ) -> tuple[list[QueueItem], float | None]:
        async def run(conn: Any) -> tuple[list[QueueItem], float | None]:
            async with conn.transaction():  # under the queue's lock: the limits hold across nodes
                await conn.execute(Q["queue_lock"], queue)
                await conn.execute(Q["queue_sweep"], queue)
                await conn.execute(Q["queue_promote"], queue, now)
                running = [Running(f[0], f[1]) for f in await conn.fetch(Q["queue_running"], queue)]
                since = now - (limits.rate[1] if limits.rate is not None else 0.0)
                recent = [(f[0], float(f[1])) for f in await conn.fetch(Q["queue_recent"], queue, since)]
                counts = Counts(limits, node, now, running, recent)
                parts = None
                if limits.partitioned:  # ('': the items without a partition key)
                    parts = [f[0] or None for f in await conn.fetch(Q["queue_ready_parts"], queue)]
                plan = read_plan(counts, most, parts)
                if parts is None:
                    found = await conn.fetch(Q["queue_ready"], queue, plan.per_key) if plan.per_key else []
                elif plan.parts:
                    keys = [p or "" for p in plan.parts]
                    found = await conn.fetch(Q["queue_ready_in"], queue, keys, plan.per_key, most)
                else:
                    found = []
                ready = [item_of(f, loads(f[5])) for f in found]
                chosen, wake = choose(limits, node, now, ready, running, recent, most)
                for item in chosen:
                    await conn.execute(Q["queue_start"], item.case_id, now, node)
                retried = [item.case_id for item in chosen if item.start.get(RETRIED) is not None]
                if retried:  # retried cases back from their queue: live again, this node's
                    await conn.execute(Q["cases_dequeued"], retried, node, "running")
                delayed = await conn.fetchval(Q["queue_next_due"], queue)
                claimed = [replace(i, state=STARTED, started_at=now, node=node) for i in chosen]
                return claimed, earliest(wake, plan.wake, None if delayed is None else float(delayed))

        loop = self._running("claim queued cases")
        return await loop.call(self._pooled(f"claiming from queue {queue!r}", run, idempotent=False))

    async def queue_requeue(
        self, case_id: str, reopened: CaseWrite, start: Mapping[str, Any], key: str
    ) -> QueueItem | None:
        encoded = encode_write(self._name, reopened)
        args = (*self._write_args(encoded, reopened.epoch, False), None)  # (its own transaction: no commit token)
        text = to_json(self._name, f"queued case {case_id!r}", dict(start))

        async def run(conn: Any) -> QueueItem | CaseExists | None:
            async with conn.transaction():
                queue = await conn.fetchval(Q["queue_of"], case_id)
                if queue is None:
                    return None
                await conn.execute(Q["queue_lock"], queue)  # (first: a claim takes it before the items it sweeps)
                await conn.execute(Q["queue_sweep"], queue)
                found = await _Named(conn).one("queue_get", {"case_id": case_id})
                if found is None or found[8] not in (STARTED, ENDED):
                    return None
                dedup = found[4]
                if dedup is not None:
                    holder = await conn.fetchval(Q["queue_dedup_other"], queue, dedup, case_id)
                    if holder is not None:
                        return CaseExists.dedup(case_id, queue, dedup, str(holder))
                await conn.execute(Q["queue_keep_start"], case_id, key)
                requeued = await conn.fetchrow(Q["queue_requeue"], case_id, text)
                written = await conn.fetchrow(Q["write_group"], *args)
                self._write_result(case_id, reopened.epoch, written)  # StoreConflict: rolled back, nothing changed
                return item_of(requeued, loads(requeued[5]))

        loop = self._running("put a retried case back in its queue")
        found = await loop.call(self._pooled(f"putting retried case {case_id!r} back in its queue", run,
                                             idempotent=False))
        if isinstance(found, CaseExists):
            raise found
        return found

    async def queue_cancel(self, case_id: str, ended: CaseWrite) -> QueueItem | None:
        encoded = encode_write(self._name, ended)
        args = (*self._write_args(encoded, None, False), None)  # (no group commit token: its own transaction)

        tries = 0

        async def run(conn: Any) -> QueueItem | None:
            nonlocal tries
            tries += 1
            async with conn.transaction():
                found = await conn.fetchrow(Q["queue_cancel"], case_id)
                if found is None:
                    if tries > 1:  # tried again after a lost answer: the first try may have committed
                        return await self._cancelled_before(conn, case_id)
                    return None
                written = await conn.fetchrow(Q["write_group"], *args)
                self._write_result(case_id, None, written)  # StoreConflict: rolled back, the item left queued
                return item_of(found, loads(found[5]))

        loop = self._running("cancel a queued case")
        return await loop.call(self._pooled(f"cancelling case {case_id!r} if it waits in a queue", run))

    @staticmethod
    async def _cancelled_before(conn: Any, case_id: str) -> QueueItem | None:
        """The item of a case cancelled in its queue (its ended case written): what a cancel whose commit answer
        was lost did, read back when it is sent again; None if it is not so."""
        found = await _Named(conn).one("queue_get", {"case_id": case_id})
        if found is None or found[8] != "cancelled" or await conn.fetchval(Q["case_ended"], case_id) is None:
            return None
        return item_of(found, loads(found[5]))

    async def queue_orphans(self, node: str, *, own: bool = True) -> list[QueueItem]:
        async def run(conn: Any) -> list[QueueItem]:
            return [item_of(f, loads(f[5])) for f in await conn.fetch(Q["queue_orphans"], node, own)]

        loop = self._running("take over claimed queued cases")
        return await loop.call(self._pooled("taking over claimed queued cases", run, idempotent=False))

    async def queue_register(self, name: str, spec: Mapping[str, Any], node: str) -> tuple[dict[str, Any], str] | None:
        text = to_json(self._name, f"queue {name!r}", dict(spec))

        async def run(conn: Any) -> tuple[dict[str, Any], str] | None:
            async with conn.transaction():
                await conn.execute(Q["queue_lock"], name)
                found = await conn.fetchrow(Q["queue_spec_get"], name)
                await conn.execute(Q["queue_register"], name, text, node)
                return None if found is None else (loads(found[0]), str(found[1]))

        loop = self._running("record a queue")
        return await loop.call(self._pooled(f"recording queue {name!r}", run))

    async def database_time(self) -> float:
        async def read(c: _Named) -> float:
            return float(await c.value("db_now"))

        return await self._read("reading the database time", read)

    async def owner(self) -> Owner | None:
        """This node while open as an owner; else the most recent node whose lease holds (None: none)."""

        async def read(c: _Named) -> Owner | None:
            found = await c.one("node_live", {"node": self._node or ""})
            if found is None:
                return None
            node_id, pid, host, since = found
            return Owner(str(node_id), int(pid), str(host), float(since))

        return await self._read("reading the owner", read)

    async def nodes(self) -> list[Owner]:
        """Every node whose lease holds now (this one first)."""

        async def read(c: _Named) -> list[Owner]:
            found = await c.all("node_live", {"node": self._node or ""})
            return [Owner(str(n), int(p), str(h), float(s)) for n, p, h, s in found]

        return await self._read("listing the nodes", read)

    # -- notifications ---------------------------------------------------------------------------------------

    async def _listen(self, *, first: bool = False) -> None:
        """(Re)connect the listener and LISTEN; then report a change (what was sent meanwhile was lost)."""
        c = self._c
        deadline = time.monotonic() + (self.retry_for if first else 365 * 86400.0)
        conn = await self._connect_retrying("subscribing to notifications", deadline)
        try:
            await conn.add_listener(f"{self.schema}_changed", self._on_notify)
        except BaseException as exc:  # (a close cancelling it too: the connection is closed, never dropped)
            conn.terminate()
            if first and isinstance(exc, Exception):
                raise fault(self._name, "subscribing to notifications", exc) from exc
            raise
        if self._closing or self._c is not c:  # the store closed while this connected
            conn.terminate()
            return
        conn.add_termination_listener(self._on_listener_lost)
        c.listener = conn
        if not first:
            with self._flag_lock:
                self._ended = None  # what was sent while disconnected is lost
        self._signal(own=False)

    def _on_listener_lost(self, conn: Any) -> None:
        if self._closing or self._c.listener is not conn:
            return
        self._c.listener = None
        self._c.listen_task = asyncio.get_running_loop().create_task(self._relisten())

    async def _relisten(self) -> None:
        delay = BACKOFF_FIRST
        while not self._closing:
            try:
                await self._listen()
                return
            except Exception as exc:
                _log.warning("store_listen_failed", store=self._name, error=str(exc))
                await asyncio.sleep(delay)
                delay = min(delay * 2, BACKOFF_MAX)

    def _on_notify(self, conn: Any, pid: int, channel: str, payload: str) -> None:
        try:
            note = json.loads(payload)
        except ValueError:
            note = {}
        if note.get("s") == self._sender:
            return  # this store object's own write: it knows
        kind = note.get("k")
        if kind in ("e", "d"):  # an `end`, or a delete: either way a copy of the case kept in memory is stale
            case_id = note.get("c")
            with self._flag_lock:
                if self._ended is not None:
                    self._ended.add(str(case_id))
                    if case_id is None or len(self._ended) > ENDED_KEPT:
                        self._ended = None  # an id too long for a NOTIFY, or too many: re-read them all
        if self._node is not None:
            if kind == "i" and note.get("o") not in (None, self._node):
                return  # an input for a case another node owns
            if kind == "q" and self._fingerprints is not None and note.get("f") not in self._fingerprints:
                return  # a queued case this node cannot run
        self._signal(own=False)

    def _signal(self, *, own: bool) -> None:
        """Something changed: set both flags and wake wait_changed (from any thread)."""
        with self._flag_lock:
            self._changed_flag = True
            self._wait_flag = True
            waiters = list(self._waiters.values())
        for token, event in waiters:
            call_soon_on(token, event.set)

    def drain_ended(self) -> set[str] | None:
        """The ids of the cases whose `end` another node committed, or that another node or a client deleted, since
        the last call, as NOTIFY told; None when some may have been missed (the listener reconnected, or more than
        ENDED_KEPT piled up): then re-read the rows of every case you wait for. For waiters on cases other nodes
        own (`await_case`), and for ended cases kept in memory (a stale copy leaves memory)."""
        self._running("drain ended cases")
        with self._flag_lock:
            ended, self._ended = self._ended, set()
        return ended

    def changed(self) -> bool:
        self._running("poll for changes")
        with self._flag_lock:
            changed, self._changed_flag = self._changed_flag, False
        return changed

    async def wait_changed(self, timeout: float) -> None:  # noqa: ASYNC109 (the interface's polling bound)
        self._running("wait for changes")
        key = object()
        event = anyio.Event()
        with self._flag_lock:
            if self._wait_flag:
                self._wait_flag = False
                event.set()
            else:
                self._waiters[key] = (anyio.lowlevel.current_token(), event)
        try:
            with anyio.move_on_after(timeout):
                await event.wait()
        finally:
            with self._flag_lock:
                self._waiters.pop(key, None)
                if event.is_set():
                    self._wait_flag = False

    # -- reads of its own (the others are `SqlStore`'s) -------------------------------------------------------

    async def journal_epochs(self, case_id: str) -> list[tuple[int, int]]:
        """(seq, epoch of the node that appended it) of each record of the case, in order."""

        async def read(c: _Named) -> list[tuple[int, int]]:
            return [(int(s), int(e)) for s, e in await c.all("journal_epochs", {"case_id": case_id})]

        return await self._read(f"reading the journal epochs of case {case_id!r}", read)

    # -- for tests of connection loss ------------------------------------------------------------------------

    async def backend_pids(self) -> list[int]:
        """The server process ids of this store's open connections (tests end them with pg_terminate_backend)."""

        async def collect() -> list[int]:
            c = self._c
            pids = [
                conn.get_server_pid() for conn in (c.writer, c.listener) if conn is not None and not conn.is_closed()
            ]
            if c.pool is not None:
                for holder in c.pool._holders:  # asyncpg keeps no public list of a pool's connections
                    conn = holder._con
                    if conn is not None and not conn.is_closed():
                        pids.append(conn.get_server_pid())
            return pids

        loop = self._running("list connections")
        return await loop.call(collect())


# -- helpers ---------------------------------------------------------------------------------------------------


async def _backoff(delay: float, deadline: float) -> bool:
    """Sleep `delay`, cut short at the deadline (the last try is made at it); False once it has passed."""
    left = deadline - time.monotonic()
    if left <= 0:
        return False
    await asyncio.sleep(min(delay, left))
    return True


def _process_name(node_id: str, pid: int, host: str) -> str:
    """The application_name of a node process's connections, by which the database tells a live holder of a node
    id from a dead one (node_register computes the same from the nodes row)."""
    tag = hashlib.md5(f"{node_id} {pid} {host}".encode(), usedforsecurity=False).hexdigest()[:16]
    return f"wfsub {tag}"


def _first(found: Any) -> Any:
    return found[0]


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


def _number(store: str, name: str, given: float | None, options: dict[str, str], default: float) -> float:
    raw: Any = given if given is not None else options.get(name, default)
    try:
        value = float(raw)
    except (TypeError, ValueError):
        raise StoreError(store, f"{name}={raw!r}: give a number of seconds") from None
    if not value > 0:
        raise StoreError(store, f"{name}={raw!r}: give a number of seconds above 0")
    if value > MAX_SECONDS:  # inf included: a call must fail in bounded time, and a dead node's lease must end
        raise StoreError(store, f"{name}={raw!r}: give a finite number of seconds (at most {MAX_SECONDS:g})")
    if name == "lease_seconds" and value < LEASE_MIN:
        raise StoreError(
            store, f"lease_seconds={raw!r}: a lease is renewed every third of it, and a node stops writing after "
            f"half of it without a renewal; below {LEASE_MIN:g} s a busy machine loses it between two renewals and "
            f"nodes take each other's cases. Give at least {LEASE_MIN:g} (default 10)"
        )
    return value


def _row(found: Any) -> CaseRow:
    row = decode_row(found[0], tuple(found[:11]))
    row.owner = found[11]
    row.epoch = int(found[12])
    if len(found) > 13:
        row.tags, row.forked_from = decode_tags(found[13]), found[14]
    return row


__all__ = ["PostgresStore"]


"""Group commit for the SQLite store: one writer connection, owned by one dedicated thread.

    event loop                          writer thread (owns the only write connection)
    ----------                          ---------------------------------------------
    write(): encode, queue.put(job) --> wait for the first job, then take every job queued (the group)
             await job.event            BEGIN IMMEDIATE
                                        per job: SAVEPOINT, apply, RELEASE (or ROLLBACK TO: that job alone fails)
                                        COMMIT (one fsync for the whole group)
             <-- run_sync_soon(wake) -- one call per event loop with waiters: sets each job's event

Every write that arrives while a commit runs waits in the queue and goes into the next transaction, so under
load a commit carries as many writes as arrived during the previous one, and the loop never touches the disk.

How the thread wakes the loop was chosen by measuring, on 2 cores (WAL, synchronous=FULL; a bare sqlite3
INSERT+COMMIT takes 150-180 us p50 on the same disk). First a prototype of each hand-off with the same minimal
writes: one writer at a time (latency), 1,000 concurrent writers x 10 writes, and the same with four tasks
keeping the loop busy in 0.5 ms slices (the two tables ran at different times on a shared machine: compare
within a table):

    hand-off (prototype)                          p50 / p99 latency     writes/s    writes/s, busy loop
    this thread, AsyncBackend.run_sync_soon        241-264 / 336-361 us  90-105 k    22-24 k
    this thread, anyio.from_thread.run_sync        264-288 / 367-424 us  87-107 k    16-22 k
    to_thread.run_sync per group (a leader task)   281-311 / 360-438 us  93-115 k     7-10 k

then the two thread hand-offs again in this module (`bench/store_bench.py` workloads; 200 writers x 20 writes
for the busy loop; best two of four runs):

    this module                       asyncio p50 / p99    writes/s  busy loop   trio p50 / p99    writes/s
    run_sync_soon (used)              189-195 / 371-374 us   40 k     16 k        206-211 / 396-404   37 k
    from_thread.run_sync (fallback)   236-238 / 419-428 us   36-41 k  14-17 k     219-238 / 372-404   34 k

`from_thread.run_sync` blocks the writer until the loop has run the callback: 20-45 us more per commit at p50
and a writer that waits on a busy loop instead of starting the next group. A leader task that runs each group
through `to_thread.run_sync` needs the busy loop to schedule it again before every commit (3x fewer writes/s
there), moves the connection between pool threads, and needs a new leader when the writer that led is
cancelled. So the dedicated thread schedules the wake-up without waiting, through the
`anyio.lowlevel.current_token()` each waiter captured: `token.backend_class.run_sync_soon` (anyio 4.16+:
`call_soon_threadsafe` on asyncio, `TrioToken.run_sync_soon` on trio), and on older anyio (4.11+) the public
`anyio.from_thread.run_sync(..., token=token)`; tests cover both paths on both backends. What bounds the
throughput now is Python work per write (encoding on the loop, the savepoint and insert in the writer, the
wake-up) under one GIL, not the disk: 10,000 writes take about 20 commits.

A write whose waiter is cancelled is still committed (or refused) with its group: cancelling the wait does not
withdraw the write. Errors: a job that breaks a rule (a second `end`, a seq written twice) is undone alone by
its savepoint and gets its own StoreError; an error of the transaction itself (disk full, I/O error, a busy
file) rolls the whole transaction back and every job of the group gets a StoreError. The thread never dies of
an error: it reports it to the group and takes the next one. A job queued with no waiter (`wait=False`) that
fails is logged.
"""

from __future__ import annotations

import contextlib
import queue
import sqlite3
import threading
import time
from collections.abc import Callable
from typing import Any

import anyio
import anyio.from_thread
import anyio.lowlevel
from anyio.lowlevel import EventLoopToken

from .._errors import StoreConflict, StoreError
from .._trace import get_logger
from ._files import fault
from ._sql import QUERIES

_log = get_logger("wfsub.store")

BEGIN, COMMIT, ROLLBACK = QUERIES["begin_write"], QUERIES["commit"], QUERIES["rollback"]
SAVEPOINT, UNDO, RELEASE = QUERIES["savepoint"], QUERIES["savepoint_undo"], QUERIES["savepoint_release"]


class Refused(Exception):
    """Raised by a job's apply when its write breaks a rule: that write alone is undone and fails."""


# Errors that concern one job: its savepoint is rolled back and the rest of the group goes on. Any other error
# (OperationalError: full, I/O, busy; DatabaseError: corrupt) ends the whole transaction.
_ONE_JOB = (Refused, sqlite3.IntegrityError, sqlite3.DataError, sqlite3.InterfaceError, OverflowError)


class Job:
    """One unit of work for the writer: `apply(conn)` runs inside the group's transaction, in a savepoint."""

    __slots__ = ("apply", "error", "event", "label", "result", "token")

    def __init__(self, apply: Callable[[sqlite3.Connection], Any], label: str, *, wait: bool) -> None:
        self.apply = apply
        self.label = label  # what the job writes, for messages: "case 'c-1'"
        self.result: Any = None
        self.error: StoreError | None = None
        self.event = anyio.Event() if wait else None
        self.token: EventLoopToken | None = anyio.lowlevel.current_token() if wait else None

    async def outcome(self) -> Any:
        assert self.event is not None
        await self.event.wait()
        if self.error is not None:
            raise self.error
        return self.result


_STOP = object()

WAKE_WITHOUT_WAITING = True
"""Wake the loop with `AsyncBackend.run_sync_soon` where anyio has it (4.16+); tests turn it off to cover the
`anyio.from_thread.run_sync` path that older anyio versions take."""


def _wake(jobs: list[Job]) -> None:
    for job in jobs:
        assert job.event is not None
        job.event.set()


class Writer:
    """The writer thread and its queue. `start()` and `stop()` block: call them from a worker thread."""

    def __init__(
        self,
        path: str,
        connect: Callable[[], sqlite3.Connection],
        *,
        heartbeat: Callable[[sqlite3.Connection], None] | None = None,
        heartbeat_every: float = 30.0,
    ) -> None:
        self.path = path
        self._connect = connect
        self._heartbeat = heartbeat
        self._heartbeat_every = heartbeat_every
        self._last_beat = time.monotonic()
        self._queue: queue.SimpleQueue[Job | object] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=f"wfsub-store-writer {path}", daemon=True)
        self._ready = threading.Event()
        self._failed: BaseException | None = None
        self._conn: sqlite3.Connection | None = None
        self.groups = 0  # transactions committed or attempted (for tests and benchmarks)
        self.jobs = 0

    def start(self) -> None:
        self._thread.start()
        self._ready.wait()
        if self._failed is not None:
            self._thread.join()
            raise self._failed

    def submit(self, job: Job) -> None:
        self._queue.put(job)

    def stop(self) -> None:
        """Commit what is queued, close the connection, end the thread."""
        if self._thread.is_alive():
            self._queue.put(_STOP)
            self._thread.join()

    # -- the thread ------------------------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._conn = self._connect()
        except BaseException as exc:  # reported to start(), which raises it in the opener
            self._failed = exc
            self._ready.set()
            return
        self._ready.set()
        try:
            self._loop(self._conn)
        finally:
            self._conn.close()

    def _loop(self, conn: sqlite3.Connection) -> None:
        timeout = self._heartbeat_every if self._heartbeat is not None else None
        while True:
            try:
                first = self._queue.get(timeout=timeout)
            except queue.Empty:
                self._commit(conn, [])  # idle: the heartbeat alone
                continue
            group: list[Job] = []
            stop = first is _STOP
            if not stop:
                assert isinstance(first, Job)
                group.append(first)
            while True:  # the group: every job queued while the previous commit ran
                try:
                    job = self._queue.get_nowait()
                except queue.Empty:
                    break
                if job is _STOP:
                    stop = True
                else:
                    assert isinstance(job, Job)
                    group.append(job)
            if group:
                self._commit(conn, group, beat=not stop)  # closing writes nothing but what was queued
            if stop:
                return

    def _commit(self, conn: sqlite3.Connection, group: list[Job], *, beat: bool = True) -> None:
        beat = beat and self._heartbeat is not None and time.monotonic() - self._last_beat >= self._heartbeat_every
        if not group and not beat:
            return
        self.groups += 1
        self.jobs += len(group)
        try:
            conn.execute(BEGIN)
            for job in group:
                conn.execute(SAVEPOINT)
                try:
                    job.result = job.apply(conn)
                except _ONE_JOB as exc:
                    conn.execute(UNDO)
                    job.result = None
                    job.error = _refusal(self.path, job, exc)
                conn.execute(RELEASE)
            if beat and self._heartbeat is not None:
                self._heartbeat(conn)
            conn.execute(COMMIT)
            if beat:
                self._last_beat = time.monotonic()
        except Exception as exc:
            if conn.in_transaction:
                with contextlib.suppress(sqlite3.Error):  # it may be gone already: the next BEGIN starts afresh
                    conn.execute(ROLLBACK)
            others = f" (one transaction with {len(group) - 1} other writes)" if len(group) > 1 else ""
            for job in group:
                if job.error is None:
                    job.result = None
                    job.error = fault(self.path, f"committing {job.label}{others}", exc)
            if not group:
                _log.warning("store_heartbeat_failed", store=self.path, error=str(exc))
                self._last_beat = time.monotonic()
        self._deliver(group)

    def _deliver(self, group: list[Job]) -> None:
        waiting: dict[int, tuple[EventLoopToken, list[Job]]] = {}
        for job in group:
            if job.token is None:
                if job.error is not None:
                    _log.error("store_write_failed", store=self.path, job=job.label, error=str(job.error))
                continue
            entry = waiting.setdefault(id(job.token.native_token), (job.token, []))
            entry[1].append(job)
        for token, jobs in waiting.values():
            soon = getattr(token.backend_class, "run_sync_soon", None) if WAKE_WITHOUT_WAITING else None
            try:
                if soon is not None:
                    soon(_wake, (jobs,), token.native_token)
                else:  # anyio < 4.16: waits until the loop has run it
                    anyio.from_thread.run_sync(_wake, jobs, token=token)
            except Exception:  # the loop has ended: nobody is waiting any more
                _log.warning("store_waiters_gone", store=self.path, jobs=len(jobs))


def _refusal(path: str, job: Job, exc: BaseException) -> StoreError:
    if isinstance(exc, Refused):
        error = StoreConflict(path, str(exc))
        error.__cause__ = exc.__cause__
        return error
    return fault(path, f"writing {job.label}", exc)

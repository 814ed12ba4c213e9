"""Group commit for the SQLite store: one writer connection, owned by one dedicated thread.

The job, the queue, the batching and the wake-up of waiters are `_group.py`'s (shared with the Postgres
writer); this module is the thread, its bell, its lingering, and how a group is executed on SQLite.

    event loop                                  writer thread (owns the only write connection)
    ----------                                  ---------------------------------------------
    write(): encode, append the job to a deque  sleeps on a bell only while the deque is empty
             (ring if the writer sleeps)        takes every job queued (the group)
             await job.event                    BEGIN IMMEDIATE; the group in one pass: its records in one
                                                statement, its rows in another; COMMIT (one fsync)
             <-- run_sync_soon(_wake) --------- one call per event loop with waiters
    _wake: waiters of prompt writes first,
           then "turned" ---------------------> lingers until then (LINGER at most, and only when writes
           then the other waiters               are queued already): what the woken tasks write at once
                                                joins the next group

Group commit. A write that arrives while a commit runs goes into the next transaction: under load a commit
carries every write that arrived during the previous one, and the loop never touches the disk. A group is
applied with no savepoint, a run of case writes as one statement for their records and one for their rows, each
a JSON array read by `json_each` (`_sqlite._apply_writes`): every sqlite3 call, and every row of an
`executemany`, gives up the GIL and must win it back from a busy loop, so a group costs four calls (BEGIN, records,
rows, COMMIT) however many writes it carries. When a job breaks a rule (a second `end`, a seq written twice),
fails on its own (a value that cannot be bound), or fewer records are appended than sent (a retried request_id:
the count cannot say which), the group is rolled back and redone a job at a time, each in a savepoint: that job
alone fails (or reports its skipped record).

The hand-off. The thread sleeps on the bell only with nothing to do, and only then does `submit` ring it, so
jobs queued while a group commits or while the writer lingers cost no thread wake-up (a thread woken from the
loop's thread often preempts the loop on 2 cores). The writer wakes each loop without waiting for it, through
the token each waiter captured: `token.backend_class.run_sync_soon` (anyio 4.16+); older anyio (4.11+) takes the
loop's own thread-safe call (no lingering then: the writer cannot be told when the loop has turned).

Lingering. The tasks a commit wakes often write again at once (`[await sub.new_case(...) for ...]`), and a
transaction started at once would make that write wait for it and then for its own. So when writes are queued
already (else the writer sleeps: a lone writer pays nothing), the writer waits, LINGER at most, until the loop
has run the tasks of prompt writes (queued after the previous group was delivered): `_wake` wakes those first,
and the first other waiter (or a callback) says "turned". A starter then gets one commit per case.

What bounds throughput. A three-effect case makes five waited writes (its start, three effect results, its
`end`: an input reaches the vm only once its record is committed, so none rides with the next). With one starter
the loop and the disk take turns: each case's writes ride about one group commit, and the loop, having run every
task those writes woke, waits for that commit's fsync with nothing else to do, so a case costs the loop's CPU (the
vm and actor as in memory, plus the durable path: records, rows, encoding, the hand-off and the wake-up) plus most
of one fsync. With many starters the commits overlap the loop's work and the loop's CPU is the bound, with its
garbage collections (many live containers) the largest single part after the vm. `python -m bench durable` prints,
under each target it misses, where a case's microseconds go.

Errors. A cancelled waiter's write is still committed (or refused) with its group. An error of the transaction
itself (disk full, I/O, a busy file) fails every job of the group with a StoreError, and the thread goes on to
the next group; a failed job queued with no waiter (`wait=False`) is logged.
"""

from __future__ import annotations

import contextlib
import queue
import sqlite3
import threading
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from .._errors import StoreConflict, StoreError
from .._trace import get_logger
from ._group import GroupQueue, Job, runs
from ._sql import QUERIES
from ._sqlite_files import fault

_log = get_logger("wfsub.store")

BEGIN, COMMIT, ROLLBACK = QUERIES["begin_write"], QUERIES["commit"], QUERIES["rollback"]
SAVEPOINT, UNDO, RELEASE = QUERIES["savepoint"], QUERIES["savepoint_undo"], QUERIES["savepoint_release"]


class Refused(Exception):
    """Raised by a job's apply when its write breaks a rule: that write alone is undone and fails (with `error`,
    StoreConflict unless told: a subclass of it that says which rule)."""

    def __init__(self, message: str, error: type[StoreConflict] = StoreConflict) -> None:
        super().__init__(message)
        self.error = error


class Redo(Exception):
    """Raised by a batch when it cannot tell each job's outcome: the group is redone one job at a time."""


# Errors of the transaction itself (OperationalError: full, I/O, busy; InternalError; DatabaseError: corrupt):
# they end the whole transaction and fail the group. Any other error concerns one job (a broken rule, a value
# that cannot be bound or encoded): its savepoint is rolled back, it fails alone, the rest of the group goes on.
_WHOLE_GROUP = (sqlite3.OperationalError, sqlite3.InternalError)


def _one_job(exc: Exception) -> bool:
    return not isinstance(exc, _WHOLE_GROUP) and type(exc) is not sqlite3.DatabaseError


_RING = object()  # a bell token: work for a sleeping writer (or `stop()`, or the last turn)

LINGER = 0.001
"""Seconds the writer waits at most, after a wake-up, for the woken loop to run the woken tasks (and queue the
writes they make) before it starts the next group."""


def _batchable(job: Job) -> bool | None:
    return True if job.batch is not None else None


class Writer:
    """The writer thread and its bell. `start()` and `stop()` block: call them from a worker thread.

    The jobs wait in a `GroupQueue`; the thread sleeps on the bell only when it is empty, and only then does
    `submit` ring it, so jobs queued while a group commits (or while the writer lingers) cost no thread
    wake-up: the writer takes them all when it is ready.
    """

    def __init__(
        self,
        path: str,
        connect: Callable[[], sqlite3.Connection],
        *,
        heartbeat: Callable[[sqlite3.Connection], None] | None = None,
        heartbeat_every: float = 30.0,
        batch: Callable[[sqlite3.Connection, list[Any]], list[Any]] | None = None,
    ) -> None:
        self.path = path
        self._connect = connect
        self._batch = batch
        self._heartbeat = heartbeat
        self._heartbeat_every = heartbeat_every
        self._last_beat = time.monotonic()
        self._bell: queue.SimpleQueue[object] = queue.SimpleQueue()
        self.queue = GroupQueue(path, partial(self._bell.put, _RING))
        self._thread = threading.Thread(target=self._run, name=f"wfsub-store-writer {path}", daemon=True)
        self._ready = threading.Event()
        self._failed: BaseException | None = None
        self._conn: sqlite3.Connection | None = None

    @property
    def groups(self) -> int:
        """Groups committed or attempted (for tests and benchmarks)."""
        return self.queue.groups

    @property
    def jobs(self) -> int:
        return self.queue.jobs

    @property
    def redone(self) -> int:
        """Groups redone one job at a time after a job broke a rule in the batched pass."""
        return self.queue.redone

    def start(self) -> None:
        self._thread.start()
        self._ready.wait()
        if self._failed is not None:
            self._thread.join()
            raise self._failed

    def submit(self, job: Job) -> None:
        self.queue.submit(job)

    def queued(self) -> int:
        """Jobs waiting for the next group (for tests)."""
        return self.queue.queued()

    def stop(self) -> None:
        """Commit what is queued, close the connection, end the thread."""
        if self._thread.is_alive():
            self.queue.stop()
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
            group, stop = self._take(timeout)
            if group is None:
                self._commit(conn, [])  # idle: the heartbeat alone
                continue
            turns = self._commit(conn, group, beat=not stop) if group else 0  # closing writes only what is queued
            if stop:
                return
            if turns:
                self._linger()

    def _take(self, timeout: float | None) -> tuple[list[Job] | None, bool]:
        """Every job queued (the group), waiting for one if there is none; (None, False) when `timeout` passed
        with nothing to do; the flag is true once `stop()` was called."""
        while True:
            taken = self.queue.take()
            if taken is not None:
                return taken
            try:
                self._bell.get(timeout=timeout)
            except queue.Empty:
                if not self.queue.awake():
                    return None, False
            # a ring (perhaps a stale one from an earlier turn): look again

    def _linger(self) -> None:
        """Wait until the loops just woken have run the woken tasks, or LINGER at most; what they queue meanwhile
        joins the next group.

        A woken task often writes again in the same step (a loop that starts cases one after another).
        Starting the next transaction right after a wake-up would leave those writes to wait for all of it and
        then for their own; waiting for the loop's turn puts them into the next transaction.
        """
        until = time.monotonic() + LINGER
        while self.queue.waiting_turns() > 0 and not self.queue.stopping:
            left = until - time.monotonic()
            if left <= 0:
                break
            try:
                self._bell.get(timeout=left)
            except queue.Empty:
                break
        self.queue.forget_turns()

    def _commit(self, conn: sqlite3.Connection, group: list[Job], *, beat: bool = True) -> int:
        """Commit a group and wake its waiters; returns how many loops were asked to say when they have turned."""
        beat = beat and self._heartbeat is not None and time.monotonic() - self._last_beat >= self._heartbeat_every
        if not group and not beat:
            return 0
        try:
            if not self._together(conn, group, beat):
                self.queue.redone += 1
                self._one_by_one(conn, group, beat)
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
        return self.queue.deliver(group, turns=True)

    def _together(self, conn: sqlite3.Connection, group: list[Job], beat: bool) -> bool:
        """The group in one pass with no savepoints, runs of batchable jobs in one statement per table.

        False when a job failed on its own (a broken rule, a value that cannot be bound) or a batch could not tell
        each job's outcome: the transaction is rolled back and nothing of the group is kept, so `_one_by_one` can
        redo it. An error of the transaction itself propagates.
        """
        conn.execute(BEGIN)
        results: list[Any] = []
        batch = self._batch
        try:
            if batch is None:
                results = [job.work(conn) for job in group]
            else:
                for batched, jobs in runs(group, _batchable):
                    if batched:
                        results += batch(conn, [job.batch for job in jobs])
                    else:
                        results.append(jobs[0].work(conn))
        except Exception as exc:  # a job's error (or Redo): the group is redone a job at a time
            if not _one_job(exc):
                raise
            conn.execute(ROLLBACK)
            return False
        if beat and self._heartbeat is not None:
            self._heartbeat(conn)
        conn.execute(COMMIT)
        for job, result in zip(group, results, strict=True):
            job.result = result
        return True

    def _one_by_one(self, conn: sqlite3.Connection, group: list[Job], beat: bool) -> None:
        """The group with a savepoint per job: a job that fails on its own is undone alone and fails alone."""
        conn.execute(BEGIN)
        for job in group:
            conn.execute(SAVEPOINT)
            try:
                job.result = job.work(conn)
            except Exception as exc:
                if not _one_job(exc):
                    raise
                conn.execute(UNDO)
                job.result = None
                job.error = _refusal(self.path, job, exc)
            conn.execute(RELEASE)
        if beat and self._heartbeat is not None:
            self._heartbeat(conn)
        conn.execute(COMMIT)


def _refusal(path: str, job: Job, exc: BaseException) -> StoreError:
    if isinstance(exc, Refused):
        error = exc.error(path, str(exc))
        error.__cause__ = exc.__cause__
        return error
    return fault(path, f"writing {job.label}", exc)


__all__ = ["LINGER", "Job", "Redo", "Refused", "Writer"]

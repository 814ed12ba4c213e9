"""Where the time of a durable case goes: perf_counter_ns probes wrapped around the SQLite store's steps.

`Probe` replaces, for the duration of a `with` block, the functions a durable write passes through (the encoder,
the hand-off to the writer thread, the writer's group steps, the wake-up of the waiting task) by wrappers that
add up the nanoseconds spent in each and stamp each job at each hand-over, so the bench can say how many
microseconds of a case each step takes, on which thread, and how long a write waits between steps. Nothing in
wfsub is changed: the wrappers sit on module and class attributes and are put back on leaving the block.

Garbage collections are timed apart (gc.callbacks, thread CPU) by generation and thread, and taken out of the
loop step they happened in: a collection is paid by whichever allocation triggers it, not by the step that made the garbage.

A step the current code does not have (its function was renamed or removed) is reported as missing rather than
failing the bench. The probes add about a microsecond per wrapped call: the instrumented run's own rate is printed
beside the plain one, so the distortion is on the page.
"""

from __future__ import annotations

import gc
import sqlite3
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import wfsub._store._group as group_module
import wfsub._store._sqlite as sqlite_store
import wfsub._store._sqlite_writer as writer_module

ns = time.perf_counter_ns  # wall clock: the writer's steps (a COMMIT's fsync is wall time, not CPU)
cpu = time.thread_time_ns  # the calling thread's CPU: the loop's steps (wall time there would count GIL waits)


class Probe:
    """Totals (ns) and counts per step, and per-job stamps (ns) at each hand-over."""

    def __init__(self) -> None:
        self.spent: Counter[str] = Counter()
        self.calls: Counter[str] = Counter()
        self.waits: Counter[str] = Counter()  # ns summed over jobs between two stamps
        self.waited: Counter[str] = Counter()  # jobs counted for each wait
        self.stamps: dict[int, dict[str, int]] = {}
        self.missing: list[str] = []
        self.writers: list[Any] = []
        self.gc_ns = 0  # the loop thread's garbage collections so far, CPU (a loop step's time excludes those in it)
        self._gc_started = 0
        self.counting_gc = False  # set by `count_gc()`, once the run's own collections start
        self._undo: list[Callable[[], None]] = []

    # -- installing the probes ---------------------------------------------------------------------------------

    def _replace(self, owner: Any, name: str, make: Callable[[Any], Any]) -> None:
        original = owner.__dict__.get(name) if isinstance(owner, type) else getattr(owner, name, None)
        if original is None:
            self.missing.append(f"{getattr(owner, '__name__', owner)}.{name}")
            return
        setattr(owner, name, make(original))
        self._undo.append(lambda: setattr(owner, name, original))

    def _timed(self, step: str) -> Callable[[Any], Any]:
        clock = cpu if step.startswith("loop") else ns

        probe = self

        def make(fn: Any) -> Any:
            spent, calls = self.spent, self.calls

            def timed(*args: Any, **kwargs: Any) -> Any:
                g, t = probe.gc_ns, clock()
                try:
                    return fn(*args, **kwargs)
                finally:
                    spent[step] += clock() - t - (probe.gc_ns - g)
                    calls[step] += 1

            return timed

        return make

    def _stamp(self, job: Any, mark: str, t: int) -> None:
        stamps = self.stamps.get(id(job))
        if stamps is not None:
            stamps[mark] = t

    def _wait(self, job: Any, name: str, since: str, t: int) -> None:
        stamps = self.stamps.get(id(job))
        if stamps is not None and since in stamps:
            self.waits[name] += t - stamps[since]
            self.waited[name] += 1

    @contextmanager
    def installed(self) -> Iterator[Probe]:
        W, S = writer_module, sqlite_store
        probe = self
        self._replace(S, "encode_write", self._timed("loop: encode (records, row to JSON)"))
        self._replace(S, "_apply_writes", self._timed("writer: SQL execute (records, rows)"))
        self._replace(group_module, "_wake", self._timed("loop: wake callback (events set)"))
        self._replace(W.Writer, "_linger", self._timed("writer: linger for the loop's turn"))

        def make_init(init: Any) -> Any:
            def __init__(job: Any, *args: Any, **kwargs: Any) -> None:
                g, t = probe.gc_ns, cpu()
                init(job, *args, **kwargs)
                probe.spent["loop: hand-off (Job, Event, token, submit)"] += cpu() - t - (probe.gc_ns - g)
                probe.stamps[id(job)] = {}
            return __init__

        def make_submit(submit: Any) -> Any:
            def timed_submit(writer: Any, job: Any, *args: Any, **kwargs: Any) -> None:
                t = cpu()
                submit(writer, job, *args, **kwargs)
                probe.spent["loop: hand-off (Job, Event, token, submit)"] += cpu() - t
                probe.calls["loop: hand-off (Job, Event, token, submit)"] += 1
                probe._stamp(job, "submitted", ns())
            return timed_submit

        def make_take(take: Any) -> Any:
            def timed_take(writer: Any, *args: Any, **kwargs: Any) -> Any:
                taken = take(writer, *args, **kwargs)
                t = ns()
                group = taken[0] if isinstance(taken, tuple) and taken else taken
                for job in group if isinstance(group, list) else ():
                    probe._wait(job, "queued until its group starts", "submitted", t)
                    probe._stamp(job, "taken", t)
                return taken
            return timed_take

        def make_together(together: Any) -> Any:
            def timed_together(writer: Any, conn: Any, group: Any, *args: Any, **kwargs: Any) -> Any:
                t = ns()
                try:
                    return together(writer, conn, group, *args, **kwargs)
                finally:
                    e = ns()
                    probe.spent["writer: group transaction (all of it)"] += e - t
                    probe.calls["writer: group transaction (all of it)"] += 1
                    for job in group if isinstance(group, list) else ():
                        probe._stamp(job, "committed", e)
            return timed_together

        def make_deliver(deliver: Any) -> Any:
            def timed_deliver(writer: Any, group: list[Any], *args: Any, **kwargs: Any) -> Any:
                t = ns()
                try:
                    return deliver(writer, group, *args, **kwargs)
                finally:
                    probe.spent["writer: deliver (run_sync_soon per loop)"] += ns() - t
                    probe.calls["writer: deliver (run_sync_soon per loop)"] += 1
                    for job in group:
                        probe._stamp(job, "delivered", t)
                        if job.event is None:  # nobody waits for it: no outcome() will drop its stamps
                            probe.stamps.pop(id(job), None)
            return timed_deliver

        def make_outcome(outcome: Any) -> Any:
            async def timed_outcome(job: Any, *args: Any, **kwargs: Any) -> Any:
                try:
                    return await outcome(job, *args, **kwargs)
                finally:
                    t = ns()
                    probe._wait(job, "committed until its task runs again", "committed", t)
                    probe._wait(job, "submitted until its task runs again", "submitted", t)
                    probe.stamps.pop(id(job), None)
            return timed_outcome

        def make_start(start: Any) -> Any:
            def started(writer: Any) -> None:
                start(writer)
                probe.writers.append(writer)
            return started

        def make_connection(connect: Any) -> Any:
            def timed_connection(store: Any) -> Any:
                return _TimedConnection(connect(store), probe)
            return timed_connection

        def collected(phase: str, info: dict[str, Any]) -> None:
            if not probe.counting_gc:
                return
            if phase == "start":
                probe._gc_started = cpu()
                return
            took = cpu() - probe._gc_started
            loop = threading.current_thread() is threading.main_thread()
            if loop:
                probe.gc_ns += took
            where = "loop" if loop else "other threads"
            probe.spent[f"gc: generation {info.get('generation')} collections, {where}"] += took
            probe.calls[f"gc: generation {info.get('generation')} collections, {where}"] += 1

        gc.callbacks.append(collected)
        self._undo.append(lambda: gc.callbacks.remove(collected))
        self._replace(W.Job, "__init__", make_init)
        self._replace(W.Writer, "submit", make_submit)
        self._replace(W.Writer, "_take", make_take)
        self._replace(W.Writer, "_together", make_together)
        self._replace(group_module.GroupQueue, "deliver", make_deliver)
        self._replace(W.Job, "outcome", make_outcome)
        self._replace(W.Writer, "start", make_start)
        self._replace(S.SqliteStore, "_writer_connection", make_connection)
        try:
            yield self
        finally:
            for undo in reversed(self._undo):
                undo()
            self._undo.clear()

    def reset(self) -> None:
        """Forget what was measured so far (the jobs in flight keep their stamps)."""
        for counter in (self.spent, self.calls, self.waits, self.waited):
            counter.clear()

    def count_gc(self) -> None:
        """Count garbage collections from now on (after the bench's own `gc.collect()` before a run)."""
        self.counting_gc = True

    @contextmanager
    def idle_of(self, loop: Any) -> Iterator[None]:
        """Time the loop spends in its selector (idle: nothing ready, or woken by the writer's wake-up)."""
        selector = getattr(loop, "_selector", None)
        if selector is None:
            self.missing.append("the event loop's selector")
            yield
            return
        select = selector.select
        spent = self.spent

        def timed_select(timeout: float | None = None) -> Any:
            t = ns()
            try:
                return select(timeout)
            finally:
                spent["loop idle in its selector"] += ns() - t

        selector.select = timed_select
        try:
            yield
        finally:
            del selector.select

    def writer_cpu_ns(self) -> int:
        """CPU time of the writer threads started under the probe (their thread CPU clocks), so far."""
        total = 0
        for writer in self.writers:
            thread = getattr(writer, "_thread", None)
            if isinstance(thread, threading.Thread) and thread.ident is not None and thread.is_alive():
                total += time.clock_gettime_ns(time.pthread_getcpuclockid(thread.ident))
        return total


class _TimedConnection:
    """The writer's sqlite3 connection with BEGIN and COMMIT timed (the COMMIT holds the fsync)."""

    def __init__(self, conn: sqlite3.Connection, probe: Probe) -> None:
        self._conn = conn
        self._probe = probe
        self._begin = writer_module.BEGIN
        self._commit = writer_module.COMMIT

    def execute(self, sql: str, *args: Any) -> Any:
        if sql is not self._begin and sql is not self._commit:
            return self._conn.execute(sql, *args)
        step = "writer: COMMIT (WAL write + fsync)" if sql is self._commit else "writer: BEGIN IMMEDIATE"
        t = ns()
        try:
            return self._conn.execute(sql, *args)
        finally:
            self._probe.spent[step] += ns() - t
            self._probe.calls[step] += 1

    def executemany(self, sql: str, rows: Any) -> Any:
        return self._conn.executemany(sql, rows)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)

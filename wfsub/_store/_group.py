"""Group commit, written once for every backend: the job, the queue, the batching, and the wake-up of waiters.

    caller's event loop                       the backend's writer (a thread, or a task on another loop)
    -------------------                       ----------------------------------------------------------
    write(): Job(work, label), queue.submit   sleeps only while the queue is empty
             (rings the writer if it sleeps)  queue.take(): every job queued (the group)
             await job.outcome()              runs the group in one transaction (the backend's part)
             <-- queue.deliver(group) ------  one call per event loop with waiters, never blocking the writer

A backend plugs in two things: `ring` (how `submit` wakes a sleeping writer: a bell for a thread, an event set
through the loop's thread-safe call for a task), and how a group is executed (`Job.work` is its own: a
function of a connection, a statement and its arguments). `runs` and `by_key` cut a group into the batches it
executes together. What stays the same everywhere is here:

- The queue is a deque; the writer is rung only when it sleeps (`take` found nothing and said so), so jobs
  queued while a group commits cost no wake-up: the writer takes them all when it is ready.
- `deliver` wakes each event loop with waiters once, through the token each waiter captured
  (`token.backend_class.run_sync_soon`, anyio 4.16+; before that the loop's own thread-safe call), never
  waiting for the loop. A failed job that nobody waits for (`wait=False`) is logged.
- Turns (used by the SQLite writer, which lingers; see `_writer.py`): with `turns=True`, a loop woken while
  jobs are queued already says when it has run the woken tasks of prompt jobs (queued after the previous group
  was delivered), so that what they write at once joins the next group. `_wake` wakes those first; the first
  other waiter (or a callback after the woken tasks) calls `turned`, which rings the writer once every loop did.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import deque
from collections.abc import Callable, Hashable
from functools import partial
from typing import Any

import anyio.lowlevel
from anyio.lowlevel import EventLoopToken

from .._errors import StoreError
from .._loops import asyncio_loop, on_asyncio
from .._trace import get_logger

_log = get_logger("wfsub.store")

WAKE_WITHOUT_WAITING = True
"""Wake a loop with `AsyncBackend.run_sync_soon` where anyio has it (4.16+); tests turn it off to cover the path
older anyio versions take (the loop's own thread-safe call: asyncio's call_soon_threadsafe, trio's token)."""


class Job:
    """One write for a writer: `work` (the backend's: what to run), `batch` (optional: what a batch takes
    instead, for jobs executed together), `label` (for messages: "case 'c-1'"), and how its outcome comes back.
    """

    __slots__ = ("batch", "error", "event", "label", "prompt", "result", "then", "token", "waiting", "work")

    def __init__(self, work: Any, label: str, *, wait: bool, batch: object = None) -> None:
        self.work = work
        self.batch = batch
        self.label = label
        self.prompt = False  # queued after the previous group was delivered: its task writes as soon as woken
        self.result: Any = None
        self.error: StoreError | None = None
        self.token: EventLoopToken | None
        self.event: Any  # the backend's own Event (asyncio.Event or trio.Event): set on its loop by `_wake`
        if wait:
            self.token, self.event = _waiter()
        else:
            self.token = self.event = None
        self.waiting = False  # a task waits in `outcome()`
        self.then: Callable[[], None] | None = None  # what its task does first once woken (see `_wake`)

    async def outcome(self) -> Any:
        """Wait for the group this job went with; its result, or the StoreError it failed with."""
        assert self.event is not None
        self.waiting = True
        try:
            await self.event.wait()
        finally:
            self.waiting = False
            then, self.then = self.then, None
            if then is not None:
                then()
        if self.error is not None:
            raise self.error
        return self.result


_last: tuple[object, EventLoopToken] | None = None  # the asyncio loop last seen, and its token


def _waiter() -> tuple[EventLoopToken, Any]:
    """The running loop's token and a new Event of its backend, for a job's waiter.

    `anyio.Event()` and `anyio.lowlevel.current_token()` each ask sniffio which library runs (about 4 us the
    pair); a job takes the token of the asyncio loop it last saw when it runs on that loop again, and makes the
    backend's own Event (anyio's is a wrapper around it). Under trio (or a loop seen for the first time) anyio
    answers, and the Event is trio's own.
    """
    global _last
    loop = asyncio_loop()
    last = _last
    if last is not None and last[0] is loop and on_asyncio(loop):
        return last[1], asyncio.Event()
    token = anyio.lowlevel.current_token()
    if loop is not None and token.native_token is loop:
        _last = (loop, token)
        return token, asyncio.Event()
    import trio  # the only other backend anyio has; imported already, since it runs

    return token, trio.Event()


def call_soon_on(token: EventLoopToken, fn: Callable[..., None], *args: Any) -> None:
    """Run fn(*args) on the event loop of `token`, from any thread, without waiting for it."""
    soon = getattr(token.backend_class, "run_sync_soon", None) if WAKE_WITHOUT_WAITING else None
    native: Any = token.native_token
    try:
        if soon is not None:
            soon(fn, args, native)
        elif hasattr(native, "call_soon_threadsafe"):  # asyncio, anyio < 4.16
            native.call_soon_threadsafe(fn, *args)
        else:  # trio, anyio < 4.16
            native.run_sync_soon(fn, *args)
    except Exception:  # the loop has ended: nobody is waiting any more
        _log.warning("store_waiter_gone")


def _wake(prompt: list[Job], early: list[Job], turned: Callable[[int], None] | None, group: int) -> None:
    """Wake the waiters of a group; with `turned`, tell the writer once the waiters of prompt writes have run.

    Tasks run in the order they are woken (asyncio; trio shuffles them, which only makes the writer start its
    next group sooner), so the first waiter of an early write, woken after them, says so as soon as it runs: no
    second call through the loop's thread-safe queue. With no early waiter, a callback scheduled after the woken
    tasks says it.
    """
    for job in prompt:
        assert job.event is not None
        job.event.set()
    if turned is not None:
        herald = next((job for job in early if job.waiting), None)
        if herald is not None:
            herald.then = partial(turned, group)
        else:
            token = prompt[0].token
            assert token is not None
            with contextlib.suppress(Exception):  # the loop is ending: the writer stops waiting for it at its bound
                token.backend_class.run_sync_soon(turned, (group,), token.native_token)
    for job in early:
        assert job.event is not None
        job.event.set()


def runs(group: list[Job], key: Callable[[Job], Hashable | None]) -> list[tuple[Hashable | None, list[Job]]]:
    """The group cut into runs of consecutive jobs of one key, in order; a job whose key is None runs alone."""
    cut: list[tuple[Hashable | None, list[Job]]] = []
    for job in group:
        k = key(job)
        if k is not None and cut and cut[-1][0] == k:
            cut[-1][1].append(job)
        else:
            cut.append((k, [job]))
    return cut


def by_key(group: list[Job], key: Callable[[Job], Hashable]) -> list[tuple[Hashable, list[Job]]]:
    """The group's jobs by key (in order within a key; keys in order of first appearance)."""
    found: dict[Hashable, list[Job]] = {}
    for job in group:
        found.setdefault(key(job), []).append(job)
    return list(found.items())


class GroupQueue:
    """The jobs waiting for a writer, and the hand-offs both ways (see the module docstring).

    `ring` wakes the writer when `submit` finds it asleep, and when `stop()` or the last `turned` comes; it is
    called from any thread and may be called when the writer is awake already (it then looks again).
    `name` names the store in log lines.
    """

    def __init__(self, name: str, ring: Callable[[], object]) -> None:
        self.name = name
        self._ring = ring
        self._jobs: deque[Job] = deque()
        self._lock = threading.Lock()  # guards _jobs against _sleeping, _stopping and _turns
        self._sleeping = False  # the writer waits to be rung: `submit` rings it
        self._stopping = False
        self._turns = 0  # loops woken by the last group that have not yet run the woken tasks
        self._early = 0  # jobs queued while the last group committed (the rest of the next group were prompt)
        self.groups = 0  # groups taken: transactions committed or attempted (for tests and benchmarks)
        self.jobs = 0  # jobs taken
        self.redone = 0  # groups the backend redid one job at a time after a job broke a rule

    # -- the callers' side -----------------------------------------------------------------------------------

    def submit(self, job: Job) -> None:
        """Queue a job (from any thread); ring the writer only if it sleeps."""
        with self._lock:
            self._jobs.append(job)
            if not self._sleeping:
                return
            self._sleeping = False
        self._ring()

    def queued(self) -> int:
        """Jobs waiting for the next group (for tests)."""
        return len(self._jobs)

    def stop(self) -> None:
        """Ask the writer to take what is queued one last time and end."""
        with self._lock:
            self._stopping = True
        self._ring()

    # -- the writer's side -----------------------------------------------------------------------------------

    def take(self) -> tuple[list[Job], bool] | None:
        """Every job queued (the group) and whether `stop()` was called; None when there is nothing: the writer
        is then marked asleep, and must wait to be rung (a ring that came meanwhile is kept by its bell)."""
        with self._lock:
            if not self._jobs and not self._stopping:
                self._sleeping = True
                return None
            group = list(self._jobs)
            self._jobs.clear()
            for job in group[self._early :]:
                job.prompt = True
            self._early = 0
            if group:
                self.groups += 1
                self.jobs += len(group)
            return group, self._stopping

    def awake(self) -> bool:
        """The writer stopped waiting by itself (a timeout): no ring is due; whether work came meanwhile."""
        with self._lock:
            self._sleeping = False
            return bool(self._jobs) or self._stopping

    @property
    def stopping(self) -> bool:
        return self._stopping

    def waiting_turns(self) -> int:
        """Loops woken by the last group that have not said they turned (0: the writer need not wait)."""
        with self._lock:
            return self._turns

    def forget_turns(self) -> None:
        """The writer stops waiting for turns: one that comes later finds nobody waiting (its ring is stale)."""
        with self._lock:
            self._turns = 0

    def turned(self, group: int) -> None:
        """A loop woken by group number `group` has run the tasks it woke (called on that loop's thread)."""
        with self._lock:
            if group != self.groups or self._turns <= 0:
                return  # late: the writer has stopped waiting for it
            self._turns -= 1
            if self._turns:
                return
        self._ring()

    def deliver(self, group: list[Job], *, turns: bool = False) -> int:
        """Wake the group's waiters, once per event loop; returns how many loops will say when they have run the
        woken tasks (`turns=True` only, and only when jobs are queued already: the next group would start at
        once, without the writes the woken tasks are about to make; with nothing queued the writer sleeps, and
        the first of those writes wakes it)."""
        with self._lock:
            self._early = queued = len(self._jobs)
        waiting: dict[int, tuple[EventLoopToken, list[Job], list[Job]]] = {}
        for job in group:
            if job.token is None:
                if job.error is not None:
                    _log.error("store_write_failed", store=self.name, job=job.label, error=str(job.error))
                continue
            _, prompt, early = waiting.setdefault(id(job.token.native_token), (job.token, [], []))
            (prompt if job.prompt else early).append(job)
        asked = 0
        for token, prompt, early in waiting.values():
            soon = getattr(token.backend_class, "run_sync_soon", None) if WAKE_WITHOUT_WAITING else None
            if soon is None:
                call_soon_on(token, _wake, prompt, early, None, self.groups)
                continue
            turned = self.turned if turns and prompt and queued else None
            if turned is not None:
                with self._lock:
                    self._turns += 1  # before the loop can answer
            try:
                soon(_wake, (prompt, early, turned, self.groups), token.native_token)
                if turned is not None:
                    asked += 1
            except Exception:  # the loop has ended: nobody is waiting any more
                if turned is not None:
                    with self._lock:
                        self._turns -= 1
                _log.warning("store_waiters_gone", store=self.name, jobs=len(prompt) + len(early))
        return asked

"""`Substrate`: the root supervisor that an application enters with `async with`, and `CaseHandle`.

The Substrate owns a root task group holding the trace hub and, nested in it, the task group of the case actors
(and, with a store, the loops that run beside them); a registry of cases in memory; the registered workflows; and
a cache of compiled programs. It is the only way in: every method checks its arguments and says what was wrong
and how to fix it.

Decisions written down here:
- `new_case` returns once the case is registered and its actor scheduled (with a store: once its `start` record
  is durable); it does not wait for the actor's first burst. Everything that can fail at start (validation,
  compilation, bad or non-JSON data) fails inside `new_case`, before anything is scheduled or written.
- Without a store, `signal` returns once the signal is queued in the case's mailbox (it waits only while the
  mailbox is full); with a store, once its record is committed and applied. `cancel_region`, `complete_region`,
  `add_instances` and `close_instances` wait until the case has applied them, so an operation the case cannot
  take raises `SignalRejected` in the caller; with a store, `cancel` waits for its record too.
- `cancel` of a case that has already ended raises `SignalRejected`, as `signal` does.
- A standby (SQLite, while another process owns the file; see `_outside`) runs no case: its inputs and new cases
  go to the owner through the store, its reads read the store; when the owner ends it takes ownership.
- Ended cases keep their result in memory for `await_case`, `status` and `data`, up to `retain_ended` of them
  (oldest dropped first; without a store a dropped id raises `CaseNotFound`; with one, it is read from the store).
  A `CaseHandle` keeps its own case's outcome regardless.
- `await_case` returns (or raises) once the case has ended and its effects and timers have stopped; each caller
  gets its own shallow copy of the final data. `timeout=0` checks without waiting.
- Timeouts of `await_case` and `new_case(timeout=...)` run on the Substrate's clock, like every other timer.
- A case is traced only when some sink will see its events: with `trace_level="min"` and no sinks, cases run
  the vm's untraced loop until `trace(case_id, level, sink)` gives one of them a sink.
- Leaving the `async with` without a store cancels every live case without compensation (their awaiters get
  `CaseCancelled` with reason "substrate closed"); with a store it writes nothing: live cases stay live in the
  store and in-memory awaiters get `SubstrateClosed`. Either way it waits for effects and timers to stop (naming,
  after `shutdown_timeout`, the effects that ignore cancellation), then lets the trace hub deliver what it holds
  (at most `shutdown_timeout` seconds) and close the sinks.
- `status`, `data` and `cases` are synchronous: for a case in memory they copy what the actor holds; for a durable
  case that is not in memory they read its row from the store on the calling thread (a small indexed read).
- `retry` and `fork` (see `_lifecycle`) write their records and then load the case as recovery does; they run on
  the Substrate that owns the store (a standby sends them to the owner through the inbox). A retried case that no
  registered version can run is suspended, its status says why, until one is registered. `delete` refuses a case
  that has not ended.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import secrets
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from types import TracebackType
from typing import Any

import anyio
from anyio.abc import TaskGroup
from pydantic import BaseModel, ValidationError

from .._errors import (
    CaseCancelled,
    CaseExists,
    CaseFailed,
    CaseNotFound,
    CommitUnknown,
    RestoredError,
    SignalRejected,
    StoreConflict,
    StoreError,
    SubstrateClosed,
    WfsubError,
    WorkflowNotRegistered,
    answer_gone,
    update_timeout,
)
from .._program import DEFAULT_MAX_INSTANCES, Program
from .._store import RETRIED, CaseRow, CaseWrite, InboxRow, Listing, QueueItem, SqliteStore, Store
from .._store import open_store as _open_store
from .._terms import MAX_SECONDS, Term
from .._trace import LEVELS, TraceLevel, TraceSink, check_sink, get_logger
from .._vm import Machine, Scheduler, Seeded
from . import _inputs as inputs
from . import _lifecycle as lifecycle
from ._answers import ANSWERS_KEPT, MOVED, Pending, remote_answer, row_result
from ._answers import moved as updates_moved
from ._answers import of as of_actor
from ._answers import result as update_result
from ._case import CaseActor, Shared
from ._children import LostChildren, check_child_queues, children_in, started_from_queue
from ._clock import Clock, RealClock, VirtualClock
from ._compact import DEFAULT_COMPACT_AFTER, check_compact_after
from ._control import CaseEvicted, Existing, Remote
from ._hub import TraceHub
from ._inputs import admit
from ._journal import JournalRecord, as_journaled, parent_step_of
from ._loader import CaseLoader
from ._mailbox import Cancel, External, RegionAction, Reply, Signal
from ._nodes import DatabaseClock, Lease, Node
from ._outside import EndWatcher, Outside, applied, same_start, start_differs
from ._persist import Background, status_of
from ._queues import (
    IN_QUEUE,
    QUEUED_ORDER,
    Queue,
    Queues,
    cancel_requeued,
    check_queued,
    check_queues,
    queued_page,
    queued_start,
    queued_status,
    with_item,
)
from ._registry import Workflows
from ._routing import InboxRouter
from ._schedules import Schedule, Schedules, ScheduleStatus, backfill_slots
from ._status import FINAL, CaseState, CaseStatus, SubstrateStatistics
from ._summary import summary_of

_log = get_logger("wfsub.runtime")

TAKEOVER_EVERY = 0.2  # seconds between a standby's looks at whether the owner's lock is free
TAKEOVER_RETRY_MOST = 5.0  # seconds at most between a standby's takeovers that met a store fault (doubling up to it)
ENDED_POLL = 2.0  # seconds between re-reads of the rows of awaited cases not in memory (a fallback to NOTIFY)

PROGRAM_CACHE_SIZE = 1024
DEFAULT_MAX_PAYLOAD = 1 << 20  # 1 MiB of JSON per durable input


DEFAULT_MAX_RECOVERIES = 5
"""`Substrate(max_recoveries=)`: recoveries in a row without a new journal record before a case is suspended."""


def _positive(value: object, name: str, *, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ValueError(f"{name} must be a positive number, got {value!r}")
    if value > MAX_SECONDS:
        fix = "pass None for no limit" if allow_none else "pass a number of seconds"
        raise ValueError(f"{name}={value!r} is more than {MAX_SECONDS:g} seconds (about 31 years): {fix}")


def _no_redaction(value: Any) -> Any:
    return value


def _guarded(redact: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """`redact` as the runtime calls it: one that raises withholds the value (never shows it unredacted).

    It runs where a case ends, in the trace hub and in `status`: an error from it must not fail a case, crash the
    Substrate or make `status` raise. The error is logged (the first, then every 1,000th); its message is not
    shown, since it may quote the value.
    """
    errors = 0

    def guarded(value: Any) -> Any:
        nonlocal errors
        try:
            return redact(value)
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:
            errors += 1
            if errors == 1 or errors % 1000 == 0:
                _log.error("redact raised; the value is withheld", error=type(exc).__name__, errors=errors)
            withheld = f"<withheld: redact raised {type(exc).__name__}>"
            return {"withheld": withheld} if isinstance(value, Mapping) else withheld

    return guarded


class Substrate:
    """The root supervisor of a set of cases. Use it as `async with Substrate(...) as sub:`.

    - `trace_level`: "none", "min" or "full", the default level of every case (`trace()` changes one case).
    - `sinks`: trace sinks that get the events of every case.
    - `quanta`: vm steps per burst before the case actor yields to the event loop.
    - `clock`: a `Clock`; the real clock by default, `wfsub.testing.VirtualClock()` in tests.
    - `workflows`: `{name: term}` or `{name: [older, ..., newest]}`: the workflows cases start from by name (with a
      store, the only ones), and that `call(name)` finds (the newest version).
    - `library`: `{name: workflow}` that `call(name)` looks workflows up in (the older spelling of `workflows`).
    - `store`: None (memory only), a path or `sqlite:///path` (SQLite, the embedded default), `postgresql://...`,
      or a store object (`wfsub.stores.SqliteStore`, `MemoryStore`): durable cases (see the README).
    - `mailbox_size`: external inputs (signals, region operations) queued per case before senders wait.
    - `retain_ended`: how many ended cases keep their result in memory (oldest dropped first).
    - `trace_buffer`: event batches buffered by the trace hub, and per sink, before events are dropped.
    - `shutdown_timeout`: seconds the sinks get on exit to take the events still buffered; effects still
      running that long after the cases were cancelled are logged (a WARNING naming them) and waited for.
    - `max_instances`: the most instances one mi without `max=` may start; beyond it the case fails at the mi.
    - `max_payload_bytes`: with a store, the largest JSON size of start data, a signal payload, `add_instances`
      items, an effect result or heartbeat details (a bigger one is refused with a ValueError naming the limit;
      nothing is written).
    - `evict_after`: with a store, seconds a case may wait for a signal or timer in memory before it leaves
      memory (it comes back on its next input or due timer; see the README).
    - `compact_after`: with a store, the journal records a live case keeps before its owner compacts them into
      one `snapshot` record (default 1000; None keeps every record): an endless case keeps a bounded journal.
    - `node_id`: the name of this Substrate as the owner of a store (with a shared store, a node): a node that
      restarts with the same id finds its cases at once; others take a dead node's cases over after its lease.
    - `redact`: a function over data applied to what people read (trace event details, suspended reasons, failure
      messages and tracebacks in `status`), never to the journal.
    - `max_recoveries`: with a store, how many times in a row recovery brings back a live case whose journal got
      no new record since the last time (it kills or hangs its process each time it runs) before the case is
      `suspended` with that reason instead (a poison case; `retry` re-opens it after a fix).
    - `standby`: a SQLite store that another live process owns makes this Substrate a standby (True, the
      default): it sends its inputs and new cases to the owner through the store, reads cases from the store,
      runs none, and takes ownership when the owner ends. False: a StoreError naming the owner instead.
    - `schedules`: `wfsub.Schedule`s: workflows started at each slot of a cron expression or a period (see
      `wfsub._runtime._schedules` and the README).
    - `queues`: `{name: wfsub.Queue(...)}`: the queues `new_case(..., queue=name)` starts cases on (see
      `wfsub._runtime._queues` and the README).
    """

    def __init__(
        self,
        *,
        trace_level: TraceLevel = "min",
        sinks: Sequence[TraceSink] = (),
        quanta: int = 100,
        clock: Clock | None = None,
        workflows: Mapping[str, Any] | None = None,
        library: Mapping[str, Term] | None = None,
        store: Any = None,
        mailbox_size: int = 1024,
        retain_ended: int = 10_000,
        trace_buffer: int = 10_000,
        shutdown_timeout: float = 5.0,
        max_instances: int = DEFAULT_MAX_INSTANCES,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD,
        redact: Callable[[Any], Any] | None = None,
        evict_after: float | None = None,
        node_id: str | None = None,
        standby: bool = True,
        max_recoveries: int = DEFAULT_MAX_RECOVERIES,
        schedules: Sequence[Schedule] = (),
        queues: Mapping[str, Queue] | None = None,
        compact_after: int | None = DEFAULT_COMPACT_AFTER,
    ) -> None:
        if trace_level not in LEVELS:
            raise ValueError(f"trace_level must be one of {', '.join(LEVELS)}, got {trace_level!r}")
        for value, name in (
            (quanta, "quanta"),
            (mailbox_size, "mailbox_size"),
            (trace_buffer, "trace_buffer"),
            (max_instances, "max_instances"),
            (max_payload_bytes, "max_payload_bytes"),
            (max_recoveries, "max_recoveries"),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if isinstance(retain_ended, bool) or not isinstance(retain_ended, int) or retain_ended < 0:
            raise ValueError(f"retain_ended must be an int >= 0, got {retain_ended!r}")
        _positive(shutdown_timeout, "shutdown_timeout")
        _positive(evict_after, "evict_after", allow_none=True)
        if isinstance(sinks, TraceSink) or not isinstance(sinks, Sequence):
            raise TypeError("sinks must be a sequence of sinks, e.g. sinks=[MemorySink()]")
        for i, sink in enumerate(sinks):
            check_sink(sink)
            if any(s is sink for s in sinks[:i]):  # one sink listed twice would get every event twice
                raise ValueError(f"sinks lists {sink!r} twice: each sink gets every event once; list it once")
        if clock is not None and not isinstance(clock, Clock):
            raise TypeError(f"clock must provide now(), sleep() and deadline_scope(); got {type(clock).__name__}")
        if redact is not None and not callable(redact):
            raise TypeError(f"redact must be a function over data (or None), got {type(redact).__name__}")
        self._workflows = Workflows(workflows, library)  # raises InvalidWorkflow for a broken version
        self._store: Store | None = _open_store(store)
        if evict_after is not None and self._store is None:
            raise ValueError(
                "evict_after needs a store: an evicted case lives on in the store until its next input or timer; "
                "pass store=... (a SQLite path, or wfsub.stores.MemoryStore() in tests)"
            )
        self._evict_after = evict_after
        self._compact_after = check_compact_after(compact_after)
        self._end_events: dict[str, anyio.Event] = {}  # awaiters of cases not in memory, by case id
        self._ended_poll_at = 0.0  # monotonic time when those awaiters next re-read their rows
        self._level = trace_level
        self._sinks = tuple(sinks)
        self._quanta = quanta
        self._clock: Clock = clock if clock is not None else RealClock()
        self._mailbox_size = mailbox_size
        self._retain = retain_ended
        self._trace_buffer = trace_buffer
        self._shutdown_timeout = shutdown_timeout
        self._max_instances = max_instances
        self._max_payload = max_payload_bytes
        self._max_recoveries = max_recoveries
        self._redact = _guarded(redact) if redact is not None else _no_redaction
        self._programs: dict[Term, Program] = {}
        self._cases: dict[str, CaseActor] = {}
        self._ended: deque[str] = deque()
        self._ids = itertools.count(1)
        self._orders = itertools.count(1)  # cases() paging order of cases without a store
        self._prefix = secrets.token_hex(6)  # generated ids must not meet an earlier run's in a store
        if node_id is not None and (not isinstance(node_id, str) or not node_id.strip() or len(node_id) > 200):
            raise ValueError(f"node_id must be a non-empty str of at most 200 characters, got {node_id!r}")
        self._owner = node_id or f"substrate-{secrets.token_hex(6)}"
        self._lease = Lease()
        self._node: Node | None = None
        self._phase = "new"  # new -> open -> closed
        self._root: TaskGroup | None = None
        self._case_tg: TaskGroup | None = None
        self._hub: TraceHub | None = None
        self._shared: Shared | None = None
        self._background: Background | None = None
        self._loader: CaseLoader | None = None  # with a store: brings durable cases into memory, lets them go
        self._router: InboxRouter | None = None  # with a store, as its owner: hands inbox inputs to their cases
        self._detach_clock: Any = None
        if not isinstance(standby, bool):
            raise TypeError(f"standby must be True or False, got {standby!r}")
        self._standby_ok = standby
        self._outside: Outside | None = None  # while a standby: its door to the owner through the store
        self._standby_since = 0.0
        # case id -> (its start: workflow, data, sent; set once its start is written or failed) of a start being
        # written now
        self._starting: dict[str, tuple[dict[str, Any], anyio.Event]] = {}
        self._queues = Queues(
            check_queues(queues), node=self._owner, now=lambda: self._clock.now(),
            deadline=lambda t: self._clock.deadline_scope(t), busy=self._busy, start=self._start_queued,
            ended=self._memory_ended, is_open=lambda: self._phase == "open",
        )
        self._queued_terms: dict[str, Term] = {}  # without a store: queued cases of unregistered terms
        check_child_queues(self._workflows, self._queues.queues)
        self._schedules = self._check_schedules(schedules)
        self._children: dict[str, list[str]] = {}  # parent id -> children (no store: all; else: last read)
        self._counts = {"started": 0, "done": 0, "failed": 0, "cancelled": 0, "evicted": 0, "idle_evicted": 0,
                        "live": 0}  # live: case actors running here (started, recovered or brought back) not exited

    # -- lifecycle ----------------------------------------------------------------------------------------

    async def __aenter__(self) -> Substrate:
        if self._phase != "new":
            raise RuntimeError("a Substrate can be entered only once; make a new Substrate instead")
        standby = False
        if self._store is not None:
            standby = await self._open_store(self._store)
        hub = self._hub = TraceHub(
            self._sinks, buffer=self._trace_buffer, sink_buffer=self._trace_buffer, redact=self._redact
        )
        shared = self._shared = Shared(self._clock, hub, self._quanta, self._mailbox_size, self._on_end)
        shared.redact = self._redact
        root = self._root = anyio.create_task_group()
        await root.__aenter__()
        root.start_soon(hub.run)
        case_tg = self._case_tg = anyio.create_task_group()
        await case_tg.__aenter__()
        shared.start_soon = lambda fn: case_tg.start_soon(fn)
        shared.substrate = self
        if isinstance(self._clock, VirtualClock):
            self._detach_clock = self._clock.attach(lambda: shared.busy == 0)
        self._phase = "open"
        if self._store is None and self._schedules.by_name:
            case_tg.start_soon(self._schedules.run)
        if self._store is None and self._queues.queues:
            case_tg.start_soon(self._queues.run)
        if self._store is not None:
            try:
                await self._register_summaries(self._store)
                await self._queues.register(self._store)
                if standby:
                    self._open_standby(self._store, case_tg)
                else:
                    await self._open_durable(self._store, case_tg)
            except BaseException:
                await self.__aexit__(None, None, None)
                raise
        return self

    async def _open_store(self, store: Store) -> bool:
        """Open the store as its owner, or (a single-node store owned by another process, `standby=True`) as a
        standby: True for a standby."""
        if store.shared or not self._standby_ok or not isinstance(store, SqliteStore):  # (standbys: SQLite)
            await store.open(owner=True, owner_id=self._owner)  # raises StoreError for a second owner
            return False
        try:
            await store.open(owner=False, owner_id=self._owner)
        except StoreError:  # an older layout only an owner migrates, ...: as an owner, or its error
            await store.open(owner=True, owner_id=self._owner)
            return False
        try:
            return not await store.take_ownership(self._owner)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await store.close()
            raise

    async def _register_summaries(self, store: Store) -> None:
        """Write the summary of every registered version (once per fingerprint: the store keeps the first)."""
        for fingerprint, (name, program) in self._workflows.by_fingerprint.items():
            if await store.program(fingerprint) is None:
                await store.put_program(summary_of(name, program, self._workflows.input_of(program), drawn=True))

    @property
    def standby(self) -> bool:
        """Whether this Substrate is a standby now (another process owns its store; see the class)."""
        return self._outside is not None

    def _open_standby(self, store: Store, case_tg: TaskGroup) -> None:
        self._schedules.use(store)  # listed and paused through the store; run once this Substrate owns it
        self._queues.use(store)  # cases queued through the store; started once this Substrate owns it
        self._outside = Outside(store, self._workflows, self._max_payload, self._clock.now)
        self._standby_since = time.monotonic()
        watcher = EndWatcher(store, self._end_events)
        _log.info("store owned by another process; this Substrate is a standby", store=store.url)

        pause = TAKEOVER_EVERY  # between two looks: longer after each takeover a store fault stopped

        async def tick() -> None:
            nonlocal pause
            if time.monotonic() - self._standby_since < pause or self._phase != "open":
                return
            self._standby_since = time.monotonic()
            try:
                owned = await store.take_ownership(self._owner)
            except StoreError as exc:  # the file busy past its timeout, a full disk: still a standby, tries again
                pause = min(pause * 2, TAKEOVER_RETRY_MOST)
                _log.warning("could not take ownership of the store; still a standby, trying again", store=store.url,
                             error=str(exc), retry_in=pause)
                return
            pause = TAKEOVER_EVERY
            if owned:
                _log.info("the owner of the store has ended; this Substrate owns it now", store=store.url)
                await self._open_durable(store, case_tg, taking_over=True)
                self._outside = None  # (calls made meanwhile went through the store: the owner takes them)
                for event in self._end_events.values():  # awaiters re-read their rows: an owner now wakes them
                    event.set()
                self._end_events.clear()
                raise _Owned

        async def watch() -> None:
            with contextlib.suppress(_Owned):
                await watcher.run(tick)

        case_tg.start_soon(watch)

    async def _open_durable(self, store: Store, case_tg: TaskGroup, *, taking_over: bool = False) -> None:
        """Run as the store's owner: its cases, and the loops beside them. `taking_over`: a standby that has just
        taken ownership, whose process a store fault must not end (the recovery of live cases is tried again)."""
        shared = self._shared
        assert shared is not None
        shared.max_payload_bytes = self._max_payload
        shared.lease = self._lease
        clock = None
        if store.shared and type(self._clock) is RealClock:  # acceptance and due times in database time
            clock = self._clock = shared.clock = DatabaseClock()
        loader = self._loader = CaseLoader(
            store, self._workflows, self._cases, self._clock, owner=self._owner, lease=self._lease,
            case_level=self._case_level(), max_instances=self._max_instances, redact=self._redact,
            actor_for=self._actor, spawn=self._spawn, counts=self._counts, busy=self._busy,
            is_open=lambda: self._phase == "open",
        )
        loader.ended_here = lambda case_id: self._ended_elsewhere({case_id})
        lost = LostChildren(self, store, case_tg.start_soon)  # cancels of children a dead process did not send
        if store.shared:
            node = self._node = Node(store, self._lease, clock, loader.taken, loader.recheck, store.lease_seconds)
            node.took_over = lost.look  # (the parents taken over may have lost their children's cancels)
            await node.renew()
            case_tg.start_soon(node.lease_loop)
            case_tg.start_soon(node.takeover_loop)
        router = self._router = InboxRouter(store, loader, self._live, self._max_payload)
        router.lifecycle = self._lifecycle_input
        router.cancel_requeued = lambda row, reason, request_id, done: cancel_requeued(
            store, row, reason, request_id, self._clock.now(), done)
        background = self._background = Background(
            store, self._clock.now, self._clock.sleep, self._clock.deadline_scope, loader.held, loader.load_quietly,
            router.take, self._busy,
        )

        def left_memory(actor: CaseActor) -> None:
            loader.left_memory(actor)
            dues = [due for _, due in actor.armed.values()]
            if actor.deadline is not None:
                dues.append(actor.deadline)
            if dues:
                background.wake(min(dues))  # its timers are now the due loop's to watch

        # What a case actor tells the Substrate (it parks, waits on effects, leaves memory), in place before the
        # first actor runs: a case recovered, taken over or claimed below parks while the others are loaded, and
        # one that parked on an effect with no `on_effect_wait` never recorded its row (nor its update answers).
        shared.on_evict = left_memory
        shared.compact_after = self._compact_after
        shared.on_effect_wait = loader.waits_on_effects
        case_tg.start_soon(loader.effect_rows)
        if self._evict_after is not None:
            shared.on_park = loader.parked_now
            case_tg.start_soon(loader.evict_loop, self._evict_after)
        loader.recovering = self._recovering
        try:
            await self._recover(loader)
        except StoreError as exc:
            if not taking_over:
                raise
            _log.warning("could not list the live cases to resume; trying again shortly", error=str(exc))
            case_tg.start_soon(self._recover_later, loader)
        lost.look()
        self._busy(1)  # until its first pass is done (see `check_versions`)
        case_tg.start_soon(loader.check_versions)
        case_tg.start_soon(loader.sweep_loop)
        case_tg.start_soon(background.due_loop)
        if store.shared:
            case_tg.start_soon(background.changes_loop, loader.claim_queued, self._changed_elsewhere)
        else:  # cases started by a standby or a client are queued for this owner
            case_tg.start_soon(background.changes_loop, loader.claim_queued)
        self._schedules.use(store)
        if self._schedules.by_name:
            case_tg.start_soon(self._schedules.run)
        self._queues.use(store)
        if self._queues.queues:
            case_tg.start_soon(self._queues.run)

    async def _recover(self, loader: CaseLoader) -> None:
        """Resume the live cases (running, or with effects in flight) not in memory; a poison case is not."""
        assert self._store is not None
        for row in await self._store.live():
            if await self._recovering(row):
                await loader.load_quietly(row.case_id)

    async def _recover_later(self, loader: CaseLoader) -> None:
        """`_recover`, tried again (backing off) until the store answers."""
        delay = TAKEOVER_EVERY
        while True:
            await anyio.sleep(delay)
            try:
                await self._recover(loader)
                return
            except StoreError as exc:
                delay = min(delay * 2, TAKEOVER_RETRY_MOST)
                _log.warning("could not list the live cases to resume; trying again", error=str(exc), retry_in=delay)

    async def _recovering(self, row: CaseRow) -> bool:
        """Count one more recovery of a live case, at startup or at a takeover; False: it is suspended as a poison
        case (see `_lifecycle.recovering`)."""
        assert self._store is not None
        try:
            return await lifecycle.recovering(self._store, row, self._max_recoveries, self._redact)
        except StoreError as exc:  # counting failed: recovered anyway (never kept back by a passing fault)
            _log.warning("could not count a recovery", case_id=row.case_id, error=str(exc))
            return True

    # -- many nodes (a shared store) ---------------------------------------------------------------------------

    def _changed_elsewhere(self, case_ids: set[str] | None) -> None:
        """Cases that ended on other nodes, or that another node or a client deleted (NOTIFY): an ended copy kept
        in memory here is stale either way (deleted, or re-opened by a retry and ended again there), so it leaves
        memory and reads go to the store; then their awaiters wake. None (some notices were missed: the listener
        reconnected): every ended copy kept here may be stale, so all of them leave memory."""
        for case_id in list(self._cases) if case_ids is None else case_ids:
            actor = self._cases.get(case_id)
            if actor is not None and actor.journal is not None and actor.state in FINAL and actor.recorded:
                del self._cases[case_id]
        self._ended_elsewhere(case_ids)

    def _ended_elsewhere(self, case_ids: set[str] | None) -> None:
        """Cases that ended on other nodes: wake their awaiters here (None: some were missed: wake them all).
        Every ENDED_POLL seconds all of them wake and re-read their rows: a LISTEN connection lost without a word
        (no RST) misses `end`s and nobody would say so."""
        events = self._end_events
        now = time.monotonic()
        if case_ids is None or (events and now >= self._ended_poll_at):
            case_ids = None
            self._ended_poll_at = now + ENDED_POLL
        for case_id in list(events) if case_ids is None else case_ids & events.keys():
            events.pop(case_id).set()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        if self._phase == "closed":
            return None
        self._phase = "closed"
        for event in self._end_events.values():  # awaiters of cases not in memory: SubstrateClosed
            event.set()
        assert self._root is not None
        assert self._case_tg is not None
        assert self._hub is not None
        cancelled_before = self._counts["cancelled"]
        try:
            self._case_tg.cancel_scope.cancel()
            watchdog = anyio.CancelScope()
            self._root.start_soon(self._report_stragglers, watchdog)
            try:
                await self._case_tg.__aexit__(None, None, None)
            finally:
                watchdog.cancel()
        finally:
            self._hub.close()
            with anyio.move_on_after(self._shutdown_timeout, shield=True):
                await self._hub.finished.wait()
            self._root.cancel_scope.cancel()
            await self._root.__aexit__(None, None, None)
            if self._detach_clock is not None:
                self._detach_clock()
            if self._store is not None:
                with anyio.CancelScope(shield=True):
                    await self._store.close()
        if self._counts["cancelled"] > cancelled_before:
            cancelled = self._counts["cancelled"] - cancelled_before
            _log.info("substrate closed; live cases were cancelled", cancelled=cancelled)
        return None

    async def _report_stragglers(self, scope: anyio.CancelScope) -> None:
        """At shutdown: after `shutdown_timeout`, name the effects that ignore cancellation (we keep waiting)."""
        with scope:
            await anyio.sleep(self._shutdown_timeout)
            stragglers = [
                f"{actor.case_id}: effect {req.name!r} at {req.path}"
                for actor in self._cases.values()
                for req in actor.running_effects.values()
            ]
            if stragglers:
                _log.warning(
                    "substrate closing: effects still running after shutdown_timeout ignore cancellation; "
                    "waiting for them (leaving leaves no task behind)",
                    shutdown_timeout=self._shutdown_timeout,
                    effects=stragglers,
                )

    def _check_open(self, what: str) -> None:
        if self._phase != "open":
            raise SubstrateClosed(what)

    def _busy(self, n: int) -> None:
        if self._shared is not None:
            self._shared.busy += n

    # -- starting cases ------------------------------------------------------------------------------------

    async def new_case(
        self,
        workflow: str | Term,
        data: Mapping[str, Any] | BaseModel | None = None,
        *,
        case_id: str | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 - the case's own deadline, not this call's
        scheduler: str | Scheduler = "deterministic",
        placement: str = "here",
        tags: Mapping[str, str] | None = None,
        queue: str | None = None,
        priority: int = 0,
        dedup: str | None = None,
        partition: str | None = None,
        delay: float | None = None,
        _parent: str | None = None,  # `start_case`: the case starting this one (see `_children`)
        _cancel_with_parent: bool = False,  # `start_case`: the parent waits for it and cancels it on withdrawal
        _parent_step: dict[str, Any] | None = None,  # and the parent's step that does ({"effect_id", "path"})
        _waited: bool = False,  # `start_case(wait=True)`: the parent waits for its end (deleted with the parent)
        _sent: Mapping[str, Any] | None = None,  # a queued start: the data its caller sent (`data`: the model's dump)
        _from_queue: bool = False,  # the start of a queue item this node claimed (the one start its id may have)
        _schedule: str | None = None,  # a schedule's slot: refused while that schedule is paused (SchedulePaused)
    ) -> CaseHandle:
        """Start a case of `workflow` (a registered name, or a term) with `data`; returns its handle.

        With a store the workflow must be registered, the data must be JSON, and the call returns once the case's
        `start` record is durable. `scheduler`: "deterministic" (the default) or `Seeded(seed)` (recorded, so a
        replay makes the same choices). `placement="any"` (a shared store): the case is queued for the first node
        that claims it (one that has its version registered); the handle follows it wherever it runs. `tags`: str
        to str, at most 16, to find the case by (`cases(tags=...)`); kept in its `start` record and its status.
        `queue=`: the case waits in state `queued` until that queue has room (`priority`: lower first; `dedup`: a
        key no other live case of the queue may hold; `partition`: the key a partitioned queue limits by; `delay`:
        seconds it waits at least); see the README, Queues.
        """
        self._check_open("start a case")
        if case_id is not None:
            case_id = inputs.check_case_id(case_id)
        case_tags = inputs.tags(tags, case_id)
        wait_for = check_queued(self._queues.queues, queue, priority, dedup, partition, delay)
        if placement not in ("here", "any"):
            raise ValueError(f"placement must be 'here' (this Substrate runs the case) or 'any', got {placement!r}")
        if placement == "any" and (self._store is None or not self._store.shared):
            raise ValueError(
                "placement='any' queues a case for any node of a shared store (store='postgresql://...'); this "
                "Substrate has no shared store: start the case here (the default placement)"
            )
        if timeout is not None:
            _positive(timeout, "timeout", allow_none=True)
        seed = None if scheduler == "deterministic" else self._seed_of(scheduler)
        program, name = self._program(workflow)
        model = self._workflows.input_of(program)
        start_data = inputs.start_data(data, model, name, case_id) if data is not None or model else None
        durable = self._store is not None
        sent = self._as_sent(data, model, _sent) if durable else None
        try:
            case_id = self._new_id(case_id)
        except CaseExists:
            assert isinstance(case_id, str)
            if not durable:
                return self._same_in_memory(case_id, program, name, start_data, model)
            if not await self._deleted_elsewhere(case_id):
                return await self._same_start(case_id, name, start_data, sent, model)
        if durable:
            start_data, _ = as_journaled(start_data or {}, "data", self._max_payload)
        elif queue is None and self._queues.queues and not _from_queue:
            known = self._queues.item(case_id)  # (one claimed is on its way: its case is not in memory yet)
            if known is not None and known.state in ("queued", "started", "cancelled"):
                return self._same_queued(known, name, {"data": start_data}, model)
        now = self._clock.now()
        if queue is not None:
            if name is None:
                assert not isinstance(workflow, str)
                self._queued_terms[case_id] = workflow
            item = QueueItem(
                case_id, queue, partition, priority, dedup,
                queued_start(name, start_data, timeout, seed, case_tags, _parent, _cancel_with_parent, sent,
                             _parent_step, _waited),
                now + wait_for, now,
            )
            return await self._enqueue(item, model, _schedule)
        deadline = None if timeout is None else now + timeout
        if self._outside is not None:  # a standby: the owner runs it
            assert name is not None
            await self._outside.start(name, program.fingerprint, start_data, case_id, deadline, seed,
                                      tags=case_tags, sent=sent, model=model)
            return CaseHandle(self, None, case_id)
        level = self._case_level()
        machine = Machine(
            program, start_data, scheduler=None if seed is None else Seeded(seed), trace_level=level,
            case_id=case_id, max_instances=self._max_instances, workflow=name,
        )
        actor = self._actor(case_id, machine, now, deadline, name, level)
        actor.tags = case_tags or None
        actor.parent = _parent
        if not durable:  # what a start repeated with its id is compared with (a durable case: its start record)
            actor.start = {"workflow": _workflow_of(program, name), "data": dict(start_data or {})}
        if durable:
            assert self._loader is not None
            assert name is not None
            queued = placement == "any"
            if await self._joined(case_id):  # another call of this Substrate wrote this id's start meanwhile
                return await self._same_start(case_id, name, start_data, sent, model)
            written = anyio.Event()
            self._starting[case_id] = ({"workflow": name, "data": start_data or {}, "sent": sent}, written)
            try:
                await self._loader.start(actor, name, program.fingerprint, start_data, seed, deadline, queued=queued,
                                         cancel_with_parent=_cancel_with_parent, sent=sent,
                                         parent_step=_parent_step, from_queue=_from_queue, waited=_waited,
                                         schedule=_schedule)
            except Existing as same:  # started by an earlier call with the same workflow and data
                return CaseHandle(self, same.actor, case_id)
            except CaseExists:  # an earlier run's case has this id: the same start, or CaseExists naming what differs
                self._starting.pop(case_id, None)
                written.set()
                return await self._same_start(case_id, name, start_data, sent, model)
            finally:
                if self._starting.get(case_id, (None, None))[1] is written:
                    del self._starting[case_id]
                written.set()
            if queued:
                return CaseHandle(self, None, case_id)
        self._spawn(actor)
        if _parent is not None and not durable:  # (a durable child is found through the store's parent index)
            self._children.setdefault(_parent, []).append(case_id)
            if _waited:  # (`delete` of its parent reads it: a durable child's row says it)
                actor.waited = "cancel" if _parent_step is not None else "abandon"
        return CaseHandle(self, actor)

    async def _deleted_elsewhere(self, case_id: str) -> bool:
        """Whether an ended case kept in memory here is no longer what the store holds under its id (another node,
        a standby, a client or the command deleted it, and perhaps started its id again): it leaves memory, so
        its id starts a new case, and inputs and awaiters reach the store's case, rather than the deleted run."""
        return self._loader is not None and await self._loader.stale_end(case_id)

    async def _joined(self, case_id: str) -> bool:
        """Wait for the calls of this Substrate that are writing a start with this case id (a queued start is not in
        memory, so two of them could both be in flight): True once one of them wrote it, False if none did."""
        assert self._store is not None
        waited = False
        while (first := self._starting.get(case_id)) is not None:
            await first[1].wait()
            waited = True
        return waited and await self._store.row(case_id) is not None

    def _as_sent(
        self, data: object, model: type[BaseModel] | None, queued: Mapping[str, Any] | None
    ) -> dict[str, Any] | None:
        """The start data as its caller sent it, as JSON, where the input `model` makes the case start with other
        data (its dump): kept in the start record so that a retry with the same data is the same start, whichever
        door takes it. None where there is no model, or the data sent is not JSON (a retry compares dumps)."""
        if queued is not None:  # dequeued: the data sent to the queue (its `data` is the model's dump already)
            return dict(queued)
        if model is None:
            return None
        sent = data.model_dump(mode="json") if isinstance(data, BaseModel) else {} if data is None else data
        try:
            journaled, _ = as_journaled(sent, "data", self._max_payload)
        except (TypeError, ValueError):
            return None
        return journaled if isinstance(journaled, dict) else None

    async def _same_start(
        self, case_id: str, name: str | None, data: Mapping[str, Any] | None, sent: Mapping[str, Any] | None,
        model: type[BaseModel] | None,
    ) -> CaseHandle:
        """A start repeated with the id of an existing durable case: its handle if it is the same start (nothing is
        written), else CaseExists naming what differs. `sent`: the data as the caller sent it, where the input
        `model` gave `data` (see `_outside.start_differs`)."""
        assert self._store is not None
        journaled, _ = as_journaled(dict(data or {}), "data", self._max_payload)
        asked = {"data": journaled} if sent is None else {"data": journaled, "sent": dict(sent)}
        starting = self._starting.get(case_id)
        if starting is not None:  # another call is writing its start record now
            start_differs(case_id, starting[0], name, asked, model)
        else:
            await same_start(self._store, case_id, name, asked, model)
        actor = self._cases.get(case_id)
        return CaseHandle(self, actor) if actor is not None else CaseHandle(self, None, case_id)

    def _same_in_memory(
        self, case_id: str, program: Program, name: str | None, data: Mapping[str, Any] | None,
        model: type[BaseModel] | None,
    ) -> CaseHandle:
        """Without a store: a start repeated with the id of a case in memory is that case if it is the same start
        (the same workflow and equal start data: the durable stores' rule, `start_differs`), else CaseExists naming
        what differs."""
        actor = self._cases[case_id]
        if actor.start is None:  # (a case brought back from a store: never here without one)
            raise CaseExists(case_id)
        start_differs(case_id, actor.start, _workflow_of(program, name), {"data": dict(data or {})}, model)
        return CaseHandle(self, actor)

    def handle(self, case_id: str) -> CaseHandle:
        """A handle to an existing case (CaseNotFound if there is none): in memory, or in the store."""
        self._check_open("get a case's handle")
        case_id = inputs.check_case_id(case_id, new=False)
        actor = self._cases.get(case_id)
        if actor is not None and not actor.evicted:
            return CaseHandle(self, actor)
        if self._store is None or self._row_now(case_id) is None:
            raise CaseNotFound(case_id)
        return CaseHandle(self, None, case_id)

    # -- schedules ---------------------------------------------------------------------------------------------

    def _check_schedules(self, schedules: Sequence[Schedule]) -> Schedules:
        if isinstance(schedules, Schedule) or not isinstance(schedules, Sequence):
            raise TypeError("schedules must be a sequence of wfsub.Schedule, e.g. schedules=[Schedule(...)]")
        seen: set[str] = set()
        for s in schedules:
            if not isinstance(s, Schedule):
                raise TypeError(f"schedules lists {s!r}, which is not a wfsub.Schedule")
            if s.name in seen:
                raise ValueError(f"schedules lists two schedules named {s.name!r}: give each its own name")
            seen.add(s.name)
            self._workflows.newest(s.workflow)  # WorkflowNotRegistered, naming the registered ones
            if s.queue is not None:
                check_queued(self._queues.queues, s.queue, 0, None, None, None)
        return Schedules(
            list(schedules), now=lambda: self._clock.now(), sleep=lambda t: self._clock.sleep(t), busy=self._busy,
            start=self._start_slot, live=self._is_live,
        )

    async def _start_slot(self, schedule: Schedule, slot: float, case_id: str) -> CaseHandle:
        """The case of a schedule's slot: refused (SchedulePaused) if the schedule is paused when it is written."""
        return await self._start_scheduled(schedule, slot, case_id, paused_refuses=True)

    async def _start_scheduled(
        self, schedule: Schedule, slot: float, case_id: str, *, paused_refuses: bool = False
    ) -> CaseHandle:
        return await self.new_case(schedule.workflow, schedule.data_for(slot), case_id=case_id, queue=schedule.queue,
                                   _schedule=schedule.name if paused_refuses else None)

    def _is_live(self, case_id: str) -> bool:
        try:
            return self.status(case_id).state not in FINAL
        except CaseNotFound:
            return False

    async def schedules(self) -> list[ScheduleStatus]:
        """The configured schedules, each with its last slot and case, whether it is paused, and its next slot."""
        self._check_open("list schedules")
        return await self._schedules.statuses()

    async def pause_schedule(self, name: str) -> None:
        """Stop schedule `name` from starting cases (on every node sharing the store) until `resume_schedule`."""
        self._check_open("pause a schedule")
        await self._schedules.pause(name, True)

    async def resume_schedule(self, name: str) -> None:
        """Let a paused schedule start cases again, from its next slot (the slots passed meanwhile are let go)."""
        self._check_open("resume a schedule")
        await self._schedules.pause(name, False)

    async def trigger_schedule(self, name: str) -> CaseHandle:
        """Start schedule `name`'s workflow now, with id `{name}@{now}` (paused or not; not counted as a slot);
        CaseExists when a case of that id (a trigger or a slot in the same second) exists."""
        self._check_open("trigger a schedule")
        schedule = self._schedules.get(name)
        now = float(math.floor(self._clock.now()))
        case_id = schedule.case_id(now)
        try:  # a second trigger in one second would be the same start, answered with the first: say so instead
            self.status(case_id)
        except CaseNotFound:
            return await self._start_scheduled(schedule, now, case_id)
        raise CaseExists.triggered(case_id, name)

    async def backfill_schedule(self, name: str, start: datetime | float, end: datetime | float) -> list[CaseHandle]:
        """Start one case per slot of schedule `name` from `start` to `end` (both included: aware datetimes or
        seconds since the epoch, in the past), each with its slot's usual id `{name}@{slot}`, so a repeated
        backfill starts nothing twice (a slot's case that exists is that case); paused or not. Returns their
        handles, oldest slot first. ValueError for an unknown schedule, an end before the start or after now, or
        more than 1000 slots (split the range); TypeError for a naive datetime."""
        self._check_open("backfill a schedule")
        schedule = self._schedules.get(name)
        slots = backfill_slots(schedule.name, schedule.cron, schedule.every, schedule.tz, start, end,
                               self._clock.now())
        return [await self._backfill_slot(schedule, slot) for slot in slots]

    async def _backfill_slot(self, schedule: Schedule, slot: float) -> CaseHandle:
        case_id = schedule.case_id(slot)
        actor = self._cases.get(case_id) if self._store is None else None
        if actor is not None:  # (without a store the slot's case in memory is that case: its data is the slot's)
            return CaseHandle(self, actor)
        return await self._start_scheduled(schedule, slot, case_id)

    # -- queues --------------------------------------------------------------------------------------------------

    async def _enqueue(self, item: QueueItem, model: type[BaseModel] | None, schedule: str | None = None) -> CaseHandle:
        try:
            await self._queues.put(item, schedule)
        except CaseExists as exc:
            self._queued_terms.pop(item.case_id, None)
            if exc.differs is not None:  # a dedup key held by a live case of the queue
                raise
            known = self._queues.item(item.case_id)
            if known is not None:  # the same start again (a schedule's slot on two nodes): that case
                return self._same_queued(known, item.start["workflow"], item.start, model)
            if self._store is None:
                raise
            return await self._same_start(item.case_id, item.start["workflow"], item.start["data"],
                                          item.start.get("sent"), model)
        return CaseHandle(self, None, item.case_id)

    def _same_queued(
        self, known: QueueItem, workflow: str | None, asked: Mapping[str, Any], model: type[BaseModel] | None
    ) -> CaseHandle:
        """A start repeated with the id of a case started on a queue (`asked`: as a start record has it): its
        handle if it is the same start, else CaseExists naming what differs."""
        start_differs(known.case_id, known.start, workflow, asked, model)
        return CaseHandle(self, self._cases.get(known.case_id), known.case_id)

    async def _start_queued(self, item: QueueItem) -> None:
        start = item.start
        if start.get(RETRIED) is not None:  # a retried case back from its queue: it goes on from its retry record
            assert self._loader is not None  # (a case is retried on a store only)
            await self._loader.load(item.case_id)
            return
        workflow: str | Term = start["workflow"] if start["workflow"] is not None else self._queued_terms.pop(
            item.case_id)
        seed = start.get("seed")
        await self.new_case(
            workflow, start.get("data"), case_id=item.case_id, timeout=start.get("timeout"),
            scheduler="deterministic" if seed is None else Seeded(seed), tags=start.get("tags"),
            _parent=start.get("parent"), _cancel_with_parent=bool(start.get("cancel_with_parent")),
            _parent_step=parent_step_of(start), _waited=bool(start.get("waited")),
            _sent=start.get("sent"), _from_queue=True,
        )
        step, parent = parent_step_of(start), start.get("parent")
        if step is not None and isinstance(parent, str):
            await started_from_queue(self, item.case_id, parent, step)

    def _written(self, case_id: str) -> bool:
        """Whether a case has been started (in memory here, or its row in the store)."""
        return case_id in self._cases or (self._store is not None and self._row_now(case_id) is not None)

    def _memory_ended(self, case_id: str) -> bool | None:
        """Without a store: whether a case has ended (None: it is not in memory)."""
        actor = self._cases.get(case_id)
        return None if actor is None else actor.state in FINAL

    def _queued_status(self, item: QueueItem) -> CaseStatus:
        return queued_status(item)

    def _with_queue(self, status: CaseStatus) -> CaseStatus:
        """A case's status with what its queue item says (when it started on a queue, or ended there)."""
        if not self._queues.queues:
            return status
        try:
            item = self._queues.item(status.case_id)
        except StoreError as exc:  # the store is away: a case in memory still answers, without its queue's fields
            _log.warning("cannot read a case's queue item; its status shows it without", case_id=status.case_id,
                         error=str(exc))
            return status
        return with_item(status, item)

    def _seed_of(self, scheduler: object) -> int | None:
        if scheduler == "deterministic":
            return None
        if isinstance(scheduler, Seeded):
            return scheduler.seed
        raise TypeError(
            f"scheduler must be 'deterministic' or Seeded(seed) (from wfsub.lowlevel), got {scheduler!r}"
        )

    def _new_id(self, case_id: object) -> str:
        if case_id is None:
            new = f"case-{self._prefix}-{next(self._ids)}"
            while new in self._cases:
                new = f"case-{self._prefix}-{next(self._ids)}"
            return new
        case_id = inputs.check_case_id(case_id)
        if case_id in self._cases:
            raise CaseExists(case_id)
        return case_id

    def _case_level(self) -> str:
        return self._level if self._sinks else "none"

    def _actor(
        self, case_id: str, machine: Machine, now: float, deadline: float | None, name: str | None,
        level: str | None = None,
    ) -> CaseActor:
        shared = self._shared
        assert shared is not None
        level = self._case_level() if level is None else level
        return CaseActor(case_id, machine, shared, now, level=level, deadline=deadline, workflow=name)

    def _spawn(self, actor: CaseActor) -> None:
        shared = self._shared
        assert shared is not None
        assert self._case_tg is not None
        if actor.journal is None:
            actor.order = next(self._orders)
        self._cases[actor.case_id] = actor
        self._counts["started"] += 1
        self._counts["live"] += 1
        shared.busy += 1
        self._case_tg.start_soon(actor.run)

    def _program(self, workflow: str | Term) -> tuple[Program, str | None]:
        """The program a case starts on, and the registered name it starts from (None: a term not registered)."""
        if isinstance(workflow, str):
            return self._workflows.newest(workflow), workflow
        if not isinstance(workflow, Term):
            raise TypeError(
                f"new_case takes a registered workflow name or a workflow term built with wfsub's constructors "
                f"(seq, par, task, ...), got {type(workflow).__name__}"
            )
        programs = self._programs
        program = programs.get(workflow)
        if program is None:
            program = self._workflows.compile(workflow)  # raises InvalidWorkflow
            if len(programs) >= PROGRAM_CACHE_SIZE:
                del programs[next(iter(programs))]
            programs[workflow] = program
        name = self._workflows.name_of(program)
        if self._store is not None and name is None:
            raise WorkflowNotRegistered(repr(workflow)[:80], self._workflows.names)
        return program, name

    # -- finding cases (in memory, else in the store) ---------------------------------------------------------

    def _get(self, case_id: str) -> CaseActor:
        case_id = inputs.check_case_id(case_id, new=False)
        actor = self._cases.get(case_id)
        if actor is None:
            raise CaseNotFound(case_id)
        return actor

    async def _live(self, case_id: str, what: str) -> CaseActor:
        """The case's actor, loaded from the store if it is parked there (raises for an unknown or ended case)."""
        self._check_open(what)
        case_id = inputs.check_case_id(case_id, new=False)
        actor = self._cases.get(case_id)
        if actor is not None and not (actor.state in FINAL and await self._deleted_elsewhere(case_id)):
            return actor
        if self._outside is not None:  # a standby: checked against the store, then through the inbox
            row = await self._outside.row(case_id)
            if CaseState(row.state).ended:
                raise SignalRejected.ended(case_id, what, row.state)
            raise Remote(row)
        if self._loader is None:
            item = self._queues.item(case_id) if self._queues.queues else None
            if item is not None and item.state == "cancelled":  # (without a store: ended in its queue)
                raise SignalRejected.ended(case_id, what, "cancelled")
            raise CaseNotFound(case_id)
        return await self._loader.live(case_id, what)

    def _closed_or(self, exc: StoreError, what: str) -> WfsubError:
        """A read of the store that failed after the Substrate closed (and its store with it) is SubstrateClosed,
        not the store's advice to open it; any other failure is what it was."""
        return SubstrateClosed(what) if self._phase == "closed" else exc

    def _row_now(self, case_id: str) -> CaseRow | None:
        """A durable case's row, read on this thread (status, data and cases are synchronous)."""
        assert self._store is not None
        return self._store.read_row(case_id)

    # -- inputs ------------------------------------------------------------------------------------------------

    async def _applied(self, case_id: str, request_id: str | None, kind: str, what: str) -> bool:
        """Whether the case took the input of `kind` with `request_id`: a call repeated with that id answers as the
        first one did (SignalRejected when an input of another kind took the id). A case without a store keeps its
        ids itself; a durable one's are in its journal."""
        actor = self._cases.get(case_id)
        if actor is not None and actor.journal is None and self._store is None:
            return actor.retried(request_id, kind, what)
        return await applied(self._store, case_id, request_id, kind, what)

    async def signal(self, case_id: str, name: str, payload: Any = None, *, request_id: str | None = None) -> None:
        """Send signal `name` (with `payload`) to a case. With a store it returns once the signal is durable;
        `request_id` makes a retried call apply once."""
        case_id = inputs.check_case_id(case_id, new=False)
        msg = inputs.signal(name, payload, request_id, case_id)
        try:
            try:
                actor = await self._live(case_id, msg.what)
            except Remote as remote:
                await self._to_inbox(case_id, msg, remote.row)
                return
            await self._signal(actor, msg)
        except SignalRejected:
            if not await self._applied(case_id, msg.request_id, "signal", msg.what):
                raise
            # a retried call whose input was applied (it may have ended the case): answered as the first was

    async def update(
        self, case_id: str, name: str, payload: Any = None, *, request_id: str | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 (how long to wait for the answer; the update stays)
    ) -> Any:
        """Send update `name` (with `payload`) to a case and return its answer: what the wait that takes it
        answers with `reply=fn`, or a later `reply(name, fn)` step of that thread; None if that thread parks or
        ends without replying (or the case ends done first).

        Raises SignalRejected when the case refuses it (an unknown name, a payload that does not fit its model,
        a `check=` that says no: now, or when a wait takes it later), CaseFailed / CaseCancelled when the case
        fails or is cancelled before answering, TimeoutError after `timeout` seconds without an answer (the case
        keeps the update). A call repeated with the same `request_id` gets the first call's answer, also while
        the first is waiting and after a crash of the process that owned the case. A case that moves to another
        node while the call waits (a takeover) answers from there: the call reads the answer from its row."""
        _check_await_timeout(timeout)
        case_id = inputs.check_case_id(case_id, new=False)
        msg = inputs.update(name, payload, request_id, case_id)
        if timeout is None:
            return await self._update(case_id, msg, None)
        with self._clock.deadline_scope(timeout):
            return await self._update(case_id, msg, None)
        raise update_timeout(case_id, msg.name, timeout)

    async def _update(self, case_id: str, msg: Signal, actor: CaseActor | None) -> Any:
        uid = msg.request_id
        assert uid is not None
        if actor is None or actor.evicted:
            actor = self._cases.get(case_id)
        if actor is None:
            try:
                actor = await self._live(case_id, msg.what)
            except Remote as remote:
                assert self._store is not None
                outside = self._outside or Outside(self._store, self._workflows, self._max_payload, self._clock.now)
                return await outside.update(case_id, msg, remote.row)
            except SignalRejected:  # an ended case: a retried call gets what the first got
                row = await self._store.row(case_id) if self._store is not None else None
                if row is None or not await applied(self._store, case_id, uid, "update", msg.what):
                    raise
                found, value = row_result(row, msg.name, uid)
                if not found:
                    raise answer_gone(case_id, msg.name, uid, ANSWERS_KEPT) from None
                return value
        updates = of_actor(actor)
        journal = actor.journal
        while True:
            first = uid not in updates.pending and uid not in updates.answers
            if not (first and actor.retried(uid, "update", msg.what)):
                break
            commit = None if journal is None else journal.committing.get(uid)
            if commit is None:  # applied before: nothing is sent again
                break
            # Its first call gave up while its record was being committed: the commit decides. Written, the update
            # is applied (the vm owes its answer, or gave it); not written, the id is free and this call sends it.
            await commit.done.wait()
            if actor.fenced and commit.error is not None:
                raise commit.error
        waiter = updates.waiter(uid)
        if first and uid in actor.request_ids:  # applied before: nothing is sent again
            if waiter.answer is None and not (actor.machine is not None and actor.machine.owes(uid)):
                updates.pending.pop(uid, None)  # and its answer is no longer kept
                raise answer_gone(case_id, msg.name, uid, ANSWERS_KEPT)
        elif first:
            try:
                if actor.state in FINAL:
                    raise actor.ended_error(msg.what)
                inbox_id = await self._signal(actor, msg)
            except BaseException:
                if updates.pending.get(uid) is waiter:
                    del updates.pending[uid]
                raise
            if inbox_id is not None:  # the case moved to another owner before it took the update: sent there
                updates_moved(updates, uid)  # (and any other caller of this id reads the row too)
                return await self._answer_from_row(case_id, msg, inbox_id)
        await self._wait_answer(actor, waiter)
        assert waiter.answer is not None
        if waiter.answer[0] == MOVED:  # the case moved to another owner while we waited: its answer is there
            return await self._answer_from_row(case_id, msg, 0)
        return update_result(actor.case_id, msg.name, waiter.answer, actor.outcome)

    async def _wait_answer(self, actor: CaseActor, waiter: Pending) -> None:
        """Wait for an update's answer here. A case that left memory and is now another node's (taken over while
        it was evicted: no actor of this node will answer) is noticed by a look at its row every ENDED_POLL s."""
        while True:
            with anyio.move_on_after(ENDED_POLL):  # (real time, as the polls of the store)
                await waiter.event.wait()
            if waiter.event.is_set():
                return
            store = self._store
            if store is None or not store.shared or self._cases.get(actor.case_id) is not None:
                continue
            try:
                row = await store.row(actor.case_id)
            except StoreError as exc:  # (looked at again at the next poll)
                _log.warning("could not read the row of a case an update waits on", case_id=actor.case_id,
                             error=str(exc))
                continue
            if row is None or row.owner != self._owner:
                updates_moved(of_actor(actor))
                return

    async def _answer_from_row(self, case_id: str, msg: Signal, inbox_id: int) -> Any:
        """An update's answer read from its case's row, written by the owner the case moved to (`inbox_id`: the
        inbox row the update went to, whose refusal is raised; 0: none, the update was journaled before)."""
        assert self._store is not None
        assert msg.request_id is not None
        return await remote_answer(self._store, case_id, msg.name, msg.request_id, inbox_id)

    async def _signal(self, actor: CaseActor, msg: Signal) -> int | None:
        """A checked signal to a case in memory: the case's own check (`admit`), then into its mailbox. Returns
        the id of the inbox row it went to instead when the case has moved to another owner (else None)."""
        if self._phase != "open":
            raise SubstrateClosed("send a signal")
        if actor.evicted:  # a handle's actor that has left memory since
            try:
                actor = await self._live(actor.case_id, msg.what)
            except Remote as remote:  # another node's now (taken over meanwhile): through the inbox
                return await self._to_inbox(actor.case_id, msg, remote.row)
        machine = actor.machine
        if machine is None or actor.state in FINAL:
            raise actor.ended_error(msg.what)
        if actor.journal is None:  # unknown names, bad payloads: refused here
            if actor.retried(msg.request_id, "update" if msg.update else "signal", msg.what):
                return None  # a retried call: applied once already
            msg.payload = machine.check_update(msg.name, msg.payload) if msg.update else machine.check_signal(
                msg.name, msg.payload)  # (`admit` of a case in memory, inlined)
            await actor.send(msg)
            return None
        admit(msg, machine, self._max_payload)  # and the payload as its record gives it back, before any write
        msg.reply = Reply()
        return await self._ask(actor, msg)

    async def _to_inbox(self, case_id: str, msg: External, row: CaseRow) -> int:
        """An input for a case another process owns: checked against its version's summary, then into the store's
        inbox, acknowledged once committed (its owner is woken by the store and journals it; a refusal is marked
        on the inbox row). Returns the inbox row's id (0: a retried call whose input was applied)."""
        assert self._store is not None
        outside = self._outside or Outside(self._store, self._workflows, self._max_payload, self._clock.now)
        inbox_id = await outside.send(case_id, msg, row)
        actor = self._cases.get(case_id)
        if inbox_id and actor is not None:  # (taken over by this node meanwhile: its next input here reads it first)
            actor.inbox_ahead = True
        return inbox_id

    async def _ask(self, actor: CaseActor, msg: External) -> int | None:
        """Send an input and wait for its answer (committed and applied, or refused). Returns the id of the inbox
        row it went to instead when the case moved to another owner meanwhile (else None)."""
        reply = msg.reply
        assert reply is not None
        while True:
            try:
                if self._router is not None:  # what waits for the case in the inbox was acknowledged first
                    await self._router.ahead(actor)
                await actor.send(msg)
                break
            except CaseEvicted:  # it left memory after we found it: bring it back and send again
                try:
                    actor = await self._live(actor.case_id, msg.what)
                except Remote as remote:  # fenced: another node has it now: the input goes to it through the inbox
                    msg.reply = None
                    return await self._to_inbox(actor.case_id, msg, remote.row)
                if actor.machine is not None:  # brought back on another version, maybe: its own check again
                    admit(msg, actor.machine, self._max_payload)
        await reply.event.wait()
        if reply.error is not None:
            if actor.fenced and isinstance(reply.error, StoreConflict) and self._store is not None \
                    and self._store.shared:  # nothing was recorded: the case's owner takes it, through the inbox
                row = await self._store.row(actor.case_id)
                if row is None:
                    raise reply.error
                msg.reply = None
                return await self._to_inbox(actor.case_id, msg, row)
            raise reply.error
        return None

    async def cancel(
        self, case_id: str, compensate: bool = True, *, reason: str = "cancelled", request_id: str | None = None
    ) -> None:
        """Cancel a case: its work is withdrawn and its awaiters get CaseCancelled (carrying `reason`, also kept
        in its status and journal). No-op once ended.

        With `compensate` (the default) the active sagas compensate and the active scopes run their on_cancel
        first (innermost first), then the case ends cancelled; `compensate=False`, or a second cancel while it
        compensates, ends it at once. A suspended case (durable, no version can run it) ends at once.
        """
        self._check_open("cancel a case")
        case_id = inputs.check_case_id(case_id, new=False)
        msg = inputs.cancel(reason, compensate, request_id, case_id)
        if self._store is None and self._queues.queues and case_id not in self._cases:
            if await self._queues.cancel(case_id, msg.reason, msg.request_id) is not None:
                return  # it was queued: it never starts
            item = self._queues.item(case_id)
            if item is not None and item.state == "cancelled":
                raise SignalRejected.ended(case_id, msg.what, "cancelled")
        if case_id not in self._cases and self._store is not None:
            row = await self._store.row(case_id)
            if row is None:
                if await self._cancel_queued(case_id, msg):
                    return  # it was queued: it ended there, and never starts
                # (cancelled there meanwhile, or started from there: a claimed case's start is written after its
                # claim, so a cancel in between waits for that start and goes to the case)
                await self._left_queue(case_id)
                row = await self._store.row(case_id)
            mine = row is not None and (not self._store.shared or row.owner == self._owner)
            if row is not None and mine and self._loader is not None and row.state == CaseState.SUSPENDED.value:
                inputs.bounded_reason(msg, self._max_payload, case_id)
                await self._loader.end_suspended(row, msg.reason, msg.request_id)  # (else: the owner's inbox)
                return
            if row is not None and mine and self._loader is not None and row.state == CaseState.QUEUED.value:
                inputs.bounded_reason(msg, self._max_payload, case_id)  # a retried case waiting in its queue
                if await cancel_requeued(self._store, row, msg.reason, msg.request_id, self._clock.now()):
                    return  # it ended there
                row = await self._store.row(case_id)  # a node claimed it meanwhile: it starts, the cancel goes to it
            if row is not None and CaseState(row.state).ended:
                if await applied(self._store, case_id, msg.request_id, "cancel", msg.what):
                    return  # a retried cancel that was applied (and ended the case): what it returned first
                raise SignalRejected.ended(case_id, msg.what, row.state)
        try:
            actor = await self._live(case_id, msg.what)
        except Remote as remote:
            await self._to_inbox(case_id, msg, remote.row)
            return
        await self._cancel(actor, msg)

    async def _cancel_queued(self, case_id: str, msg: Cancel) -> bool:
        """Cancel a durable case that waits in its queue (True: it ended there); False when it does not wait there
        (no such item, or it has started: its cancel goes to the case)."""
        inputs.bounded_reason(msg, self._max_payload, case_id)

        def mine(name: str) -> str | None:  # (for a store that holds no version of it)
            versions = self._workflows.versions.get(name)
            return versions[-1].fingerprint if versions else None

        return await self._queues.cancel(case_id, msg.reason, msg.request_id, mine) is not None

    async def _cancel(self, actor: CaseActor, msg: Cancel) -> None:
        self._check_open("cancel a case")
        if actor.evicted:
            await self.cancel(actor.case_id, msg.compensate, reason=msg.reason, request_id=msg.request_id)
            return
        if actor.state in FINAL:
            if await self._applied(actor.case_id, msg.request_id, "cancel", msg.what):
                return  # a retried cancel that was applied (and ended the case): what it returned first
            raise actor.ended_error(msg.what)
        if actor.journal is None:
            if actor.retried(msg.request_id, "cancel", msg.what):
                return  # a retried cancel that was applied (the case may still be compensating): not sent again
            actor.post(msg)
            return
        inputs.bounded_reason(msg, self._max_payload, actor.case_id)  # (`admit` of a cancel: its reason's size)
        msg.reply = Reply()
        await self._ask(actor, msg)

    async def cancel_region(self, case_id: str, region: str, *, request_id: str | None = None) -> None:
        """Withdraw all work of the named region (a scope or a named mi) of a case, compensating what is inside."""
        await self._region(case_id, RegionAction.CANCEL, region, None, request_id)

    async def complete_region(self, case_id: str, region: str, *, request_id: str | None = None) -> None:
        """Close the named region now: an mi joins with the outputs so far; a scope continues after itself."""
        await self._region(case_id, RegionAction.COMPLETE, region, None, request_id)

    async def add_instances(
        self, case_id: str, region: str, items: Sequence[Any], *, request_id: str | None = None
    ) -> None:
        """Add one instance per item to the live dynamic mi `region` of a case."""
        await self._region(case_id, RegionAction.ADD_INSTANCES, region, items, request_id)

    async def close_instances(self, case_id: str, region: str, *, request_id: str | None = None) -> None:
        """Close the dynamic mi `region` of a case: it takes no more instances (its join fires once they end)."""
        await self._region(case_id, RegionAction.CLOSE_INSTANCES, region, None, request_id)

    async def _region(
        self, case_id: str, action: RegionAction, region: str, items: Sequence[Any] | None, request_id: str | None
    ) -> None:
        case_id = inputs.check_case_id(case_id, new=False)
        msg = inputs.region(action, region, items, request_id, case_id)
        try:
            try:
                actor = await self._live(case_id, msg.what)
            except Remote as remote:
                await self._to_inbox(case_id, msg, remote.row)
                return
            machine = actor.machine
            if machine is None or actor.state in FINAL:
                raise actor.ended_error(msg.what)
            admit(msg, machine, None if actor.journal is None else self._max_payload)  # before anything is queued
            msg.reply = Reply()
            await self._ask(actor, msg)
        except SignalRejected:
            if not await self._applied(case_id, msg.request_id, action.kind, msg.what):
                raise
            # a retried call whose input was applied (it may have ended the case): answered as the first was

    # -- outcomes -----------------------------------------------------------------------------------------------

    async def await_case(
        self, case_id: str, timeout: float | None = None, *, model: type[BaseModel] | None = None  # noqa: ASYNC109
    ) -> Any:
        """The case's final data (validated into `model` if given); raises CaseFailed, CaseCancelled, or
        TimeoutError when `timeout` passes first (the case goes on). `timeout=0` checks without waiting.

        A durable case that is not in memory (parked in the store, evicted) is not loaded to be awaited: the
        awaiter is woken when the case ends, wherever its next input brings it back."""
        _check_await_timeout(timeout)
        case_id = inputs.check_case_id(case_id, new=False)
        if self._store is not None and self._phase == "open":
            await self._deleted_elsewhere(case_id)  # an ended copy in memory: still in the store? (one row read)
        return _validated(case_id, await self._outcome(case_id, None, timeout), model)

    async def _left_queue(self, case_id: str) -> None:
        """A queued case: wait until it has started (CaseCancelled if it was cancelled while queued)."""
        if not self._queues.queues or case_id in self._cases:
            return
        item = self._queues.item(case_id)
        if item is None:
            return
        if item.state in ("queued", "started"):
            await self._queues.wait_moved(case_id, self._written)
            item = self._queues.item(case_id)
        if item is not None and item.state == "cancelled" and not self._written(case_id):
            raise CaseCancelled(case_id, IN_QUEUE)  # (with a store: ended as any case, its row says how)

    async def _outcome(self, case_id: str, actor: CaseActor | None, timeout: float | None) -> dict[str, Any]:  # noqa: ASYNC109
        if timeout is None:
            await self._left_queue(case_id)
            return await self._wait_end(case_id, actor, check_only=False)
        if timeout == 0:
            item = self._queues.item(case_id) if self._queues.queues and case_id not in self._cases else None
            if item is not None and item.state == "queued":
                raise TimeoutError(f"case {case_id!r} is queued on {item.queue!r}: it has not started yet")
            await self._left_queue(case_id)
            return await self._wait_end(case_id, actor, check_only=True)
        with self._clock.deadline_scope(timeout):
            await self._left_queue(case_id)
            return await self._wait_end(case_id, actor, check_only=False)
        raise TimeoutError(
            f"case {case_id!r} did not end within {timeout:g}s; it goes on running (await it again, or cancel it)"
        )

    async def _wait_end(self, case_id: str, actor: CaseActor | None, *, check_only: bool) -> dict[str, Any]:
        """The outcome once the case has ended: from its actor, or from the store when it is not in memory."""
        while True:
            if actor is None or actor.evicted:
                actor = self._cases.get(case_id)
            if actor is not None and not actor.evicted:
                if actor.exited:
                    return actor.outcome()  # raises CaseFailed / CaseCancelled / SubstrateClosed
                if check_only:  # ended: its outcome once its `end` record is written, not waiting for its effects
                    if actor.state not in FINAL:
                        raise TimeoutError(_not_ended(case_id))
                    if not actor.recorded:
                        if actor.on_recorded is None:
                            actor.on_recorded = anyio.Event()
                        await actor.on_recorded.wait()
                    return actor.outcome()
                if actor.done is None:
                    actor.done = anyio.Event()
                await actor.done.wait()
                continue  # ended, closed, or evicted: look again
            if self._store is None:
                raise CaseNotFound(case_id)
            row = await self._store.row(case_id)
            if row is None:
                raise CaseNotFound(case_id)
            if CaseState(row.state).ended:
                return _row_outcome(row)
            if check_only:
                raise TimeoutError(_not_ended(case_id))
            if self._phase != "open":
                raise SubstrateClosed(f"await case {case_id!r}: it stays live in the store; await it after re-opening")
            event = self._end_events.get(case_id)
            if event is None:
                event = self._end_events[case_id] = anyio.Event()
            if case_id in self._cases:
                continue  # brought back while the row was read
            await event.wait()

    def status(self, case_id: str) -> CaseStatus:
        """Where the case is: state, threads (`at`), waits, effects and timers in flight, times, failure, and the
        cases it started (`children`)."""
        try:
            return children_in(self, self._status(case_id))
        except StoreError as exc:
            raise self._closed_or(exc, f"read the status of case {case_id!r}") from exc

    def _status(self, case_id: str) -> CaseStatus:
        case_id = inputs.check_case_id(case_id, new=False)
        actor = self._cases.get(case_id)
        if actor is not None:
            return self._with_queue(actor.status())
        if self._store is not None:
            row = self._row_now(case_id)
            if row is not None:
                return self._with_queue(status_of(row, self._redact))
        if self._queues.queues:
            item = self._queues.item(case_id)
            if item is not None:
                return self._queued_status(item)
        return self._get(case_id).status()

    def data(self, case_id: str) -> dict[str, Any]:
        """A copy of the case's data now (the final data once it has ended)."""
        case_id = inputs.check_case_id(case_id, new=False)
        actor = self._cases.get(case_id)
        if actor is not None:
            return actor.data()
        if self._store is not None:
            try:
                row = self._row_now(case_id)
            except StoreError as exc:
                raise self._closed_or(exc, f"read the data of case {case_id!r}") from exc
            if row is not None:
                return dict(row.data or {})
        return self._get(case_id).data()

    def cases(
        self, *, state: str | None = None, workflow: str | None = None, limit: int = 100, before: int | None = None,
        tags: Mapping[str, str] | None = None, id_prefix: str | None = None, started_after: float | None = None,
        started_before: float | None = None, parent: str | None = None,
    ) -> list[CaseStatus]:
        """Cases newest first, at most `limit`, those that pass every filter given: `state`, `workflow` name,
        every pair of `tags`, `id_prefix` (the id starts with it), `started_after` < start time <= `started_before`,
        `parent` (the children a case started). Page with `before`: pass the `order` of the last case of the
        previous page. A case in memory is reported (and filtered by state) as it is now; one that is not, as the
        store last recorded it."""
        if state is not None and state not in CaseState.__members__.values():
            known = ", ".join(s.value for s in CaseState)
            raise ValueError(f"state must be one of {known} (or None), got {state!r}")
        filters = inputs.listing(limit=limit, before=before, tags_given=tags, id_prefix=id_prefix,
                                 started_after=started_after, started_before=started_before, parent=parent)
        queued = self._queued_listed(state, workflow, limit, before, filters)
        if len(queued) == limit or (state == CaseState.QUEUED.value and self._store is None):
            return queued  # (with a store, retried cases waiting in their queues follow: rows in state queued)
        limit -= len(queued)
        if before is not None and before > QUEUED_ORDER:
            before = None  # (the queued cases come first: the next page starts at the newest started case)
        return queued + self._started_listed(state, workflow, limit, before, filters)

    def _queued_listed(
        self, state: str | None, workflow: str | None, limit: int, before: int | None, filters: dict[str, Any]
    ) -> list[CaseStatus]:
        if not (self._queues.queues or self._store):
            return []
        return queued_page(lambda n, below: self._queues.items("queued", None, n, below), state, workflow, limit,
                           before, filters)

    def _started_listed(
        self, state: str | None, workflow: str | None, limit: int, before: int | None, filters: dict[str, Any]
    ) -> list[CaseStatus]:
        if self._store is None:
            found = []
            match = Listing(state, workflow, limit, before, **filters)
            for actor in reversed(self._cases.values()):
                if before is not None and actor.order >= before:
                    continue
                now = actor.status()
                row = CaseRow(now.case_id, actor.workflow or "", "", now.state.value, now.started_at or 0.0, 0.0,
                              tags=now.tags, parent=actor.parent)
                if match.matches(actor.order, row):
                    found.append(self._with_queue(now))
                    if len(found) == limit:
                        break
            return found
        store = self._store
        listed: list[CaseStatus] = []
        seen: set[str] = set()
        try:
            rows = store.read_cases(Listing(state, workflow, limit, before, **filters))
        except StoreError as exc:
            raise self._closed_or(exc, "list cases") from exc
        for row in rows:
            seen.add(row.case_id)
            live = self._cases.get(row.case_id)
            if live is None or live.exited or live.journal is None:
                listed.append(status_of(row, self._redact))
                continue
            live.journal.order = row.order
            now = live.status()
            if state is None or now.state == state:  # else it has moved on since its row was written
                listed.append(now)
        if state is not None:  # cases in memory in that state whose row has not caught up yet
            match = Listing(state, workflow, limit, None, **filters)
            for actor in list(self._cases.values()):
                j = actor.journal
                if (
                    j is None or actor.exited or actor.case_id in seen or actor.state.value != state
                    or not match.matches(0, CaseRow(actor.case_id, actor.workflow or "", "", state,
                                                    actor.started_at, 0.0, tags=dict(actor.tags or {}),
                                                    parent=actor.parent))
                ):
                    continue
                if not j.order:
                    stored = store.read_row(actor.case_id)
                    j.order = stored.order if stored is not None else 0
                if j.order and (before is None or j.order < before):
                    listed.append(actor.status())
            listed.sort(key=lambda status: -(status.order or 0))
        return [self._with_queue(status) for status in listed[:limit]]

    async def journal(self, case_id: str, *, newest: int | None = None) -> list[JournalRecord]:
        """Every record of a durable case's journal, in order (a Substrate without a store has none). `newest=N`:
        only its start record and the newest N records after it (the rest is read but not validated nor
        returned: what a view of a long journal needs)."""
        if self._store is None:
            raise ValueError("a Substrate without a store keeps no journal: pass store=... to make cases durable")
        case_id = inputs.check_case_id(case_id, new=False)
        try:
            records = await self._store.journal(case_id)
        except StoreError as exc:
            raise self._closed_or(exc, f"read the journal of case {case_id!r}") from exc
        if not records:
            raise CaseNotFound(case_id)
        return [JournalRecord.model_validate(r) for r in inputs.journal_part(records, newest)]

    async def prune(self, older_than: float) -> int:
        """Remove the cases that ended at least `older_than` seconds ago (never one without an `end`)."""
        if isinstance(older_than, bool) or not isinstance(older_than, int | float) or not math.isfinite(older_than):
            raise ValueError(f"older_than must be a number of seconds, got {older_than!r}")
        if older_than < 0:
            raise ValueError(f"older_than must be >= 0 seconds, got {older_than!r}")
        cutoff = self._clock.now() - older_than
        for case_id in list(self._ended):
            actor = self._cases.get(case_id)
            if actor is not None and actor.ended_at is not None and actor.ended_at <= cutoff:
                del self._cases[case_id]
        if self._store is None:
            return 0
        return await self._store.prune(cutoff)

    async def retry(self, case_id: str) -> CaseHandle:
        """Re-open a failed case at the step that failed: a `retry` record is journaled and that step runs again,
        on the case's version or the one it migrates to (so a fix registered since applies); an effect whose
        final outcome failed the case starts again. Also re-opens a case suspended after too many recoveries
        (`max_recoveries`). Returns its handle (`result()` waits for the next end).

        SignalRejected (with the reason) for a case that is not failed, or whose failure ran compensations."""
        self._check_open("retry a case")
        case_id = inputs.check_case_id(case_id, new=False)
        if self._outside is not None:  # a standby: the owner retries it
            await self._outside.lifecycle(case_id, "retry", {})
            return CaseHandle(self, None, case_id)
        return await self._retry(case_id, [])

    async def _retry(self, case_id: str, inbox_done: list[int]) -> CaseHandle:
        store, loader = self._owned_store("retry a case")
        actor = await self._settled(case_id)
        if actor is not None and actor.state not in FINAL and not actor.evicted:
            raise SignalRejected.not_retryable(case_id, actor.state.value)
        row = await store.row(case_id)
        if row is None:
            raise CaseNotFound(case_id)
        if store.shared and row.owner != self._owner:
            taken = await store.take_ended(case_id) if CaseState(row.state).ended else None
            if taken is None and CaseState(row.state).ended:  # another node took it since: say where it is now
                now = await store.row(case_id)
                if now is None:
                    raise CaseNotFound(case_id)
                row = now
                if not CaseState(row.state).ended:  # re-opened there already
                    raise SignalRejected.not_retryable(case_id, row.state)
                if inbox_done:  # a queued retry this node took as its owner's lease ran out: left to the owner now
                    raise Remote(row)
            if taken is None:  # a node whose lease is live owns it (its memory holds it): that node retries it
                raise SignalRejected.not_retryable(
                    case_id, row.state, f"node {row.owner!r} owns it: retry it there (a Client or `wfsub retry` "
                    "sends it there), or once that node has gone (its lease expired)"
                )
            row = taken
        record = lifecycle.retry_record(case_id, row, await store.journal(case_id), self._clock.now())
        item = store.read_queue_item(case_id)
        if item is not None and item.state in ("started", "ended"):  # it goes back through its queue
            return await self._retry_queued(store, row, record, item, inbox_done, actor)
        if actor is not None and self._cases.get(case_id) is actor:
            del self._cases[case_id]  # the ended run leaves memory first: from its retry on, reads see the store
        try:
            await lifecycle.reopen(store, row, record, inbox_done)
        except StoreConflict:  # a retry at the same time wrote its record first: this one finds it re-opened
            now = await store.row(case_id)
            if now is None:  # deleted meanwhile (the store refuses to write a case it no longer holds)
                raise CaseNotFound(case_id) from None
            raise SignalRejected.not_retryable(case_id, now.state) from None
        except CommitUnknown:  # re-opened or not, the store decides: the sweep brings it back if it runs again
            loader.bring_back(case_id)
            raise
        await loader.load(case_id)
        return self.handle(case_id)

    async def _retry_queued(
        self, store: Store, row: CaseRow, record: dict[str, Any], item: QueueItem, inbox_done: list[int],
        actor: CaseActor | None,
    ) -> CaseHandle:
        """Retry a case that started from a queue: it waits there again (see `_lifecycle.requeue`)."""
        case_id = row.case_id
        if item.queue not in self._queues.queues:
            raise SignalRejected.not_retryable(
                case_id, row.state, f"it started on queue {item.queue!r}, which this Substrate does not configure, "
                "and a retried case goes back through its queue: retry it from a Substrate with "
                f"queues={{{item.queue!r}: Queue(...)}}"
            )
        if actor is not None and self._cases.get(case_id) is actor:
            del self._cases[case_id]  # the ended run leaves memory first: from its retry on, reads see the store
        try:
            await lifecycle.requeue(store, row, record, item, inbox_done)
        except StoreConflict:  # a retry at the same time wrote its record first: this one finds it re-opened
            now = await store.row(case_id)
            if now is None:  # deleted meanwhile
                raise CaseNotFound(case_id) from None
            raise SignalRejected.not_retryable(case_id, now.state) from None
        self._queues.nudge()
        return self.handle(case_id)

    async def fork(self, case_id: str, *, at: int, new_case_id: str | None = None) -> CaseHandle:
        """Start a new case whose journal is the journal of `case_id` up to and including record `at` (its
        `start` names the origin: `status().forked_from`; it keeps the origin's tags), replayed, then live.
        ValueError for an `at` the journal does not hold (compaction may have removed it: the message names the
        first record still kept)."""
        self._check_open("fork a case")
        case_id = inputs.check_case_id(case_id, new=False)
        body = inputs.fork_body(at, new_case_id, case_id)
        if self._outside is not None:  # a standby: the owner forks it
            if new_case_id is None:
                body["new_case_id"] = new_case_id = f"case-{self._prefix}-{next(self._ids)}"
            await self._outside.lifecycle(case_id, "fork", body)
            return CaseHandle(self, None, new_case_id)
        return await self._fork(case_id, at, new_case_id, [])

    async def _fork(self, case_id: str, at: int, new_case_id: str | None, inbox_done: list[int]) -> CaseHandle:
        store, loader = self._owned_store("fork a case")
        new_id = self._new_id(new_case_id)
        origin = await store.row(case_id)
        if origin is None:
            raise CaseNotFound(case_id)
        now = self._clock.now()
        records = lifecycle.fork_records(case_id, await store.journal(case_id), at, new_id, now)
        row = lifecycle.fork_row(origin, new_id, int(records[-1]["seq"]), now)
        try:
            await store.write(CaseWrite(new_id, records, row, inbox_done=inbox_done))
        except CommitUnknown:  # started or not, the store decides: the sweep brings it back if it was
            loader.bring_back(new_id)
            raise
        except StoreConflict:
            if not lifecycle.same_fork(await store.journal(new_id), case_id, at):
                raise CaseExists(new_id) from None
            # the same fork repeated (after a CommitUnknown, say): answered with the case it started
            started = await store.row(new_id)
            if started is not None and CaseState(started.state).ended:
                return self.handle(new_id)
        await loader.load(new_id)
        return self.handle(new_id)

    async def _lifecycle_input(self, row: InboxRow) -> None:
        """A `retry`, `fork` or `backfill` someone else wrote to the inbox (the command, a client, a standby): done
        here, its inbox row taken out in the same write (a backfill's once its slots have started; a refusal is
        raised for the router to mark on the row)."""
        body = row.body if isinstance(row.body, dict) else {}
        if row.kind == "retry":
            await self._retry(row.case_id, [row.id])
        elif row.kind == "backfill":  # (a Client's or the command's: this Substrate has the schedule's data=)
            assert self._store is not None
            await self.backfill_schedule(body["schedule"], body["start"], body["end"])  # (KeyError: refused)
            await self._store.write(CaseWrite(row.case_id, inbox_done=[row.id]))
        else:
            checked = inputs.fork_body(body.get("at"), body.get("new_case_id"), row.case_id)
            await self._fork(row.case_id, checked["at"], checked.get("new_case_id"), [row.id])

    def _owned_store(self, what: str) -> tuple[Store, CaseLoader]:
        """The store and loader of an owning Substrate (retry and fork replay cases here, so they run here)."""
        if self._store is None:
            raise ValueError(f"cannot {what}: a Substrate without a store keeps no journal; pass store=...")
        if self._loader is None:
            raise ValueError(
                f"cannot {what} from a standby: the process that owns the store runs cases; call it there"
            )
        return self._store, self._loader

    async def _settled(self, case_id: str) -> CaseActor | None:
        """The case's actor in memory (None: none), once the `end` record of an ended one is written."""
        actor = self._cases.get(case_id)
        if actor is not None and actor.journal is not None and actor.state in FINAL and not actor.recorded:
            if actor.on_recorded is None:
                actor.on_recorded = anyio.Event()
            await actor.on_recorded.wait()
        return actor

    async def delete(self, case_id: str) -> None:
        """Remove an ended case at once: its journal, row, snapshots, tags and queue item (`await_case` then raises
        CaseNotFound; its id starts a new case), and the children it waited for (`start_case(wait=True)`; theirs
        too): an ended one goes with it, an abandoned one still running stays. CaseNotFound for no such case;
        SignalRejected for a case that has not ended, or a child cancelled with it that has not ended yet."""
        self._check_open("delete a case")
        case_id = inputs.check_case_id(case_id, new=False)
        actor = self._cases.get(case_id)
        if actor is not None and not actor.evicted:
            if actor.state not in FINAL:
                raise SignalRejected.not_ended(case_id, "be deleted", actor.state.value)
            if actor.journal is not None and not actor.recorded:  # its `end` record is being written
                if actor.on_recorded is None:
                    actor.on_recorded = anyio.Event()
                await actor.on_recorded.wait()
        if self._store is None or (actor is not None and actor.journal is None):
            item = self._queues.item(case_id) if self._queues.queues else None
            if case_id not in self._cases and (item is None or item.state != "cancelled"):
                raise CaseNotFound(case_id)
            for gone in [case_id, *self._waited_in_memory(case_id)]:
                self._cases.pop(gone, None)
                self._children.pop(gone, None)
                self._queues.forget(gone)  # (a store removes its item as it deletes the case)
            return
        row = await self._store.row(case_id)
        if row is None:
            self._cases.pop(case_id, None)
            raise CaseNotFound(case_id)
        if not CaseState(row.state).ended:
            raise SignalRejected.not_ended(case_id, "be deleted", row.state)
        for gone in await lifecycle.delete_ended(self._store, case_id):
            self._cases.pop(gone, None)

    def _waited_in_memory(self, case_id: str) -> list[str]:
        """Without a store: the children a case waited for that `delete` removes with it (see
        `_lifecycle.waited_children`), or SignalRejected naming those cancelled with it that have not ended."""
        gone: list[str] = []
        owed: list[tuple[str, str]] = []
        parents = [case_id]
        while parents:
            for child in self._children.get(parents.pop(), ()):
                actor = self._cases.get(child)
                if actor is None or actor.waited is None or child in gone:
                    continue
                if actor.state in FINAL:
                    gone.append(child)
                    parents.append(child)
                elif actor.waited == "cancel":
                    owed.append((child, actor.state.value))
        if owed:
            actor = self._cases.get(case_id)
            raise SignalRejected.children_live(case_id, owed, None if actor is None else actor.state.value)
        return gone

    def trace(self, case_id: str, level: TraceLevel, sink: TraceSink | None = None) -> None:
        """Set one case's trace level and, with `sink`, send that case's events to `sink` as well."""
        self._check_open("change a case's tracing")
        if level not in LEVELS:
            raise ValueError(f"trace level must be one of {', '.join(LEVELS)}, got {level!r}")
        actor = self._get(case_id)
        if sink is not None:
            check_sink(sink)
            already = any(s is sink for s in self._sinks) or any(s is sink for s in actor.sinks)
            if not already and not actor.exited:  # a sink that sees the case already is not given it twice
                actor.sinks = (*actor.sinks, sink)
                assert self._hub is not None
                self._hub.retain(sink)
        effective = level if (self._sinks or actor.sinks) else "none"
        actor.level = effective
        if actor.machine is not None:
            actor.machine.trace_level = effective

    def statistics(self) -> SubstrateStatistics:
        """Counters: cases started, live, ended by outcome, retained, evicted; trace events, drops, sink errors.

        `cases_live` counts the cases this Substrate runs now: those it started, recovered from its store or
        brought back into memory, until they end or leave memory (evicted while idle, or the Substrate closed)."""
        c = self._counts
        stats = self._hub.stats if self._hub is not None else None
        return SubstrateStatistics(
            cases_started=c["started"],
            cases_live=c["live"],
            cases_done=c["done"],
            cases_failed=c["failed"],
            cases_cancelled=c["cancelled"],
            cases_retained=len(self._ended),
            cases_evicted=c["evicted"],
            cases_idle_evicted=c["idle_evicted"],
            cases_in_memory=len(self._cases),
            trace_events=stats.events if stats else 0,
            trace_dropped=stats.dropped if stats else 0,
            sink_errors=stats.sink_errors if stats else 0,
        )

    def _on_end(self, actor: CaseActor) -> None:
        self._counts["live"] -= 1  # (every actor spawned calls this once, when it exits)
        if actor.closed or actor.evicted:
            return  # it stays live in the store (closed with the Substrate, or evicted while idle)
        if self._queues.queues:
            self._queues.nudge()  # (it may have made room in its queue)
        if self._loader is not None:
            self._loader.parked.pop(actor.case_id, None)
        event = self._end_events.pop(actor.case_id, None)
        if event is not None:
            event.set()
        state = actor.state
        if state in FINAL:
            self._counts[state] += 1  # (a StrEnum: the key "done" is found by its member)
        ended = self._ended
        ended.append(actor.case_id)
        cases = self._cases
        while len(ended) > self._retain:
            old = ended.popleft()
            if old in cases and cases[old].state in FINAL:
                del cases[old]
                self._counts["evicted"] += 1

    def __repr__(self) -> str:
        store = f" store={self._store.url}" if self._store is not None else ""
        return f"<Substrate {self._phase} cases={len(self._cases)} trace_level={self._level!r}{store}>"


class _Owned(Exception):
    """Internal: a standby took ownership of its store (its watch ends)."""


def _workflow_of(program: Program, name: str | None) -> str:
    """The workflow a case without a store started from, as a repeated start compares it: its registered name, or
    for a term not registered the program's fingerprint (the same term again, or an equal one, is the same)."""
    return name if name is not None else f"unregistered {program.term.kind} {program.fingerprint[:12]}"


def _not_ended(case_id: str) -> str:
    return f"case {case_id!r} has not ended; it goes on running (await it again, or cancel it)"


def _check_await_timeout(timeout: object) -> None:
    if timeout is None:
        return
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not math.isfinite(timeout) or timeout < 0:
        raise ValueError(f"timeout must be a number of seconds >= 0 (0: check without waiting), got {timeout!r}")


def _validated(case_id: str, data: dict[str, Any], model: type[BaseModel] | None) -> Any:
    if model is None:
        return data
    if not (isinstance(model, type) and issubclass(model, BaseModel)):
        raise TypeError(f"model must be a pydantic model class, got {model!r}")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ValueError(
            f"case {case_id!r} ended with data that does not fit {model.__name__}: {exc.error_count()} error(s):\n"
            f"{exc}\nawait it without model= to see the data as it is"
        ) from exc


def _row_outcome(row: CaseRow) -> dict[str, Any]:
    """The outcome of a case that ended in an earlier run, from its row."""
    if row.state == CaseState.DONE.value:
        return dict(row.data or {})
    if row.state == CaseState.FAILED.value:
        error = row.error or {}
        failed = CaseFailed(row.case_id, str(error.get("path", "?")), str(error.get("message", "")))
        failed.traceback = error.get("traceback")
        failed.record = error.get("record")
        raise failed from RestoredError(str(error.get("type", "Exception")), str(error.get("message", "")))
    raise CaseCancelled(row.case_id, row.cancel_reason or "cancelled")


class CaseHandle:
    """A started case: `case_id`, `await result()`, `status()`, `data()`, `done()`, `await signal(...)`,
    `await cancel()`.

    The handle keeps its case's outcome, so `result()` works even after the Substrate's retention bound has
    dropped the case from its registry.
    """

    __slots__ = ("_sub", "_actor", "case_id")

    def __init__(self, sub: Substrate, actor: CaseActor | None, case_id: str | None = None) -> None:
        self._sub = sub
        self._actor = actor  # None: the case runs elsewhere (another node) or is not in memory yet
        self.case_id = actor.case_id if actor is not None else case_id or ""

    async def result(self, timeout: float | None = None, *, model: type[BaseModel] | None = None) -> Any:  # noqa: ASYNC109
        """The final data (validated into `model` if given); raises CaseFailed, CaseCancelled, or TimeoutError
        (the case goes on). `timeout=0` checks without waiting."""
        if timeout is None and model is None:  # the common case, kept short
            actor = self._actor
            if actor is not None and actor.exited and not actor.evicted:
                return actor.outcome()  # ended and exited: nothing to wait for
            if actor is None:
                await self._sub._left_queue(self.case_id)  # (a queued case: until it starts)
            return await self._sub._wait_end(
                self.case_id, actor if actor is not None and not actor.evicted else self._current(), check_only=False
            )
        _check_await_timeout(timeout)
        return _validated(self.case_id, await self._sub._outcome(self.case_id, self._current(), timeout), model)

    def _current(self) -> CaseActor | None:
        """The case's actor in memory (None while it is elsewhere: evicted into the store, on another node)."""
        actor = self._actor
        if actor is None or actor.evicted:
            found = self._sub._cases.get(self.case_id)
            if found is None:
                return None
            self._actor = actor = found
        return actor

    def status(self) -> CaseStatus:
        actor = self._current()
        if actor is None:
            return self._sub.status(self.case_id)
        try:
            return children_in(self._sub, actor.status())
        except StoreError as exc:
            raise self._sub._closed_or(exc, f"read the status of case {self.case_id!r}") from exc

    def data(self) -> dict[str, Any]:
        """A copy of the case's data now (the final data once it has ended)."""
        actor = self._current()
        return actor.data() if actor is not None else self._sub.data(self.case_id)

    def done(self) -> bool:
        """Whether the case has ended (its result is ready), without waiting."""
        actor = self._current()
        if actor is None:
            return self._sub.status(self.case_id).ended
        return actor.state in FINAL and actor.recorded

    async def signal(self, name: str, payload: Any = None, *, request_id: str | None = None) -> None:
        actor = self._actor
        if actor is None or actor.evicted:
            actor = self._current()
        if actor is None:
            await self._sub.signal(self.case_id, name, payload, request_id=request_id)
        else:
            if type(name) is str and name and request_id is None and not isinstance(payload, list | tuple | dict):
                await self._sub._signal(actor, Signal(name, payload))  # `inputs.signal`'s checks, passed inline
            elif request_id is not None:  # a retry of a signal that ended the case returns, as the first call did
                await self._sub.signal(self.case_id, name, payload, request_id=request_id)
            else:
                await self._sub._signal(actor, inputs.signal(name, payload, request_id, self.case_id))

    async def update(
        self, name: str, payload: Any = None, *, request_id: str | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 (how long to wait for the answer)
    ) -> Any:
        """Send update `name` to this case and return its answer (see Substrate.update)."""
        _check_await_timeout(timeout)
        msg = inputs.update(name, payload, request_id, self.case_id)
        sub = self._sub
        if timeout is None:
            return await sub._update(self.case_id, msg, self._current())
        with sub._clock.deadline_scope(timeout):
            return await sub._update(self.case_id, msg, self._current())
        raise update_timeout(self.case_id, msg.name, timeout)

    async def cancel(self, compensate: bool = True, *, reason: str = "cancelled") -> None:
        msg = inputs.cancel(reason, compensate, None, self.case_id)
        actor = self._current()
        if actor is None:
            await self._sub.cancel(self.case_id, compensate, reason=reason)
        else:
            await self._sub._cancel(actor, msg)

    async def close_instances(self, region: str) -> None:
        """Close the dynamic mi `region` of this case (see Substrate.close_instances)."""
        await self._sub.close_instances(self.case_id, region)

    def __repr__(self) -> str:
        return f"<CaseHandle {self.case_id!r} {self.status().state.value}>"

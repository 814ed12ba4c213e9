"""`Substrate`: the root supervisor that an application enters with `async with`.

The Substrate owns a root task group holding the trace hub and, nested in it, the task group of the case actors
(and, with a store, the loops that run beside them); a table of cases in memory; the registered workflows. It is
the only way in: every method checks its arguments and says what was wrong and how to fix it, then hands over to
the room that does it, each over the shared `CaseTable` (`_table`):

- `_options`: the options, checked once; `_ownership`: the mode (memory, owner, standby), built once where the
  Substrate is entered, and what only a store's owner does (recovery, takeover, retry, fork, delete);
- `_starts`: every start (the API's, a queue's, a schedule's, a child's) over one `StartRequest`;
- `_deliver`: where a checked input goes (the mailbox, the store's inbox, a queue), one route per kind;
- `_reads`: outcomes, status, data, listings, journals; `_handle`: `CaseHandle`, over `_deliver` and `_reads`.

Decisions written down here (the rooms' docstrings hold the rest):
- Timeouts of `await_case` and `new_case(timeout=...)` run on the Substrate's clock, like every other timer.
- Ended cases keep their result in memory for `await_case`, `status` and `data`, up to `retain_ended` of them
  (oldest dropped first; without a store a dropped id raises `CaseNotFound`; with one, it is read from the store).
  A `CaseHandle` keeps its own case's outcome regardless.
- `await_case` returns (or raises) once the case has ended and its effects and timers have stopped; each caller
  gets its own shallow copy of the final data. `timeout=0` checks without waiting.
- A case is traced only when some sink will see its events: with `trace_level="min"` and no sinks, cases run
  the vm's untraced loop until `trace(case_id, level, sink)` gives one of them a sink.
- Leaving the `async with` without a store cancels every live case without compensation (their awaiters get
  `CaseCancelled` with reason "substrate closed"); with a store it writes nothing: live cases stay live in the
  store and in-memory awaiters get `SubstrateClosed`. Either way it waits for effects and timers to stop (naming,
  after `shutdown_timeout`, the effects that ignore cancellation), then lets the trace hub deliver what it holds
  (at most `shutdown_timeout` seconds) and close the sinks.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from types import TracebackType
from typing import Any

import anyio
from anyio.abc import TaskGroup
from pydantic import BaseModel

from .._errors import CaseExists, CaseNotFound, update_timeout
from .._program import DEFAULT_MAX_INSTANCES
from .._store import Store
from .._store import open_store as _open_store
from .._terms import Term
from .._trace import LEVELS, TraceLevel, TraceSink, check_sink, get_logger
from .._vm import Scheduler
from . import _inputs as inputs
from ._case import CaseActor
from ._children import check_child_queues
from ._clock import Clock, RealClock, VirtualClock
from ._compact import DEFAULT_COMPACT_AFTER
from ._deliver import Deliver
from ._handle import CaseHandle, handle_of
from ._hub import TraceHub
from ._journal import JournalRecord
from ._mailbox import RegionAction
from ._options import DEFAULT_MAX_PAYLOAD, DEFAULT_MAX_RECOVERIES, Options, check_await_timeout
from ._ownership import Ownership
from ._queues import Queue, Queues, check_queues
from ._reads import Reads
from ._registry import Workflows
from ._schedules import Schedule, Schedules, ScheduleStatus, backfill_slots
from ._start_request import StartRequest
from ._starts import Starts, check_schedules
from ._status import CaseStatus, SubstrateStatistics
from ._table import CaseTable

_log = get_logger("wfsub.runtime")


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
      or a store object (`wfsub.stores.SqliteStore`, `MemoryStore`): durable cases (the docs: guide, Durable cases).
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
      memory (it comes back on its next input or due timer; the docs: guide, Durable cases).
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
    - `schedules`: `wfsub.Schedule`s: workflows started at each slot of a cron expression or a period (the docs:
      guide, Schedules and queues).
    - `queues`: `{name: wfsub.Queue(...)}`: the queues `new_case(..., queue=name)` starts cases on (the docs:
      guide, Schedules and queues).
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
        self._opts = Options.checked(
            trace_level=trace_level, sinks=sinks, quanta=quanta, clock=clock, mailbox_size=mailbox_size,
            retain_ended=retain_ended, trace_buffer=trace_buffer, shutdown_timeout=shutdown_timeout,
            max_instances=max_instances, max_payload_bytes=max_payload_bytes, redact=redact,
            evict_after=evict_after, node_id=node_id, standby=standby, max_recoveries=max_recoveries,
            compact_after=compact_after,
        )
        self._workflows = Workflows(workflows, library)  # raises InvalidWorkflow for a broken version
        self._store: Store | None = _open_store(store)
        if evict_after is not None and self._store is None:
            raise ValueError(
                "evict_after needs a store: an evicted case lives on in the store until its next input or timer; "
                "pass store=... (a SQLite path, or wfsub.stores.MemoryStore() in tests)"
            )
        self._build(RealClock() if clock is None else clock, check_queues(queues), schedules)
        self._root: TaskGroup | None = None
        self._case_tg: TaskGroup | None = None
        self._hub: TraceHub | None = None
        self._detach_clock: Callable[[], None] | None = None

    def _build(self, clock: Clock, queues: dict[str, Queue], schedules: Sequence[Schedule]) -> None:
        """The table of cases and the rooms over it (see the module)."""
        opts = self._opts
        # (the queues' and the schedules' calls reach the rooms built below: none runs before `async with`)
        queue_set = Queues(
            queues, node=opts.owner, now=lambda: t.clock.now(), deadline=lambda s: t.clock.deadline_scope(s),
            busy=lambda n: t.busy(n), start=lambda item: starts.dequeued(item), ended=lambda c: t.memory_ended(c),
            is_open=lambda: t.is_open(),
        )
        t = self._table = CaseTable(opts, self._workflows, self._store, clock, queue_set)
        self._cases = t.cases  # (the same dict)
        check_child_queues(self._workflows, queue_set.queues)
        self._schedules = Schedules(
            check_schedules(schedules, self._workflows, queue_set.queues), now=lambda: t.clock.now(),
            sleep=lambda s: t.clock.sleep(s), busy=t.busy, start=lambda s, slot, c: starts.slot(s, slot, c),
            live=lambda c: reads.is_live(c),
        )
        reads = self._reads = Reads(t)
        deliver = self._deliver = Deliver(t, reads)
        starts = self._starts = Starts(t, deliver)
        self._steering = _Steering(t, starts, deliver, reads)
        self._own = Ownership(
            t, starts, self._schedules, self._steering, handle=lambda c: handle_of(deliver, c),
            backfill=self.backfill_schedule, live=deliver.live,
        )

    # -- lifecycle ----------------------------------------------------------------------------------------

    async def __aenter__(self) -> Substrate:
        t = self._table
        if t.phase != "new":
            raise RuntimeError("a Substrate can be entered only once; make a new Substrate instead")
        standby = False
        if self._store is not None:
            standby = await self._own.open_store(self._store)
        opts = self._opts
        hub = self._hub = TraceHub(opts.sinks, buffer=opts.trace_buffer, sink_buffer=opts.trace_buffer,
                                   redact=opts.redact)
        root = self._root = anyio.create_task_group()
        await root.__aenter__()
        root.start_soon(hub.run)
        case_tg = self._case_tg = anyio.create_task_group()
        await case_tg.__aenter__()
        if isinstance(t.clock, VirtualClock):
            self._detach_clock = t.clock.attach(lambda: t.shared is None or t.shared.busy == 0)
        t.phase = "open"
        try:
            await self._own.open(hub, case_tg, standby)
        except BaseException:
            await self.__aexit__(None, None, None)
            raise
        return self

    @property
    def standby(self) -> bool:
        """Whether this Substrate is a standby now (another process owns its store; see the class)."""
        return self._table.outside is not None

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        t = self._table
        if t.phase == "closed":
            return None
        t.phase = "closed"
        for event in t.end_events.values():  # awaiters of cases not in memory: SubstrateClosed
            event.set()
        assert self._root is not None
        assert self._case_tg is not None
        assert self._hub is not None
        cancelled_before = t.counts["cancelled"]
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
            with anyio.move_on_after(self._opts.shutdown_timeout, shield=True):
                await self._hub.finished.wait()
            self._root.cancel_scope.cancel()
            await self._root.__aexit__(None, None, None)
            if self._detach_clock is not None:
                self._detach_clock()
            if self._store is not None:
                with anyio.CancelScope(shield=True):
                    await self._store.close()
        if t.counts["cancelled"] > cancelled_before:
            cancelled = t.counts["cancelled"] - cancelled_before
            _log.info("substrate closed; live cases were cancelled", cancelled=cancelled)
        return None

    async def _report_stragglers(self, scope: anyio.CancelScope) -> None:
        """At shutdown: after `shutdown_timeout`, name the effects that ignore cancellation (we keep waiting)."""
        with scope:
            await anyio.sleep(self._opts.shutdown_timeout)
            stragglers = [
                f"{actor.case_id}: effect {req.name!r} at {req.path}"
                for actor in self._cases.values()
                for req in actor.running_effects.values()
            ]
            if stragglers:
                _log.warning(
                    "substrate closing: effects still running after shutdown_timeout ignore cancellation; "
                    "waiting for them (leaving leaves no task behind)",
                    shutdown_timeout=self._opts.shutdown_timeout,
                    effects=stragglers,
                )

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
    ) -> CaseHandle:
        """Start a case of `workflow` (a registered name, or a term) with `data`; returns its handle.

        With a store the workflow must be registered, the data must be JSON, and the call returns once the case's
        `start` record is durable. `scheduler`: "deterministic" (the default) or `Seeded(seed)` (recorded, so a
        replay makes the same choices). `placement="any"` (a shared store): the case is queued for the first node
        that claims it (one that has its version registered); the handle follows it wherever it runs. `tags`: str
        to str, at most 16, to find the case by (`cases(tags=...)`); kept in its `start` record and its status.
        `queue=`: the case waits in state `queued` until that queue has room (`priority`: lower first; `dedup`: a
        key no other live case of the queue may hold; `partition`: the key a partitioned queue limits by; `delay`:
        seconds it waits at least); the docs: guide, Schedules and queues.
        """
        return await self._starts.new_case(
            workflow, data, case_id=case_id, timeout=timeout, scheduler=scheduler, placement=placement, tags=tags,
            queue=queue, priority=priority, dedup=dedup, partition=partition, delay=delay,
        )

    def handle(self, case_id: str) -> CaseHandle:
        """A handle to an existing case (CaseNotFound if there is none): in memory, in the store, or in its queue."""
        return handle_of(self._deliver, case_id)

    # -- schedules ---------------------------------------------------------------------------------------------

    async def schedules(self) -> list[ScheduleStatus]:
        """The configured schedules, each with its last slot and case, whether it is paused, and its next slot."""
        self._table.check_open("list schedules")
        return await self._schedules.statuses()

    async def pause_schedule(self, name: str) -> None:
        """Stop schedule `name` from starting cases (on every node sharing the store) until `resume_schedule`."""
        self._table.check_open("pause a schedule")
        await self._schedules.pause(name, True)

    async def resume_schedule(self, name: str) -> None:
        """Let a paused schedule start cases again, from its next slot (the slots passed meanwhile are let go)."""
        self._table.check_open("resume a schedule")
        await self._schedules.pause(name, False)

    async def trigger_schedule(self, name: str) -> CaseHandle:
        """Start schedule `name`'s workflow now, with id `{name}@{now}` (paused or not; not counted as a slot);
        CaseExists when a case of that id (a trigger or a slot in the same second) exists."""
        self._table.check_open("trigger a schedule")
        schedule = self._schedules.get(name)
        now = float(math.floor(self._table.clock.now()))
        case_id = schedule.case_id(now)
        try:  # a second trigger in one second would be the same start, answered with the first: say so instead
            self.status(case_id)
        except CaseNotFound:
            return await self._starts.scheduled(schedule, now, case_id)
        raise CaseExists.triggered(case_id, name)

    async def backfill_schedule(self, name: str, start: datetime | float, end: datetime | float) -> list[CaseHandle]:
        """Start one case per slot of schedule `name` from `start` to `end` (both included: aware datetimes or
        seconds since the epoch, in the past), each with its slot's usual id `{name}@{slot}`, so a repeated
        backfill starts nothing twice (a slot's case that exists is that case); paused or not. Returns their
        handles, oldest slot first. ValueError for an unknown schedule, an end before the start or after now, or
        more than 1000 slots (split the range); TypeError for a naive datetime."""
        self._table.check_open("backfill a schedule")
        schedule = self._schedules.get(name)
        slots = backfill_slots(schedule.name, schedule.cron, schedule.every, schedule.tz, start, end,
                               self._table.clock.now())
        return [await self._starts.backfilled(schedule, slot) for slot in slots]

    # -- inputs ------------------------------------------------------------------------------------------------

    async def signal(self, case_id: str, name: str, payload: Any = None, *, request_id: str | None = None) -> None:
        """Send signal `name` (with `payload`) to a case. Without a store it returns once the signal is queued in
        the case's mailbox (it waits only while the mailbox is full); with a store, once its record is committed
        and applied. `request_id` makes a retried call apply once."""
        case_id = inputs.check_case_id(case_id, new=False)
        await self._deliver.signal(case_id, inputs.signal(name, payload, request_id, case_id))

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
        check_await_timeout(timeout)
        case_id = inputs.check_case_id(case_id, new=False)
        msg = inputs.update(name, payload, request_id, case_id)
        if timeout is None:
            return await self._deliver.update(case_id, msg, None)
        with self._table.clock.deadline_scope(timeout):
            return await self._deliver.update(case_id, msg, None)
        raise update_timeout(case_id, msg.name, timeout)

    async def cancel(
        self, case_id: str, compensate: bool = True, *, reason: str = "cancelled", request_id: str | None = None
    ) -> None:
        """Cancel a case: its work is withdrawn and its awaiters get CaseCancelled (carrying `reason`, also kept
        in its status and journal). SignalRejected once it has ended (a retried call whose cancel ended it
        returns). A blank `reason` is refused (ValueError), by every door alike.

        With `compensate` (the default) the active sagas compensate and the active scopes run their on_cancel
        first (innermost first), then the case ends cancelled; `compensate=False`, or a second cancel while it
        compensates, ends it at once. A suspended case (durable, no version can run it) ends at once; one waiting
        in its queue never starts. With a store, `cancel` returns once its record is committed.
        """
        self._table.check_open("cancel a case")
        case_id = inputs.check_case_id(case_id, new=False)
        await self._deliver.cancel(case_id, inputs.cancel(reason, compensate, request_id, case_id))

    async def cancel_region(self, case_id: str, region: str, *, request_id: str | None = None) -> None:
        """Withdraw all work of the named region (a scope or a named mi) of a case, compensating what is inside.
        Like the other region operations, it returns once the case has applied it (SignalRejected when the case
        cannot take it)."""
        await self._deliver.region(case_id, RegionAction.CANCEL, region, None, request_id)

    async def complete_region(self, case_id: str, region: str, *, request_id: str | None = None) -> None:
        """Close the named region now: an mi joins with the outputs so far; a scope continues after itself."""
        await self._deliver.region(case_id, RegionAction.COMPLETE, region, None, request_id)

    async def add_instances(
        self, case_id: str, region: str, items: Sequence[Any], *, request_id: str | None = None
    ) -> None:
        """Add one instance per item to the live dynamic mi `region` of a case."""
        await self._deliver.region(case_id, RegionAction.ADD_INSTANCES, region, items, request_id)

    async def close_instances(self, case_id: str, region: str, *, request_id: str | None = None) -> None:
        """Close the dynamic mi `region` of a case: it takes no more instances (its join fires once they end)."""
        await self._deliver.region(case_id, RegionAction.CLOSE_INSTANCES, region, None, request_id)

    # -- reads ---------------------------------------------------------------------------------------------------

    async def await_case(
        self, case_id: str, timeout: float | None = None, *, model: type[BaseModel] | None = None  # noqa: ASYNC109
    ) -> Any:
        """The case's final data (validated into `model` if given); raises CaseFailed, CaseCancelled, or
        TimeoutError when `timeout` passes first (the case goes on). `timeout=0` checks without waiting.

        A durable case that is not in memory (parked in the store, evicted) is not loaded to be awaited: the
        awaiter is woken when the case ends, wherever its next input brings it back."""
        check_await_timeout(timeout)
        return await self._reads.await_case(case_id, timeout, model)

    def status(self, case_id: str) -> CaseStatus:
        """Where the case is: state, threads (`at`), waits, effects and timers in flight, times, failure, and the
        cases it started (`children`). Synchronous: a durable case not in memory is read from the store's row on
        the calling thread (a small indexed read)."""
        return self._reads.status(case_id)

    def data(self, case_id: str) -> dict[str, Any]:
        """A copy of the case's data now (the final data once it has ended)."""
        return self._reads.data(case_id)

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
        return self._reads.cases_listed(state, workflow, limit, before, tags, id_prefix, started_after,
                                        started_before, parent)

    async def journal(self, case_id: str, *, newest: int | None = None) -> list[JournalRecord]:
        """Every record of a durable case's journal, in order (a Substrate without a store has none). `newest=N`:
        only its start record and the newest N records after it (the rest is read but not validated nor
        returned: what a view of a long journal needs)."""
        return await self._reads.journal(case_id, newest)

    # -- lifecycle of ended cases ----------------------------------------------------------------------------------

    async def prune(self, older_than: float) -> int:
        """Remove the cases that ended at least `older_than` seconds ago (never one without an `end`)."""
        if isinstance(older_than, bool) or not isinstance(older_than, int | float) or not math.isfinite(older_than):
            raise ValueError(f"older_than must be a number of seconds, got {older_than!r}")
        if older_than < 0:
            raise ValueError(f"older_than must be >= 0 seconds, got {older_than!r}")
        t = self._table
        cutoff = t.clock.now() - older_than
        for case_id in list(t.ended):
            actor = t.cases.get(case_id)
            if actor is not None and actor.ended_at is not None and actor.ended_at <= cutoff:
                del t.cases[case_id]
        if self._store is None:
            return 0
        return await self._store.prune(cutoff)

    async def retry(self, case_id: str) -> CaseHandle:
        """Re-open a failed case at the step that failed: a `retry` record is journaled and that step runs again,
        on the case's version or the one it migrates to (so a fix registered since applies); an effect whose
        final outcome failed the case starts again. Also re-opens a case suspended after too many recoveries
        (`max_recoveries`). Returns its handle (`result()` waits for the next end).

        SignalRejected (with the reason) for a case that is not failed, or whose failure ran compensations."""
        t = self._table
        t.check_open("retry a case")
        case_id = inputs.check_case_id(case_id, new=False)
        if t.outside is not None:  # a standby: the owner retries it
            await t.outside.lifecycle(case_id, "retry", {})
            return CaseHandle(self._deliver, None, case_id)
        return await self._own.retry(case_id, [])

    async def fork(self, case_id: str, *, at: int, new_case_id: str | None = None) -> CaseHandle:
        """Start a new case whose journal is the journal of `case_id` up to and including record `at` (its
        `start` names the origin: `status().forked_from`; it keeps the origin's tags), replayed, then live.
        ValueError for an `at` the journal does not hold (compaction may have removed it: the message names the
        first record still kept)."""
        t = self._table
        t.check_open("fork a case")
        case_id = inputs.check_case_id(case_id, new=False)
        body = inputs.fork_body(at, new_case_id, case_id)
        if t.outside is not None:  # a standby: the owner forks it
            if new_case_id is None:
                body["new_case_id"] = new_case_id = t.generated_id()
            await t.outside.lifecycle(case_id, "fork", body)
            return CaseHandle(self._deliver, None, new_case_id)
        return await self._own.fork(case_id, at, new_case_id, [])

    async def delete(self, case_id: str) -> None:
        """Remove an ended case at once: its journal, row, snapshots, tags and queue item (`await_case` then raises
        CaseNotFound; its id starts a new case), and the children it waited for (`start_case(wait=True)`; theirs
        too): an ended one goes with it, an abandoned one still running stays. CaseNotFound for no such case;
        SignalRejected for a case that has not ended, or a child cancelled with it that has not ended yet."""
        self._table.check_open("delete a case")
        await self._own.delete(inputs.check_case_id(case_id, new=False))

    # -- tracing and counters ----------------------------------------------------------------------------------

    def trace(self, case_id: str, level: TraceLevel, sink: TraceSink | None = None) -> None:
        """Set one case's trace level and, with `sink`, send that case's events to `sink` as well."""
        t = self._table
        t.check_open("change a case's tracing")
        if level not in LEVELS:
            raise ValueError(f"trace level must be one of {', '.join(LEVELS)}, got {level!r}")
        actor = t.get(case_id)
        sinks = self._opts.sinks
        if sink is not None:
            check_sink(sink)
            already = any(s is sink for s in sinks) or any(s is sink for s in actor.sinks)
            if not already and not actor.exited:  # a sink that sees the case already is not given it twice
                actor.sinks = (*actor.sinks, sink)
                assert self._hub is not None
                self._hub.retain(sink)
        effective = level if (sinks or actor.sinks) else "none"
        actor.level = effective
        if actor.machine is not None:
            actor.machine.trace_level = effective

    def statistics(self) -> SubstrateStatistics:
        """Counters: cases started, live, ended by outcome, retained, evicted; trace events, drops, sink errors.

        `cases_live` counts the cases this Substrate runs now: those it started, recovered from its store or
        brought back into memory, until they end or leave memory (evicted while idle, or the Substrate closed)."""
        t = self._table
        c = t.counts
        stats = self._hub.stats if self._hub is not None else None
        return SubstrateStatistics(
            cases_started=c["started"],
            cases_live=c["live"],
            cases_done=c["done"],
            cases_failed=c["failed"],
            cases_cancelled=c["cancelled"],
            cases_retained=len(t.ended),
            cases_evicted=c["evicted"],
            cases_idle_evicted=c["idle_evicted"],
            cases_in_memory=len(t.cases),
            trace_events=stats.events if stats else 0,
            trace_dropped=stats.dropped if stats else 0,
            sink_errors=stats.sink_errors if stats else 0,
        )

    def __repr__(self) -> str:
        store = f" store={self._store.url}" if self._store is not None else ""
        return f"<Substrate {self._table.phase} cases={len(self._cases)} trace_level={self._opts.level!r}{store}>"


class _Steering:
    """What child-case steps act on other cases through (`_children.Steering`): the rooms of one Substrate."""

    __slots__ = ("_table", "_starts", "_deliver", "_reads")

    def __init__(self, table: CaseTable, starts: Starts, deliver: Deliver, reads: Reads) -> None:
        self._table = table
        self._starts = starts
        self._deliver = deliver
        self._reads = reads

    @property
    def table(self) -> CaseTable:
        return self._table

    async def start(self, req: StartRequest) -> CaseHandle:
        return await self._starts.start(req)

    async def await_case(self, case_id: str) -> Any:
        return await self._reads.await_case(case_id, None, None)

    async def signal(self, case_id: str, name: str, payload: Any, request_id: str) -> None:
        case_id = inputs.check_case_id(case_id, new=False)
        await self._deliver.signal(case_id, inputs.signal(name, payload, request_id, case_id))

    async def cancel(self, case_id: str, reason: str, request_id: str) -> None:
        self._table.check_open("cancel a case")
        case_id = inputs.check_case_id(case_id, new=False)
        await self._deliver.cancel(case_id, inputs.cancel(reason, True, request_id, case_id))

    async def live(self, case_id: str, what: str) -> CaseActor:
        return await self._deliver.live(case_id, what)

    def status(self, case_id: str) -> CaseStatus:
        return self._reads.bare_status(case_id)

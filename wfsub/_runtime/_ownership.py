"""A Substrate's mode and what only a store's owner does.

The mode is decided once, where the Substrate is entered: without a store (memory only), as the store's owner, or
as a standby (SQLite, while another process owns the file; see `_outside`). It decides which parts are built: the
`Shared` state of the case actors with the hooks of that mode, and, for an owner, the loader, the inbox router and
the loops beside the cases (recovery, due timers, changes made elsewhere, a shared store's lease and takeovers,
schedules and queues). A standby runs no case: its inputs and new cases go to the owner through the store, its
reads read the store; when the owner ends it takes ownership and is built as an owner then.

`retry` and `fork` (see `_lifecycle`) write their records and then load the case as recovery does; they run on the
Substrate that owns the store (a standby sends them to the owner through the inbox). A retried case that no
registered version can run is suspended, its status says why, until one is registered. `delete` refuses a case
that has not ended.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import anyio
from anyio.abc import TaskGroup

from .._errors import CaseExists, CaseNotFound, CommitUnknown, SignalRejected, StoreConflict, StoreError
from .._store import CaseRow, CaseWrite, InboxRow, QueueItem, SqliteStore, Store
from .._trace import get_logger
from . import _inputs as inputs
from . import _lifecycle as lifecycle
from ._case import CaseActor, Shared
from ._children import LostChildren, Steering
from ._clock import RealClock
from ._control import Owned, Remote
from ._hub import TraceHub
from ._loader import CaseLoader
from ._nodes import DatabaseClock, Lease, Node
from ._outside import EndWatcher, Outside
from ._persist import Background
from ._queues import cancel_requeued
from ._reads import recorded
from ._routing import InboxRouter
from ._status import FINAL, CaseState
from ._summary import summary_of

if TYPE_CHECKING:
    from ._handle import CaseHandle
    from ._schedules import Schedules
    from ._starts import Starts
    from ._table import CaseTable

_log = get_logger("wfsub.runtime")

TAKEOVER_EVERY = 0.2  # seconds between a standby's looks at whether the owner's lock is free
TAKEOVER_RETRY_MOST = 5.0  # seconds at most between a standby's takeovers that met a store fault (doubling up to it)
ENDED_POLL = 2.0  # seconds between re-reads of the rows of awaited cases not in memory (a fallback to NOTIFY)

def _nothing(actor: CaseActor) -> None:
    """A hook a mode without a store has nothing to do in (cases there never park in a store nor leave memory)."""


class Ownership:
    """The mode of one Substrate, and what only a store's owner does (see the module)."""

    def __init__(
        self, table: CaseTable, starts: Starts, schedules: Schedules, steering: Steering,
        handle: Callable[[str], CaseHandle], backfill: Callable[[str, Any, Any], Awaitable[object]],
        live: Callable[[str, str], Awaitable[CaseActor]],
    ) -> None:
        self.t = table
        self.starts = starts
        self.schedules = schedules
        self.steering = steering
        self.handle = handle  # a handle to an existing case (`_handle.handle_of`)
        self.backfill = backfill  # `Substrate.backfill_schedule` (a backfill someone wrote to the inbox)
        self.live = live  # the case's actor, in memory or loaded (`Deliver.live`)
        self.lease = Lease()
        self.node: Node | None = None
        self.background: Background | None = None
        self.standby_since = 0.0

    # -- opening: the mode ---------------------------------------------------------------------------------------

    async def open_store(self, store: Store) -> bool:
        """Open the store as its owner, or (a single-node store owned by another process, `standby=True`) as a
        standby: True for a standby."""
        owner = self.t.owner
        if store.shared or not self.t.opts.standby_ok or not isinstance(store, SqliteStore):  # (standbys: SQLite)
            await store.open(owner=True, owner_id=owner)  # raises StoreError for a second owner
            return False
        try:
            await store.open(owner=False, owner_id=owner)
        except StoreError:  # an older layout only an owner migrates, ...: as an owner, or its error
            await store.open(owner=True, owner_id=owner)
            return False
        try:
            return not await store.take_ownership(owner)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await store.close()
            raise

    def shared(self, hub: TraceHub, case_tg: TaskGroup) -> Shared:
        """What every case actor shares, without a store or as a standby (an owner's: `open_durable`)."""
        t = self.t
        opts = t.opts
        return Shared(
            t.clock, hub, opts.quanta, opts.mailbox_size, t.on_end, opts.redact, case_tg.start_soon, self.steering,
            on_park=_nothing, on_evict=_nothing, on_effect_wait=_nothing, max_payload_bytes=None, lease=None,
            compact_after=None,
        )

    async def open(self, hub: TraceHub, case_tg: TaskGroup, standby: bool) -> None:
        """Build the parts of this Substrate's mode and start its loops beside the cases."""
        t = self.t
        t.shared = self.shared(hub, case_tg)
        store = t.store
        if store is None:
            self._scheduled_loops(case_tg)
            return
        await self._register_summaries(store)
        await t.queues.register(store)
        if standby:
            self._open_standby(store, case_tg)
        else:
            await self.open_durable(store, case_tg)

    async def _register_summaries(self, store: Store) -> None:
        """Write the summary of every registered version (once per fingerprint: the store keeps the first)."""
        workflows = self.t.workflows
        for fingerprint, (name, program) in workflows.by_fingerprint.items():
            if await store.program(fingerprint) is None:
                await store.put_program(summary_of(name, program, workflows.input_of(program), drawn=True))

    def _open_standby(self, store: Store, case_tg: TaskGroup) -> None:
        t = self.t
        self.schedules.use(store)  # listed and paused through the store; run once this Substrate owns it
        t.queues.use(store)  # cases queued through the store; started once this Substrate owns it
        t.outside = Outside(store, t.workflows, t.opts.max_payload, t.clock.now)
        self.standby_since = time.monotonic()
        watcher = EndWatcher(store, t.end_events)
        _log.info("store owned by another process; this Substrate is a standby", store=store.url)

        pause = TAKEOVER_EVERY  # between two looks: longer after each takeover a store fault stopped

        async def tick() -> None:
            nonlocal pause
            if time.monotonic() - self.standby_since < pause or t.phase != "open":
                return
            self.standby_since = time.monotonic()
            try:
                owned = await store.take_ownership(t.owner)
            except StoreError as exc:  # the file busy past its timeout, a full disk: still a standby, tries again
                pause = min(pause * 2, TAKEOVER_RETRY_MOST)
                _log.warning("could not take ownership of the store; still a standby, trying again", store=store.url,
                             error=str(exc), retry_in=pause)
                return
            pause = TAKEOVER_EVERY
            if owned:
                _log.info("the owner of the store has ended; this Substrate owns it now", store=store.url)
                await self.open_durable(store, case_tg, taking_over=True)
                t.outside = None  # (calls made meanwhile went through the store: the owner takes them)
                for event in t.end_events.values():  # awaiters re-read their rows: an owner now wakes them
                    event.set()
                t.end_events.clear()
                raise Owned

        async def watch() -> None:
            with contextlib.suppress(Owned):
                await watcher.run(tick)

        case_tg.start_soon(watch)

    async def open_durable(self, store: Store, case_tg: TaskGroup, *, taking_over: bool = False) -> None:
        """Run as the store's owner: its cases, and the loops beside them. `taking_over`: a standby that has just
        taken ownership, whose process a store fault must not end (the recovery of live cases is tried again)."""
        t = self.t
        opts = t.opts
        clock = None
        if store.shared and type(t.clock) is RealClock:  # acceptance and due times in database time
            clock = t.clock = DatabaseClock()
        loader = t.loader = CaseLoader(
            store, t.workflows, t.cases, t.clock, owner=t.owner, lease=self.lease, case_level=opts.case_level,
            max_instances=opts.max_instances, redact=opts.redact, actor_for=self.starts.actor,
            spawn=self.starts.spawn, counts=t.counts, busy=t.busy, is_open=t.is_open,
            ended_here=lambda case_id: self.ended_elsewhere({case_id}), recovering=self.recovering,
        )
        lost = LostChildren(self.steering, store, case_tg.start_soon)  # cancels of children a dead process lost
        if store.shared:
            # (the parents taken over may have lost their children's cancels: looked for after each takeover)
            node = self.node = Node(store, self.lease, clock, loader.taken, loader.recheck, store.lease_seconds,
                                    took_over=lost.look)
            await node.renew()
            case_tg.start_soon(node.lease_loop)
            case_tg.start_soon(node.takeover_loop)
        t.router = InboxRouter(
            store, loader, self.live, opts.max_payload, lifecycle=self.lifecycle_input,
            cancel_requeued=lambda row, reason, request_id, done: cancel_requeued(
                store, row, reason, request_id, t.clock.now(), done),
        )
        background = self.background = Background(
            store, t.clock.now, t.clock.sleep, t.clock.deadline_scope, loader.held, loader.load_quietly,
            t.router.take, t.busy,
        )
        self._owner_shared(loader, background)
        case_tg.start_soon(loader.effect_rows)
        if opts.evict_after is not None:
            case_tg.start_soon(loader.evict_loop, opts.evict_after)
        try:
            await self._recover(loader)
        except StoreError as exc:
            if not taking_over:
                raise
            _log.warning("could not list the live cases to resume; trying again shortly", error=str(exc))
            case_tg.start_soon(self._recover_later, loader)
        lost.look()
        self._owner_loops(store, case_tg, loader, background)

    def _owner_shared(self, loader: CaseLoader, background: Background) -> None:
        """What a case actor tells an owner (it parks, waits on effects, leaves memory), in place before the first
        actor runs: a case recovered, taken over or claimed parks while the others are loaded, and one that parked
        on an effect with no `on_effect_wait` never recorded its row (nor its update answers)."""
        t = self.t
        opts = t.opts

        def left_memory(actor: CaseActor) -> None:
            loader.left_memory(actor)
            dues = [due for _, due in actor.armed.values()]
            if actor.deadline is not None:
                dues.append(actor.deadline)
            if dues:
                background.wake(min(dues))  # its timers are now the due loop's to watch

        assert t.shared is not None  # (a standby taking over keeps its busy count and its hub)
        t.shared = dataclasses.replace(
            t.shared, clock=t.clock, on_evict=left_memory, on_effect_wait=loader.waits_on_effects,
            on_park=loader.parked_now if opts.evict_after is not None else _nothing,
            max_payload_bytes=opts.max_payload, lease=self.lease, compact_after=opts.compact_after,
        )

    def _owner_loops(self, store: Store, case_tg: TaskGroup, loader: CaseLoader, background: Background) -> None:
        """The loops beside an owner's cases, its schedules and queues among them."""
        t = self.t
        t.busy(1)  # until its first pass is done (see `check_versions`)
        case_tg.start_soon(loader.check_versions)
        case_tg.start_soon(loader.sweep_loop)
        case_tg.start_soon(background.due_loop)
        if store.shared:
            case_tg.start_soon(background.changes_loop, loader.claim_queued, self.changed_elsewhere)
        else:  # cases started by a standby or a client are queued for this owner
            case_tg.start_soon(background.changes_loop, loader.claim_queued)
        self.schedules.use(store)
        t.queues.use(store)
        self._scheduled_loops(case_tg)

    def _scheduled_loops(self, case_tg: TaskGroup) -> None:
        """The loops of the schedules and the queues, started here only: without a store, or as a store's owner
        (a standby lists them through the store and starts them once it owns it)."""
        if self.schedules.by_name:
            case_tg.start_soon(self.schedules.run)
        if self.t.queues.queues:
            case_tg.start_soon(self.t.queues.run)

    async def _recover(self, loader: CaseLoader) -> None:
        """Resume the live cases (running, or with effects in flight) not in memory; a poison case is not."""
        assert self.t.store is not None
        for row in await self.t.store.live():
            if await self.recovering(row):
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

    async def recovering(self, row: CaseRow) -> bool:
        """Count one more recovery of a live case, at startup or at a takeover; False: it is suspended as a poison
        case (see `_lifecycle.recovering`)."""
        t = self.t
        assert t.store is not None
        try:
            return await lifecycle.recovering(t.store, row, t.opts.max_recoveries, t.opts.redact)
        except StoreError as exc:  # counting failed: recovered anyway (never kept back by a passing fault)
            _log.warning("could not count a recovery", case_id=row.case_id, error=str(exc))
            return True

    # -- changes made elsewhere (a shared store) -----------------------------------------------------------------

    def changed_elsewhere(self, case_ids: set[str] | None) -> None:
        """Cases that ended on other nodes, or that another node or a client deleted (NOTIFY): an ended copy kept
        in memory here is stale either way (deleted, or re-opened by a retry and ended again there), so it leaves
        memory and reads go to the store; then their awaiters wake. None (some notices were missed: the listener
        reconnected): every ended copy kept here may be stale, so all of them leave memory."""
        cases = self.t.cases
        for case_id in list(cases) if case_ids is None else case_ids:
            actor = cases.get(case_id)
            if actor is not None and actor.journal is not None and actor.state in FINAL and actor.recorded:
                del cases[case_id]
        self.ended_elsewhere(case_ids)

    def ended_elsewhere(self, case_ids: set[str] | None) -> None:
        """Cases that ended on other nodes: wake their awaiters here (None: some were missed: wake them all).
        Every ENDED_POLL seconds all of them wake and re-read their rows: a LISTEN connection lost without a word
        (no RST) misses `end`s and nobody would say so."""
        t = self.t
        events = t.end_events
        now = time.monotonic()
        if case_ids is None or (events and now >= t.ended_poll_at):
            case_ids = None
            t.ended_poll_at = now + ENDED_POLL
        for case_id in list(events) if case_ids is None else case_ids & events.keys():
            events.pop(case_id).set()

    # -- what only an owner does -------------------------------------------------------------------------------

    def owned_store(self, what: str) -> tuple[Store, CaseLoader]:
        """The store and loader of an owning Substrate (retry and fork replay cases here, so they run here)."""
        if self.t.store is None:
            raise ValueError(f"cannot {what}: a Substrate without a store keeps no journal; pass store=...")
        if self.t.loader is None:
            raise ValueError(
                f"cannot {what} from a standby: the process that owns the store runs cases; call it there"
            )
        return self.t.store, self.t.loader

    async def retry(self, case_id: str, inbox_done: list[int]) -> CaseHandle:
        """Re-open a failed (or poison-suspended) case (see `Substrate.retry`); `inbox_done`: the inbox row that
        asked for it, taken out in the same write."""
        store, loader = self.owned_store("retry a case")
        actor = self.t.cases.get(case_id)
        if actor is not None and actor.journal is not None and actor.state in FINAL:
            await recorded(actor)
        if actor is not None and actor.state not in FINAL and not actor.evicted:
            raise SignalRejected.not_retryable(case_id, actor.state.value)
        row = await store.row(case_id)
        if row is None:
            raise CaseNotFound(case_id)
        if store.shared and row.owner != self.t.owner:
            row = await self._take_ended(store, row, inbox_done)
        record = lifecycle.retry_record(case_id, row, await store.journal(case_id), self.t.clock.now())
        item = store.read_queue_item(case_id)
        if item is not None and item.state in ("started", "ended"):  # it goes back through its queue
            return await self._retry_queued(store, row, record, item, inbox_done, actor)
        self._leaves_memory(actor)
        try:
            await lifecycle.reopen(store, row, record, inbox_done)
        except StoreConflict:  # a retry at the same time wrote its record first: this one finds it re-opened
            await self._retried_meanwhile(store, case_id)
        except CommitUnknown:  # re-opened or not, the store decides: the sweep brings it back if it runs again
            loader.bring_back(case_id)
            raise
        await loader.load(case_id)
        return self.handle(case_id)

    async def _take_ended(self, store: Store, row: CaseRow, inbox_done: list[int]) -> CaseRow:
        """Take an ended case of another node (shared store) to retry it here: its row once taken, else why not."""
        case_id = row.case_id
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
        return taken

    def _leaves_memory(self, actor: CaseActor | None) -> None:
        """The ended run of a retried case leaves memory first: from its retry on, reads see the store."""
        if actor is not None and self.t.cases.get(actor.case_id) is actor:
            del self.t.cases[actor.case_id]

    async def _retried_meanwhile(self, store: Store, case_id: str) -> None:
        """A retry whose record lost to another written at the same time: why it is not retried (raised)."""
        now = await store.row(case_id)
        if now is None:  # deleted meanwhile (the store refuses to write a case it no longer holds)
            raise CaseNotFound(case_id) from None
        raise SignalRejected.not_retryable(case_id, now.state) from None

    async def _retry_queued(
        self, store: Store, row: CaseRow, record: dict[str, Any], item: QueueItem, inbox_done: list[int],
        actor: CaseActor | None,
    ) -> CaseHandle:
        """Retry a case that started from a queue: it waits there again (see `_lifecycle.requeue`)."""
        case_id = row.case_id
        if item.queue not in self.t.queues.queues:
            raise SignalRejected.not_retryable(
                case_id, row.state, f"it started on queue {item.queue!r}, which this Substrate does not configure, "
                "and a retried case goes back through its queue: retry it from a Substrate with "
                f"queues={{{item.queue!r}: Queue(...)}}"
            )
        self._leaves_memory(actor)
        try:
            await lifecycle.requeue(store, row, record, item, inbox_done)
        except StoreConflict:  # a retry at the same time wrote its record first: this one finds it re-opened
            await self._retried_meanwhile(store, case_id)
        self.t.queues.nudge()
        return self.handle(case_id)

    async def fork(self, case_id: str, at: int, new_case_id: str | None, inbox_done: list[int]) -> CaseHandle:
        """A new case from the journal of `case_id` up to record `at` (see `Substrate.fork`)."""
        store, loader = self.owned_store("fork a case")
        new_id = self.t.new_id(new_case_id)
        origin = await store.row(case_id)
        if origin is None:
            raise CaseNotFound(case_id)
        now = self.t.clock.now()
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

    async def lifecycle_input(self, row: InboxRow) -> None:
        """A `retry`, `fork` or `backfill` someone else wrote to the inbox (the command, a client, a standby): done
        here, its inbox row taken out in the same write (a backfill's once its slots have started; a refusal is
        raised for the router to mark on the row)."""
        body = row.body if isinstance(row.body, dict) else {}
        if row.kind == "retry":
            await self.retry(row.case_id, [row.id])
        elif row.kind == "backfill":  # (a Client's or the command's: this Substrate has the schedule's data=)
            assert self.t.store is not None
            await self.backfill(body["schedule"], body["start"], body["end"])  # (KeyError: refused)
            await self.t.store.write(CaseWrite(row.case_id, inbox_done=[row.id]))
        else:
            checked = inputs.fork_body(body.get("at"), body.get("new_case_id"), row.case_id)
            await self.fork(row.case_id, checked["at"], checked.get("new_case_id"), [row.id])

    # -- delete --------------------------------------------------------------------------------------------------

    async def delete(self, case_id: str) -> None:
        """Remove an ended case at once (see `Substrate.delete`)."""
        t = self.t
        actor = t.cases.get(case_id)
        if actor is not None and not actor.evicted:
            if actor.state not in FINAL:
                raise SignalRejected.not_ended(case_id, "be deleted", actor.state.value)
            if actor.journal is not None:  # its `end` record may be being written
                await recorded(actor)
        if t.store is None or (actor is not None and actor.journal is None):
            item = t.queues.item(case_id) if t.queues.queues else None
            if case_id not in t.cases and (item is None or item.state != "cancelled"):
                raise CaseNotFound(case_id)
            for gone in [case_id, *self._waited_in_memory(case_id)]:
                t.cases.pop(gone, None)
                t.children.pop(gone, None)
                t.queues.forget(gone)  # (a store removes its item as it deletes the case)
            return
        row = await t.store.row(case_id)
        if row is None:
            t.cases.pop(case_id, None)
            raise CaseNotFound(case_id)
        if not CaseState(row.state).ended:
            raise SignalRejected.not_ended(case_id, "be deleted", row.state)
        for gone in await lifecycle.delete_ended(t.store, case_id):
            t.cases.pop(gone, None)

    def _waited_in_memory(self, case_id: str) -> list[str]:
        """Without a store: the children a case waited for that `delete` removes with it (see
        `_lifecycle.waited_children`), or SignalRejected naming those cancelled with it that have not ended."""
        cases = self.t.cases
        gone: list[str] = []
        owed: list[tuple[str, str]] = []
        parents = [case_id]
        while parents:
            for child in self.t.children.get(parents.pop(), ()):
                actor = cases.get(child)
                if actor is None or actor.waited is None or child in gone:
                    continue
                if actor.state in FINAL:
                    gone.append(child)
                    parents.append(child)
                elif actor.waited == "cancel":
                    owed.append((child, actor.state.value))
        if owed:
            actor = cases.get(case_id)
            raise SignalRejected.children_live(case_id, owed, None if actor is None else actor.state.value)
        return gone


"""Durable cases in and out of memory: `CaseLoader`, the part of a Substrate on a store that brings a case back
(on an input, at recovery, when a timer falls due, after a version check, when this node claims or takes it
over) and lets an idle one go (eviction), and the rows of cases that wait long on effects.

The Substrate keeps the registry of cases in memory (`cases`, shared with this loader) and makes their actors;
the loader decides which durable case is brought into memory and when, once per case however many callers ask
at the same time. It exists only for a Substrate with a store, made when the store is opened.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

import anyio

from .._errors import CaseExists, CaseNotFound, ReplayDivergence, SignalRejected, StoreConflict, StoreError
from .._store import CaseRow, CaseWrite, Store
from .._trace import TraceSink, get_logger
from .._vm import Machine
from ._case import CaseActor
from ._case_journal import case_row, write_waiting_row
from ._clock import Clock
from ._durable import CaseJournal
from ._journal import start_record
from ._mailbox import TimerFired
from ._nodes import Lease
from ._persist import Loaded, end_suspended, rebuild, suspend
from ._registry import Workflows
from ._status import CaseState

_log = get_logger("wfsub.runtime")

EFFECT_ROW_AFTER = 0.1  # seconds a durable case waits on effects before its row records them
CLAIM_BATCH = 100  # queued cases (placement="any") a node claims at a time

ActorFor = Callable[[str, Machine, float, "float | None", "str | None", "str | None"], CaseActor]


class Remote(Exception):
    """Internal: the case is another node's (shared stores): inputs for it go through the inbox."""

    def __init__(self, row: CaseRow) -> None:
        self.row = row


class CaseLoader:
    """Brings durable cases into memory and lets them go (see the module)."""

    def __init__(
        self,
        store: Store,
        workflows: Workflows,
        cases: dict[str, CaseActor],
        clock: Clock,
        *,
        owner: str,
        lease: Lease,
        case_level: str,
        max_instances: int,
        redact: Callable[[Any], Any],
        actor_for: ActorFor,
        spawn: Callable[[CaseActor], None],
        counts: dict[str, int],
        busy: Callable[[int], None],
        is_open: Callable[[], bool],
    ) -> None:
        self.store = store
        self.workflows = workflows
        self.cases = cases  # the Substrate's registry of cases in memory (the same dict)
        self.clock = clock
        self.owner = owner
        self.lease = lease
        self.case_level = case_level
        self.max_instances = max_instances
        self.redact = redact
        self.actor_for = actor_for
        self.spawn = spawn
        self.counts = counts
        self.busy = busy
        self.is_open = is_open
        self.loading: dict[str, anyio.Event] = {}
        # The tracing trace() gave an evicted case (its level, its own sinks): the case gets it back when it comes
        # back. Its sinks stay retained meanwhile (the hub closes them with the Substrate).
        self.evicted_tracing: dict[str, tuple[str, tuple[TraceSink, ...]]] = {}
        self.parked: dict[str, float] = {}  # evict_after: parked durable cases in memory -> when they parked
        self.effect_waits: deque[tuple[float, CaseActor, int]] = deque()  # durable cases waiting on effects
        # The loops below sleep on the case clock only until their next entry falls due, and on these events while
        # they have none: a VirtualClock advanced by a year fires them once per entry, not once per period.
        self.effect_waits_added = anyio.Event()
        self.parked_added = anyio.Event()

    # -- bringing a case into memory -------------------------------------------------------------------------

    async def live(self, case_id: str, what: str) -> CaseActor:
        """The actor of a case not in memory, loaded from the store (raises for an unknown or ended case, and
        `Remote` for another node's)."""
        row = await self.store.row(case_id)
        if row is None:
            raise CaseNotFound(case_id)
        if CaseState(row.state).ended:
            raise SignalRejected.ended(case_id, what, row.state)
        if self.store.shared and row.owner != self.owner:
            raise Remote(row)  # another node's case (or one queued for any node): its inputs go through the inbox
        if row.state == CaseState.SUSPENDED.value and self.workflows.find(row.fingerprint) is None:
            reason = f"it is suspended (no registered version can run it): {row.suspended_reason}"
            raise SignalRejected(case_id, what, reason)
        loaded = await self.load(case_id)
        if loaded is None:
            raise SignalRejected(case_id, what, f"the case is {row.state}: {row.suspended_reason or ''}".strip())
        return loaded

    async def load(self, case_id: str) -> CaseActor | None:
        """Bring a durable case that has not ended into memory (once, however many callers ask at the same time)."""
        actor = self.cases.get(case_id)
        if actor is not None:
            return actor
        waiting = self.loading.get(case_id)
        if waiting is not None:
            await waiting.wait()
            return self.cases.get(case_id)
        event = self.loading[case_id] = anyio.Event()
        self.busy(1)
        try:
            loaded = await rebuild(
                self.store, self.workflows, case_id, self.case_level, self.max_instances, self.redact
            )
            return self.resume(loaded)
        except ReplayDivergence:
            return None  # suspended: its row says why
        finally:
            self.busy(-1)
            del self.loading[case_id]
            event.set()

    async def load_quietly(self, case_id: str) -> None:
        """Bring a case back for the background (recovery, due timers, version checks): a case that fails to come
        back is logged, never a reason for the Substrate to stop."""
        try:
            await self.load(case_id)
        except (StoreError, CaseNotFound) as exc:
            _log.error("could not bring a case back from the store", case_id=case_id, error=str(exc))
        except Exception as exc:  # its journal does not replay (a damaged record, a bug): this case alone stops
            _log.exception("could not rebuild a case from its journal; it is suspended", case_id=case_id)
            row = await self.store.row(case_id)
            if row is not None and not CaseState(row.state).ended:
                reason = f"its journal could not be replayed: {type(exc).__name__}: {exc}"
                await suspend(self.store, row, reason, self.redact)

    def resume(self, loaded: Loaded) -> CaseActor:
        row = loaded.row
        replayer = loaded.replayer
        machine = replayer.machine
        tracing = self.evicted_tracing.pop(row.case_id, None)
        level = None if tracing is None else tracing[0]
        actor = self.actor_for(row.case_id, machine, row.started_at, loaded.journal.deadline, row.workflow, level)
        if tracing is not None:
            machine.trace_level = tracing[0]
            actor.sinks = tracing[1]
        actor.journal = loaded.journal
        actor.cancel_reason = replayer.cancel_reason  # a case brought back while it is being cancelled
        # Timers that fell due while the case was out of memory fire first, in the order of their due times, before
        # any input that reaches the case from now on (those were accepted after the timers were due).
        now = self.clock.now()
        timers = sorted(replayer.timers.values(), key=lambda armed: (armed[1], armed[0].timer_id))
        for timer, due in timers:
            if due <= now:
                actor.armed[timer.timer_id] = (timer.path, due)
                actor.inbox.append(TimerFired(timer.timer_id))
        actor.resume = (list(replayer.effects.values()), [(t, due) for t, due in timers if due > now])
        machine.note("case_resumed", loaded.program.term.kind, {"workflow": row.workflow})
        self.spawn(actor)
        self.counts["started"] -= 1  # it was started in an earlier run
        return actor

    async def start(
        self, actor: CaseActor, workflow: str, fingerprint: str, data: dict[str, Any] | None, seed: int | None,
        deadline: float | None, *, queued: bool,
    ) -> None:
        """Write a new case's `start` record (and its row): the case's id is reserved in memory meanwhile. `queued`:
        the case is queued for any node of a shared store instead (placement="any"). Raises CaseExists for an id
        an earlier run's case has."""
        machine = actor.machine
        assert machine is not None
        machine.digesting = True  # its task outputs are digested into each record from now on
        now = actor.started_at
        case_id = actor.case_id
        journal = actor.journal = CaseJournal(self.store, case_id, workflow, fingerprint, now, time=now)
        journal.deadline = deadline
        start = start_record(case_id, workflow, fingerprint, data, seed, deadline, now)
        change = CaseWrite(case_id, [start], case_row(actor, CaseState.RUNNING))
        if queued:
            try:
                await self.store.queue_case(change)
            except StoreConflict:
                raise CaseExists(case_id) from None
            return
        self.cases[case_id] = actor  # reserve the id while the start record is written
        try:
            await self.store.write(change)
        except StoreConflict:  # an earlier run's case has this id: its start record is there
            self.cases.pop(case_id, None)
            raise CaseExists(case_id) from None
        except BaseException:
            self.cases.pop(case_id, None)
            raise

    async def end_suspended(
        self, row: CaseRow, reason: str, request_id: str | None, inbox_done: list[int] | None = None
    ) -> None:
        """Cancel a suspended case: it ends at once. Concurrent cancels end it once (the others find it ended)."""
        try:
            await end_suspended(self.store, row, reason, self.clock.now(), request_id, inbox_done)
        except StoreConflict:
            now = await self.store.row(row.case_id)
            if now is None or not CaseState(now.state).ended:
                raise
            if inbox_done:
                await self.store.write(CaseWrite(row.case_id, inbox_done=inbox_done))

    # -- what the Substrate runs beside its cases --------------------------------------------------------------

    async def check_versions(self) -> None:
        """Parked cases recorded on a version that is not registered, and suspended ones whose version is
        registered again: checked now, in the background, so what a deploy does to cases in flight is known when
        it starts (`status` shows the stored state until a case's check is done)."""
        for state in (CaseState.WAITING_SIGNAL.value, CaseState.WAITING_TIMER.value, CaseState.SUSPENDED.value):
            before: int | None = None
            while True:
                rows = await self.store.cases(state=state, limit=500, before=before)
                if not rows:
                    break
                for row in rows:
                    if self.store.shared and row.owner != self.owner:
                        continue  # another node's case (or a queued one): its owner checks it
                    registered = self.workflows.find(row.fingerprint) is not None
                    if row.case_id not in self.cases and registered == (state == CaseState.SUSPENDED.value):
                        await self.load_quietly(row.case_id)
                before = rows[-1].order

    async def claim_queued(self) -> None:
        """Claim cases queued with placement="any" whose version this node runs, and start them here."""
        if not self.lease.ok or not self.is_open():
            return
        fingerprints = sorted(self.workflows.by_fingerprint)
        for case_id in await self.store.claim_queued(fingerprints, CLAIM_BATCH):
            await self.load_quietly(case_id)

    def waits_on_effects(self, actor: CaseActor) -> None:
        assert actor.journal is not None
        self.effect_waits.append((self.clock.now(), actor, actor.journal.seq))
        self.effect_waits_added.set()

    async def effect_rows(self) -> None:
        """Record in its row what a case waits for once it has waited EFFECT_ROW_AFTER seconds on effects. A
        quick effect is answered first and costs nothing; a slow one shows in `status` and `wfsub show`."""
        waits = self.effect_waits
        while True:
            if not waits:
                self.effect_waits_added = anyio.Event()
                await self.effect_waits_added.wait()
                continue
            await self.clock.sleep(max(0.0, waits[0][0] + EFFECT_ROW_AFTER - self.clock.now()))
            now = self.clock.now()
            while waits and waits[0][0] + EFFECT_ROW_AFTER <= now:
                _, actor, seq = waits.popleft()
                j = actor.journal
                if (
                    j is not None and j.seq == seq and actor.parked and actor.state is CaseState.WAITING_EFFECT
                    and not actor.evicted
                ):
                    write_waiting_row(actor)

    # -- idle eviction -------------------------------------------------------------------------------------------

    def parked_now(self, actor: CaseActor) -> None:
        parked = self.parked
        parked.pop(actor.case_id, None)  # to the end: the dict stays in order of parking
        parked[actor.case_id] = self.clock.now()
        self.parked_added.set()

    def left_memory(self, actor: CaseActor) -> None:
        if self.cases.get(actor.case_id) is actor:
            del self.cases[actor.case_id]
        if not actor.fenced:
            self.counts["idle_evicted"] += 1
            if actor.sinks or actor.level != self.case_level:  # given by trace(): kept for when it comes back
                self.evicted_tracing[actor.case_id] = (actor.level, actor.sinks)
                actor.sinks = ()  # (not released: the resumed case takes them over)

    async def evict_loop(self, after: float) -> None:
        """Every so often, ask the cases parked for `after` seconds to leave memory (oldest first)."""
        parked = self.parked
        while True:
            if not parked:
                self.parked_added = anyio.Event()
                await self.parked_added.wait()
                continue
            # The oldest entry is first (a case parking again moves to the end): sleep until it is due.
            await self.clock.sleep(max(0.0, next(iter(parked.values())) + after - self.clock.now()))
            now = self.clock.now()
            while parked:
                case_id, since = next(iter(parked.items()))
                if since + after > now:
                    break
                del parked[case_id]
                actor = self.cases.get(case_id)
                if actor is not None and actor.parked and not actor.requested:
                    actor.evict()

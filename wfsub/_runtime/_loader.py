"""Durable cases in and out of memory: `CaseLoader`, the part of a Substrate on a store that brings a case back
(on an input, at recovery, when a timer falls due, after a version check, when this node claims or takes it
over) and lets an idle one go (eviction), and the rows of cases that wait long on effects.

The Substrate keeps the registry of cases in memory (`cases`, shared with this loader) and makes their actors;
the loader decides which durable case is brought into memory and when, once per case however many callers ask
at the same time. It exists only for a Substrate with a store, made when the store is opened.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import anyio

from .._errors import (
    CaseExists,
    CaseNotFound,
    CommitUnknown,
    ReplayDivergence,
    SchedulePaused,
    SignalRejected,
    StoreConflict,
    StoreError,
)
from .._store import CaseRow, CaseWrite, DamagedEntry, Listing, Store
from .._trace import TraceSink, get_logger
from .._vm import Machine
from ._answers import restore as restore_answers
from ._case import CaseActor, moved_away
from ._case_journal import case_row, write_waiting_row
from ._clock import Clock
from ._compact import start_of
from ._control import Existing, Remote, StartRefused
from ._durable import CaseJournal
from ._journal import start_record
from ._mailbox import TimerFired
from ._nodes import LIVE, Lease
from ._persist import LeftSuspended, Loaded, end_suspended, is_poison, rebuild, suspend
from ._queues import not_found_or_queued
from ._registry import Workflows
from ._same_start import same_data
from ._status import FINAL, CaseState

_log = get_logger("wfsub.runtime")

EFFECT_ROW_AFTER = 0.1  # seconds a durable case waits on effects before its row records them
SWEEP_EVERY = 30.0  # seconds between checks that every live case this node owns in the store is in memory
SWEEP_RETRY = (0.5, 10.0)  # seconds before the check after a case failed to come back: first, then at most
CLAIM_BATCH = 100  # queued cases (placement="any") a node claims at a time

ActorFor = Callable[[str, Machine, float, "float | None", "str | None", "str | None"], CaseActor]


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
        ended_here: Callable[[str], None],
        recovering: Callable[[CaseRow], Awaitable[bool]],
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
        # case id -> set once the start being written with that id is written (the actor is in `cases` then) or
        # refused (an earlier case has the id: loads go on to the store's)
        self.starting: dict[str, anyio.Event] = {}
        # The tracing trace() gave an evicted case (its level, its own sinks): the case gets it back when it comes
        # back. Its sinks stay retained meanwhile (the hub closes them with the Substrate).
        self.evicted_tracing: dict[str, tuple[str, tuple[TraceSink, ...]]] = {}
        self.parked: dict[str, float] = {}  # evict_after: parked durable cases in memory -> when they parked
        self.effect_waits: deque[tuple[float, CaseActor, int]] = deque()  # durable cases waiting on effects
        self.missed = anyio.Event()  # set when a case failed to come back (the store failed): `sweep_loop` retries
        self.missed_ids: set[str] = set()  # those cases
        self.ended_here = ended_here  # wakes the awaiters of a case that ended out of memory
        # Counts a live case's recovery (a poison case is suspended instead: False); a takeover counts as a
        # recovery as a restart does (see `_lifecycle.recovering`).
        self.recovering = recovering
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
            raise not_found_or_queued(self.store, case_id, what)
        if CaseState(row.state).ended:
            raise SignalRejected.ended(case_id, what, row.state)
        if self.store.shared and row.owner != self.owner:
            raise Remote(row)  # another node's case (or one queued for any node): its inputs go through the inbox
        if row.state == CaseState.SUSPENDED.value and not self.may_run(row):
            raise _suspended(row, what)
        if row.state == CaseState.QUEUED.value:  # retried, waiting in its queue: it runs once a node claims it
            item = self.store.read_queue_item(case_id)
            raise SignalRejected.requeued(case_id, what, None if item is None else item.queue)
        loaded = await self.load(case_id)
        if loaded is None:  # it could not be brought back: suspended now (its journal does not replay, or is
            row = await self.store.row(case_id) or row  # damaged), or the store failed to load it (tried again)
            if CaseState(row.state).ended:  # failed at once: its queued start data does not fit its input model
                raise SignalRejected.ended(case_id, what, row.state)
            if row.state != CaseState.SUSPENDED.value:
                raise StoreError(self.store.url, f"case {case_id!r} could not be brought back now; try again")
            raise _suspended(row, what)
        return loaded

    async def load(self, case_id: str) -> CaseActor | None:
        """Bring a durable case that has not ended into memory (once, however many callers ask at the same time).
        A start being written with its id is waited for first: its actor if it was written, else the stored case."""
        while (pending := self.starting.get(case_id)) is not None:
            await pending.wait()
        actor = self.cases.get(case_id)
        if actor is not None and not (actor.state in FINAL and await self.stale_end(case_id)):
            return actor
        actor = self.cases.get(case_id)  # (brought back by another caller while the store was read)
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
                self.store, self.workflows, case_id, self.case_level, self.max_instances, self.redact,
                self.clock.now(),
            )
            return self.resume(loaded)
        except (ReplayDivergence, LeftSuspended):
            return None  # suspended: its row says why
        except StartRefused:  # failed before it ran, for queued start data its input model refuses
            self.ended_here(case_id)
            return None
        except DamagedEntry as exc:  # an entry of its own that cannot be read back: this case alone stops
            await self.suspend_damaged(case_id, str(exc))
            return None
        except (StoreError, CaseNotFound):
            raise
        except Exception as exc:  # its journal does not replay (a record missing a field, a bug): this case alone
            _log.exception("could not rebuild a case from its journal; it is suspended", case_id=case_id)
            await self.suspend_damaged(case_id, f"its journal could not be replayed: {type(exc).__name__}: {exc}")
            return None
        finally:
            self.busy(-1)
            del self.loading[case_id]
            event.set()

    def held(self, case_id: str) -> bool:
        """Whether a case is in memory here, not ended: a background pass that finds its id live in the store
        leaves it to its actor. An ended copy is not held: the store may hold another run of its id (deleted by
        a client, a standby, the command or another node, then started again), which `load` brings in."""
        actor = self.cases.get(case_id)
        return actor is not None and actor.state not in FINAL

    async def stale_end(self, case_id: str) -> bool:
        """Whether the ended copy of a case kept in memory here is no longer what the store holds under its id:
        deleted elsewhere (a client, a standby, the command, another node), maybe started again since, or
        re-opened by a retry on another node. It leaves memory then, so reads, inputs and loads go to the store
        (one row read; only for an ended copy whose `end` is written)."""
        actor = self.cases.get(case_id)
        if actor is None or actor.journal is None or actor.state not in FINAL or not actor.recorded:
            return False
        row = await self.store.row(case_id)
        if row is not None and row.state == actor.state.value and row.last_seq == actor.journal.seq:
            return False
        if self.cases.get(case_id) is actor:
            del self.cases[case_id]
            self.parked.pop(case_id, None)
        return True

    async def suspend_damaged(self, case_id: str, reason: str) -> None:
        """Mark a case that cannot be rebuilt suspended with the reason (kept intact: a repaired store resumes it)."""
        row = await self.store.row(case_id)
        if row is not None and not CaseState(row.state).ended:
            await suspend(self.store, row, reason, self.redact)

    async def load_quietly(self, case_id: str) -> None:
        """Bring a case back for the background (recovery, due timers, version checks): a case that fails to come
        back is logged, never a reason for the Substrate to stop (one that cannot be rebuilt is suspended by
        `load`; one the store failed to load is tried again by `sweep_loop`)."""
        try:
            await self.load(case_id)
        except CaseNotFound as exc:
            _log.error("could not bring a case back from the store", case_id=case_id, error=str(exc))
        except StoreError as exc:  # a passing fault, as far as we know: `sweep_loop` tries again
            _log.error("could not bring a case back from the store; trying again shortly", case_id=case_id,
                       error=str(exc))
            self.missed_ids.add(case_id)
            self.missed.set()

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
        actor.inbox_ahead = True  # inputs may wait for it in the inbox: they go before this Substrate's own
        actor.tags, actor.forked_from = row.tags or None, row.forked_from
        actor.kept_beats = loaded.heartbeats
        restore_answers(actor, row, machine.take_answers())  # (a retried update finds its answer)
        actor.parent = loaded.journal.parent
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
        deadline: float | None, *, queued: bool, cancel_with_parent: bool = False,
        sent: Mapping[str, Any] | None = None,
        parent_step: dict[str, Any] | None = None, from_queue: bool = False, waited: bool = False,
        schedule: str | None = None,
    ) -> None:
        """Write a new case's `start` record (and its row): the case's id is reserved in memory meanwhile. `queued`:
        the case is queued for any node of a shared store instead (placement="any"). `sent`: the data as the
        caller sent it (see `start_record`). `from_queue`: the start of a queue item this node claimed (any other
        start of its id is refused while the item waits: `CaseWrite.from_queue`). `schedule`: the schedule whose
        slot this is (SchedulePaused while it is paused: `CaseWrite.schedule`). Raises CaseExists for an id an
        earlier run's case, or a queue item that waits, has."""
        machine = actor.machine
        assert machine is not None
        machine.digesting = True  # its task outputs are digested into each record from now on
        now = actor.started_at
        case_id = actor.case_id
        journal = actor.journal = CaseJournal(self.store, case_id, workflow, fingerprint, now, time=now)
        journal.deadline = deadline
        journal.parent = actor.parent
        journal.parent_step = parent_step
        journal.waited = waited or cancel_with_parent or parent_step is not None
        start = start_record(case_id, workflow, fingerprint, data, seed, deadline, now, actor.tags, actor.parent,
                             cancel_with_parent, sent, parent_step, waited)
        journal.start = start
        change = CaseWrite(case_id, [start], case_row(actor, CaseState.RUNNING), from_queue=from_queue,
                           schedule=schedule)
        if queued:
            try:
                await self.store.queue_case(change)
            except StoreConflict:
                await self.started_before(case_id, start)
                raise CaseExists(case_id) from None
            return
        # The id is not put in `cases` before its start is written: the id may be a parked case's, which an input
        # arriving meanwhile brings back from the store (it waits for this write's outcome in `load`).
        written = self.starting[case_id] = anyio.Event()
        try:
            await self.store.write(change)
            self.cases[case_id] = actor  # (the caller spawns it before it awaits anything)
        except CommitUnknown:  # started or not, the store decides: the sweep brings it back soon if it was (a retry
            self.bring_back(case_id)  # of a child's start finds it in the store and goes on without loading it)
            raise
        except SchedulePaused:  # nothing was written
            raise
        except StoreConflict:  # an earlier run's case has this id: its start record is there
            self._started(case_id, written)
            await self.started_before(case_id, start)
            raise CaseExists(case_id) from None
        finally:
            self._started(case_id, written)

    def _started(self, case_id: str, written: anyio.Event) -> None:
        if self.starting.get(case_id) is written:
            del self.starting[case_id]
        written.set()

    async def started_before(self, case_id: str, start: dict[str, Any]) -> None:
        """Raise `Existing` when the stored case `case_id` started from the same workflow and data as `start`
        (a repeated `new_case`, e.g. after a CommitUnknown): a live one of this node's is brought into memory."""
        stored = await self.store.load(case_id)
        began = None if stored is None else start_of(stored.start)  # (kept in a compaction's snapshot record)
        if stored is None or began is None or began.get("workflow") != start["workflow"]:
            return
        if not same_data(began, start):
            return
        row = stored.row
        mine = not self.store.shared or row.owner == self.owner
        actor = None
        if mine and not CaseState(row.state).ended and row.state != CaseState.QUEUED.value:
            actor = self.cases.get(case_id) or await self.load(case_id)  # (a retried one in its queue stays there)
        raise Existing(actor)

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

    # -- many nodes: cases taken over, by this node or from it ---------------------------------------------------

    async def taken(self, row: CaseRow) -> None:
        """A case this node has just taken over (its epoch bumped). An actor of it still in memory is never
        trusted: it holds an older epoch (this node had the case before a pause and lost it meanwhile), so it
        leaves memory without writing. The case is then brought back at the new epoch if it was running (counted
        as a recovery: a case that kills each node that runs it is suspended as a poison case, not taken over from
        node to node for ever); a parked one comes back on its next input or due timer."""
        self.drop_stale(row)
        if (row.state in LIVE or row.effects) and await self.recovering(row):
            await self.load_quietly(row.case_id)

    def drop_stale(self, row: CaseRow) -> bool:
        """Whether the actor in memory of the case of `row` held it at an older epoch or for another owner (it
        leaves memory then, writing nothing; the next input or load makes a fresh one)."""
        actor = self.cases.get(row.case_id)
        if actor is None or actor.journal is None or actor.state in FINAL:
            return False
        if row.owner == self.owner and actor.journal.epoch >= row.epoch:
            return False
        del self.cases[row.case_id]
        self.parked.pop(row.case_id, None)
        actor.fence(moved_away(self.store.url, row.case_id))
        _log.warning("case left memory: another node took it over", case_id=row.case_id, owner=row.owner,
                     epoch=row.epoch)
        return True

    async def recheck(self) -> bool:
        """After this node's lease may have run out: the actors of cases it no longer holds (another owner, a newer
        epoch) leave memory. False when the store could not be read (the node stays paused and checks again)."""
        for case_id, actor in list(self.cases.items()):
            if actor.journal is None or actor.state in FINAL:
                continue
            try:
                row = await self.store.row(case_id)
            except StoreError as exc:
                _log.warning("could not check which cases this node still holds", case_id=case_id, error=str(exc))
                return False
            if row is not None and self.cases.get(case_id) is actor:
                self.drop_stale(row)
        return True

    # -- what the Substrate runs beside its cases --------------------------------------------------------------

    async def sweep_loop(self) -> None:
        """Bring back the cases this node owns in the store that should be in memory and are not: those that
        failed to come back (recovery, takeover, a claim, a due timer) while the store failed, soon after (backing
        off while it still fails), and every SWEEP_EVERY seconds any live one (a takeover whose answer was lost,
        say; not a suspended one: it waits for a version or a cancel). So no case stays owned and not run. Real
        time, whatever clock the cases run on (as the lease)."""
        delay = SWEEP_RETRY[0]
        while True:
            with anyio.move_on_after(SWEEP_EVERY):
                await self.missed.wait()
            if self.missed.is_set():
                await anyio.sleep(delay)
                delay = min(delay * 2, SWEEP_RETRY[1])
                self.missed = anyio.Event()
            else:
                delay = SWEEP_RETRY[0]
            if not self.is_open():
                continue
            missed, self.missed_ids = self.missed_ids, set()
            try:
                rows = [row for row in await self.store.live() if row.state != CaseState.SUSPENDED.value]
                rows += [row for row in [await self.store.row(case_id) for case_id in missed] if row is not None]
            except StoreError as exc:
                _log.warning("could not list this node's live cases", error=str(exc))
                self.missed_ids |= missed
                self.missed.set()
                continue
            for row in rows:
                if self.held(row.case_id) or row.case_id in self.loading or CaseState(row.state).ended:
                    continue
                if self.store.shared and row.owner != self.owner:
                    continue
                await self.load_quietly(row.case_id)

    async def check_versions(self) -> None:
        """`check_versions_once`, tried again (backing off) while the store fails. The caller counted this Substrate
        busy for the first try (`busy(1)` before starting it), so a VirtualClock settles only once the cases that
        try brings back (or suspends) are known."""
        delay = SWEEP_RETRY[0]
        counted = True
        while True:
            try:
                await self.check_versions_once()
                return
            except StoreError as exc:
                _log.warning("could not check the versions of stored cases; trying again", error=str(exc))
            finally:
                if counted:
                    self.busy(-1)
                    counted = False
            await anyio.sleep(delay)
            delay = min(delay * 2, SWEEP_RETRY[1])

    async def check_versions_once(self) -> None:
        """Parked cases recorded on a version that is not registered, and suspended ones that a registered version
        may run now (their own, or one their journal migrates to): checked now, in the background, so what a
        deploy does to cases in flight is known when it starts (`status` shows the stored state until a case's
        check is done)."""
        tried: set[str] = set()  # a case tried once (parked, then found suspended) is not tried again in this pass
        for state in (CaseState.WAITING_SIGNAL.value, CaseState.WAITING_TIMER.value, CaseState.SUSPENDED.value):
            before: int | None = None
            while True:
                rows = await self.store.cases(Listing(state, limit=500, before=before))
                if not rows:
                    break
                for row in rows:
                    if self.store.shared and row.owner != self.owner:
                        continue  # another node's case (or a queued one): its owner checks it
                    if self.held(row.case_id) or row.case_id in tried:
                        continue
                    tried.add(row.case_id)
                    if state == CaseState.SUSPENDED.value:
                        if self.may_run(row):  # its version, or one it may migrate to: tried again
                            await self.load_quietly(row.case_id)
                    elif self.workflows.find(row.fingerprint) is None:
                        await self.load_quietly(row.case_id)
                before = rows[-1].order

    def may_run(self, row: CaseRow) -> bool:
        """Whether a registered version may run a suspended case: its own, or (its journal decides, when it is
        replayed) any registered version of its workflow. Never a poison case: its version runs it, and that is
        what stops its process; only `retry` brings it back."""
        if is_poison(row):
            return False
        return self.workflows.find(row.fingerprint) is not None or bool(self.workflows.versions.get(row.workflow))

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

    def bring_back(self, case_id: str) -> None:
        """Have the sweep bring `case_id` back soon if the store holds it live and this node's (a write for it
        whose outcome is unknown: a retry, a fork)."""
        self.missed_ids.add(case_id)
        self.missed.set()

    def left_memory(self, actor: CaseActor) -> None:
        if self.cases.get(actor.case_id) is actor:
            del self.cases[actor.case_id]
        if actor.fenced:  # the store refused its journal: still this node's (a resend after a lost answer), the
            self.missed_ids.add(actor.case_id)  # sweep brings it back from the journal; another node's, it skips it
            self.missed.set()
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


def _suspended(row: CaseRow, what: str) -> SignalRejected:
    """The refusal of an input for a suspended case (a poison case's says to retry it)."""
    if is_poison(row):
        return SignalRejected.poisoned(row.case_id, what, row.suspended_reason)
    return SignalRejected.suspended(row.case_id, what, row.suspended_reason)

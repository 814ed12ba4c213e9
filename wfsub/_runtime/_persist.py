"""Durable cases on a store: starting them, bringing them back into memory, and what the Substrate runs beside
its cases (recovery, due timers of parked cases, the inbox of outside writers, version checks).

Recovery. Entering a Substrate on a store resumes the cases that were running or had effects in flight: each
is rebuilt (newest usable snapshot + the records after it, or the whole journal), its timers re-armed at their
due times, and the effects that were in flight started again (at least once: the idempotency key is stable).
Parked cases (waiting for a signal or a timer) stay in the store until an input or a due timer needs them, so
recovery does not replay a million parked cases at start.

Versions. A case runs on the registered version whose fingerprint it recorded. If none matches, it is replayed
against the registered versions of its workflow, newest first; it migrates (a `version` record and a fresh
snapshot) to the first whose replay applies the whole journal without divergence and whose in-flight effects and
armed timers match what the case row recorded (ids, node paths, names). Otherwise it is `suspended`, with the
newest version's divergence in its status, and kept intact until a version that can run it is registered (its
own, or one it migrates to: each start of a Substrate tries again). A suspended case can still be cancelled: it
ends at once.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import anyio

from .._errors import CaseNotFound, ReplayDivergence, StoreError
from .._program import Program
from .._store import CaseRow, CaseWrite, InboxRow, Record, Store
from .._trace import get_logger
from ._answers import with_taken
from ._compact import is_snapshot, start_of
from ._durable import CaseJournal, snapshot_of, usable
from ._journal import effective, end_record, input_record, parent_step_of, waited_of
from ._queued import checked_start
from ._refusals import refused_inputs
from ._registry import Workflows
from ._replay import Replayer, replayer_for
from ._request_ids import journaled_kinds, taken
from ._status import CaseState, CaseStatus, EffectStatus, Failure, TimerStatus

_log = get_logger("wfsub.runtime")

INBOX_POLL = 0.2  # seconds between checks for inputs written by someone else (a cheap data_version check)
DUE_POLL = 1.0  # seconds the due-timer loop sleeps at most before looking at the store again
DUE_PAGE = 1000  # due rows the due-timer loop reads at a time


POISON = "recovered"
"""How a poison case's suspended reason begins (`_lifecycle.poison_reason`): `retry` re-opens such a case."""


def is_poison(row: CaseRow) -> bool:
    """Whether a row is a case suspended as poison (recovered `max_recoveries` times without a new record): only
    `retry` brings it back, never a background pass or an input (each would run it, and kill its process, again).
    Its count of recoveries says so; a row suspended before the count did, by its reason."""
    if row.state != CaseState.SUSPENDED.value:
        return False
    return bool((row.recovered or {}).get("poison")) or (row.suspended_reason or "").startswith(POISON)


class LeftSuspended(Exception):  # noqa: N818 (not an error: the answer of a load that must not run the case)
    """Internal: `rebuild` of a poison case (`is_poison`): it stays in the store, suspended, until a `retry`."""


class Loaded:
    """A case rebuilt from the store, ready to become a live actor."""

    __slots__ = ("row", "start", "program", "replayer", "journal", "heartbeats")

    def __init__(self, row: CaseRow, start: Record, program: Program, replayer: Replayer, journal: CaseJournal):
        self.row = row
        self.start = start
        self.program = program
        self.replayer = replayer
        self.journal = journal
        self.heartbeats: dict[str, Any] = {}  # the heartbeats its case row kept (`Store.put_heartbeats`)


def _same(value: Any) -> Any:
    return value


async def rebuild(
    store: Store, workflows: Workflows, case_id: str, trace_level: str, max_instances: int,
    redact: Callable[[Any], Any] = _same, now: float | None = None,
) -> Loaded:
    """Rebuild a case that has not ended from the store (raising CaseNotFound, or ReplayDivergence with the case
    then marked suspended in the store). `now`: a case whose journal holds only its start has its start data
    checked by its input model first (`_queued`: StartRefused once it is failed for it)."""
    stored = await store.load(case_id)
    if stored is None:
        raise CaseNotFound(case_id)
    row, first = stored.row, stored.start
    if is_poison(row):  # (whoever asks: replaying it would start the effect that stops its process again)
        raise LeftSuspended(case_id)
    start = start_of(first)  # (a compacted journal's first record is its `snapshot`, which keeps the start)
    found = workflows.find(row.fingerprint)
    if found is not None:
        program = found[1]
        if now is not None and stored.snapshot is None and not stored.records and not row.ended_at:
            start = await checked_start(store, workflows, row, start, program, now)
        snapshot = stored.snapshot if usable(stored.snapshot) else None
        try:
            if snapshot is not None:
                records = stored.records
                replayer = Replayer(
                    program, start, trace_level=trace_level, snapshot=snapshot.state, max_instances=max_instances,
                )
            else:  # from the first record kept: the start, or a compaction's snapshot record
                records = stored.records if stored.snapshot is None else await _after_first(store, case_id)
                base = first if is_snapshot(first) else start  # (a queued case's start: as checked above)
                replayer = replayer_for(program, base, trace_level=trace_level, max_instances=max_instances)
            for record in effective(records):
                replayer.apply(record)
            # On to where the live case was after its last record: blocked again, with the same effects in flight
            # and timers armed (tasks re-run; nothing external happens). Inputs waiting for it then apply there.
            replayer.run()
            _same_tasks_as_parked(row, replayer)
        except ReplayDivergence as exc:
            await suspend(store, row, str(exc), redact)
            raise
        journal = _journal(store, row, start, replayer)
        journal.first_seq = int(first["seq"])
        loaded = Loaded(row, start, program, replayer, journal)
    else:
        loaded = await migrate(store, workflows, row, first, trace_level, max_instances, redact)
    loaded.heartbeats = dict(stored.heartbeats)
    return loaded


async def migrate(
    store: Store, workflows: Workflows, row: CaseRow, start: Record, trace_level: str, max_instances: int,
    redact: Callable[[Any], Any] = _same,
) -> Loaded:
    """Replay a case recorded on an unregistered version against the registered versions of its workflow, newest
    first: it migrates to the first its whole journal applies to (suspended, with the newest's divergence, if
    none does)."""
    versions = workflows.versions.get(row.workflow)
    if not versions:
        reason = (
            f"case {row.case_id!r} recorded workflow {row.workflow!r}, which is not registered "
            f"(registered: {', '.join(workflows.names) or 'none'}); register it to resume the case"
        )
        await suspend(store, row, reason, redact)
        raise ReplayDivergence(row.case_id, 0, "start", f"workflow {row.workflow!r} registered", "it is not")
    records = await store.journal(row.case_id)  # from its first record kept: the start, or a snapshot record
    if not records:
        raise CaseNotFound(row.case_id)
    start = start_of(records[0])
    newest: ReplayDivergence | None = None
    for program in reversed(versions):
        try:
            replayer = check_version(program, row, records, max_instances, trace_level)
            break
        except ReplayDivergence as exc:
            newest = newest or exc
    else:
        assert newest is not None
        await suspend(store, row, str(newest), redact)
        raise newest
    journal = _journal(store, row, start, replayer)
    journal.first_seq = int(records[0]["seq"])
    m = replayer.machine
    digest, _ = m.take_digest()
    now = replayer.time
    # The timers armed before the migration keep the due times the old version gave them (its row has them); the
    # new version's durations count only for timers armed from here on. The record carries them for replay.
    pinned = {str(t["timer_id"]): float(t["due"]) for t in row.timers if int(t["timer_id"]) in replayer.timers}
    record = journal.record("version", m.steps, digest, now,
                            **{"from": row.fingerprint, "to": program.fingerprint, "timers": pinned})
    replayer.pin_timers(pinned)
    journal.fingerprint = program.fingerprint
    journal.migrated_from = row.migrated_from = row.fingerprint
    row.fingerprint = program.fingerprint
    row.last_seq = journal.seq
    row.digest = digest  # the new version's tasks, as the `version` record has them
    snapshot = snapshot_of(m, journal, {tid: due for tid, (_, due) in replayer.timers.items()})
    await store.write(CaseWrite(row.case_id, [record], row, snapshot, epoch=journal.epoch))
    _log.info("case migrated to a new version", case_id=row.case_id, to=program.fingerprint[:16])
    return Loaded(row, start, program, replayer, journal)


def check_version(
    program: Program, row: CaseRow, records: list[Record], max_instances: int | None = None,
    trace_level: str = "none",
) -> Replayer:
    """The case replayed on `program`, or the ReplayDivergence that suspends it there, as a migration decides:
    the whole journal applies, and the effects and timers then in flight are the ones its row recorded (see
    `_same_requests`). A Substrate migrates by it; `wfsub replay` checks it before a deploy."""
    replayer = replayer_for(program, records[0], trace_level=trace_level, max_instances=max_instances)
    records = effective(records)
    for record in records[1:]:
        replayer.apply(record)
    if records[-1].get("kind") == "end":
        return replayer
    replayer.run()
    if program.fingerprint != row.fingerprint:
        _same_requests(row, replayer, records)
    return replayer


_PARKED_ROWS = (CaseState.WAITING_SIGNAL.value, CaseState.WAITING_TIMER.value, CaseState.WAITING_EFFECT.value)


def _waited_as(row: CaseRow) -> str:
    """The state a row's list of waits was written in: a suspended case's is the state it was suspended from
    (suspending it changed only its state and reason), so it is checked as that parked row would be: a version
    that would run what the case never ran (an effect inserted before the wait it parked at) still diverges,
    whatever input brings it back."""
    if row.state == CaseState.SUSPENDED.value:
        return row.suspended_from or row.state
    return row.state


def _same_tasks_as_parked(row: CaseRow, replayer: Replayer) -> None:
    """The tasks run after the last record, replayed, gave what they gave before the case parked: a row written
    when the case parked carries their digest (no record does until the next input), so a task that reads a
    clock, randomness or global state cannot hand the case other data silently."""
    if row.digest is None or _waited_as(row) not in _PARKED_ROWS or row.last_seq != replayer.seq:
        return
    digest, tasks = replayer.machine.take_digest()
    if digest != row.digest:
        raise ReplayDivergence(
            row.case_id, row.last_seq, "parked", f"task outputs with digest {row.digest} when the case parked",
            f"the tasks gave digest {digest}", tasks,
        )


def _same_requests(row: CaseRow, replayer: Replayer, records: list[Record]) -> None:
    """After a migration replay, the effects in flight and the timers armed must be the ones the row recorded
    (ids, node paths, effect names): a version that would run another effect in place of one in flight (whose
    side effect may be under way) or arm another timer is not the case's.

    A row written where the case waits (for a signal, a timer or effects) after the journal's last record lists
    exactly what was in flight. Any other row (a running case) was written before its last inputs were applied:
    then each effect and timer it lists that no later record answered must still be in flight, as it recorded.
    """
    have_effects = {eid: (req.path, req.name) for eid, req in replayer.effects.items()}
    have_timers = {tid: timer.path for tid, (timer, _) in replayer.timers.items()}
    exact = _waited_as(row) in _PARKED_ROWS and row.last_seq == records[-1].get("seq")
    if exact:
        want_effects = {e["effect_id"]: (e["path"], e["name"]) for e in row.effects}
        want_timers = {t["timer_id"]: t["path"] for t in row.timers}
    else:
        answered = {(r.get("kind"), r.get("effect_id"), r.get("timer_id")) for r in records}
        want_effects = {
            e["effect_id"]: (e["path"], e["name"]) for e in row.effects
            if ("effect", e["effect_id"], None) not in answered
        }
        want_timers = {t["timer_id"]: t["path"] for t in row.timers if ("timer", None, t["timer_id"]) not in answered}
        have_effects = {eid: v for eid, v in have_effects.items() if eid in want_effects}
        have_timers = {tid: v for tid, v in have_timers.items() if tid in want_timers}
    if want_effects == have_effects and want_timers == have_timers:
        return

    def effects(found: Mapping[int, tuple[str, str]]) -> str:
        return ", ".join(f"effect {eid} {name!r} at {path}" for eid, (path, name) in sorted(found.items())) or "none"

    def timers(found: Mapping[int, str]) -> str:
        return ", ".join(f"timer {tid} at {path}" for tid, path in sorted(found.items())) or "none"

    differs = []
    for eid in sorted(want_effects.keys() | have_effects.keys()):
        was, now = want_effects.get(eid), have_effects.get(eid)
        if was != now:
            said = "nothing" if was is None else f"{was[1]!r} at {was[0]}"
            runs = "nothing" if now is None else f"{now[1]!r} at {now[0]}"
            differs.append(f"effect {eid}: in flight {said}, the new version has {runs}")
    differs.extend(
        f"timer {tid}: armed at {want_timers.get(tid) or 'nothing'}, the new version has "
        f"{have_timers.get(tid) or 'nothing'}"
        for tid in sorted(want_timers.keys() | have_timers.keys())
        if want_timers.get(tid) != have_timers.get(tid)
    )
    raise ReplayDivergence(
        row.case_id,
        row.last_seq,
        "version",
        f"effects in flight: {effects(want_effects)}; timers armed: {timers(want_timers)} (as the case recorded)",
        f"the new version has effects {effects(have_effects)} and timers {timers(have_timers)} ({'; '.join(differs)})",
    )


async def _after_first(store: Store, case_id: str) -> list[Record]:
    """The records after the first one the journal keeps (its start, or a compaction's snapshot record)."""
    return (await store.journal(case_id))[1:]


def _journal(store: Store, row: CaseRow, start: Record, replayer: Replayer) -> CaseJournal:
    # The journal's own last seq, not the row's: a case that never parked since its start (effects in flight)
    # has records past what its row last said.
    journal = CaseJournal(
        store, row.case_id, row.workflow, row.fingerprint, row.started_at, seq=replayer.seq, time=replayer.time
    )
    journal.deadline = start.get("deadline")
    journal.parent = start.get("parent")
    journal.parent_step = parent_step_of(start)
    journal.waited = waited_of(start)
    journal.order = row.order
    journal.epoch = row.epoch or 1
    journal.request_ids = dict(replayer.request_ids)
    journal.start = start
    journal.run = replayer.run_count
    journal.recovered = row.recovered
    journal.migrated_from = row.migrated_from
    journal.refused = list(row.refused)
    journal.row_parked = row.state in (CaseState.WAITING_SIGNAL.value, CaseState.WAITING_TIMER.value)
    return journal


async def suspend(store: Store, row: CaseRow, reason: str, redact: Callable[[Any], Any] = _same) -> None:
    """Keep a case that no registered version can run intact, marked suspended with the reason (redacted: the
    row is what people read)."""
    try:
        current = await store.row(row.case_id)  # read again just before: a cancel may have ended it meanwhile
        if current is None or CaseState(current.state).ended or current.last_seq != row.last_seq:
            return  # ended or moved on since `row` was read: its row says so, nothing to mark
        if row.state != CaseState.SUSPENDED.value:  # (suspended again: it keeps the state it was suspended from)
            row.suspended_from = row.state
        row.state = CaseState.SUSPENDED.value
        row.suspended_reason = str(redact(reason))
        await store.write(CaseWrite(row.case_id, [], row, epoch=row.epoch or None))
    except StoreError as exc:
        _log.error("could not mark a case suspended", case_id=row.case_id, error=str(exc))
    _log.warning("case suspended", case_id=row.case_id, reason=row.suspended_reason)


async def end_suspended(
    store: Store, row: CaseRow, reason: str, now: float, request_id: str | None, inbox_done: list[int] | None = None
) -> None:
    """Cancel a suspended case: it ends at once, with no compensation (no program can run it). A request id
    another kind of input of the case used is refused (SignalRejected, see `_request_ids`); the id of a cancel the
    case took (one that set it compensating before it was suspended) is that cancel retried: nothing is written
    (a second cancel would end the case at once, skipping the compensation the first one asked for)."""
    if request_id is not None and taken(
        await journaled_kinds(store, row.case_id, request_id), request_id, "cancel", row.case_id, "cancel"
    ):
        if inbox_done:
            await store.write(CaseWrite(row.case_id, inbox_done=list(inbox_done)))
        return
    asked = {} if request_id is None else {"request_id": request_id}
    cancel = input_record(row.last_seq + 1, "cancel", None, now, None, reason=reason, compensate=False, **asked)
    runs = sum(1 for record in await store.journal(row.case_id) if record.get("kind") == "retry")
    end = end_record(row.last_seq + 2, now, "cancelled", reason=reason, run=runs)
    row.state = CaseState.CANCELLED.value
    row.ended_at = now
    row.cancel_reason = reason
    row.last_seq += 2
    await store.write(CaseWrite(row.case_id, [cancel, end], row, inbox_done=list(inbox_done or ()),
                                epoch=row.epoch or None))


def status_of(row: CaseRow, redact: Callable[[Any], Any]) -> CaseStatus:
    """A case's status as its row in the store records it (a case that is not in memory)."""
    error = row.error or {}
    failure = None
    if row.state == CaseState.FAILED.value:
        record = error.get("record") or {}
        failure = Failure(
            type=str(error.get("type", "StepFailed")),
            message=str(redact(error.get("message", ""))),
            path=str(error.get("path", "?")),
            traceback=redact(error.get("traceback")),
            compensated=tuple(record.get("compensated") or ()),
        )
    return CaseStatus(
        case_id=row.case_id,
        state=CaseState(row.state),
        steps=0,
        signals=tuple(row.signals),
        effects_pending=len(row.effects),
        timers_armed=len(row.timers),
        regions=(),
        wakeups=0,
        started_at=row.started_at,
        ended_at=row.ended_at,
        error=None if failure is None else f"case {row.case_id!r} failed at {failure.path}: {failure.message}",
        cancel_reason=row.cancel_reason,
        workflow=row.workflow,
        at=tuple(row.at),
        effects=tuple(
            EffectStatus(effect_id=e["effect_id"], name=e["name"], path=e["path"], attempt=e.get("attempt", 1),
                         started_at=e.get("started_at"))
            for e in row.effects
        ),
        timers=tuple(TimerStatus(timer_id=t["timer_id"], path=t["path"], due=t["due"]) for t in row.timers),
        failure=failure,
        suspended_reason=None if row.suspended_reason is None else str(redact(row.suspended_reason)),
        order=row.order or None,
        tags=dict(row.tags),
        forked_from=row.forked_from,
        version=row.fingerprint or None,
        migrated_from=row.migrated_from,
        refused=with_taken(refused_inputs(row.refused) if row.refused else (), row.taken_refused),
        parent=row.parent,
    )


class Background:
    """The loops a durable Substrate runs beside its cases (each counted busy while it works, for VirtualClock)."""

    def __init__(
        self,
        store: Store,
        now: Callable[[], float],
        sleep: Callable[[float], Any],
        deadline: Callable[[float], Any],
        held: Callable[[str], bool],
        load: Callable[[str], Any],
        route_inbox: Callable[[list[InboxRow]], Awaitable[None]],
        busy: Callable[[int], None],
    ) -> None:
        self.store = store
        self.now = now
        self.sleep = sleep
        self.deadline = deadline  # the clock's own timeout scope: a VirtualClock moves it
        self.held = held  # whether a case is in memory, not ended (`CaseLoader.held`)
        self.load = load
        self.route_inbox = route_inbox
        self.busy = busy
        self.nudge = anyio.Event()
        self.sleeping_until = math.inf  # the earliest due time the due loop will look at the store by

    def wake(self, due: float) -> None:
        """A case left memory with a timer (or deadline) due at `due`: look again now if that comes before what the
        due loop sleeps until (one comparison per eviction: a burst of evictions wakes it once, if at all)."""
        if due < self.sleeping_until:
            self.sleeping_until = due
            self.nudge.set()

    async def due_loop(self) -> None:
        """Bring back parked cases (not in memory) whose timer or deadline is due; they fire it at once."""
        while True:
            # A fresh nudge before reading: a case leaving memory while the store is read wakes the wait below.
            self.nudge = anyio.Event()
            self.sleeping_until = math.inf
            self.busy(1)
            try:
                now = self.now()
                await self._load_due(now)
                # The next due time after now, whoever holds that case: a row due by now is in memory (its own
                # timer fires it) or was just brought back, so the loop never waits on a due time that has passed
                # and sleeps through a parked case's later one (rows of cases in memory stay in the store's
                # answer until they fire).
                upcoming = await self.store.next_due(after=now)
            except StoreError as exc:
                _log.error("could not read due cases", error=str(exc))
                upcoming = None
            finally:
                self.busy(-1)
            # Wake when the next due time comes (on the case clock), when nudged, or after DUE_POLL seconds of real
            # time (what others changed in the store). The poll is real time whatever the clock, so a VirtualClock
            # advanced by a year fires this loop once per due time in that year, not once per DUE_POLL.
            with anyio.move_on_after(DUE_POLL):
                if upcoming is None:
                    await self.nudge.wait()
                else:
                    self.sleeping_until = min(self.sleeping_until, upcoming)
                    with self.deadline(upcoming - self.now()):
                        await self.nudge.wait()

    async def _load_due(self, now: float) -> None:
        """Bring back every parked case not in memory whose due time is `now` or earlier, page by page (the rows of
        cases in memory are passed over, never read again in this pass)."""
        after: tuple[float, int] | None = None
        while True:
            rows = await self.store.due(now, DUE_PAGE, after=after)
            for row in rows:
                if not self.held(row.case_id):
                    await self.load(row.case_id)
            if len(rows) < DUE_PAGE:
                return
            last = rows[-1]
            assert last.next_due is not None
            after = (last.next_due, last.order)

    async def changes_loop(
        self,
        claim: Callable[[], Awaitable[None]] | None = None,
        ended_elsewhere: Callable[[set[str] | None], None] | None = None,
    ) -> None:
        """Take what others committed: inputs in the inbox (the `wfsub` command, other nodes) for this store's
        cases, and on a shared store the cases that ended on other nodes (their awaiters here wake) and queued
        cases to claim. The store says when to look (`wait_changed`: SQLite's data_version, Postgres's NOTIFY)."""
        store = self.store
        first = True
        while True:
            if not first:
                await store.wait_changed(INBOX_POLL)
            first = False
            self.busy(1)
            try:
                if ended_elsewhere is not None:
                    ended_elsewhere(store.drain_ended())
                if claim is not None:
                    await claim()
                # The inbox is read whole each time (it holds only inputs not yet journaled): a shared store's ids
                # can commit out of order (several writers), and an input the store failed to hand over is tried
                # again at the next poll, without holding up the ones after it.
                await self.route_inbox(await store.inbox_take(after=0))
            except StoreError as exc:
                _log.error("could not read the inbox", error=str(exc))
            finally:
                self.busy(-1)

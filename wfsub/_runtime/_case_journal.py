"""The durable side of a case actor: how a case with a journal appends its inputs and commits them, tells the
store where it parks, leaves memory when idle, and records its end.

A durable case (one with a `CaseJournal`) journals every input before applying it: it takes the waiting inputs,
gives each its sequence number and the step count at which it applies, commits them in one write (grouped by
the store with other cases' writes), then applies them in order at that count. Its senders are answered once
their input is committed and applied. The inputs from outside were checked at their door (`_inputs.admit`:
the vm's check, their JSON as journaled), so a record is built from the message as it is. A region operation
is also checked against the case as it will be when applied (is the region active, does it take the operation):
it goes first in its batch, so a refused one is never journaled and its sender (an inbox row too) hears why. The
case tells the
store when it parks on a signal or a timer (its case row, without waiting for the commit) and when it ends (an
`end` record, waited for).

Request ids (see `_request_ids`): an input whose id the case took from an input of the same kind is a retry,
answered without a record (in the same batch: once the input it repeats is committed, with its outcome); one
whose id an input of another kind took is refused like any input the case refuses; an input refused for any
reason leaves its id free. The ids of a commit being written are in `CaseJournal.committing`, so an update
retried meanwhile (`Substrate.update`) waits for that commit instead of taking its id for an answer long gone.

These are functions over the actor (`_case.CaseActor`), which calls them where its coroutine reaches them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import anyio

from .._errors import (
    CommitUnknown,
    EffectResultError,
    RestoredError,
    StoreConflict,
    StoreError,
    SubstrateClosed,
    WfsubError,
    error_name,
)
from .._store import CaseRow, CaseWrite
from .._trace import get_logger
from . import _compact as compaction
from ._answers import journaled, not_journaled, row_answers, row_owed, row_refused, unsaved
from ._control import Fenced
from ._durable import SNAPSHOT_EVERY, CaseJournal, InCommit, snapshot_of
from ._inputs import kind_of
from ._journal import ERROR_TEXT_LIMIT, as_journaled, end_record, error_body
from ._mailbox import Cancel, EffectDone, External, Message, RegionAction, RegionOp, Signal, TimerFired
from ._refusals import log_refused
from ._request_ids import taken
from ._status import CaseState

if TYPE_CHECKING:
    from .._vm import RunResult
    from ._case import CaseActor

_log = get_logger("wfsub.runtime")

_STORE_RETRY = 1.0  # seconds between attempts to journal an input the store refused with an error
_RUNNING = CaseState.RUNNING
_FAILED = CaseState.FAILED
_CANCELLED = CaseState.CANCELLED
_WAITING_EFFECT = CaseState.WAITING_EFFECT
_WAITING_SIGNAL = CaseState.WAITING_SIGNAL
_WAITING_TIMER = CaseState.WAITING_TIMER


def _request(msg: Any) -> dict[str, Any]:
    request_id = getattr(msg, "request_id", None)
    return {} if request_id is None else {"request_id": request_id}


async def durable_burst(actor: CaseActor, drain: bool = True) -> RunResult:
    if drain:
        while actor.inbox:
            await journal_inbox(actor)
    return actor.vm_burst()


async def journal_inbox(actor: CaseActor) -> None:
    """Journal the waiting inputs in one commit, then apply them in order at this step (see the module)."""
    j = actor.journal
    m = actor.machine
    assert j is not None
    assert m is not None
    batch, actor.inbox = actor.inbox, []
    actor.took_mailbox()
    digest, _ = m.take_digest()
    now = actor.shared.clock.now()
    entries: list[tuple[Message, dict[str, Any]]] = []
    refused: list[tuple[int, str]] = []
    told: list[tuple[External, str]] = []  # the refused inbox inputs, logged once their refusal is committed
    repeated: list[int] = []  # inbox rows of retried calls: taken, nothing journaled
    seq = j.seq
    fresh: dict[str, Message] = {}  # request id -> the input of this batch that carries it
    twins: list[Message] = []  # retries of an input of this batch (same id, same kind): answered as it is
    for index, msg in enumerate(batch):
        if type(msg) is RegionOp and entries:  # checked against the case as it is when applied: first in a batch
            actor.inbox[:0] = batch[index:]  # (the next batch: durable_burst journals until the inbox is empty)
            break
        request_id = getattr(msg, "request_id", None)
        inbox_id: int = getattr(msg, "inbox_id", 0)
        try:
            if request_id is not None and taken(
                j.request_ids, request_id, kind_of(_external(msg)), actor.case_id, _external(msg).what
            ):  # a retried call: applied once already (or in this commit), no record, no seq
                if request_id in fresh:
                    twins.append(msg)
                else:
                    actor.answer(msg, None)
                if inbox_id:
                    repeated.append(inbox_id)
                continue
            record = _record_for(actor, msg, digest, now)
        except (WfsubError, TypeError, ValueError) as exc:  # refused before anything is written (its id stays free)
            actor.answer(msg, exc)
            if inbox_id:
                refused.append((inbox_id, str(exc)))
                if isinstance(msg, Signal | Cancel | RegionOp):
                    told.append((msg, str(exc)))
            continue
        if request_id is not None:
            j.request_ids[request_id] = kind_of(_external(msg))
            fresh[request_id] = msg
            if record.get("update"):  # owed from now: a row written with this commit lists it (`CaseRow.owed`)
                journaled(actor, request_id)
        entries.append((msg, record))
    if not entries and not refused and not repeated:
        return
    commit = InCommit()  # a caller retrying one of these inputs meanwhile waits for it (`Substrate._update`)
    for request_id in fresh:
        j.committing[request_id] = commit
    try:
        await _commit_batch(actor, entries, refused, told, repeated, twins, seq, list(fresh), commit)
    finally:
        for request_id in fresh:
            j.committing.pop(request_id, None)
        commit.done.set()


def _external(msg: Message) -> External:
    """An input that carries a request id: one from outside the case."""
    assert isinstance(msg, Signal | Cancel | RegionOp)
    return msg


async def _commit_batch(
    actor: CaseActor, entries: list[tuple[Message, dict[str, Any]]], refused: list[tuple[int, str]],
    told: list[tuple[External, str]], repeated: list[int], twins: list[Message], seq: int, fresh_ids: list[str],
    commit: InCommit,
) -> None:
    """Commit a batch built by `journal_inbox`, then apply it; its twins hear what the inputs they repeat heard."""
    j = actor.journal
    assert j is not None
    records = [record for _, record in entries]
    inbox_done = [i for i in (getattr(msg, "inbox_id", 0) for msg, _ in entries) if i]
    inbox_done += repeated
    row = _running_row(actor) if j.row_parked or unsaved(actor) else None
    lease = actor.shared.lease
    if lease is not None and not lease.ok:  # a node that may have lost its cases writes nothing until it knows
        try:
            await lease.wait()
        except anyio.get_cancelled_exc_class():  # closing with nothing written: close_live answers the inbox
            _not_written(actor, seq, fresh_ids)
            actor.inbox[:0] = [msg for msg, _ in entries] + twins
            raise
    try:
        if actor.stale is not None:  # another node took the case while this one could not tell: nothing is ours
            raise actor.stale
        with anyio.CancelScope(shield=True):  # the store commits a write whose waiter is cancelled all the same:
            # a closing Substrate waits for the outcome, so each sender hears whether its input was journaled
            appended = await j.commit(records, row=row, inbox_done=inbox_done, inbox_refused=refused)
    except (StoreConflict, CommitUnknown) as exc:
        # StoreConflict: the journal moved on without us (another owner): nothing more is ours. CommitUnknown:
        # written or not, this process cannot tell: the journal decides, so the case leaves memory and is read
        # back from it (`CaseLoader.left_memory`: the sweep); a caller retries with its request_id (applied once).
        actor.fenced = True  # (before the answers: a caller that hears of it sends the input to the owner)
        commit.error = exc
        for msg in [*(msg for msg, _ in entries), *twins]:
            actor.answer(msg, exc)
        raise Fenced(exc) from exc
    except StoreError as exc:
        _not_written(actor, seq, fresh_ids)  # nothing was written: the numbers are free again
        _store_failed(actor, [*entries, *((msg, {}) for msg in twins)], exc)
        return
    if told:
        j.refused = None  # its status reads them again
        for msg, reason in told:
            log_refused(actor.case_id, kind_of(msg), getattr(msg, "name", None), reason, msg.request_id)
    if records:
        j.time = records[-1]["time"]
    for (msg, record), fresh in zip(entries, appended, strict=True):
        if fresh:
            _apply_record(actor, msg, record)
        else:  # a retried call (same request_id): applied once already
            if record.get("update"):
                not_journaled(actor, [record["request_id"]])
            actor.answer(msg, None)
    for msg in twins:
        actor.answer(msg, None)
    if compaction.due(actor):  # an endless case: its journal starts again from a snapshot record
        try:
            await compaction.compact(actor)
        except StoreError as exc:  # (StoreConflict, CommitUnknown: as an input's commit above)
            actor.fenced = True
            raise Fenced(exc) from exc


def _not_written(actor: CaseActor, seq: int, fresh_ids: list[str]) -> None:
    """A batch that was not written: its seqs and its request ids are free again."""
    j = actor.journal
    assert j is not None
    j.seq = seq
    for request_id in fresh_ids:
        j.request_ids.pop(request_id, None)
    not_journaled(actor, fresh_ids)


def _store_failed(actor: CaseActor, entries: list[tuple[Message, dict[str, Any]]], exc: StoreError) -> None:
    """The commit failed (rolled back): external callers hear of it; the case's own inputs are retried."""
    _log.error("could not journal inputs; retrying the case's own", case_id=actor.case_id, error=str(exc))
    retry: list[Message] = []
    for msg, _ in entries:
        if isinstance(msg, EffectDone | TimerFired) or (isinstance(msg, Cancel) and msg.reply is None):
            retry.append(msg)
        else:
            actor.answer(msg, exc)
    if retry:
        actor.shared.busy += 1

        async def again() -> None:
            try:
                await anyio.sleep(_STORE_RETRY)
            finally:
                actor.shared.busy -= 1
            for msg in retry:
                actor.post(msg)

        actor.shared.start_soon(again)


def _record_for(actor: CaseActor, msg: Message, digest: str, now: float) -> dict[str, Any]:
    """The journal record of an input, checked against the case as it stands (raises when it is refused)."""
    j = actor.journal
    m = actor.machine
    assert j is not None
    assert m is not None
    step = m.steps
    limit = actor.shared.max_payload_bytes
    kind = type(msg)
    if kind is Signal:  # checked by `_inputs.admit` at its door: its payload is already as journaled
        assert isinstance(msg, Signal)
        if m.ended:
            raise actor.ended_error(msg.what)
        if msg.update:  # replay delivers it as an update again (its id: the request id), to compute its answer
            return j.record("signal", step, digest, now, name=msg.name, payload=msg.payload, update=True,
                            **_request(msg))
        return j.record("signal", step, digest, now, name=msg.name, payload=msg.payload, **_request(msg))
    if kind is EffectDone:
        assert isinstance(msg, EffectDone)
        path, name = actor.requested.get(msg.effect_id, ("?", "?"))
        if msg.error is None:
            try:
                output, _ = as_journaled(msg.output, "the result", limit)
                return j.record("effect", step, digest, now, effect_id=msg.effect_id, path=path, name=name,
                                result=output)
            except TypeError as exc:  # a result that cannot be journaled fails the effect (not retried)
                msg.error, msg.traceback = EffectResultError.not_json(name, path, str(exc)), None
            except ValueError as exc:
                msg.error, msg.traceback = EffectResultError.too_large(name, path, str(exc)), None
        error = error_body(msg.error, msg.traceback)
        return j.record("effect", step, digest, now, effect_id=msg.effect_id, path=path, name=name, error=error)
    if kind is TimerFired:
        assert isinstance(msg, TimerFired)
        path = actor.armed.get(msg.timer_id, ("?", 0.0))[0]
        return j.record("timer", step, digest, now, timer_id=msg.timer_id, path=path)
    if kind is Cancel:
        assert isinstance(msg, Cancel)
        if m.ended:
            raise actor.ended_error("cancel")
        return j.record("cancel", step, digest, now, reason=msg.reason, compensate=msg.compensate, **_request(msg))
    assert isinstance(msg, RegionOp)  # checked by `_inputs.admit` at its door, its items as journaled
    if m.ended:
        raise actor.ended_error(msg.what)
    # Whether the region is active (and takes the operation) is checked now, not only at the door: the operation
    # is first in its batch (`journal_inbox`), so the case is as it will be when the operation is applied, and a
    # refused one is never journaled (its inbox row is marked refused, and its sender hears why).
    m.check_region_op(msg.action.value, msg.name, msg.items)
    fields: dict[str, Any] = {"region": msg.name, **_request(msg)}
    if msg.action is RegionAction.ADD_INSTANCES:
        fields["items"] = msg.items
    return j.record(msg.action.kind, step, digest, now, **fields)


def _apply_record(actor: CaseActor, msg: Message, record: dict[str, Any]) -> None:
    """Apply an input as decoded from its record: the live run sees exactly what a replay will."""
    kind = type(msg)
    if kind is Signal:
        assert isinstance(msg, Signal)
        msg.payload = record["payload"]
    elif kind is EffectDone:
        assert isinstance(msg, EffectDone)
        if "result" in record:
            msg.output = record["result"]
        else:  # the live run keeps the exception itself (CaseFailed.__cause__); the vm reads its type and text
            msg.output = None
            if msg.error is None:
                msg.error = RestoredError(record["error"]["type"], record["error"]["message"])
    elif kind is RegionOp:
        assert isinstance(msg, RegionOp)
        msg.items = record.get("items")
    actor.apply(msg)


def case_row(actor: CaseActor, state: CaseState) -> CaseRow:
    """The case row as this actor sees the case now."""

    j = actor.journal
    m = actor.machine
    assert j is not None
    timers = [{"timer_id": tid, "path": path, "due": due} for tid, (path, due) in sorted(actor.armed.items())]
    dues = [due for _, due in actor.armed.values()]
    if actor.deadline is not None:
        dues.append(actor.deadline)
    return CaseRow(
        case_id=actor.case_id,
        workflow=j.workflow,
        fingerprint=j.fingerprint,
        state=state.value,
        started_at=j.started_at,
        updated_at=actor.shared.clock.now(),
        last_seq=j.seq,
        at=m.threads_at() if m is not None else [],
        signals=list(actor.signals),
        effects=[{"effect_id": eid, "path": p, "name": n} for eid, (p, n) in sorted(actor.requested.items())],
        timers=timers,
        next_due=min(dues) if dues else None,
        data=dict(m.data) if m is not None else actor.final_data,
        order=j.order,
        recovered=j.recovered,  # (kept: a count of recoveries is reset only by a new record, see _lifecycle)
        migrated_from=j.migrated_from,
        answers=row_answers(actor),
        owed=row_owed(actor),
        taken_refused=row_refused(actor),
        parent=j.parent,
        parent_step=j.parent_step,
        waited=j.waited,
    )


def _running_row(actor: CaseActor) -> CaseRow:
    """The row written with the inputs that wake a parked case: running from this record on. Where its threads
    will wait next is not known until the inputs are applied, so it names no waits (a status reads it as
    'running'); recovery brings running cases back at start whatever their row says."""
    row = case_row(actor, _RUNNING)
    row.at, row.signals, row.timers = [], [], []
    row.next_due = actor.deadline
    return row


def parked_in_store(actor: CaseActor) -> None:
    """Parked on a signal or a timer with nothing in flight: tell the store (no need to wait for it). Parked
    on effects: the Substrate writes the row if they take long (a quick effect is answered before that)."""
    j = actor.journal
    m = actor.machine
    assert j is not None
    assert m is not None
    if actor.state is _WAITING_EFFECT:
        actor.shared.on_effect_wait(actor)
        return
    if actor.state not in (_WAITING_SIGNAL, _WAITING_TIMER) or actor.requested:
        return

    snapshot = None
    if j.since_snapshot >= SNAPSHOT_EVERY:
        snapshot = snapshot_of(m, j, {tid: due for tid, (_, due) in actor.armed.items()})
        j.since_snapshot = 0
    row = case_row(actor, actor.state)
    row.digest, _ = m.take_digest()  # the tasks run since the last record: a reload must find them the same
    j.row_parked = True
    actor.shared.busy += 1
    _spawn_store_write(actor, CaseWrite(actor.case_id, [], row, snapshot, epoch=j.epoch), j.seq)
    actor.shared.on_park(actor)


def write_waiting_row(actor: CaseActor) -> None:
    """The case still waits for the effects it waited for a moment ago: record them in its row (status and
    `wfsub show` read it), without waiting for the write."""
    j = actor.journal
    assert j is not None

    j.row_parked = True  # the row says it waits: the next input's commit records it running again
    row = case_row(actor, actor.state)
    if actor.machine is not None:
        row.digest, _ = actor.machine.take_digest()  # (as a parked row's)
    actor.shared.busy += 1
    _spawn_store_write(actor, CaseWrite(actor.case_id, [], row, epoch=j.epoch), j.seq)


def _spawn_store_write(actor: CaseActor, change: Any, seq: int) -> None:
    """A parked row, whose loss a crash makes harmless (the row says 'live' until it lands): the case does not
    wait for it, a task beside it does (so eviction knows whether it landed)."""
    j = actor.journal
    assert j is not None

    async def write() -> None:
        try:
            await j.store.write(change)
            if j.seq == seq:
                j.parked_row_at = seq
        except StoreError as exc:
            _log.warning("could not record a parked case's row", case_id=actor.case_id, error=str(exc))
        finally:
            actor.shared.busy -= 1

    actor.shared.start_soon(write)


def _recorded(actor: CaseActor) -> None:
    actor.recorded = True
    if actor.on_recorded is not None:
        actor.on_recorded.set()


async def write_end(actor: CaseActor) -> None:
    """The case ended: its `end` record (and final row), waited for before its awaiters are released."""
    j = actor.journal
    if j is None:
        return
    try:
        await _write_end_record(actor, j)
    finally:
        _recorded(actor)


async def _write_end_record(actor: CaseActor, j: CaseJournal) -> None:
    now = actor.shared.clock.now()
    error = None
    if actor.state is _FAILED:
        error = {
            "type": error_name(actor.cause) if actor.cause is not None else "StepFailed",
            "message": actor.error_message,
            "path": actor.error_path,
            "traceback": (actor.traceback or "")[-ERROR_TEXT_LIMIT:] or None,
            "record": actor.record,
        }
    end = end_record(j.seq + 1, now, actor.state.value, actor.end_digest, result=actor.final_data, error=error,
                     reason=actor.cancel_reason, compensated=actor.compensated, run=j.run)
    row = case_row(actor, actor.state)
    row.last_seq = end["seq"]
    row.ended_at = actor.ended_at
    row.error = actor.shared.redact(end.get("error"))  # the row is read by people (wfsub show); the journal not
    row.cancel_reason = actor.cancel_reason if actor.state is _CANCELLED else None
    row.at, row.signals, row.effects, row.timers, row.next_due = [], [], [], [], None
    try:
        with anyio.CancelScope(shield=True):
            await j.commit([end], row=row)
        j.seq += 1
    except StoreConflict as exc:  # another owner has the case: it writes the end
        _log.warning("case end not recorded: the store refused its journal", case_id=actor.case_id, error=str(exc))
    except StoreError as exc:  # the sweep replays the case to its end and writes it then (soon: see on_end)
        _log.error("could not record a case's end", case_id=actor.case_id, error=str(exc))
        actor.end_unwritten = True


def close_live(actor: CaseActor) -> None:
    """The Substrate closes with a durable case still live: nothing is written; awaiters get SubstrateClosed."""
    actor.closed = True
    actor.machine = None
    for msg in actor.inbox:
        actor.answer(msg, SubstrateClosed("apply an input: the case stays live in the store"))
    actor.inbox.clear()


async def evict_now(actor: CaseActor) -> bool:
    """Leave memory if still idle: the row and (after inputs since the last one) a snapshot are committed
    first, so a reload starts from them; an input that arrives meanwhile keeps the case in memory."""
    actor.evicting = False
    j = actor.journal
    m = actor.machine
    assert j is not None
    assert m is not None
    if actor.state not in (_WAITING_SIGNAL, _WAITING_TIMER) or actor.requested:
        return False

    snapshot = snapshot_of(m, j, {tid: due for tid, (_, due) in actor.armed.items()}) if j.since_snapshot else None
    if snapshot is not None or j.parked_row_at != j.seq:  # else the row written when it parked says it all
        try:
            row = case_row(actor, actor.state)
            row.digest, _ = m.take_digest()  # (as a parked row's)
            await j.store.write(CaseWrite(actor.case_id, [], row, snapshot, epoch=j.epoch))
        except StoreError as exc:
            _log.warning("could not evict an idle case; it stays in memory", case_id=actor.case_id, error=str(exc))
            return False
    if snapshot is not None:
        j.since_snapshot = 0
    if actor.inbox:
        return False
    actor.evicted = True
    actor.left("evicted")
    actor.shared.on_evict(actor)  # from now on, inputs go to a reloaded actor
    return True

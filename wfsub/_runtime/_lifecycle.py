"""Re-opening and copying durable cases: `Substrate.retry` and `Substrate.fork` (see the README, Case lifecycle).

Retry. A failed case is re-opened by a `retry` record appended after its `end`: `{seq, kind: "retry", step, time,
digest, run, ended, redo}`. A replay drops the `end` at seq `ended` and the effect outcomes at the seqs in `redo`
(`_journal.effective`), so the case is rebuilt as it was before the step that failed: a task that failed runs again
when the vm runs on (on the case's version, or the version it migrates to: a fix registered since applies); an
effect whose final outcome was the failure is in flight again and starts again. The retry record sits at the
step of the last record kept (no task runs between them, so its digest is that record's), and `run` counts the
retries: each later `end` carries it, so a case still ends once per run. A case whose failure ran compensations
is refused: its undoing already happened, and running the failed step again would run on over it. A compacted
case (its journal starts with a `snapshot` record) is retried the same way: its retries before the snapshot are
counted in the snapshot's state, and with no input after the snapshot the retry record sits at the snapshot's
step (its digest None: the snapshot records none to check against).

Poison cases. Recovery counts, in the case row (`recovered: {seq, count}`), the times it brought a live case back
while its journal stood at the same last record: a case that kills (or hangs) its process each time it runs
journals nothing new between recoveries. Past `max_recoveries` it is suspended with that reason instead of being
recovered again (its effects and timers are no longer listed, so the next start leaves it alone). `retry`
re-opens it the same way as a failed case, with nothing dropped: its `retry` record is a new record, so the count
starts again.

Retry through a queue. A case that started from a queue goes back through it when it is retried (`requeue`):
it waits there in state `queued` until its queue has room (its slot counts again once it runs; its dedup key is
held again, so a retry while another live case of the queue holds the key is refused with CaseExists naming it,
and nothing is written). Its `retry` record is written at once (the retry is acknowledged then), its row
`queued`; the node that claims its item loads it, and it goes on from the retry record. While it waits it takes
no input but a cancel, which ends it there (`_queues.cancel_requeued`). Retrying it needs a Substrate that
configures its queue (it is refused otherwise, saying so).

Delete. An ended case is deleted only while no input for it waits in the store's inbox: a `retry` or `fork` a
client (or `wfsub`) queued while no owner ran is acknowledged as done once an owner takes it, and deleting its
case first would drop it without a word. So `delete` refuses, naming the inputs, until an owner has taken them
(applied, or refused with a reason); the store checks this in the same transaction as the delete. The children
the case waited for (`start_case(wait=True)`: their rows say `waited`) go with it, in the same transaction, and
theirs with them: each ended one goes; one still live is left running if it was abandoned (on_parent_cancel=
"abandon": a case of its own from then on), and refuses the delete if it is cancelled with its parent (its
cancel is under way, and the look for cancels a dead process did not send finds a child through its parent's
row). Children started without waiting (wait=False) are cases of their own: never deleted with it.

Fork. A fork is a new case whose journal is the origin's records up to and including `at`, with its `start`
record naming the origin (`forked_from: {case_id, seq}`) and keeping the origin's tags (of a compacted journal:
the `start` its first record, the `snapshot`, holds; the stores read a row's tags and origin from there); it is
written in one transaction, then loaded like any case (replayed, then live: effects in flight at `at` start
again). A fork taken where the origin was suspended or had ended runs on from there: an `end` record is never
copied.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .._errors import CaseNotFound, SignalRejected
from .._store import RETRIED, CaseRow, CaseWrite, QueueItem, Record, Store, retried_key
from ._journal import INPUT_KINDS, effective
from ._persist import POISON, is_poison, suspend
from ._status import CaseState


def poison_reason(times: int, seq: int) -> str:
    """The reason a case is suspended after `times` recoveries that journaled nothing past record `seq`."""
    return (
        f"{POISON} {times} times without journaling a new record (its last record is seq {seq}): it stops its "
        "process, or hangs it, each time it runs; fix the cause (a step that crashes the process, runs out of "
        "memory or never returns), then `retry` it, or cancel it"
    )


def _last_input(records: Sequence[Record]) -> tuple[int, str | None]:
    """The step and digest of the last input record after the first record of a journal; with none, the first
    record's: a `start` (step 0, the initial digest) or a compaction's `snapshot` (its step; its digest is not
    recorded, so None: not checked)."""
    for record in reversed(records[1:]):
        if record.get("kind") in INPUT_KINDS and record.get("step") is not None:
            return int(record["step"]), str(record.get("digest") or "")
    if records and records[0].get("kind") == "snapshot":
        return int(records[0].get("step") or 0), None
    return 0, ""


def _handled_failure(record: Mapping[str, Any], before_end: Sequence[Record]) -> str | None:
    """What the failure's withdrawal ran, if it ran anything that leaves a trace (None: nothing): a compensation
    that failed (anywhere in the chain of causes), or a cancel handler or compensation effect whose outcome is the
    last record before the `end` (it ran while the case was failing)."""
    cause: Mapping[str, Any] | None = record
    while cause:
        if cause.get("type") == "CompensationFailed" or cause.get("compensated"):
            return "compensations, and one failed"
        cause = cause.get("cause") if isinstance(cause.get("cause"), Mapping) else None
    last = before_end[-1] if before_end else {}
    path = str(last.get("path", ""))
    if last.get("kind") == "effect" and ("[on_cancel]" in path or "compensation]" in path):
        return f"its cancel handlers ({last.get('name')} at {path})"
    return None


def retry_record(case_id: str, row: CaseRow, records: list[Record], now: float) -> Record:
    """The `retry` record that re-opens a failed (or poison-suspended) case, or SignalRejected saying why it
    cannot be retried."""
    state = row.state
    first = records[0] if records else {}
    if first.get("kind") not in ("start", "snapshot"):
        raise SignalRejected.not_retryable(
            case_id, state, "its journal does not start with its start record (or, compacted, its snapshot record)"
        )
    end = records[-1] if records[-1].get("kind") == "end" else None
    before = int((first.get("state") or {}).get("run", 0)) if first.get("kind") == "snapshot" else 0
    runs = before + sum(1 for record in records if record.get("kind") == "retry")
    redo: list[int] = []
    ended: int | None = None
    if state == CaseState.FAILED.value:
        if end is None or end.get("outcome") != "failed":
            raise SignalRejected.not_retryable(
                case_id, state, "its journal does not end with its failure (its end is being written: try again)"
            )
        error = end.get("error") or {}
        compensated = list((error.get("record") or {}).get("compensated") or ())
        if compensated:
            raise SignalRejected.not_retryable(
                case_id, state,
                f"its failure already ran compensations ({', '.join(map(str, compensated))}): running the "
                "failed step again would go on over that undoing; start a new case (or fork this one from a record "
                "before the failure: `fork(case_id, at=seq)`)",
            )
        handled = _handled_failure(error.get("record") or {}, records[:-1])
        if handled is not None:
            raise SignalRejected.not_retryable(
                case_id, state,
                f"its failure already ran {handled}: running the failed step again would go on over what they did; "
                "start a new case (or fork this one from a record before the failure: `fork(case_id, at=seq)`)",
            )
        ended = int(end["seq"])
        path = error.get("path")
        for earlier in reversed(records[:-1]):  # the effect whose final outcome failed the case runs again
            kind = earlier.get("kind")
            if kind in ("retry", "start", "snapshot"):
                break
            if kind == "effect" and earlier.get("error") is not None and earlier.get("path") == path:
                redo.append(int(earlier["seq"]))
                break
    elif is_poison(row):
        if end is not None:
            raise SignalRejected.not_retryable(case_id, state)
    else:
        raise SignalRejected.not_retryable(case_id, state)
    kept = effective([*records, {"seq": -1, "kind": "retry", "ended": ended, "redo": redo}])[:-1]
    step, digest = _last_input(kept)
    record: Record = {"seq": int(records[-1]["seq"]) + 1, "kind": "retry", "step": step, "time": now,
                      "digest": digest, "run": runs + 1, "redo": redo}
    if ended is not None:
        record["ended"] = ended
    return record


async def recovering(store: Store, row: CaseRow, max_recoveries: int, redact: Any) -> bool:
    """Count one more recovery of a live case (written to its row); False, with the case suspended as a poison
    case, when that would be more than `max_recoveries` in a row with no new record in its journal."""
    stored = await store.load(row.case_id)
    if stored is None:
        return False
    if stored.records:
        last = int(stored.records[-1]["seq"])
    else:
        last = stored.snapshot.seq if stored.snapshot is not None else 0
    mark = row.recovered or {}
    count = int(mark.get("count", 0)) + 1 if mark.get("seq") == last else 1
    row = stored.row
    if count > max_recoveries:
        row.effects, row.timers, row.next_due = [], [], None  # not live any more: the next start leaves it alone
        row.recovered = {"seq": last, "count": count - 1, "poison": 1}  # nothing but `retry` loads it (`is_poison`)
        await suspend(store, row, poison_reason(count - 1, last), redact)
        return False
    row.recovered = {"seq": last, "count": count}
    await store.write(CaseWrite(row.case_id, [], row, epoch=row.epoch or None))
    return True


def _reopened(row: CaseRow, record: Record, state: CaseState) -> None:
    """A retried case's row as its retry record leaves it: in `state`, its end, failure, suspension (with the state
    it was suspended from), cancel reason, digest and recovery count gone."""
    row.state = state.value
    row.ended_at = None
    row.error = None
    row.suspended_reason = None
    row.suspended_from = None
    row.cancel_reason = None
    row.last_seq = int(record["seq"])
    row.updated_at = float(record["time"])
    row.digest = None
    row.recovered = None


async def reopen(store: Store, row: CaseRow, record: Record, inbox_done: list[int] | None = None) -> None:
    """Commit the retry record with the case's row running again (recovery resumes it from here if this
    process stops before it is loaded)."""
    _reopened(row, record, CaseState.RUNNING)
    await store.write(CaseWrite(row.case_id, [record], row, inbox_done=list(inbox_done or ()),
                                epoch=row.epoch or None))


async def requeue(
    store: Store, row: CaseRow, record: Record, item: QueueItem, inbox_done: list[int] | None = None
) -> None:
    """A retried case that started from a queue goes back through it (see `_store._queueing`): its retry record
    is committed with its row `queued` (not live: no recovery, no input loads it) in the transaction that queues
    its item again, marked retried; the node that claims the item loads it. CaseExists (nothing written) when
    another live case of the queue holds its dedup key."""
    _reopened(row, record, CaseState.QUEUED)
    row.effects, row.timers, row.next_due = [], [], None
    start = {**item.start, RETRIED: int(record["run"])}
    reopened = CaseWrite(row.case_id, [record], row, inbox_done=list(inbox_done or ()), epoch=row.epoch or None)
    if await store.queue_requeue(row.case_id, reopened, start, retried_key(item.order, int(record["seq"]))) is None:
        raise SignalRejected.not_retryable(  # (its item was deleted or changed meanwhile)
            row.case_id, row.state, f"its queue item {item.queue!r} changed meanwhile; retry it again"
        )


DELETE_TRIES = 3  # a delete whose children changed while it ran (one retried, or deleted) looks at them again


async def delete_ended(store: Store, case_id: str) -> list[str]:
    """Delete a case whose row says it ended, with the children it waited for (see the module); the ids deleted
    (the case's first). SignalRejected saying why not: inputs for it or one of those children wait in the inbox
    (naming them), a child cancelled with it has not ended, a retry re-opened it meanwhile (its state now), or its
    `end` record is not written yet; CaseNotFound when it was deleted meanwhile."""
    for _ in range(DELETE_TRIES):
        children, owed = await waited_children(store, case_id)
        if owed:
            parent = await store.row(case_id)  # (the reason says whether its cancel reaches them)
            raise SignalRejected.children_live(case_id, [(row.case_id, row.state) for row in owed],
                                               None if parent is None else parent.state)
        if await store.delete(case_id, children):
            return [case_id, *children]
        pending = await store.inbox_pending(case_id)
        if pending:
            raise SignalRejected.inputs_pending(case_id, [(row.id, row.kind) for row in pending])
        now = await store.row(case_id)  # what changed since the caller read it: deleted, or re-opened by a retry
        if now is None:
            raise CaseNotFound(case_id)
        if not CaseState(now.state).ended:
            raise SignalRejected.not_ended(case_id, "be deleted", now.state)
        if not children or await _ending(store, case_id):
            raise SignalRejected.not_ended(case_id, "be deleted", "ending: its end record is not written yet")
        for child in children:
            pending = await store.inbox_pending(child)
            if pending:
                raise SignalRejected.inputs_pending(case_id, [(row.id, row.kind) for row in pending], child)
        # (a child was retried, deleted or is ending meanwhile: its children are looked at again)
    raise SignalRejected.not_ended(
        case_id, "be deleted", "ended, but the children it waited for kept changing while it was being deleted "
        "(retried or deleted meanwhile); try again"
    )


async def _ending(store: Store, case_id: str) -> bool:
    """Whether a case whose row says it ended has no `end` record yet (it is being written)."""
    records = await store.journal(case_id)
    return not records or records[-1].get("kind") != "end"


async def waited_children(store: Store, case_id: str) -> tuple[list[str], list[CaseRow]]:
    """The children a case waited for that `delete` removes with it, and theirs (the ended ones, parents before
    their children), and the ones it must not leave behind: live children cancelled with their parent (see the
    module). A live child it waited for that was abandoned is in neither: it stays, with its own children."""
    gone: list[str] = []
    owed: list[CaseRow] = []
    parents, seen = [case_id], {case_id}
    while parents:
        parent = parents.pop()
        before: int | None = None
        while True:
            rows = await store.cases(parent=parent, limit=CHILDREN_PAGE, before=before)
            for row in rows:
                if row.case_id in seen or not (row.waited or row.parent_step is not None):
                    continue  # (not waited for: started with wait=False, or a fork naming the parent)
                seen.add(row.case_id)
                if CaseState(row.state).ended:
                    gone.append(row.case_id)
                    parents.append(row.case_id)
                elif row.parent_step is not None:
                    owed.append(row)
            if len(rows) < CHILDREN_PAGE:
                break
            before = rows[-1].order
    return gone, owed


CHILDREN_PAGE = 500  # children read at a time by `waited_children`


def fork_records(
    case_id: str, records: list[Record], at: object, new_case_id: str, now: float
) -> list[Record]:
    """The journal of a fork of `case_id` at record `at`: its records up to and including `at` (no `end`), the
    `start` naming the origin. ValueError for an `at` that is not a record of the journal, naming what is."""
    if isinstance(at, bool) or not isinstance(at, int):
        raise TypeError(f"fork: at must be the seq (an int) of a record of case {case_id!r}, got {at!r}")
    first = int(records[0].get("seq", 0)) if records else 0
    last = int(records[-1].get("seq", 0)) if records else 0
    if records and records[0].get("kind") != "start" and at < first:
        raise ValueError(
            f"fork: record {at} of case {case_id!r} is no longer kept (compaction removed the records before "
            f"seq {first}, the first record still kept): fork at {first} or later"
        )
    if at < 0 or at > last:
        raise ValueError(
            f"fork: case {case_id!r} has no record {at}: its journal holds records {first} to {last}; "
            "fork at one of those (its journal lists them: `journal()`, or `wfsub journal`)"
        )
    prefix = [dict(record) for record in records if int(record["seq"]) <= at and record.get("kind") != "end"]
    head = prefix[0]
    start: Record = dict(head.get("start") or {}) if head.get("kind") == "snapshot" else head
    start["case_id"] = new_case_id
    start["forked_from"] = {"case_id": case_id, "seq": at}
    for key in ("waited", "cancel_with_parent", "parent_step"):  # a case of its own: no parent waits for a fork
        start.pop(key, None)
    start["time"] = start.get("time", now)
    if head is not start:  # a compacted journal: its snapshot record holds the start (what the stores read)
        head["start"] = start
    return prefix


def same_fork(records: list[Record], case_id: str, at: int) -> bool:
    """Whether a journal is that of a fork of `case_id` at record `at` (a repeated fork is answered with it)."""
    if not records:
        return False
    first = records[0]
    start = first if first.get("kind") == "start" else first.get("start")
    return isinstance(start, dict) and start.get("forked_from") == {"case_id": case_id, "seq": at}


def fork_row(origin: CaseRow, new_case_id: str, last_seq: int, now: float) -> CaseRow:
    """The row a fork is written with: running (it is loaded at once, and recovery resumes it if not)."""
    return CaseRow(
        case_id=new_case_id, workflow=origin.workflow, fingerprint=origin.fingerprint,
        state=CaseState.RUNNING.value, started_at=now, updated_at=now, last_seq=last_seq, data=None,
    )

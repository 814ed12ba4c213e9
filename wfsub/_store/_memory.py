"""`MemoryStore`: the store interface in memory, with the semantics of the SQLite store (for runtime tests).

Everything is kept as the same JSON text the SQLite store writes, so a value that SQLite would refuse (a NaN,
a set, an int key) is refused here too, and what a read returns is never the caller's own object. The rules
are the same: a record whose request_id the case's journal holds is skipped, one `end` per case, each seq once,
`order` assigned when a case's row is first written, increasing inbox ids, the newest two snapshots kept.
A write that breaks a rule is refused whole, as a rolled-back SAVEPOINT is in SQLite; `wait=False` writes
report such a refusal in the log, not to the caller.

One `MemoryStore` object is the store: it lives as long as the object (close and open it again to model a
restart). Only one owner may have it open at a time (a second `open(owner=True)` raises StoreError until the
first owner closes it).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import anyio.lowlevel

from .._errors import CaseExists, SchedulePaused, StoreConflict, StoreError
from .._trace import get_logger
from ._base import (
    REFUSED_KEPT,
    CaseRow,
    CaseWrite,
    DamagedEntry,
    InboxRow,
    Owner,
    ProgramSummary,
    Record,
    ScheduleRow,
    Snapshot,
    StoredCase,
)
from ._listing import Listing
from ._queueing import ENDED, QUEUED, STARTED, QueueItem, QueueLimits, QueueTable
from ._rows import (
    SNAPSHOTS_KEPT,
    EncodedWrite,
    case_gone,
    decode_record,
    decode_row,
    decode_start,
    decode_tags,
    encode_write,
    headless,
    inbox_text,
    kept_snapshot,
    loads,
    no_start,
    second_end,
    seq_taken,
    start_meta,
    starts_case,
    to_json,
    waits_in_queue,
)
from ._single import SingleNode

_log = get_logger("wfsub.store")


@dataclass(slots=True)
class _Case:
    journal: dict[int, str] = field(default_factory=dict)  # seq -> record JSON
    request_ids: dict[str, int] = field(default_factory=dict)  # of the records kept -> their seq (the unique index)
    ended: bool = False
    row: dict[str, Any] | None = None  # encoded row params
    order: int = 0
    snapshots: dict[int, tuple[int, int, str]] = field(default_factory=dict)  # seq -> (format, bytecode, JSON)
    tags: str | None = None  # the start record's tags (JSON), taken when the row is first written
    forked_from: str | None = None
    heartbeats: str | None = None  # JSON (see Store.put_heartbeats)


@dataclass(slots=True)
class _Inbox:
    case_id: str
    kind: str
    body: str
    request_id: str | None
    created_at: float
    refused: str | None = None


class ScheduleTable:
    """The schedules table in memory (MemoryStore's, and a Substrate's without a store), with the rules of the
    SQL stores: the newest registration wins, a slot only moves forward."""

    def __init__(self) -> None:
        self._rows: dict[str, ScheduleRow] = {}

    def register(self, name: str, spec: dict[str, Any], first_slot: float) -> ScheduleRow:
        known = self._rows.get(name)
        if known is None:
            known = ScheduleRow(name, spec, first_slot, None, False, time.time())
        else:
            known = replace(known, spec=spec, updated_at=time.time())
        self._rows[name] = known
        return known

    def advance(self, name: str, slot: float, case_id: str | None) -> bool:
        known = self._rows.get(name)
        if known is None or (known.last_slot is not None and known.last_slot >= slot):
            return False
        last_case = known.last_case if case_id is None else case_id
        self._rows[name] = replace(known, last_slot=slot, last_case=last_case, updated_at=time.time())
        return True

    def pause(self, name: str, paused: bool) -> bool:
        known = self._rows.get(name)
        if known is None:
            return False
        self._rows[name] = replace(known, paused=paused, updated_at=time.time())
        return True

    def rows(self) -> list[ScheduleRow]:
        return [self._rows[name] for name in sorted(self._rows)]

    def paused(self, name: str) -> bool:
        known = self._rows.get(name)
        return known is not None and known.paused


class MemoryStore(SingleNode):
    """A store in memory: the full interface, the same rules as `SqliteStore`, nothing durable."""

    url = "memory:"
    _name = "memory"  # how messages name it: "store memory: ..."

    def __init__(self) -> None:
        self._cases: dict[str, _Case] = {}
        self._inbox: dict[int, _Inbox] = {}
        self._next_order = 1
        self._next_inbox = 1
        self._open = False
        self._owner: str | None = None
        self._changed = False
        self._wait_mark = False  # wait_changed's own flag (it never consumes changed())
        self._programs: dict[str, ProgramSummary] = {}  # by fingerprint, in registration order
        self._schedules = ScheduleTable()
        self._queue = QueueTable(self._case_ended)
        self._queue_specs: dict[str, tuple[dict[str, Any], str]] = {}

    def __repr__(self) -> str:
        return f"MemoryStore(cases={len(self._cases)}, open={self._open})"

    # -- life ------------------------------------------------------------------------------------------------

    async def open(self, *, owner: bool, owner_id: str) -> None:
        await anyio.lowlevel.checkpoint()
        if owner:
            if self._owner is not None:
                raise StoreError(
                    self._name,
                    f"already owned by Substrate {self._owner!r} (pid {os.getpid()}, this process): one Substrate "
                    "owns a store at a time; close the first one, or open this one with owner=False",
                )
            self._own(owner_id)
        self._open = True

    async def close(self) -> None:
        await anyio.lowlevel.checkpoint()
        self._open = False
        self._owner = None

    def _is_open(self) -> bool:
        return self._open

    # -- writes ----------------------------------------------------------------------------------------------

    async def write(self, change: CaseWrite, *, wait: bool = True) -> list[bool]:
        self._check_open("write")
        encoded = encode_write(self._name, change)
        try:
            appended = self._apply(encoded)
        except StoreError as exc:
            if wait:
                raise
            _log.error("store_write_failed", store=self._name, job=f"case {change.case_id!r}", error=str(exc))
            return []
        # after applying, as SqliteStore: a waiter cancelled here still has its write applied
        await anyio.lowlevel.checkpoint()
        return appended if wait else []

    def _apply(self, change: EncodedWrite) -> list[bool]:
        """Check every rule first, then apply: a refused write changes nothing."""
        case = self._cases.get(change.case_id) or _Case()
        if case.row is None and not case.journal and headless(change):
            raise StoreConflict(self._name, case_gone(change.case_id))
        if change.schedule is not None and self._schedules.paused(change.schedule):
            raise SchedulePaused.refused(self._name, change.schedule, change.case_id)
        if case.row is None and not case.journal and starts_case(change):
            item = self._queue.items.get(change.case_id)
            if item is not None and item.state in (QUEUED, STARTED):
                raise StoreConflict(self._name, waits_in_queue(change.case_id))
        appended: list[bool] = []
        seen_ids = dict(case.request_ids)
        seqs: set[int] = set()
        ended = case.ended
        for record in change.records:
            if record.kind == "start" and (case.row is not None or case.journal):  # (its seq 0 compacted away)
                raise StoreConflict(self._name, seq_taken(change.case_id, record.seq))
            if record.request_id is not None and record.request_id in seen_ids:
                appended.append(False)
                continue
            if record.seq in case.journal or record.seq in seqs:
                raise StoreConflict(self._name, seq_taken(change.case_id, record.seq))
            if record.kind == "end":
                if ended:
                    raise StoreConflict(self._name, second_end(change.case_id, record.seq))
                ended = True
            elif record.kind == "retry":  # a failed case re-opened: its next run ends once too
                ended = False
            if record.request_id is not None:
                seen_ids[record.request_id] = record.seq
            seqs.add(record.seq)
            appended.append(True)
        # every rule held: apply
        self._cases[change.case_id] = case
        for record, ok in zip(change.records, appended):
            if ok:
                case.journal[record.seq] = record.text
        case.request_ids = seen_ids
        case.ended = ended
        if change.row is not None:
            if case.row is None:
                case.order, self._next_order = self._next_order, self._next_order + 1
                if case.journal:  # (as the SQL stores' trigger: what the first record's start says, read only)
                    case.tags, case.forked_from = start_meta(case.journal[min(case.journal)])
            case.row = change.row.params
        if change.snapshot is not None:
            snap = change.snapshot.params
            case.snapshots[snap["seq"]] = (snap["format"], snap["bytecode"], snap["state"])
            for seq in sorted(case.snapshots)[:-SNAPSHOTS_KEPT]:
                del case.snapshots[seq]
        if change.compact is not None:  # (in the same write: the journal starts with the snapshot record)
            for seq in [seq for seq in case.journal if seq < change.compact]:
                del case.journal[seq]
            # as the SQL stores' unique index, which covers the records kept: an id compacted away is free again
            # (the snapshot record keeps the window of ids a retry is still checked against: `_request_ids`)
            case.request_ids = {rid: seq for rid, seq in case.request_ids.items() if seq >= change.compact}
            for seq in [seq for seq in case.snapshots if seq < change.compact]:
                del case.snapshots[seq]
        for inbox_id in change.inbox_done:
            self._inbox.pop(inbox_id, None)
        for inbox_id, reason in change.inbox_refused:
            if inbox_id in self._inbox:
                self._inbox[inbox_id].refused = reason
        if not case.journal and case.row is None and not case.snapshots:
            del self._cases[change.case_id]  # a write of inbox moves only: no case to keep
        return appended

    async def inbox_put(
        self, case_id: str, kind: str, body: Mapping[str, Any], *, request_id: str | None, created_at: float
    ) -> int:
        self._check_open("put an input in the inbox")
        text = inbox_text(self._name, case_id, kind, body, request_id)
        inbox_id, self._next_inbox = self._next_inbox, self._next_inbox + 1
        self._inbox[inbox_id] = _Inbox(case_id, kind, text, request_id, created_at)
        self._changed = self._wait_mark = True
        await anyio.lowlevel.checkpoint()
        return inbox_id

    async def owner(self) -> Owner | None:
        await anyio.lowlevel.checkpoint()
        return None if self._owner is None else Owner(self._owner, os.getpid(), None, None)

    async def take_ownership(self, owner_id: str) -> bool:
        self._check_open("take ownership")
        await anyio.lowlevel.checkpoint()
        if self._owner is not None:
            return False
        self._own(owner_id)
        return True

    def _own(self, owner_id: str) -> None:
        """Become the owner: every case is this owner's to run now, so the started queue items are its own too
        (per_node counts them as this node's)."""
        self._owner = owner_id
        self._queue.follow_owner(owner_id)

    async def put_heartbeats(self, case_id: str, heartbeats: Mapping[str, Any], *, epoch: int | None = None) -> None:
        self._check_open("record heartbeats")
        text = to_json(self._name, f"the heartbeats of case {case_id!r}", dict(heartbeats))
        await anyio.lowlevel.checkpoint()
        case = self._cases.get(case_id)
        if case is not None and case.row is not None:
            case.heartbeats = text

    async def put_program(self, summary: ProgramSummary) -> None:
        self._check_open("record a program summary")
        await anyio.lowlevel.checkpoint()
        self._programs.setdefault(summary.fingerprint, summary)

    async def program(self, fingerprint: str) -> ProgramSummary | None:
        self._check_open("read a program summary")
        await anyio.lowlevel.checkpoint()
        return self._programs.get(fingerprint)

    async def newest_program(self, workflow: str) -> ProgramSummary | None:
        self._check_open("read a program summary")
        await anyio.lowlevel.checkpoint()
        found = [summary for summary in self._programs.values() if summary.workflow == workflow]
        return found[-1] if found else None

    async def schedule_register(self, name: str, spec: Mapping[str, Any], first_slot: float) -> ScheduleRow:
        self._check_open("record a schedule")
        await anyio.lowlevel.checkpoint()
        return self._schedules.register(name, loads(to_json(self._name, f"schedule {name!r}", dict(spec))), first_slot)

    async def schedule_advance(self, name: str, slot: float, case_id: str | None) -> bool:
        self._check_open("record a schedule's slot")
        await anyio.lowlevel.checkpoint()
        return self._schedules.advance(name, slot, case_id)

    async def schedule_pause(self, name: str, paused: bool) -> bool:
        self._check_open("pause a schedule")
        await anyio.lowlevel.checkpoint()
        return self._schedules.pause(name, paused)

    async def schedules(self) -> list[ScheduleRow]:
        self._check_open("list schedules")
        await anyio.lowlevel.checkpoint()
        return self._schedules.rows()

    def _case_ended(self, case_id: str) -> bool | None:
        case = self._cases.get(case_id)
        return None if case is None else case.ended

    async def queue_put(self, item: QueueItem, *, schedule: str | None = None) -> None:
        self._check_open("queue a case")
        await anyio.lowlevel.checkpoint()
        if schedule is not None and self._schedules.paused(schedule):
            raise SchedulePaused.refused(self._name, schedule, item.case_id)
        self._queue.put(replace(item, start=loads(to_json(self._name, f"queued case {item.case_id!r}", item.start))))

    async def queue_claim(
        self, queue: str, limits: QueueLimits, node: str, now: float, most: int
    ) -> tuple[list[QueueItem], float | None]:
        self._check_open("claim queued cases")
        await anyio.lowlevel.checkpoint()
        claimed, wake = self._queue.claim(queue, limits, node, now, most)
        for item in claimed:  # a retried case back from its queue: live again (see Store.queue_claim)
            case = self._cases.get(item.case_id)
            if case is not None and case.row is not None and case.row["state"] == QUEUED:
                case.row.update(state="running", live=1, parked=0)
        return claimed, wake

    async def queue_requeue(
        self, case_id: str, reopened: CaseWrite, start: Mapping[str, Any], key: str
    ) -> QueueItem | None:
        self._check_open("put a retried case back in its queue")
        encoded = encode_write(self._name, reopened)
        stored: dict[str, Any] = loads(to_json(self._name, f"queued case {case_id!r}", dict(start)))
        await anyio.lowlevel.checkpoint()
        item = self._queue.items.get(case_id)
        if item is None or item.state not in (STARTED, ENDED):
            return None
        before = dict(self._queue.items)
        found = self._queue.requeue(case_id, stored, key)
        if isinstance(found, CaseExists):
            raise found
        try:
            self._apply(encoded)
        except BaseException:
            self._queue.items = before  # (one transaction: the item as it was)
            raise
        return found

    async def queue_cancel(self, case_id: str, ended: CaseWrite) -> QueueItem | None:
        self._check_open("cancel a queued case")
        encoded = encode_write(self._name, ended)
        await anyio.lowlevel.checkpoint()
        item = self._queue.items.get(case_id)
        if item is None or item.state != QUEUED:
            return None
        self._apply(encoded)  # (refused whole, the item left queued, if its id were taken)
        return self._queue.cancel(case_id)

    def read_queue_items(
        self, *, state: str | None = None, queue: str | None = None, limit: int = 100, before: int | None = None
    ) -> list[QueueItem]:
        self._check_open("list queued cases")
        return self._queue.listed(state, queue, limit, before)

    def read_queue_item(self, case_id: str) -> QueueItem | None:
        self._check_open("read a queued case")
        self._queue.sweep()
        return self._queue.items.get(case_id)

    async def children_of_ended(self, limit: int = 1000) -> list[tuple[str, str]]:
        self._check_open("list the children of ended cases")
        await anyio.lowlevel.checkpoint()
        rows = {case_id: self._row(case) for case_id, case in self._cases.items() if case.row is not None}
        found = sorted((row.order, row.case_id, row.parent) for row in rows.values()
                       if row.parent is not None and row.ended_at is None and row.parent in rows
                       and rows[row.parent].ended_at is not None)
        return [(case_id, parent) for _, case_id, parent in found[:limit] if parent is not None]

    async def children_waited_for(
        self, owner: str | None, after: int = 0, limit: int = 1000
    ) -> list[tuple[int, str, str, dict[str, Any]]]:
        self._check_open("list the children waited for by live cases")
        await anyio.lowlevel.checkpoint()
        rows = {case_id: self._row(case) for case_id, case in self._cases.items() if case.row is not None}
        found = sorted((row.order, row.case_id, row.parent, row.parent_step) for row in rows.values()
                       if row.parent is not None and row.ended_at is None and row.parent in rows
                       and rows[row.parent].ended_at is None and row.parent_step and row.order > after)
        return [(o, c, p, step) for o, c, p, step in found[:limit] if p is not None and step is not None]

    async def queue_orphans(self, node: str, *, own: bool = True) -> list[QueueItem]:
        self._check_open("list queued cases")
        await anyio.lowlevel.checkpoint()
        return self._queue.orphans(node) if own else []  # (one process: no other node claims)

    async def queue_register(self, name: str, spec: Mapping[str, Any], node: str) -> tuple[dict[str, Any], str] | None:
        self._check_open("record a queue")
        await anyio.lowlevel.checkpoint()
        before = self._queue_specs.get(name)
        self._queue_specs[name] = (loads(to_json(self._name, f"queue {name!r}", dict(spec))), node)
        return before

    async def queue_specs(self) -> dict[str, dict[str, Any]]:
        self._check_open("read the queues")
        await anyio.lowlevel.checkpoint()
        return {name: spec for name, (spec, _) in sorted(self._queue_specs.items())}

    async def prune(self, ended_before: float, limit: int | None = None) -> int:
        self._check_open("prune")
        await anyio.lowlevel.checkpoint()
        gone = [
            case_id
            for case_id, case in self._cases.items()
            if case.ended
            and case.row is not None
            and case.row["ended_at"] is not None
            and case.row["ended_at"] <= ended_before
        ]
        if limit is not None:
            gone = gone[:limit]
        for case_id in gone:
            del self._cases[case_id]
            self._queue.forget(case_id)
        for inbox_id in [i for i, row in self._inbox.items() if row.case_id in gone]:
            del self._inbox[inbox_id]
        return len(gone)

    async def delete(self, case_id: str, children: Sequence[str] = ()) -> bool:
        self._check_open("delete a case")
        await anyio.lowlevel.checkpoint()
        gone = {case_id, *children}
        for one in gone:
            case = self._cases.get(one)
            if case is None or not case.ended or case.row is None or case.row["ended_at"] is None:
                return False
        if any(row.case_id in gone and row.refused is None for row in self._inbox.values()):
            return False  # an input waits for one of them (see `Store.delete`)
        for one in gone:
            del self._cases[one]
            self._queue.forget(one)
        for inbox_id in [i for i, row in self._inbox.items() if row.case_id in gone]:
            del self._inbox[inbox_id]
        return True

    # -- reads -----------------------------------------------------------------------------------------------

    def _row(self, case: _Case) -> CaseRow:
        assert case.row is not None
        row = decode_row(case.order, case.row)
        row.tags, row.forked_from = decode_tags(case.tags), case.forked_from
        return row

    def _rows(self) -> list[tuple[_Case, dict[str, Any]]]:
        return [(case, case.row) for case in self._cases.values() if case.row is not None]

    async def load(self, case_id: str) -> StoredCase | None:
        self._check_open("load a case")
        await anyio.lowlevel.checkpoint()
        case = self._cases.get(case_id)
        if case is None or case.row is None:
            return None
        if not case.journal:
            raise DamagedEntry(self._name, case_id, no_start(case_id))
        first = decode_start(self._name, case_id, case.journal[min(case.journal)])
        snapshot = None
        if case.snapshots:
            at = max(case.snapshots)
            fmt, bytecode, state = case.snapshots[at]
            snapshot = kept_snapshot(Snapshot(case_id, at, fmt, bytecode, loads(state)), first)
        after = first["seq"] if snapshot is None else snapshot.seq
        records = [decode_record(self._name, case_id, case.journal[seq]) for seq in sorted(case.journal) if seq > after]
        heartbeats = loads(case.heartbeats) if case.heartbeats is not None else {}
        return StoredCase(self._with_refused(self._row(case)), first, snapshot, records, heartbeats)

    async def first_seq(self, case_id: str) -> int | None:
        self._check_open("read a journal")
        await anyio.lowlevel.checkpoint()
        case = self._cases.get(case_id)
        return min(case.journal) if case is not None and case.journal else None

    async def row(self, case_id: str) -> CaseRow | None:
        await anyio.lowlevel.checkpoint()
        return self.read_row(case_id)

    def read_row(self, case_id: str) -> CaseRow | None:
        self._check_open("read a case row")
        case = self._cases.get(case_id)
        return self._with_refused(self._row(case)) if case is not None and case.row is not None else None

    def _with_refused(self, row: CaseRow) -> CaseRow:
        """The row with the latest inbox inputs refused for its case (`CaseRow.refused`)."""
        ids = sorted((i for i, one in self._inbox.items() if one.case_id == row.case_id and one.refused is not None),
                     reverse=True)
        row.refused = [self._inbox_row(i, self._inbox[i]) for i in ids[:REFUSED_KEPT]]
        return row

    async def journal(self, case_id: str) -> list[Record]:
        self._check_open("read a journal")
        await anyio.lowlevel.checkpoint()
        case = self._cases.get(case_id)
        if case is None:
            return []
        return [decode_record(self._name, case_id, case.journal[seq]) for seq in sorted(case.journal)]

    async def journaled_request(self, case_id: str, request_id: str) -> list[Record]:
        return [
            record for record in await self.journal(case_id)
            if record.get("request_id") == request_id or record.get("kind") == "snapshot"
        ]

    async def cases(self, listing: Listing) -> list[CaseRow]:
        await anyio.lowlevel.checkpoint()
        return self.read_cases(listing)

    def read_cases(self, listing: Listing) -> list[CaseRow]:
        self._check_open("list cases")
        found = [
            (case.order, row)
            for case, row in ((case, self._row(case)) for case, _ in self._rows())
            if listing.matches(case.order, row)
        ]
        found.sort(key=lambda item: item[0], reverse=True)
        return [row for _, row in found[: max(listing.limit, 0)]]

    async def live(self) -> list[CaseRow]:
        self._check_open("list live cases")
        await anyio.lowlevel.checkpoint()
        found = [case for case, row in self._rows() if row["live"]]
        return [self._row(case) for case in sorted(found, key=lambda case: case.order)]

    def _parked(self) -> list[tuple[float, int, _Case]]:
        return [
            (row["next_due"], case.order, case)
            for case, row in self._rows()
            if row["parked"] and row["next_due"] is not None
        ]

    async def due(
        self, until: float, limit: int = 1000, after: tuple[float, int] | None = None
    ) -> list[CaseRow]:
        self._check_open("list due cases")
        await anyio.lowlevel.checkpoint()
        start = (-math.inf, 0) if after is None else after
        found = sorted(
            (due, order, case) for due, order, case in self._parked() if due <= until and (due, order) > start
        )
        return [self._row(case) for _, _, case in found[: max(limit, 0)]]

    async def next_due(self, after: float | None = None) -> float | None:
        self._check_open("read the next due time")
        await anyio.lowlevel.checkpoint()
        later = -math.inf if after is None else after
        return min((due for due, _, _ in self._parked() if due > later), default=None)

    def _inbox_row(self, inbox_id: int, row: _Inbox) -> InboxRow:
        return InboxRow(inbox_id, row.case_id, row.kind, loads(row.body), row.request_id, row.created_at, row.refused)

    async def inbox_take(self, after: int = 0, limit: int = 1000) -> list[InboxRow]:
        self._check_open("read the inbox")
        await anyio.lowlevel.checkpoint()
        ids = sorted(i for i, row in self._inbox.items() if i > after and row.refused is None)
        return [self._inbox_row(i, self._inbox[i]) for i in ids[: max(limit, 0)]]

    async def inbox_row(self, inbox_id: int) -> InboxRow | None:
        self._check_open("read an inbox row")
        await anyio.lowlevel.checkpoint()
        row = self._inbox.get(inbox_id)
        return None if row is None else self._inbox_row(inbox_id, row)

    async def inbox_pending(self, case_id: str, limit: int = 10, after: int = 0) -> list[InboxRow]:
        self._check_open("read the inbox")
        await anyio.lowlevel.checkpoint()
        ids = sorted(
            i for i, row in self._inbox.items() if i > after and row.case_id == case_id and row.refused is None
        )
        return [self._inbox_row(i, self._inbox[i]) for i in ids[: max(limit, 0)]]

    def inbox_waiting(self, case_id: str) -> bool | None:
        self._check_open("read the inbox")
        return any(row.case_id == case_id and row.refused is None for row in self._inbox.values())

    def changed(self) -> bool:
        self._check_open("poll for changes")
        changed, self._changed = self._changed, False
        return changed

    def _store_name(self) -> str:
        return self._name

    def _poll_changed(self) -> bool:
        self._check_open("wait for changes")
        changed, self._wait_mark = self._wait_mark, False
        return changed


__all__ = ["MemoryStore", "ScheduleTable"]

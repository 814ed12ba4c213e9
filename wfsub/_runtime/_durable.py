"""What a durable case keeps besides its machine: where its journal stands, and how it tells the store.

The case actor is the only writer of its journal. It takes the inputs waiting in its mailbox, gives each the
next sequence number and the step count at which it will be applied, commits them, then applies them in that
order at that count (the vm does not run in between): an input reaches the vm only after its record is
committed, and a call that returned is never lost. `CaseJournal` holds the numbers that takes: the last
sequence number, the acceptance time of the last record applied (timers armed after it are due that time plus
their seconds), how many records came since the last snapshot, and whether the store's case row says the case
is parked (so the next input's commit also marks it live again, in the same transaction).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import anyio

from .._program import BYTECODE_VERSION
from .._store import CaseRow, CaseWrite, InboxRow, Record, Snapshot, Store
from .._vm import SNAPSHOT_FORMAT, Machine
from ._journal import input_record
from ._request_ids import RequestKinds, for_snapshot

SNAPSHOT_EVERY = 32  # a case that parks writes a snapshot once this many records came since the last one


class InCommit:
    """The outcome of a commit of inputs being written, for a caller that retries one of them meanwhile (an update
    whose first call gave up): `done` is set once the commit has ended and its inputs are applied; `error` is
    what the commit raised (None: written, or nothing written and the ids are free again)."""

    __slots__ = ("done", "error")

    def __init__(self) -> None:
        self.done = anyio.Event()
        self.error: BaseException | None = None


@dataclass(slots=True)
class CaseJournal:
    """The journal side of one durable case (see the module docstring)."""

    store: Store
    case_id: str
    workflow: str
    fingerprint: str
    started_at: float
    seq: int = 0  # the last sequence number written
    time: float = 0.0  # the acceptance time of the last record applied
    since_snapshot: int = 0
    row_parked: bool = False  # the store's row says the case waits for a signal or a timer
    parked_row_at: int = -1  # the seq after which the parked row was last committed (eviction then writes nothing)
    deadline: float | None = None  # the case's timeout as an absolute time (from the start record)
    order: int = 0
    epoch: int = 1  # shared stores: the epoch this node holds the case at (every write is fenced by it)
    # request id -> input kind, of the inputs journaled or in the commit being written (recovery reads them back;
    # see `_request_ids`)
    request_ids: RequestKinds = field(default_factory=dict)
    committing: dict[str, InCommit] = field(default_factory=dict)  # the ids of the commit being written
    start: Record | None = None  # the case's `start` record (a compaction's `snapshot` record keeps it)
    first_seq: int = 0  # the seq of the first record the journal keeps (0, or the last compaction's snapshot)
    uncompactable: bool = False  # its data is not JSON: no snapshot, so no compaction (see `_compact`)
    compactions: int = 0  # compactions this actor made (tests and benchmarks read it)
    run: int = 0  # retries of the case so far (`Substrate.retry`): its next `end` carries it
    recovered: dict[str, int] | None = None  # the row's count of recoveries without a new record (poison cases)
    migrated_from: str | None = None  # the fingerprint before the case's latest migration (its row keeps it)
    refused: list[InboxRow] | None = field(default_factory=list)  # latest refused inbox inputs (None: read the row)
    parent: str | None = None  # a child case: the id of the case that started it (from the start record)
    parent_step: dict[str, Any] | None = None  # a child its parent waits for with "cancel": the parent's step
    waited: bool = False  # a child its parent waits for (with "cancel" or "abandon"): deleted with its parent

    def record(self, kind: str, step: int, digest: str, now: float, **fields: Any) -> Record:
        """The next input record (its seq, step, acceptance time and digest), not yet written."""
        self.seq += 1
        return input_record(self.seq, kind, step, now, digest, **fields)

    async def commit(
        self,
        records: list[Record],
        *,
        row: CaseRow | None = None,
        inbox_done: list[int] | None = None,
        inbox_refused: list[tuple[int, str]] | None = None,
    ) -> list[bool]:
        """Write records (and the row, inbox moves) in one transaction of the store's next group commit."""
        change = CaseWrite(
            self.case_id, records, row, None, list(inbox_done or ()), list(inbox_refused or ()), epoch=self.epoch
        )
        appended = await self.store.write(change)
        self.since_snapshot += len(records)
        if row is not None:
            self.row_parked = row.state in ("waiting_signal", "waiting_timer")
        return appended


def snapshot_of(
    machine: Machine, journal: CaseJournal, timers: Mapping[int, float], request_ids: RequestKinds | None = None
) -> Snapshot | None:
    """A snapshot of a case after its last record applied, or None when its data is not JSON (then the whole
    journal is replayed on recovery: slower, never wrong). It keeps `request_ids` (a compaction's window), or every
    id the case holds (a stored snapshot: the records after the last compaction are still in the journal, and the
    store's unique index still knows their ids)."""
    kept = journal.request_ids if request_ids is None else request_ids
    state = {"machine": machine.snapshot(), "time": journal.time, "seq": journal.seq, "timers": dict(timers),
             "request_ids": for_snapshot(kept)}
    if journal.run:
        state["run"] = journal.run
    try:
        json.dumps(state, allow_nan=False)
    except (TypeError, ValueError):
        return None
    return Snapshot(journal.case_id, journal.seq, SNAPSHOT_FORMAT, BYTECODE_VERSION, state)


def usable(snapshot: Snapshot | None) -> bool:
    """A snapshot of another format or bytecode version is ignored: the whole journal is replayed instead."""
    return snapshot is not None and snapshot.format == SNAPSHOT_FORMAT and snapshot.bytecode == BYTECODE_VERSION

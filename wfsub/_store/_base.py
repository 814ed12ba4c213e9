"""The store interface: what the runtime asks of a place that keeps cases (memory, SQLite, Postgres).

A store keeps, per case, a journal of records (append-only, in sequence order), a case row (what the case is
doing, kept in step with the journal), occasional snapshots, and an inbox of inputs written by anyone but the
owning Substrate. It never interprets records: the vm's determinism is the source of truth, and a store only
keeps records in order, commits them durably, and answers queries. One backend module implements this
interface per database; `MemoryStore` implements it in memory with the same semantics, for tests.

Writes go through `write(CaseWrite)`: the store groups every write that arrives while its previous commit
runs into one transaction (group commit), so many cases share one fsync. A write returns once committed (or
at once with `wait=False`, for writes whose loss a crash makes harmless: a parked case's row).

Times are floats in seconds since the epoch (or the Substrate clock's seconds), as the runtime gives them.

`Store` (a Protocol) is everything the runtime and the `wfsub` command use of a store, and nothing else: they
touch no other attribute. `StoreBase` is what backends share: they subclass it, and it builds the errors of a
store used before `open()`, opened twice, or used while closing.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from .._errors import StoreConflict, StoreError
from ._queueing import QueueItem, QueueLimits

SCHEMA_VERSION = 11
"""The version of the store layout this library writes; a store reports a newer one with a StoreError."""
REFUSED_KEPT = 10  # refused inbox inputs a case row carries (`CaseRow.refused`, `CaseStatus.refused`)

Record = dict[str, Any]
"""One journal record as plain JSON-able data (see `wfsub._store._records` for the kinds and their fields).

Every record has `seq` (0 for `start`, then 1, 2, ...) and `kind`; input records also have `step`, `time` and
`digest`. A store reads only `seq`, `kind` and `request_id` (if present) of a record.
"""


class DamagedEntry(StoreError):
    """An entry the store holds for a case cannot be read back (not JSON, a field every record has missing, the
    `start` record gone): no retry mends it. The runtime suspends that case alone with this text (the Substrate and
    the other cases go on); the fix is to restore the entry from a backup of the store, or to cancel the case."""

    def __init__(self, store: str, case_id: str, what: str) -> None:
        self.case_id = case_id
        super().__init__(
            store,
            f"case {case_id!r} cannot be read back: {what}. The case is kept as it is, suspended; restore the store "
            f"from a backup, or cancel the case (`wfsub cancel STORE {case_id}`: a suspended case ends at once)",
        )


@dataclass(slots=True)
class CaseRow:
    """What a case is doing, as the store last recorded it: enough to list, show and wake cases."""

    case_id: str
    workflow: str  # registered name
    fingerprint: str  # of the program version the case runs on
    state: str  # a CaseState value
    started_at: float
    updated_at: float
    ended_at: float | None = None
    last_seq: int = 0  # seq of the newest record in the journal
    at: list[str] = field(default_factory=list)  # node paths where the case's threads are
    signals: list[str] = field(default_factory=list)  # signal names it waits for
    effects: list[dict[str, Any]] = field(default_factory=list)  # in flight: {"effect_id", "path", "name"}
    timers: list[dict[str, Any]] = field(default_factory=list)  # armed: {"timer_id", "path", "due"}
    next_due: float | None = None  # the earliest timer due (or the case deadline): when to wake a parked case
    data: dict[str, Any] | None = None  # the data when the row was written (the final data once ended)
    error: dict[str, Any] | None = None  # failed: {"type", "message", "path", "traceback"}
    cancel_reason: str | None = None
    suspended_reason: str | None = None  # suspended: the ReplayDivergence text
    # suspended: the state its row had when it was suspended; a parked one's row listed exactly what the case waited
    # for (effects, timers, task digest), which a version that may run it must still match (`_runtime._persist`)
    suspended_from: str | None = None
    digest: str | None = None  # parked rows: the digest of the task outputs so far (a reload must reach it)
    order: int = 0  # assigned by the store when the case is created: the paging key of `cases(before=)`
    owner: str | None = None  # shared stores: the node that owns the case (None: queued, or a single-node store)
    epoch: int = 0  # shared stores: 1 when started (0 while queued), +1 at each takeover; pass it in CaseWrite
    recovered: dict[str, int] | None = None  # {"seq", "count"}: recoveries in a row with the journal at `seq`
    tags: dict[str, str] = field(default_factory=dict)  # read only: the `tags` of the case's `start` record
    forked_from: str | None = None  # read only: the case this one was forked from (its `start` record says)
    migrated_from: str | None = None  # the fingerprint the case ran on before its latest migration
    # The latest inbox inputs the owner refused for this case, newest first (at most REFUSED_KEPT): read from the
    # inbox's refused rows by the single-row reads (`row`, `read_row`, `load`), never written through the row.
    refused: list[InboxRow] = field(default_factory=list)
    # The answers of the case's latest updates, by update id: {id: [kind, value]} (see `_runtime._answers`). Not
    # journaled (a replay computes them again): kept here so a process that sent an update through the inbox,
    # or a call retried after a crash, finds its answer.
    answers: dict[str, Any] | None = None
    # The ids of the updates the case journaled and has not answered yet (buffered, owed by a thread, or not yet
    # applied): with `answers`, it tells a process reading the row that an update journaled at or before
    # `last_seq` and in neither was answered, and its answer dropped. Written by a case that took updates; None
    # on the other rows and on rows written before it was kept (an update missing from `answers` may be owed).
    owed: list[str] | None = None
    # Inputs a `check=` refused when a wait took them from the buffer (the latest ten, newest first: kind, name,
    # reason, time, request_id): journaled as inputs, refused by the case itself, so not in the inbox.
    taken_refused: list[dict[str, Any]] | None = None
    parent: str | None = None  # a child case (`start_case`): the id of the case that started it
    # A child its parent waits for and cancels on withdrawal: the parent's step, {"effect_id", "path"} (a parent
    # that withdrew that step but died before cancelling the child is found by it: `_runtime._children`).
    parent_step: dict[str, Any] | None = None
    waited: bool = False  # a child case its parent waits for (`start_case(wait=True)`): deleted with its parent


@dataclass(slots=True)
class Snapshot:
    """A machine snapshot of a case taken after the record `seq` was applied."""

    case_id: str
    seq: int
    format: int  # the vm snapshot format version
    bytecode: int  # the bytecode version it was taken with
    state: dict[str, Any]  # `Machine.snapshot()`


@dataclass(slots=True)
class InboxRow:
    """An input written by someone other than the owner, waiting to be moved into its case's journal."""

    id: int  # assigned by the store, increasing: the inbox's order
    case_id: str
    kind: str  # signal | cancel | cancel_region | complete_region | add_instances | close_instances
    body: dict[str, Any]  # the input's fields (name, payload, region, items, compensate, ...)
    request_id: str | None
    created_at: float
    refused: str | None = None  # why the owner refused it (the row stays, marked, for `wfsub signal --wait`)


@dataclass(frozen=True, slots=True)
class Owner:
    """The Substrate that owns a store: who, where, since when (seconds since the epoch)."""

    owner_id: str
    pid: int | None
    host: str | None
    since: float | None


@dataclass(frozen=True, slots=True)
class ProgramSummary:
    """What one registered program version can take, as its registering Substrate wrote it (see
    `wfsub._runtime._summary`): `summary` is JSON: {"signals": {name: JSON Schema or None}, "updates": {...},
    "regions": {name: "scope" | "mi"}, "root": the workflow's root node path}."""

    fingerprint: str
    workflow: str
    summary: dict[str, Any]


@dataclass(frozen=True, slots=True)
class ScheduleRow:
    """What the store keeps of one schedule (see `wfsub._runtime._schedules`): its newest registration, the newest
    slot it has dealt with (started, skipped or let go) and the case it started last, and whether it is paused."""

    name: str
    spec: dict[str, Any]  # JSON: {"workflow", "cron", "every", "tz", "overlap", "catchup", "queue"}
    last_slot: float | None  # seconds since the epoch of the newest slot dealt with (None: none yet)
    last_case: str | None  # the id of the case it started last (overlap="skip" looks at it)
    paused: bool
    updated_at: float


@dataclass(slots=True)
class CaseWrite:
    """What one case commits at once, in one transaction with every other write of the same group.

    - `records`: appended to the journal in order. A record carrying a `request_id` that this case's journal
      already holds is not appended (a retried call applies once); `write` says which were appended.
    - `row`: replaces the case row (inserted with the `start` record; `order` is then assigned).
    - `snapshot`: stored beside older ones (the store may drop all but the newest few).
    - `inbox_done`: inbox rows moved into this journal: deleted in the same transaction.
    - `inbox_refused`: inbox rows refused: (id, reason), kept and marked.
    - `compact`: a compaction (see `wfsub._runtime._compact`): the seq of the `snapshot` record among `records`;
      the case's records and snapshots before that seq are deleted in the same transaction, so the journal then
      starts with that record (or, the write refused, nothing changed). Seqs are never renumbered.
    - `epoch`: on a shared store, the epoch the writer holds the case at (`CaseRow.epoch` from `load()`,
      `take_over()`, or 1 after the start write). Every write for an existing case checks, under a lock on the
      case row, that this node owns the case at this epoch; otherwise that write alone fails with StoreConflict
      (fencing: the case was taken over). None checks the owner only. Single-node stores ignore it.
    - `from_queue`: the write that starts the case of a queue item (its start at dequeue, or its end when it is
      cancelled in its queue). Any other write that starts a case (its journal's first record: a `start`, or a
      fork's `snapshot`) is refused with StoreConflict while a queue item of its id waits (queued, or claimed and
      its case not written): checked in the write's own transaction, so a start and a queueing of one id never
      both commit (see `_queueing`).
    - `schedule`: the name of the schedule whose slot this write starts: refused with SchedulePaused while that
      schedule is paused, checked in the write's own transaction (on Postgres under a share lock on the
      schedule's row, so a pause waits for a start that checked before it), so no slot starts after
      `pause_schedule` returned.
    An `end` record is accepted once per case; a second one is a StoreError (only the owner writes it).
    """

    case_id: str
    records: list[Record] = field(default_factory=list)
    row: CaseRow | None = None
    snapshot: Snapshot | None = None
    inbox_done: list[int] = field(default_factory=list)
    inbox_refused: list[tuple[int, str]] = field(default_factory=list)
    epoch: int | None = None
    compact: int | None = None
    from_queue: bool = False
    schedule: str | None = None


@dataclass(slots=True)
class StoredCase:
    """What recovery needs to rebuild a case: its row, the newest usable snapshot, the records after it."""

    row: CaseRow
    start: Record  # the first record kept: `start`, or after a compaction the `snapshot` record (which holds it)
    snapshot: Snapshot | None  # the newest snapshot (the caller checks its versions)
    records: list[Record]  # the records after the snapshot's seq (after `start` without a snapshot), in order
    heartbeats: dict[str, Any] = field(default_factory=dict)  # see `Store.put_heartbeats`


@runtime_checkable
class Store(Protocol):
    """What the runtime and the `wfsub` command use of a store. Every method may raise StoreError (the driver's
    error as cause). Backends subclass `StoreBase`; `tests/stores/test_store_generic.py` is the contract."""

    url: str  # how to open it again (shown in messages; `wfsub` takes it); never holds a password
    shared: bool  # True: several Substrates (nodes) own cases in this store at once (Postgres)
    lease_seconds: float  # shared stores: how long a node's lease lasts unless renewed; single-node stores: 0.0

    async def open(self, *, owner: bool, owner_id: str) -> None:
        """Create or migrate the schema, then (owner=True) become an owner of the store.

        Single-node stores: the one Substrate that owns it; a second owner is refused with a StoreError naming
        the current owner and how to stop it. Shared stores: `owner_id` is this node's id; opening takes (or
        renews) its lease and does not exclude other nodes. The `wfsub` command opens with owner=False: it reads
        and writes the inbox only, and takes no lease.
        """
        ...

    async def close(self) -> None:
        """Finish the writes in flight, release ownership, close connections. Writes nothing else."""
        ...

    async def write(self, change: CaseWrite, *, wait: bool = True) -> list[bool]:
        """Commit `change` (grouped with concurrent writes); per record, whether it was appended. A write of records
        or a row for a case the store does not hold (deleted or pruned meanwhile) is refused with StoreConflict
        unless its records begin with the journal's first record (a `start`, or a compacted fork's `snapshot`)."""
        ...

    async def load(self, case_id: str) -> StoredCase | None:
        """The case's row, start record, newest snapshot and the records after it (None: no such case)."""
        ...

    async def row(self, case_id: str) -> CaseRow | None:
        """The case row (None: no such case)."""
        ...

    async def first_seq(self, case_id: str) -> int | None:
        """The seq of the first record the case's journal still keeps: 0 (its `start`) until a compaction, then
        the seq of its `snapshot` record (the records before it are gone). None: no such case."""
        ...

    def read_row(self, case_id: str) -> CaseRow | None:
        """The case row, read synchronously on the calling thread (a small indexed read: `Substrate.status`)."""
        ...

    def read_cases(
        self, *, state: str | None = None, workflow: str | None = None, limit: int = 100, before: int | None = None,
        tags: Mapping[str, str] | None = None, id_prefix: str | None = None, started_after: float | None = None,
        started_before: float | None = None, parent: str | None = None,
    ) -> list[CaseRow]:
        """`cases()`, read synchronously on the calling thread (an index read of one page: `Substrate.cases`)."""
        ...

    async def journal(self, case_id: str) -> list[Record]:
        """Every record of the case, in order (empty: no such case)."""
        ...

    async def journaled_request(self, case_id: str, request_id: str) -> list[Record]:
        """The records that say whether the case's journal holds an input with `request_id`, in order: the one
        that carries it (at most one: an id is unique within the records a case keeps), after the journal's
        `snapshot` record if it was compacted (that record keeps the ids of the latest inputs it replaced: a
        window, not all of them). Empty: neither (an indexed read, for a client's check of an id before it writes
        to the inbox)."""
        ...

    async def cases(
        self, *, state: str | None = None, workflow: str | None = None, limit: int = 100, before: int | None = None,
        tags: Mapping[str, str] | None = None, id_prefix: str | None = None, started_after: float | None = None,
        started_before: float | None = None, parent: str | None = None,
    ) -> list[CaseRow]:
        """Case rows newest first (by `order`), filtered, at most `limit`, those with `order` < `before`: every
        filter given holds (`wfsub._store._listing.Listing` says each; `parent=`: only the children that case
        started)."""
        ...

    async def delete(self, case_id: str, children: Sequence[str] = ()) -> bool:
        """Remove an ended case (its row, journal, snapshots, inbox rows, tags and queue item: see
        `_queueing`), and with it the cases `children` (the ended children it waited for, as the runtime found
        them: `_runtime._lifecycle.delete_ended`), in one transaction; False (and
        nothing removed) when any of them is no such case, has no `end` record, or has an input waiting in the inbox
        (not yet taken nor refused: a `retry` or `fork` a client queued would be lost; `inbox_pending` names
        them). An `inbox_put` for the case committed before the delete is seen by it; one under way waits for it
        (and then names no case). Postgres tells the other nodes (NOTIFY), which drop the case from memory."""
        ...

    async def live(self) -> list[CaseRow]:
        """Rows of cases that were running or had effects in flight: what recovery resumes at once."""
        ...

    async def due(
        self, until: float, limit: int = 1000, after: tuple[float, int] | None = None
    ) -> list[CaseRow]:
        """Rows of parked cases whose `next_due` <= `until`, earliest first (by `next_due`, then `order`), at most
        `limit`; `after`: the (`next_due`, `order`) of the last row of the page before, to read the next page."""
        ...

    async def next_due(self, after: float | None = None) -> float | None:
        """The earliest `next_due` among parked cases, or the earliest later than `after` (None: no parked case
        has a timer, or none after `after`)."""
        ...

    async def inbox_put(
        self, case_id: str, kind: str, body: Mapping[str, Any], *, request_id: str | None, created_at: float
    ) -> int:
        """Insert an input into the inbox; returns its id once committed (outside writers use this)."""
        ...

    async def inbox_take(self, after: int = 0, limit: int = 1000) -> list[InboxRow]:
        """Inbox rows not yet refused with id > `after`, in id order."""
        ...

    async def inbox_row(self, inbox_id: int) -> InboxRow | None:
        """One inbox row (None once it was moved into a journal)."""
        ...

    async def inbox_pending(self, case_id: str, limit: int = 10, after: int = 0) -> list[InboxRow]:
        """The inputs for a case still waiting in the inbox (neither taken nor refused) with id > `after`, oldest
        first."""
        ...

    def inbox_waiting(self, case_id: str) -> bool | None:
        """Cheap and synchronous: whether an input for the case waits in the inbox now (neither taken nor refused);
        None when the store cannot tell without a read (the caller reads `inbox_pending` when it has reason to)."""
        ...

    def changed(self) -> bool:
        """Cheap and synchronous: whether another connection committed since the last call (inbox polling)."""
        ...

    async def wait_changed(self, timeout: float) -> None:  # noqa: ASYNC109 (a polling bound, not a deadline)
        """Return when something this node should look at was committed since the last return (an inbox row
        for one of its cases or for no case, an `end` of any case, a queued case it may claim, a takeover), or
        after `timeout` seconds. Shared stores are woken by NOTIFY and also return right after (re)subscribing,
        since notifications are lost across reconnects: re-read then. Single-node stores poll. One task should
        wait per store (a return consumes what it reports); it does not consume `changed()`."""
        ...

    def drain_ended(self) -> set[str] | None:
        """Ids of the cases whose `end` another node committed, or that another node or a client deleted, since the
        last call; None when some may have been missed (re-read every case waited for). Single-node stores: always
        empty (no other node ends a case)."""
        ...

    async def renew_lease(self) -> float:
        """Extend this node's lease to database now + `lease_seconds`; return database time (seconds since the
        epoch). StoreError if it cannot. Single-node stores: the local time (there is no lease to renew)."""
        ...

    async def take_over(self, limit: int = 1000) -> list[CaseRow]:
        """Take up to `limit` cases of nodes whose lease expired: each becomes this node's with its epoch bumped,
        and is returned (the caller recovers the live ones; parked ones come back through `due()` and the
        inbox). Never gives one case to two nodes. Single-node stores: []."""
        ...

    async def take_ended(self, case_id: str) -> CaseRow | None:
        """Take an ended case for this node, to re-open it (`retry`): when no node owns it, or its owner's lease
        has expired (a node gone for good), it becomes this node's with its epoch bumped (fenced like a takeover:
        a write of the old owner is refused) and its row is returned; None when a node whose lease is live owns
        it, or there is no such ended case. Single-node stores: its row as it is."""
        ...

    async def queue_case(self, change: CaseWrite) -> None:
        """Commit a new case's start write (its `start` record and row) with no owner, for the first node that
        claims it (`new_case(placement="any")`). StoreConflict if the case id is taken (a case has it, or a queue item
        of it waits: see `CaseWrite.from_queue`). Single-node stores raise
        StoreError: placement="any" needs a shared store."""
        ...

    async def replace_start(self, case_id: str, start: Record) -> None:
        """Replace the `start` record of a case whose journal holds nothing else yet (a queued case its owner just
        claimed: its start data as the input model of its workflow gives it). StoreConflict if the journal holds
        more. Single-node stores without queued cases raise StoreError."""
        ...

    async def claim_queued(self, fingerprints: Sequence[str], limit: int) -> list[str]:
        """Claim up to `limit` queued cases whose fingerprint is one of `fingerprints` (oldest first; never one
        another node claims); they become this node's at epoch 1. Returns their ids. Single-node stores: []."""
        ...

    async def database_time(self) -> float:
        """The store's clock, seconds since the epoch: on a shared store, what acceptance times, due times and
        leases are measured in (database time); on a single-node store, the local clock."""
        ...

    async def prune(self, ended_before: float, limit: int | None = None) -> int:
        """Remove the cases that ended at or before `ended_before` (never one without `end`), at most `limit` of them
        (None: all) in one transaction, as `delete` removes one; returns how many."""
        ...

    async def owner(self) -> Owner | None:
        """The Substrate that owns the store now (None: none is running), as far as the store can tell."""
        ...

    async def take_ownership(self, owner_id: str) -> bool:
        """A store opened with owner=False becomes the owner if nobody owns it now (a standby Substrate whose
        owner has gone); False if someone does. Single-node stores only: a shared store raises StoreError (its
        nodes own cases, not the store)."""
        ...

    async def put_heartbeats(self, case_id: str, heartbeats: Mapping[str, Any], *, epoch: int | None = None) -> None:
        """Keep the last heartbeat of each in-flight effect of a case beside its row (`{effect id as str:
        {"details", "at", "attempt"}}`, replacing what was kept): not journaled, never read by a replay, given back
        by `load()` so a recovered effect's next attempt sees them. A case without a row is left as it is; on a
        shared store a case this node does not own at `epoch` too (the heartbeat of a node that lost the case)."""
        ...

    async def put_program(self, summary: ProgramSummary) -> None:
        """Record a program version's summary, once per fingerprint (a second call for it changes nothing)."""
        ...

    async def program(self, fingerprint: str) -> ProgramSummary | None:
        """The summary of a program version (None: no Substrate registered it with this store yet)."""
        ...

    async def newest_program(self, workflow: str) -> ProgramSummary | None:
        """The summary of the version of `workflow` registered last (None: none registered)."""
        ...

    async def schedule_register(self, name: str, spec: Mapping[str, Any], first_slot: float) -> ScheduleRow:
        """Record schedule `name`'s registration (the newest wins); a schedule the store does not know yet starts
        with `last_slot = first_slot`. Returns the row as it is now."""
        ...

    async def schedule_advance(self, name: str, slot: float, case_id: str | None) -> bool:
        """Move schedule `name` on to `slot` (and its last case to `case_id`, unless None) if its last slot is
        older: False when another process got there first (or the schedule is unknown)."""
        ...

    async def schedule_pause(self, name: str, paused: bool) -> bool:
        """Pause or resume schedule `name`; False if the store does not know it."""
        ...

    async def schedules(self) -> list[ScheduleRow]:
        """Every schedule the store knows, by name."""
        ...

    async def queue_put(self, item: QueueItem, *, schedule: str | None = None) -> None:
        """Keep a queued case (see `_queueing`): CaseExists if a case or item has its id, or a live item of its
        queue holds its dedup key. `schedule`: the schedule whose slot this is (see `CaseWrite.schedule`):
        SchedulePaused while it is paused."""
        ...

    async def queue_claim(
        self, queue: str, limits: QueueLimits, node: str, now: float, most: int
    ) -> tuple[list[QueueItem], float | None]:
        """Claim for `node` the items of `queue` its limits let start now (at most `most`), in one transaction; and
        the earliest time another may become startable without a case ending (None: none). The row of a claimed
        item's case that waited in its queue (retried: `queued`) is live again, `running` (on a shared store
        owned by `node`, its epoch bumped)."""
        ...

    async def queue_requeue(
        self, case_id: str, reopened: CaseWrite, start: Mapping[str, Any], key: str
    ) -> QueueItem | None:
        """Put the queue item of a retried case back in its queue, in the transaction that writes `reopened` (its
        `retry` record and its row, `queued`): queued again with `start` (what it starts with, marked retried),
        keeping its place; the start it had stays counted in its queue's rate window under `key` (see
        `_queueing`). None, with nothing written, when the case has no queue item that started; CaseExists naming
        the holder, with nothing written, when another live item of its queue holds its dedup key."""
        ...

    async def queue_cancel(self, case_id: str, ended: CaseWrite) -> QueueItem | None:
        """Cancel a queued item (it never starts) and write `ended`, its case ended (see `_queueing`), in one
        transaction; None, writing nothing, if there is no item of that id waiting (none, or it started or was
        cancelled already)."""
        ...

    def read_queue_items(
        self, *, state: str | None = None, queue: str | None = None, limit: int = 100, before: int | None = None
    ) -> list[QueueItem]:
        """Queue items, newest first (those whose `order` is below `before`, if given), read on the calling thread
        (cases() is synchronous)."""
        ...

    def read_queue_item(self, case_id: str) -> QueueItem | None:
        """One queue item, read on the calling thread (status() is synchronous)."""
        ...

    async def children_of_ended(self, limit: int = 1000) -> list[tuple[str, str]]:
        """(child id, parent id) of up to `limit` child cases (`start_case`) that have not ended whose parent has,
        oldest first."""
        ...

    async def children_waited_for(
        self, owner: str | None, after: int = 0, limit: int = 1000
    ) -> list[tuple[int, str, str, dict[str, Any]]]:
        """(order, child id, parent id, the parent's step) of up to `limit` child cases that have not ended, whose
        parent has not ended either and waits for them with "cancel" (their row has `parent_step`), with `order`
        > `after`, oldest first; `owner` (shared stores): only those whose parent that node owns."""
        ...

    async def queue_orphans(self, node: str, *, own: bool = True) -> list[QueueItem]:
        """Items claimed by a process that stopped before writing their case, taken over by `node` (each by one
        node) to start: on a shared store those of nodes whose lease ran out, and with `own` those `node` claimed
        itself (in an earlier process: only when it opens); on SQLite, when it opens (`own`), every such item (its
        owner is the only claimer)."""
        ...

    async def queue_register(self, name: str, spec: Mapping[str, Any], node: str) -> tuple[dict[str, Any], str] | None:
        """Record queue `name`'s configuration (the newest wins); returns the one it replaces and who registered
        that (None: none)."""
        ...

    async def queue_specs(self) -> dict[str, dict[str, Any]]:
        """Every queue's registered configuration, by name."""
        ...


class StoreBase(Store):
    """What every backend shares: the checks around `open()` and `close()`, and their errors, built once.

    A backend says how messages name it (`_store_name`) and whether it is open (`_is_open`); it sets
    `_opening` while `open()` runs. Then `_refuse_second_open()` at the top of `open()`, `_check_open(action)`
    (or `_not_open(action)`) before any use, and `_closing_error(action)` for a call that meets a store being closed
    give the same errors on every backend.
    """

    _opening: bool = False  # open() is running

    def _store_name(self) -> str:
        """How messages name the store: its file, its URL without password, "memory"."""
        return self.url

    def _is_open(self) -> bool:
        raise NotImplementedError

    def inbox_waiting(self, case_id: str) -> bool | None:
        return None  # a backend that can look cheaply (no round trip, no thread) says so

    def _refuse_second_open(self) -> None:
        """The error of `open()` on a store object that is open (or opening) already."""
        if self._is_open() or self._opening:
            raise StoreError(self._store_name(), "open() called on a store that is already open: close() it first")

    def _not_open(self, action: str) -> StoreError:
        """The error of a call before `open()` or after `close()`."""
        return StoreError(
            self._store_name(), f"cannot {_verb(action)}: the store is not open; call `await store.open(owner=..., "
            "owner_id=...)` first (a Substrate opens its store when it starts)"
        )

    def _check_open(self, action: str) -> None:
        if not self._is_open():
            raise self._not_open(action)

    def _closing_error(self, action: str) -> StoreError:
        """The error of a call that meets the store while `close()` is taking it down."""
        return StoreError(self._store_name(), f"cannot {_verb(action)}: the store is closing")


_VERBS = {
    "reading": "read", "loading": "load", "listing": "list", "polling": "poll", "waiting": "wait",
    "taking": "take", "claiming": "claim", "recording": "record", "renewing": "renew", "writing": "write",
    "committing": "commit", "putting": "put", "queueing": "queue", "pruning": "prune", "draining": "drain",
    "deleting": "delete",
}


def _verb(action: str) -> str:
    """An action as `cannot ...` says it: a backend names a read by its gerund, which its other errors begin
    with ("reading the row of case 'c1': ..."), so "reading the row of case 'c1'" becomes "read the row ..."."""
    first, space, rest = action.partition(" ")
    return _VERBS.get(first, first) + space + rest


LASTING_SQLSTATES = ("22", "23", "54")
"""The SQLSTATE classes of a request the database refuses for what it holds, however often it is sent: a data
exception (22: a NUL in text, a value out of range), an integrity violation (23) and a program limit exceeded (54:
an index entry larger than a page allows)."""


def refused_for_good(error: StoreError) -> bool:
    """Whether a store refused a request for what it holds rather than for how the store was reached: a Postgres
    error of a `LASTING_SQLSTATES` class, or SQLite's constraint, too-big or type-mismatch errors. Sent again, it is
    refused again, so a caller that retries store trouble must not retry this. A `StoreConflict` is the store's own
    answer about a write (fenced, a seq taken, a case moved) and is not one of these: sent again, it may pass."""
    if isinstance(error, StoreConflict):
        return False
    cause = error.__cause__
    for _ in range(8):  # (a driver's error may be wrapped once or twice; never follow a cycle)
        if cause is None:
            return False
        state = getattr(cause, "sqlstate", None)
        if isinstance(state, str):
            return state[:2] in LASTING_SQLSTATES
        if isinstance(cause, sqlite3.IntegrityError | sqlite3.DataError):
            return True
        cause = cause.__cause__
    return False


def require_store(store: object) -> Store:
    if not isinstance(store, Store):
        raise TypeError(
            f"{store!r} is not a store: pass None, a path or sqlite:///path, postgresql://..., or a store object "
            "(wfsub.stores.SqliteStore, PostgresStore, MemoryStore)"
        )
    return store


__all__ = [
    "LASTING_SQLSTATES",
    "REFUSED_KEPT",
    "SCHEMA_VERSION",
    "CaseRow",
    "CaseWrite",
    "DamagedEntry",
    "InboxRow",
    "Owner",
    "ProgramSummary",
    "Record",
    "ScheduleRow",
    "Snapshot",
    "Store",
    "StoreBase",
    "StoredCase",
    "refused_for_good",
    "require_store",
]


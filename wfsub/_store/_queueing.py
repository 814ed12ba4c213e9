"""Queued cases in a store: what every backend keeps of them and how it chooses which to start.

A case started with `new_case(..., queue=)` is kept as a queue item until its queue has room; then one node
claims it (state `started`, `started_at` = the dequeue time, `node`) and starts it as any case. The backends keep
the items in a table of their own (`queue_items`) and choose in one transaction, which on Postgres holds a lock on
the queue (an advisory lock per queue name), so the limits hold across nodes:

- concurrency: at most that many of the queue's items started and not ended (an item whose case has not been
  written yet counts as started: it is on its way);
- per_node: the same, counted per node;
- rate (n, seconds): at most n items started in any window of `seconds` (sliding: counted from the start times);
- partitioned: each limit per partition key;
- order: lower priority first, then first come first served; an item with a `not_before` (delay=) later than now
  waits.

While an item waits (queued, or started and its case not written yet) its id is its own: a write that starts a
case of that id other than the item's own (`CaseWrite.from_queue`) is refused, and queueing an id refuses one a
case has, each in its own transaction (on Postgres both under an advisory lock on the case id), so a start and a
queueing of one id never both commit.

A case that started from a queue goes back through it when it is retried (`Store.queue_requeue`): in the
transaction that writes its `retry` record (its row `queued`), its item is queued again, keeping its place, its
start marked `retried` (the runtime loads the case, which goes on from its retry record, when a node claims it),
unless another live item of its queue holds its dedup key (refused, nothing written); its earlier start stays in
its queue's rate window under a key of its own (`retried_key`). The claim of such an item makes its case's row
live again (on Postgres the claimer's, its epoch bumped), so the claimer, or whoever recovers it, runs it.

An item cancelled while it waited is `cancelled`, and the same transaction writes its case (a row, a `start`, a
`cancel` and an `end` record, built by the runtime: `Store.queue_cancel`), so an id is an ended case from then on.
Deleting a case (`delete`, `prune`) removes its item in the transaction that removes the case, so its id starts
afresh; an item that had started is kept as `deleted` under a key no case id can be (`tombstone`), so its start
still counts in its queue's rate window.

`choose` is that choice, written once in Python for all backends: each gives it what it read inside its
transaction and writes what it returns. A claim considers every waiting item, however long the backlog, but the
SQL stores read only what may start now (`read_plan`): an item is `due` once its delay has passed (the claim
marks those whose time has come), and a claim reads the first due items of the queue, or of each partition that
has room, as many as may start there; the backlog of a full partition, and delayed items, are never read (the
earliest delay is one indexed read, for the wake-up). The memory table hands `choose` all its waiting items.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from .._errors import CaseExists

QUEUED, STARTED, ENDED, CANCELLED, DELETED = "queued", "started", "ended", "cancelled", "deleted"
TOMBSTONE = " deleted "  # + the item's order: the key of a deleted case's started item (a case id never starts
#                          with a space: new_case refuses one)


def tombstone(order: int) -> str:
    """The key a deleted case's started item is kept under (see the module)."""
    return f"{TOMBSTONE}{order}"


def retried_key(order: int, seq: int) -> str:
    """The key the earlier start of a retried case's item is kept under (its retry record's `seq`), as a deleted
    case's is, so it still counts in its queue's rate window (see the module)."""
    return f"{TOMBSTONE}{order} retried at {seq}"


RETRIED = "retried"  # the key of an item's start that marks it a retried case back in its queue (its run)


@dataclass(frozen=True, slots=True)
class QueueLimits:
    """A queue's limits, as a store applies them (see the module docstring)."""

    concurrency: int | None = None
    per_node: int | None = None
    rate: tuple[int, float] | None = None
    partitioned: bool = False


@dataclass(frozen=True, slots=True)
class QueueItem:
    """A case started on a queue: queued until a node claims it, then started (and ended when its case has)."""

    case_id: str
    queue: str
    partition: str | None
    priority: int
    dedup: str | None
    start: dict[str, Any]  # JSON: {"workflow", "data", "timeout", "seed"}: what new_case starts it with
    not_before: float  # delay=: not claimed before this time
    enqueued_at: float
    state: str = QUEUED  # queued | started | ended | cancelled | deleted
    started_at: float | None = None  # the dequeue time
    node: str | None = None  # the node that claimed it
    order: int = 0  # assigned by the store: first come first served


@dataclass(frozen=True, slots=True)
class Running:
    """What a claim counts: one started-and-not-ended item, or one start inside the rate window."""

    partition: str | None
    node: str | None


class Counts:
    """What a claim counts of a queue before it chooses, per key (the partition when `partitioned`, else one key
    for all): its started-and-not-ended items, this node's share of them, and its starts in the rate window."""

    def __init__(
        self,
        limits: QueueLimits,
        node: str,
        now: float,
        running: Iterable[Running],
        recent_starts: Iterable[tuple[str | None, float]],
    ) -> None:
        self.limits = limits
        self.live: Counter[str | None] = Counter()
        self.mine: Counter[str | None] = Counter()
        for r in running:
            self.live[self.key(r.partition)] += 1
            if r.node == node:
                self.mine[self.key(r.partition)] += 1
        self.window: dict[str | None, list[float]] = {}
        if limits.rate is not None:
            for partition, started in recent_starts:
                if started > now - limits.rate[1]:
                    self.window.setdefault(self.key(partition), []).append(started)

    def key(self, partition: str | None) -> str | None:
        return partition if self.limits.partitioned else None

    def room(self, partition: str | None, most: int) -> int:
        """How many more items of this partition may start now, at most `most`."""
        k, limits = self.key(partition), self.limits
        room = most
        if limits.concurrency is not None:
            room = min(room, limits.concurrency - self.live[k])
        if limits.per_node is not None:
            room = min(room, limits.per_node - self.mine[k])
        if limits.rate is not None:
            room = min(room, limits.rate[0] - len(self.window.get(k, ())))
        return max(room, 0)

    def rate_free_at(self, partition: str | None) -> float | None:
        """When a start leaves this partition's rate window, if the window is full (else None)."""
        rate, starts = self.limits.rate, self.window.get(self.key(partition), [])
        if rate is None or len(starts) < rate[0]:
            return None
        return min(starts) + rate[1]


def choose(
    limits: QueueLimits,
    node: str,
    now: float,
    waiting: Sequence[QueueItem],
    running: Iterable[Running],
    recent_starts: Iterable[tuple[str | None, float]],
    most: int,
) -> tuple[list[QueueItem], float | None]:
    """The waiting items to start now (in priority, then arrival order), at most `most`, and the earliest time a
    waiting item that is not chosen may become startable (a delay running out, a start leaving the rate window;
    None: only an ending case makes room).

    `waiting`: the queue's queued items, ordered by (priority, order). `running`: its started-and-not-ended items.
    `recent_starts`: (partition, started_at) of its items started within the rate window.
    """
    counts = Counts(limits, node, now, running, recent_starts)
    key = counts.key
    live, mine, window = counts.live, counts.mine, counts.window
    chosen: list[QueueItem] = []
    wake: float | None = None

    def later(t: float) -> None:
        nonlocal wake
        wake = t if wake is None else min(wake, t)

    for item in waiting:
        if len(chosen) >= most:
            break
        if item.not_before > now:
            later(item.not_before)
            continue
        k = key(item.partition)
        if limits.concurrency is not None and live[k] >= limits.concurrency:
            continue
        if limits.per_node is not None and mine[k] >= limits.per_node:
            continue
        if limits.rate is not None:
            starts = window.setdefault(k, [])
            if len(starts) >= limits.rate[0]:
                later(min(starts) + limits.rate[1])
                continue
            starts.append(now)
        live[k] += 1
        mine[k] += 1
        chosen.append(item)
    return chosen, wake


@dataclass(frozen=True, slots=True)
class ReadPlan:
    """What a SQL store reads of a queue's ready items (queued, their delay passed) for one claim, so that a claim
    considers every waiting item however long the backlog, reading only what may start now:

    - not partitioned: the first `per_key` ready items in start order (the room the queue has; none when full);
    - partitioned: the first `per_key` ready items of each partition in `parts` (the partitions that have room),
      merged in start order, the first `most` of them. A full partition's backlog is never read.

    `wake`: when a partition left out for its rate window has room again (None: none was)."""

    per_key: int
    parts: list[str | None]
    wake: float | None


def read_plan(counts: Counts, most: int, ready_parts: Sequence[str | None] | None) -> ReadPlan:
    """The reads of one claim (see ReadPlan). `ready_parts`: the partitions holding ready items (partitioned
    queues; None otherwise)."""
    wake: float | None = None

    def left_out(partition: str | None) -> None:
        nonlocal wake
        free = counts.rate_free_at(partition)
        if free is not None:
            wake = free if wake is None else min(wake, free)

    if ready_parts is None:
        room = counts.room(None, most)
        if room == 0:
            left_out(None)
        return ReadPlan(room, [], wake)
    parts: list[str | None] = []
    per_key = 0
    for partition in ready_parts:
        room = counts.room(partition, most)
        if room == 0:
            left_out(partition)
            continue
        parts.append(partition)
        per_key = max(per_key, room)
    return ReadPlan(per_key, parts, wake)


def earliest(*times: float | None) -> float | None:
    """The earliest of the times given (None: none is)."""
    known = [t for t in times if t is not None]
    return min(known) if known else None


def live_dedup(items: Iterable[QueueItem], queue: str, dedup: str) -> str | None:
    """The id of a live item (queued, or started and not ended) of `queue` with key `dedup`, else None."""
    for item in items:
        if item.queue == queue and item.dedup == dedup and item.state in (QUEUED, STARTED):
            return item.case_id
    return None


def item_of(found: Sequence[Any], start: dict[str, Any]) -> QueueItem:
    """A queue item from a row of the SQL stores (columns as `queue_get` selects them; `start` decoded)."""
    return QueueItem(
        case_id=str(found[0]), queue=str(found[1]), partition=None if found[2] is None else str(found[2]),
        priority=int(found[3]), dedup=None if found[4] is None else str(found[4]), start=start,
        not_before=float(found[6]), enqueued_at=float(found[7]), state=str(found[8]),
        started_at=None if found[9] is None else float(found[9]), node=None if found[10] is None else str(found[10]),
        order=int(found[11]),
    )


class QueueTable:
    """The queue items in memory (MemoryStore's, and a Substrate's without a store), with the SQL stores' rules.

    `ended(case_id)`: None while no case of that id exists, else whether it has ended. `missing_is_ended`: a
    started item whose case is not there has ended (a Substrate without a store: its cases are in memory from
    their claim on, and leave it only after they ended); else it is on its way (a store: written after the claim).
    """

    def __init__(self, ended: Callable[[str], bool | None], *, missing_is_ended: bool = False) -> None:
        self.ended = ended
        self.missing_is_ended = missing_is_ended
        self.items: dict[str, QueueItem] = {}
        self.next_order = 1

    def sweep(self) -> None:
        """Mark the started items whose case has ended."""
        for case_id, item in list(self.items.items()):
            if item.state == STARTED:
                ended = self.ended(case_id)
                if ended or (ended is None and self.missing_is_ended):
                    self.items[case_id] = replace(item, state=ENDED)

    def put(self, item: QueueItem) -> None:
        self.sweep()
        if item.case_id in self.items or self.ended(item.case_id) is not None:
            raise CaseExists(item.case_id)
        if item.dedup is not None:
            holder = live_dedup(self.items.values(), item.queue, item.dedup)
            if holder is not None:
                raise CaseExists.dedup(item.case_id, item.queue, item.dedup, holder)
        self.items[item.case_id] = replace(item, order=self.next_order)
        self.next_order += 1

    def claim(self, queue: str, limits: QueueLimits, node: str, now: float, most: int) -> tuple[list[QueueItem],
                                                                                                 float | None]:
        self.sweep()
        mine = [i for i in self.items.values() if i.queue == queue]
        waiting = sorted((i for i in mine if i.state == QUEUED), key=lambda i: (i.priority, i.order))
        running = [Running(i.partition, i.node) for i in mine if i.state == STARTED]
        recent = [(i.partition, i.started_at) for i in mine if i.started_at is not None]
        chosen, wake = choose(limits, node, now, waiting, running, recent, most)
        claimed = []
        for item in chosen:
            started = replace(item, state=STARTED, started_at=now, node=node)
            self.items[item.case_id] = started
            claimed.append(started)
        return claimed, wake

    def cancel(self, case_id: str) -> QueueItem | None:
        item = self.items.get(case_id)
        if item is None or item.state != QUEUED:
            return None
        self.items[case_id] = item = replace(item, state=CANCELLED)
        return item

    def forget(self, case_id: str) -> None:
        """A deleted case's item: gone from its id (see the module)."""
        item = self.items.pop(case_id, None)
        if item is not None and item.started_at is not None:
            key = tombstone(item.order)
            self.items[key] = replace(item, case_id=key, state=DELETED)

    def listed(self, state: str | None, queue: str | None, limit: int, before: int | None = None) -> list[QueueItem]:
        self.sweep()
        found = [i for i in self.items.values()
                 if (state is None or i.state == state) and (queue is None or i.queue == queue)
                 and (before is None or i.order < before)]
        return sorted(found, key=lambda i: -i.order)[:limit]

    def follow_owner(self, node: str) -> None:
        """A new owner of the store runs every case: the started items are its own from now on."""
        for case_id, item in list(self.items.items()):
            if item.state == STARTED:
                self.items[case_id] = replace(item, node=node)

    def requeue(self, case_id: str, start: dict[str, Any], key: str) -> QueueItem | CaseExists | None:
        """A retried case's item queued again (see the module): None if it has no item that started; the
        refusal when another live item of its queue holds its dedup key."""
        self.sweep()
        item = self.items.get(case_id)
        if item is None or item.state not in (STARTED, ENDED):
            return None
        if item.dedup is not None:
            others = [i for i in self.items.values() if i.case_id != case_id]
            holder = live_dedup(others, item.queue, item.dedup)
            if holder is not None:
                return CaseExists.dedup(case_id, item.queue, item.dedup, holder)
        if item.started_at is not None:
            self.items[key] = replace(item, case_id=key, state=DELETED, dedup=None)
        self.items[case_id] = item = replace(item, state=QUEUED, started_at=None, node=None, start=start)
        return item

    def orphans(self, node: str) -> list[QueueItem]:
        """The started items whose case is not there, taken by `node` (one process: its owner is the only
        claimer, so these were claimed by an earlier owner that stopped before starting them)."""
        taken = []
        for case_id, item in list(self.items.items()):
            if item.state == STARTED and self.ended(case_id) is None:
                self.items[case_id] = item = replace(item, node=node)
                taken.append(item)
        return taken


__all__ = [
    "CANCELLED",
    "Counts",
    "DELETED",
    "ENDED",
    "QUEUED",
    "RETRIED",
    "STARTED",
    "TOMBSTONE",
    "QueueItem",
    "QueueLimits",
    "QueueTable",
    "ReadPlan",
    "Running",
    "choose",
    "earliest",
    "item_of",
    "live_dedup",
    "read_plan",
    "retried_key",
    "tombstone",
]

"""Queues: cases that wait for room before they start.

`Substrate(queues={"mail": Queue(concurrency=10, rate=(100, 60.0))})` and `new_case(..., queue="mail",
priority=0, dedup=None, partition=None, delay=None)`. A queued case is kept as a queue item (state `queued`, no
journal yet) until its queue has room; then a node claims it and starts it as any case (its `start` record is
written then, `started_at` and `dequeued_at` are the dequeue time, and a `timeout=` counts from there).

Decisions written down here:
- Room: at most `concurrency` of the queue's cases started and not ended (a claimed case whose start is being
  written counts), at most `per_node` of them on one node (the node that runs the case: a queue item follows its
  case to the node that takes it over, at a failover or when a new owner opens a SQLite file), at most `rate[0]`
  starts in any window of `rate[1]` seconds (sliding: counted from the start times kept in the store), each per
  `partition=` key when `partitioned=True` (a case without a key is a partition of its own). Lower `priority`
  first, then first come first served; a case with `delay=` waits at least that long. A claim considers every
  waiting case, however long the backlog (see `_store._queueing`).
- The claim is one transaction of the store: SQLite's single writer, or on Postgres under an advisory lock on the
  queue's name, so the limits hold across nodes. Every node claims for itself and runs what it claimed.
- A node looks for room when one of its queued or queued-from-here cases is started or ends, when a delay or a
  rate window runs out (on the Substrate's clock), and every `POLL` seconds of real time (cases ended and queued
  on other nodes).
- `dedup=key`: a second live case (queued, or started and not ended) of the queue with that key is refused with
  `CaseExists` naming the case that holds it.
- A waiting case's id is its own: a start of that id not from its queue item (any door, without `queue=`; a
  fork's new id), while the item is queued or claimed and its case not written, is that queued case if it is the
  same start (`same_data`: its handle) and `CaseExists` naming what differs otherwise. The store refuses it in the
  write that would start it (`CaseWrite.from_queue` marks the item's own start), so it holds against a queueing of
  the id at the same moment; without a store the Substrate checks its in-memory items (one event loop).
- A queued case can be cancelled: it never starts, and ends there as any case ends (`cancel_queued`): in the
  transaction that marks its queue item cancelled its case is written with a `start` record (its workflow's
  newest version in the store, its start data, tags and parent), the `cancel` record (with the cancel's
  `request_id`) and an `end` record (`cancelled`, with `queue` naming its queue), and its row. So every door
  answers it as an ended case: `status()` says `cancelled` (`started_at` None: it never started), `await_case`
  raises CaseCancelled, a retried cancel with its request id returns as the first did, other inputs are refused
  as for an ended case, a start with its id is that case (or CaseExists), `journal()` reads its three records,
  and `delete` removes it and its queue item. Its reason: the cancel's, or "cancelled while queued" for the
  default one. Without a store it is kept as its cancelled queue item, which those doors read the same way (but
  a retried cancel is refused as an ended case's: without a store no request id is kept), and `delete` removes.
- A retried case that started from a queue goes back through it (see `_lifecycle`, Retry through a queue): its
  item is queued again, marked retried; it is listed from its row (state `queued`), and `cases(state="queued")`
  lists such rows after the queued items.
- `await_case` of a queued case waits for it to start and end. `status()` of a queued case shows `queue`,
  `priority`, `dedup`, `partition`; `started_at` and `dequeued_at` are None until it starts.
- Starting on a queue that `queues=` does not name is refused with the names it has (a `Client`: the queues
  registered in the store). Each Substrate records its queues in the store; the newest registration of a queue
  wins (a WARNING names the one it replaced), and every node claims with the registered limits.
- A node that stopped between claiming a case and writing its start leaves it counted as running until another
  takes the claim over and starts it (once: the take-over is one store transaction, and a case id is written once):
  on SQLite the next owner of the file, when it opens (the owner is the file's only claimer); on Postgres any live
  node once the claimer's lease has run out (it looks whenever it looks for room), or the claimer itself when it
  comes back with the same node id. A node whose claim or start failed in the store (an outage, a commit whose
  answer was lost: it may have claimed cases it never heard of) looks for its own claims never started at its
  next round, and starts them.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import anyio

from .._errors import NOTHING, CaseNotFound, SignalRejected, StoreError, WfsubError, bad_option, unknown_name
from .._store import CANCELLED, QUEUED, RETRIED, CaseRow, CaseWrite, QueueItem, QueueLimits, QueueTable, Store
from .._trace import get_logger
from ._inputs import MAX_CASE_ID_BYTES, stored_key
from ._journal import end_record, input_record, start_record, waited_of
from ._request_ids import journaled_kinds, taken
from ._status import CaseState, CaseStatus

_log = get_logger("wfsub.runtime")

POLL = 1.0  # seconds of real time between looks at the queues for room made by other nodes
CLAIM_MOST = 64  # cases one claim may start


@dataclass(frozen=True, slots=True, init=False)
class Queue:
    """Limits of a queue of cases (the docs: guide, Schedules and queues): `concurrency` cases started and not
    ended, `per_node` of them on one node, `rate=(n, seconds)` starts in any window of that many seconds, each per
    partition key when `partitioned=True`. None: no such limit."""

    concurrency: int | None
    per_node: int | None
    rate: tuple[int, float] | None
    partitioned: bool

    def __init__(
        self,
        concurrency: int | None = None,
        per_node: int | None = None,
        rate: tuple[int, float] | None = None,
        partitioned: bool = False,
    ) -> None:
        for name, value in (("concurrency", concurrency), ("per_node", per_node)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise bad_option("Queue", f"{name} must be an int >= 1 or None", value,
                                 fix=f"e.g. {name}=10 (None: no limit)")
        if rate is not None:
            ok = (
                isinstance(rate, tuple) and len(rate) == 2
                and isinstance(rate[0], int) and not isinstance(rate[0], bool) and rate[0] >= 1
                and isinstance(rate[1], int | float) and not isinstance(rate[1], bool)
                and math.isfinite(rate[1]) and rate[1] > 0
            )
            if not ok:
                raise bad_option("Queue", "rate must be (starts, seconds): an int >= 1 and a positive number", rate,
                                 fix="e.g. rate=(100, 60.0): at most 100 starts in any 60 seconds")
            rate = (rate[0], float(rate[1]))
        if not isinstance(partitioned, bool):
            raise bad_option("Queue", "partitioned must be True or False", partitioned,
                             fix="True applies every limit per new_case(..., partition=key)", error=TypeError)
        object.__setattr__(self, "concurrency", concurrency)
        object.__setattr__(self, "per_node", per_node)
        object.__setattr__(self, "rate", rate)
        object.__setattr__(self, "partitioned", partitioned)

    @property
    def limits(self) -> QueueLimits:
        return QueueLimits(self.concurrency, self.per_node, self.rate, self.partitioned)

    @property
    def spec(self) -> dict[str, Any]:
        """What the store keeps of it."""
        return {"concurrency": self.concurrency, "per_node": self.per_node,
                "rate": None if self.rate is None else list(self.rate), "partitioned": self.partitioned}

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any]) -> Queue:
        rate = spec.get("rate")
        return cls(spec.get("concurrency"), spec.get("per_node"), None if rate is None else (rate[0], rate[1]),
                   bool(spec.get("partitioned")))


def check_queues(queues: Mapping[str, Queue] | None) -> dict[str, Queue]:
    if queues is None:
        return {}
    if not isinstance(queues, Mapping):
        raise TypeError("queues must be a mapping of name -> wfsub.Queue, e.g. queues={'mail': Queue(concurrency=5)}")
    for name, queue in queues.items():
        if not isinstance(name, str) or not name:
            raise bad_option("queues", "a queue's name must be a non-empty str", name, fix="e.g. {'mail': Queue()}",
                             error=TypeError)
        if not isinstance(queue, Queue):
            raise bad_option(f"queues[{name!r}]", "must be a wfsub.Queue", queue, fix="e.g. Queue(concurrency=5)",
                             error=TypeError)
    return dict(queues)


def check_queued(
    queues: Mapping[str, Queue], queue: object, priority: object, dedup: object, partition: object, delay: object
) -> float:
    """new_case's queue options, checked in one place (the delay in seconds, 0 for none)."""
    if queue is None:
        given = [name for name, value in (("priority", priority), ("dedup", dedup), ("partition", partition),
                                          ("delay", delay)) if value not in (None, 0)]
        if given:
            raise bad_option("new_case", f"{', '.join(given)} apply to a queued case only", NOTHING,
                             fix="pass queue='name' too (a queue of Substrate(queues={...}))")
        return 0.0
    if not isinstance(queue, str) or queue not in queues:
        raise unknown_name("queue", queue, queues, fix="start on a queue given as Substrate(queues={name: Queue()})")
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise bad_option("new_case", "priority must be an int (lower starts first)", priority, fix="e.g. priority=0",
                         error=TypeError)
    for name, value in (("dedup", dedup), ("partition", partition)):
        if value is not None and (not isinstance(value, str) or not value):
            raise bad_option("new_case", f"{name} must be a non-empty str or None", value,
                             fix=f"e.g. {name}='customer-17'", error=TypeError)
        if value is not None:
            stored_key(value, f"new_case: {name}", MAX_CASE_ID_BYTES)
    if delay is None:
        return 0.0
    if isinstance(delay, bool) or not isinstance(delay, int | float) or not math.isfinite(delay) or delay < 0:
        raise bad_option("new_case", "delay must be a number of seconds >= 0", delay, fix="e.g. delay=30")
    return float(delay)


StartItem = Callable[[QueueItem], Awaitable[object]]

IN_QUEUE = "cancelled while queued"  # the reason of a queued case cancelled with the default one


def cancelled_in_queue(
    item: QueueItem, fingerprint: str, reason: str, request_id: str | None, now: float
) -> CaseWrite:
    """The write that ends a case cancelled while it waited in its queue (see the module): its start as its item
    would have started it, then its `cancel` and `end` records, and its row."""
    start, case_id = item.start, item.case_id
    why = IN_QUEUE if reason == "cancelled" else reason
    asked = {} if request_id is None else {"request_id": request_id}
    end = end_record(2, now, "cancelled", reason=why)
    end["queue"] = item.queue
    records = [
        start_record(case_id, start["workflow"], fingerprint, start.get("data"), start.get("seed"), None, now,
                     start.get("tags"), start.get("parent"), bool(start.get("cancel_with_parent")),
                     waited=bool(start.get("waited"))),
        input_record(1, "cancel", None, now, None, reason=why, compensate=False, **asked),
        end,
    ]
    row = CaseRow(
        case_id=case_id, workflow=start["workflow"], fingerprint=fingerprint, state=CaseState.CANCELLED.value,
        started_at=now, updated_at=now, ended_at=now, last_seq=2, data=dict(start.get("data") or {}),
        cancel_reason=why, parent=start.get("parent"), waited=waited_of(start),
    )
    return CaseWrite(case_id, records, row, from_queue=True)


async def cancel_queued(
    store: Store, case_id: str, reason: str, request_id: str | None, now: float,
    version_of: Callable[[str], str | None] | None = None,
) -> QueueItem | None:
    """Cancel the case `case_id` if it waits in its queue, writing its case ended (see the module); None if it
    does not wait there (no such item, or it started or was cancelled already). It is recorded on the newest
    version of its workflow in the store; `version_of(workflow)`: the fingerprint to record when the store holds
    none (a store written before program summaries)."""
    item = store.read_queue_item(case_id)
    if item is None or item.state != QUEUED:
        return None
    found = await store.newest_program(item.start["workflow"])
    version = found.fingerprint if found is not None else (version_of(item.start["workflow"]) if version_of else None)
    if version is None:
        raise StoreError(store.url, f"cannot cancel queued case {case_id!r}: the store holds no version of its "
                         f"workflow {item.start['workflow']!r}; open a Substrate that registers it, then cancel again")
    return await store.queue_cancel(case_id, cancelled_in_queue(item, version, reason, request_id, now))


async def cancel_requeued(
    store: Store, row: CaseRow, reason: str, request_id: str | None, now: float, inbox_done: list[int] | None = None
) -> bool:
    """Cancel a retried case that waits in its queue (its row `queued`, see `_lifecycle.requeue`): it ends there,
    with no compensation (it has not run since its retry), its `cancel` record and the `end` of its run written in
    the transaction that marks its item cancelled. False, writing nothing, when its item no longer waits (a node
    claimed it meanwhile: the cancel goes to the case, which is starting). A request id another kind of input of
    the case used is refused (SignalRejected)."""
    if request_id is not None:
        taken(await journaled_kinds(store, row.case_id, request_id), request_id, "cancel", row.case_id, "cancel")
    item = store.read_queue_item(row.case_id)
    if item is None or item.state != QUEUED:
        return False
    asked = {} if request_id is None else {"request_id": request_id}
    runs = sum(1 for record in await store.journal(row.case_id) if record.get("kind") == "retry")
    cancel = input_record(row.last_seq + 1, "cancel", None, now, None, reason=reason, compensate=False, **asked)
    end = end_record(row.last_seq + 2, now, "cancelled", reason=reason, run=runs)
    end["queue"] = item.queue
    row.state = CaseState.CANCELLED.value
    row.ended_at = now
    row.cancel_reason = reason
    row.last_seq += 2
    ended = CaseWrite(row.case_id, [cancel, end], row, inbox_done=list(inbox_done or ()), epoch=row.epoch or None)
    return await store.queue_cancel(row.case_id, ended) is not None


def with_item(status: CaseStatus, item: QueueItem | None) -> CaseStatus:
    """A case's status with what its queue item says (when it started on a queue); one cancelled while queued
    never started (`started_at` None), unless it was a retried case (it ran before)."""
    if item is None:
        return status
    update: dict[str, Any] = {"queue": item.queue, "priority": item.priority, "dedup": item.dedup,
                              "partition": item.partition, "dequeued_at": item.started_at}
    if item.state == CANCELLED and item.start.get(RETRIED) is None:
        update["started_at"] = None
    return status.model_copy(update=update)


class Queues:
    """A Substrate's queues: it keeps queued cases in its store (or in memory) and starts those it claims."""

    def __init__(
        self,
        queues: dict[str, Queue],
        *,
        node: str,
        now: Callable[[], float],
        deadline: Callable[[float], anyio.CancelScope],
        busy: Callable[[int], None],
        start: StartItem,
        ended: Callable[[str], bool | None],
        is_open: Callable[[], bool],
    ) -> None:
        self.queues = queues
        self.node = node
        self.now = now
        self.deadline = deadline
        self.busy = busy
        self.start = start
        self.is_open = is_open
        self.table: Store | QueueTable = QueueTable(ended, missing_is_ended=True)
        self.nudged = anyio.Event()
        self.moved: dict[str, anyio.Event] = {}  # case id -> set when that queued case started or was cancelled
        # A claim or a start the store failed (an outage, a commit whose answer was lost) may have left cases
        # claimed by this node and never started: the next round looks for them, as an opening does.
        self.unsure = False

    def use(self, store: Store) -> None:
        self.table = store

    async def register(self, store: Store) -> None:
        """Record this node's queues in the store: the newest registration of a queue wins (logged when it
        replaces another configuration)."""
        for name, queue in self.queues.items():
            before = await store.queue_register(name, queue.spec, self.node)
            if before is not None and before[0] != queue.spec:
                _log.warning("queue configured differently before; the newest registration wins", queue=name,
                             now=queue.spec, before=before[0], registered_by=before[1])

    def nudge(self) -> None:
        self.nudged.set()

    async def put(self, item: QueueItem, schedule: str | None = None) -> None:
        """Queue a case; `schedule`: the schedule whose slot it is (refused while it is paused: see
        `Store.queue_put`; without a store the Substrate checks it)."""
        table = self.table
        if isinstance(table, QueueTable):
            table.put(item)
        else:
            await table.queue_put(item, schedule=schedule)
        self.nudge()

    async def cancel(
        self, case_id: str, reason: str, request_id: str | None, version_of: Callable[[str], str | None] | None = None
    ) -> QueueItem | None:
        """Cancel a case waiting in its queue (see `cancel_queued`); None if it does not wait there."""
        table = self.table
        if isinstance(table, QueueTable):
            item = table.cancel(case_id)
        else:
            item = await cancel_queued(table, case_id, reason, request_id, self.now(), version_of)
        if item is not None:
            self._moved(case_id)
        return item

    def forget(self, case_id: str) -> None:
        """Without a store: a deleted case's item leaves its id (a store does it as it deletes the case)."""
        if isinstance(self.table, QueueTable):
            self.table.forget(case_id)

    def item(self, case_id: str) -> QueueItem | None:
        table = self.table
        return table.items.get(case_id) if isinstance(table, QueueTable) else table.read_queue_item(case_id)

    def items(self, state: str | None, queue: str | None, limit: int, before: int | None = None) -> list[QueueItem]:
        """Queue items newest first (`order` below `before`), read on the calling thread (cases() is
        synchronous)."""
        table = self.table
        if isinstance(table, QueueTable):
            return table.listed(state, queue, limit, before)
        return table.read_queue_items(state=state, queue=queue, limit=limit, before=before)

    async def wait_moved(self, case_id: str, written: Callable[[str], bool]) -> None:
        """Return once the queued case has been cancelled, or has started and its case is `written` (a claimed
        case's start is written after its claim; another node's, seen in the store)."""
        while True:
            event = self.moved.setdefault(case_id, anyio.Event())
            item = self.item(case_id)
            if item is None or item.state == "cancelled" or (item.state != "queued" and written(case_id)):
                return
            with anyio.move_on_after(POLL):
                await event.wait()

    def _moved(self, case_id: str) -> None:
        event = self.moved.pop(case_id, None)
        if event is not None:
            event.set()

    async def run(self) -> None:
        """Start what the queues have room for, until cancelled (the Substrate's task group cancels it on exit)."""
        table = self.table
        if not isinstance(table, QueueTable):
            self.busy(1)
            try:
                for item in await table.queue_orphans(self.node):  # claimed before a stop, never started
                    await self._start(item)
            except StoreError as exc:
                _log.error("queues: could not look for cases claimed before a stop", error=str(exc))
            finally:
                self.busy(-1)
        while True:
            self.nudged = anyio.Event()
            wake: float | None = None
            self.busy(1)
            try:
                if self.unsure and not isinstance(table, QueueTable):  # this node's own claims never started
                    self.unsure = False
                    for item in await table.queue_orphans(self.node):
                        await self._start(item)
                if not isinstance(table, QueueTable) and table.shared:  # claimed by nodes whose lease ran out
                    for item in await table.queue_orphans(self.node, own=False):
                        _log.warning("queues: starting a case claimed by a node that stopped before starting it",
                                     case_id=item.case_id, queue=item.queue)
                        await self._start(item)
                specs = {} if isinstance(table, QueueTable) else await table.queue_specs()
                for name, mine in self.queues.items():
                    queue = Queue.from_spec(specs[name]) if name in specs else mine  # the newest registration
                    while self.is_open():  # (closing: claim nothing it would not start)
                        now = self.now()
                        if isinstance(table, QueueTable):
                            claimed, later = table.claim(name, queue.limits, self.node, now, CLAIM_MOST)
                        else:
                            claimed, later = await table.queue_claim(name, queue.limits, self.node, now, CLAIM_MOST)
                        async with anyio.create_task_group() as tg:  # their start records commit together
                            for item in claimed:
                                tg.start_soon(self._start, item)
                        if later is not None:
                            wake = later if wake is None else min(wake, later)
                        if len(claimed) < CLAIM_MOST:
                            break
            except StoreError as exc:
                self.unsure = True
                _log.error("queues: could not claim queued cases", error=str(exc))
            finally:
                self.busy(-1)
            with anyio.move_on_after(POLL):
                if wake is None:
                    await self.nudged.wait()
                else:
                    with self.deadline(max(0.0, wake - self.now())):
                        await self.nudged.wait()

    async def _start(self, item: QueueItem) -> None:
        try:
            await self.start(item)
        except StoreError as exc:  # claimed, not started (or not known to be): the next round looks again
            self.unsure = True
            _log.error("queues: the store failed starting a claimed case", case_id=item.case_id, error=str(exc))
        except Exception as exc:  # (it was checked when queued: a workflow this node has not registered, ...)
            _log.error("queues: could not start a claimed case", case_id=item.case_id, queue=item.queue,
                       error=f"{type(exc).__name__}: {exc}")
        finally:
            self._moved(item.case_id)


QUEUED_ORDER = 2**52  # `cases()` lists queued cases first, their `order` this plus their place in the queues


def queued_status(item: QueueItem) -> CaseStatus:
    """The status of a case that has not left its queue (queued, or cancelled while queued)."""
    cancelled = item.state == "cancelled"
    return CaseStatus(
        case_id=item.case_id, state=CaseState.CANCELLED if cancelled else CaseState.QUEUED, steps=0, signals=(),
        effects_pending=0, timers_armed=0, regions=(), wakeups=0, started_at=None,
        workflow=item.start.get("workflow"), queue=item.queue, priority=item.priority, dedup=item.dedup,
        partition=item.partition, cancel_reason="cancelled while queued" if cancelled else None,
        order=QUEUED_ORDER + item.order, tags=dict(item.start.get("tags") or {}), parent=item.start.get("parent"),
    )


def queued_page(
    read: Callable[[int, int | None], list[QueueItem]], state: str | None, workflow: str | None, limit: int,
    before: int | None, filters: Mapping[str, Any],
) -> list[CaseStatus]:
    """The queued cases `cases()` lists first (a Substrate's and a Client's), newest first, that pass the filters:
    they have no row yet, only their queue items, which carry their workflow, tags and parent (a queued case has no
    start time: a filter on it matches none). Their `order` is QUEUED_ORDER plus the item's, so `before=` pages
    through them and then on into the started cases. `read(n, before)`: up to n queued items below `before`."""
    if state not in (None, CaseState.QUEUED.value) or (before is not None and before <= QUEUED_ORDER):
        return []
    if filters.get("started_after") is not None or filters.get("started_before") is not None:
        return []
    prefix, parent = filters.get("id_prefix"), filters.get("parent")
    tags: Mapping[str, str] = filters.get("tags") or {}
    found: list[CaseStatus] = []
    cursor = None if before is None else before - QUEUED_ORDER
    chunk = max(limit, 100)
    while len(found) < limit:
        items = read(chunk, cursor)
        for item in items:
            if item.start.get(RETRIED) is not None:
                continue  # a retried case: its row (state queued) lists it with the started cases
            s = queued_status(item)
            if ((workflow is None or s.workflow == workflow) and (prefix is None or s.case_id.startswith(prefix))
                    and (parent is None or s.parent == parent) and all(s.tags.get(k) == v for k, v in tags.items())):
                found.append(s)
                if len(found) == limit:
                    break
        if len(items) < chunk:
            break
        cursor = items[-1].order
    return found


__all__ = [
    "QUEUED_ORDER",
    "Queue",
    "Queues",
    "cancel_queued",
    "cancelled_in_queue",
    "check_queued",
    "check_queues",
    "queued_page",
    "queued_status",
    "with_item",
]


def not_found_or_queued(store: Store, case_id: str, what: str) -> WfsubError:
    """What an input for a case with no row gets: it waits in its queue (never started), or there is no such case."""
    item = store.read_queue_item(case_id)
    if item is not None and item.state == QUEUED:
        return SignalRejected.queued(case_id, what, item.queue)
    return CaseNotFound(case_id)

"""`Client`: start, steer and read the cases of a store from a process that runs none of them (a script, an
admin tool, another service), on SQLite or Postgres.

    async with wfsub.Client("orders.db") as client:
        handle = await client.new_case("order", {"items": items}, case_id="order-42")
        await client.signal("order-42", "approve", {"by": "ann"})
        result = await handle.result()

A client opens its store without owning it (SQLite: no file lock; Postgres: no lease) and never takes over: its
inputs and new cases go to the owner through the store (see `_outside`), checked first against the program
summary of the case's version as the owner would check them; its reads read the store. Every method is a
coroutine. A new case starts on the newest version of its workflow that a Substrate registered with the store.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Mapping, Sequence
from datetime import datetime
from types import TracebackType
from typing import Any

import anyio
from anyio.abc import TaskGroup
from pydantic import BaseModel

from .._errors import CaseCancelled, CaseExists, CaseNotFound, SignalRejected, SubstrateClosed, update_timeout
from .._store import RETRIED, Listing, QueueItem, Store
from .._store import open_store as _open_store
from .._vm import Scheduler, Seeded
from . import _inputs as inputs
from ._children import stored_children
from ._deliver import cancel_waiting
from ._handle import CaseHandle
from ._journal import JournalRecord, as_journaled, queued_start
from ._lifecycle import delete_ended
from ._mailbox import RegionAction
from ._options import DEFAULT_MAX_PAYLOAD, check_await_timeout, no_redaction, positive
from ._outside import EndWatcher, Outside
from ._persist import status_of
from ._queues import (
    IN_QUEUE,
    QUEUED_ORDER,
    Queue,
    check_queued,
    queued_page,
    queued_status,
    with_item,
)
from ._reads import row_outcome, validated
from ._same_start import same_queued
from ._status import CaseState, CaseStatus

QUEUED_POLL = 0.2  # seconds between looks at a queued case a client awaits (nothing is notified when it starts)


class Client:
    """A door to the cases of a store for a process that runs none of them (see the module).

    - `store`: a path or `sqlite:///path`, `postgresql://...`, or a store object.
    - `max_payload_bytes`: the largest JSON size of start data, a signal payload or `add_instances` items sent.
    """

    def __init__(self, store: Any, *, max_payload_bytes: int = DEFAULT_MAX_PAYLOAD) -> None:
        if isinstance(max_payload_bytes, bool) or not isinstance(max_payload_bytes, int) or max_payload_bytes < 1:
            raise ValueError(f"max_payload_bytes must be an int >= 1, got {max_payload_bytes!r}")
        opened = _open_store(store, existing=True)  # a mistyped path is an error, not a new empty store
        if opened is None:
            raise ValueError(
                "a Client needs a store: pass a path or sqlite:///path, postgresql://..., or a store object (a "
                "Substrate without a store keeps its cases in its own memory, out of reach of other processes)"
            )
        self._store: Store = opened
        self._max_payload = max_payload_bytes
        self._id = f"client-{secrets.token_hex(6)}"
        self._phase = "new"
        self._outside: Outside | None = None
        self._watcher: EndWatcher | None = None
        self._tg: TaskGroup | None = None

    async def __aenter__(self) -> Client:
        if self._phase != "new":
            raise RuntimeError("a Client can be entered only once; make a new Client instead")
        await self._store.open(owner=False, owner_id=self._id)
        self._outside = Outside(self._store, None, self._max_payload, _now)
        self._watcher = EndWatcher(self._store)
        tg = self._tg = anyio.create_task_group()
        await tg.__aenter__()
        tg.start_soon(self._watcher.run)
        self._phase = "open"
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        if self._phase != "open":
            return None
        self._phase = "closed"
        assert self._tg is not None
        assert self._watcher is not None
        self._watcher.close()  # awaiters: SubstrateClosed
        self._tg.cancel_scope.cancel()
        try:
            await self._tg.__aexit__(None, None, None)
        finally:
            with anyio.CancelScope(shield=True):
                await self._store.close()
        return None

    def _door(self, what: str) -> Outside:
        if self._phase != "open" or self._outside is None:
            raise SubstrateClosed(what, client=True)
        return self._outside

    # -- starting and steering ---------------------------------------------------------------------------------

    async def new_case(
        self,
        workflow: str,
        data: Mapping[str, Any] | BaseModel | None = None,
        *,
        case_id: str | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 - the case's own deadline, not this call's
        scheduler: str | Scheduler = "deterministic",
        tags: Mapping[str, str] | None = None,
        queue: str | None = None,
        priority: int = 0,
        dedup: str | None = None,
        partition: str | None = None,
        delay: float | None = None,
    ) -> CaseHandle:
        """Start a case of the registered workflow `workflow` (its newest version registered with the store);
        returns once its start is committed (the owner runs it). With the `case_id` of an existing case: the same
        workflow and start data give back that case (nothing is written), else CaseExists naming what differs.
        `tags` as for `Substrate.new_case`; `queue=` and the rest: as on Substrate.new_case (the queue must be one a
        Substrate registered)."""
        door = self._door("start a case")
        case_id = f"case-{secrets.token_hex(8)}" if case_id is None else inputs.check_case_id(case_id)
        case_tags = inputs.tags(tags, case_id)
        if queue is not None or (priority, dedup, partition, delay) != (0, None, None, None):
            specs = await self._store.queue_specs()
            wait_for = check_queued({name: Queue.from_spec(spec) for name, spec in specs.items()}, queue, priority,
                                    dedup, partition, delay)
        start_data = inputs.start_data(data)
        if timeout is not None:
            positive(timeout, "timeout", allow_none=True)
        seed = None
        if scheduler != "deterministic":
            if not isinstance(scheduler, Seeded):
                raise TypeError(
                    f"scheduler must be 'deterministic' or Seeded(seed) (from wfsub.lowlevel), got {scheduler!r}"
                )
            seed = scheduler.seed
        name, fingerprint = await door.version(workflow)
        found = await self._store.program(fingerprint)
        if found is not None:  # its input model, as the owner checks it (`Workflow(term, input=Model)`)
            inputs.start_against_summary(start_data, found.summary, name, case_id)
        now = await self._store.database_time() if self._store.shared else _now()  # times a case's timers count from
        if queue is not None:
            journaled, _ = as_journaled(dict(start_data or {}), "data", self._max_payload)
            item = QueueItem(case_id, queue, partition, priority, dedup,
                             queued_start(name, journaled, timeout, seed, case_tags), now + wait_for, now)
            try:
                await self._store.queue_put(item)
            except CaseExists as exc:  # the id is taken (or a live case holds the dedup key: `differs` says so)
                if exc.differs is not None:
                    raise
                await same_queued(self._store, case_id, name, item.start)
            return ClientHandle(self, case_id)
        deadline = None if timeout is None else now + timeout
        await door.start(name, fingerprint, start_data, case_id, deadline, seed, now, tags=case_tags)
        return ClientHandle(self, case_id)

    async def signal(self, case_id: str, name: str, payload: Any = None, *, request_id: str | None = None) -> None:
        """Send signal `name` (with `payload`); returns once it is in the store's inbox (the owner applies it)."""
        door = self._door("send a signal")
        case_id = inputs.check_case_id(case_id, new=False)
        msg = inputs.signal(name, payload, request_id, case_id)
        await door.send(case_id, msg)

    async def update(
        self, case_id: str, name: str, payload: Any = None, *, request_id: str | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 (how long to wait for the answer; the update stays)
    ) -> Any:
        """Send update `name` and return the owner's answer (see Substrate.update): it goes through the store's
        inbox, and the answer is read from the case's row once the owner has written it."""
        door = self._door("send an update")
        check_await_timeout(timeout)
        case_id = inputs.check_case_id(case_id, new=False)
        msg = inputs.update(name, payload, request_id, case_id)
        if timeout is None:
            return await door.update(case_id, msg)
        with anyio.move_on_after(timeout):
            return await door.update(case_id, msg)
        raise update_timeout(case_id, msg.name, timeout)

    async def cancel(
        self, case_id: str, compensate: bool = True, *, reason: str = "cancelled", request_id: str | None = None
    ) -> None:
        """Cancel a case (see Substrate.cancel); SignalRejected if it has ended."""
        door = self._door("cancel a case")
        case_id = inputs.check_case_id(case_id, new=False)
        msg = inputs.cancel(reason, compensate, request_id, case_id)
        row = await self._store.row(case_id)
        if row is None:
            now = await self._store.database_time() if self._store.shared else _now()
            if await cancel_waiting(self._store, case_id, msg, now, self._max_payload):
                return  # it was queued: it ended there, and never starts
        await door.send(case_id, msg, row)  # (no row: read again, it may have been written meanwhile)

    async def cancel_region(self, case_id: str, region: str, *, request_id: str | None = None) -> None:
        await self._region(case_id, RegionAction.CANCEL, region, None, request_id)

    async def complete_region(self, case_id: str, region: str, *, request_id: str | None = None) -> None:
        await self._region(case_id, RegionAction.COMPLETE, region, None, request_id)

    async def add_instances(
        self, case_id: str, region: str, items: Sequence[Any], *, request_id: str | None = None
    ) -> None:
        await self._region(case_id, RegionAction.ADD_INSTANCES, region, items, request_id)

    async def close_instances(self, case_id: str, region: str, *, request_id: str | None = None) -> None:
        await self._region(case_id, RegionAction.CLOSE_INSTANCES, region, None, request_id)

    async def _region(
        self, case_id: str, action: RegionAction, region: str, items: Sequence[Any] | None, request_id: str | None
    ) -> None:
        door = self._door(action.value)
        case_id = inputs.check_case_id(case_id, new=False)
        msg = inputs.region(action, region, items, request_id, case_id)
        await door.send(case_id, msg)

    # -- reading ---------------------------------------------------------------------------------------------

    async def handle(self, case_id: str) -> CaseHandle:
        """A handle to an existing case, queued or started (CaseNotFound if there is none)."""
        door = self._door("get a case's handle")
        case_id = inputs.check_case_id(case_id, new=False)
        if self._store.read_queue_item(case_id) is None:
            await door.row(case_id)
        return ClientHandle(self, case_id)

    async def status(self, case_id: str) -> CaseStatus:
        """The case's status as the store last recorded it, with the cases it started (`children`)."""
        door = self._door("read a case's status")
        case_id = inputs.check_case_id(case_id, new=False)
        item = self._store.read_queue_item(case_id)
        if item is not None and item.state == "queued" and item.start.get(RETRIED) is None:
            return queued_status(item)  # (a retried case waiting in its queue has its row: read below)
        try:
            row = await door.row(case_id)
        except CaseNotFound:
            if item is None:
                raise
            return queued_status(item)  # claimed by a node that has not written its start yet: not started
        return with_item(await stored_children(self._store, status_of(row, no_redaction)), item)

    async def data(self, case_id: str) -> dict[str, Any]:
        """The case's data as the store last recorded it (the final data once it has ended)."""
        return dict((await self._door("read a case's data").row(case_id)).data or {})

    async def cases(
        self, *, state: str | None = None, workflow: str | None = None, limit: int = 100, before: int | None = None,
        tags: Mapping[str, str] | None = None, id_prefix: str | None = None, started_after: float | None = None,
        started_before: float | None = None, parent: str | None = None,
    ) -> list[CaseStatus]:
        """Cases newest first, filtered as `Substrate.cases` filters them, at most `limit` (page with `before`)."""
        self._door("list cases")
        if state is not None and state not in CaseState.__members__.values():
            known = ", ".join(s.value for s in CaseState)
            raise ValueError(f"state must be one of {known} (or None), got {state!r}")
        filters = inputs.listing(limit=limit, before=before, tags_given=tags, id_prefix=id_prefix,
                                 started_after=started_after, started_before=started_before, parent=parent)
        store = self._store
        queued = queued_page(lambda n, below: store.read_queue_items(state="queued", limit=n, before=below), state,
                             workflow, limit, before, filters)
        if len(queued) == limit:
            return queued  # (with state="queued", retried cases waiting in their queues follow: rows in that state)
        if before is not None and before > QUEUED_ORDER:
            before = None  # (the queued cases come first: the next page starts at the newest started case)
        rows = await store.cases(Listing(state, workflow, limit - len(queued), before, **filters))
        return queued + [status_of(row, no_redaction) for row in rows]

    async def retry(self, case_id: str) -> CaseHandle:
        """Re-open a failed case (see `Substrate.retry`): its owner does it; returns once done (or queued while no
        owner runs). SignalRejected with the reason when it cannot be retried."""
        door = self._door("retry a case")
        case_id = inputs.check_case_id(case_id, new=False)
        await door.lifecycle(case_id, "retry", {})
        return ClientHandle(self, case_id)

    async def backfill_schedule(self, name: str, start: datetime | float, end: datetime | float) -> list[CaseHandle]:
        """Start one case per slot of schedule `name` from `start` to `end` (see `Substrate.backfill_schedule`):
        a Substrate that runs the schedule does it (its `data=` may be a function only it has), through the store;
        returns once done (or queued while no owner runs), with the handles of the slots' cases, oldest first. The
        range is checked here against the schedule the store keeps; SignalRejected with the owner's reason when it
        refuses (it does not configure that schedule, say)."""
        door = self._door("backfill a schedule")
        return [ClientHandle(self, case_id) for case_id in await door.backfill(name, start, end)]

    async def fork(self, case_id: str, *, at: int, new_case_id: str | None = None) -> CaseHandle:
        """A new case from the journal of `case_id` up to record `at` (see `Substrate.fork`): its owner does it;
        returns once done (or queued while no owner runs)."""
        door = self._door("fork a case")
        case_id = inputs.check_case_id(case_id, new=False)
        body = inputs.fork_body(at, new_case_id, case_id)
        body["new_case_id"] = new_id = new_case_id or f"case-{secrets.token_hex(8)}"
        await door.lifecycle(case_id, "fork", body)
        return ClientHandle(self, new_id)

    async def delete(self, case_id: str) -> None:
        """Remove an ended case at once (see `Substrate.delete`); SignalRejected for one that has not ended."""
        row = await self._door("delete a case").row(case_id)
        if not CaseState(row.state).ended:
            raise SignalRejected.not_ended(case_id, "be deleted", row.state)
        await delete_ended(self._store, case_id)

    async def journal(self, case_id: str, *, newest: int | None = None) -> list[JournalRecord]:
        """Every record of the case's journal, in order (`newest=N`: its start record and the newest N after it,
        as `Substrate.journal`)."""
        self._door("read a journal")
        case_id = inputs.check_case_id(case_id, new=False)
        records = await self._store.journal(case_id)
        if not records:
            raise CaseNotFound(case_id)
        return [JournalRecord.model_validate(r) for r in inputs.journal_part(records, newest)]

    async def await_case(
        self, case_id: str, timeout: float | None = None, *, model: type[BaseModel] | None = None  # noqa: ASYNC109
    ) -> Any:
        """The case's final data (validated into `model` if given); raises CaseFailed, CaseCancelled, or
        TimeoutError when `timeout` passes first (the case goes on). `timeout=0` checks without waiting."""
        check_await_timeout(timeout)
        door = self._door("await a case")
        case_id = inputs.check_case_id(case_id, new=False)
        if timeout is None:
            return validated(case_id, await self._wait_end(door, case_id, check_only=False), model)
        if timeout == 0:
            return validated(case_id, await self._wait_end(door, case_id, check_only=True), model)
        with anyio.move_on_after(timeout):
            return validated(case_id, await self._wait_end(door, case_id, check_only=False), model)
        raise TimeoutError(
            f"case {case_id!r} did not end within {timeout:g}s; it goes on running (await it again, or cancel it)"
        )

    async def _wait_end(self, door: Outside, case_id: str, *, check_only: bool) -> dict[str, Any]:
        watcher = self._watcher
        assert watcher is not None
        while True:
            event = watcher.event(case_id)  # before the read: an end committed after it wakes us
            item = self._store.read_queue_item(case_id)
            if item is not None and self._store.read_row(case_id) is None:  # not started yet (or being started)
                if item.state == "cancelled":  # (a store written before such a case was written ended)
                    raise CaseCancelled(case_id, IN_QUEUE)
                if check_only:
                    raise TimeoutError(f"case {case_id!r} is queued on {item.queue!r}: it has not started yet")
                await anyio.sleep(QUEUED_POLL)
                continue
            row = await door.row(case_id)
            if CaseState(row.state).ended:
                return row_outcome(row)
            if check_only:
                raise TimeoutError(
                    f"case {case_id!r} has not ended; it goes on running (await it again, or cancel it)"
                )
            await event.wait()
            if self._phase != "open":
                raise SubstrateClosed(f"await case {case_id!r}: the Client was closed")

    def __repr__(self) -> str:
        return f"<Client {self._phase} store={self._store.url}>"


class ClientHandle(CaseHandle):
    """A `CaseHandle` of a Client: the same methods, answered through the store."""

    __slots__ = ("_client",)

    def __init__(self, client: Client, case_id: str) -> None:  # (no Substrate behind it)
        self._client = client
        self._actor = None
        self.case_id = case_id

    async def result(self, timeout: float | None = None, *, model: type[BaseModel] | None = None) -> Any:  # noqa: ASYNC109
        return await self._client.await_case(self.case_id, timeout, model=model)

    def status(self) -> CaseStatus:
        store = self._client._store
        item = store.read_queue_item(self.case_id)
        row = None if item is not None and item.state == "queued" else store.read_row(self.case_id)
        if row is None:
            if item is None:
                raise CaseNotFound(self.case_id)
            return queued_status(item)  # queued, or claimed and not started yet
        return with_item(status_of(row, no_redaction), item)

    def data(self) -> dict[str, Any]:
        row = self._client._store.read_row(self.case_id)
        if row is None:
            raise CaseNotFound(self.case_id)
        return dict(row.data or {})

    def done(self) -> bool:
        return self.status().ended

    async def signal(self, name: str, payload: Any = None, *, request_id: str | None = None) -> None:
        await self._client.signal(self.case_id, name, payload, request_id=request_id)

    async def update(
        self, name: str, payload: Any = None, *, request_id: str | None = None,
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> Any:
        return await self._client.update(self.case_id, name, payload, request_id=request_id, timeout=timeout)

    async def cancel(self, compensate: bool = True, *, reason: str = "cancelled") -> None:
        await self._client.cancel(self.case_id, compensate, reason=reason)

    async def close_instances(self, region: str) -> None:
        await self._client.close_instances(self.case_id, region)


def _now() -> float:
    return time.time()

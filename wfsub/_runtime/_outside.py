"""The door of a process that runs no case of a store: a standby Substrate (SQLite, while another process owns
the file) and a `wfsub.Client`. Both start, steer and read cases the same way:

- An input (signal, cancel, region operation) is checked against the case's row (unknown id: `CaseNotFound`;
  ended: `SignalRejected`), its request id against the journal (one the case took from an input of the same kind:
  a retried call, which returns and writes nothing; of another kind: `SignalRejected`, see `_request_ids`) and
  against the program summary of its recorded version (`_inputs.against_summary`), then written to the store's
  inbox; the call returns once that row is committed. The owner applies it.
- A new case is a `start` record and a row marked queued (`Store.queue_case`), written in one transaction; the
  owner claims it (`Store.claim_queued`: on SQLite the owner, on Postgres the first node that runs its version)
  and runs it. The version is the caller's own registered program (a standby) or the newest version of that
  workflow whose summary the store holds (a client).
- A start with a `case_id` that exists is idempotent (`_same_start`): the same workflow and the same start data
  give back that case, and write nothing; anything else is `CaseExists` naming what differs. The same data: as its
  callers sent it (a start record keeps that as `sent` where the input model's dump differs), whichever door took
  the first start, or, for a door with the workflow's input model (a standby), as the model reads it. An id a
  queue item waits for (queued, or claimed and not started yet) is that queued case's: the store refuses the start
  in its write, and it is answered as the same start or CaseExists against what the item starts the case with.
- A `retry` or `fork` is checked against the stored journal as the owner checks it, written to the inbox (kinds
  `retry`, `fork`) and followed until the owner has done it or refused it (its reason raised as SignalRejected).
- Waiting for a case to end: `EndWatcher` looks at the store when it changes (a cheap check: SQLite's
  `data_version`, Postgres's NOTIFY) and re-reads the rows of the cases awaited, waking those that ended.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import anyio
from pydantic import BaseModel

from .._errors import (
    CaseExists,
    CaseNotFound,
    SignalRejected,
    StoreConflict,
    StoreError,
    WorkflowNotRegistered,
)
from .._store import CaseRow, CaseWrite, ProgramSummary, Store
from .._trace import get_logger
from . import _inputs as inputs
from ._answers import remote_answer, row_result
from ._journal import as_journaled, start_record
from ._lifecycle import fork_records, retry_record
from ._mailbox import Cancel, External, Signal
from ._queues import not_found_or_queued
from ._registry import Workflows
from ._request_ids import journaled_kinds, taken
from ._same_start import same_start
from ._schedules import backfill_request
from ._status import CaseState
from ._summary import summary_of

_log = get_logger("wfsub.runtime")

CHANGE_WAIT = 0.25  # seconds an EndWatcher waits for a change before it looks again (a fallback, and its beat)
LIFECYCLE_POLL = 0.02  # seconds between looks at a `retry` or `fork` inbox row until its owner has done it
RECHECK_EVERY = 2.0  # seconds between re-reads of every awaited row whatever the store says (a lost NOTIFY)


class Outside:
    """Starting and steering cases of a store from a process that runs none of them (see the module)."""

    def __init__(self, store: Store, workflows: Workflows | None, max_payload: int, now: Callable[[], float]) -> None:
        self.store = store
        self.workflows = workflows  # a standby's registered programs (None: a client has none)
        self.max_payload = max_payload
        self.now = now
        self._summaries: dict[str, ProgramSummary | None] = {}  # by fingerprint (a summary never changes)

    async def summary(self, fingerprint: str) -> tuple[Mapping[str, Any] | None, Mapping[str, type] | None]:
        """The summary of a program version, and its payload models when this process has it registered."""
        if self.workflows is not None:
            found = self.workflows.find(fingerprint)
            if found is not None:
                return summary_of(found[0], found[1]).summary, found[1].signal_models
        if fingerprint not in self._summaries:
            self._summaries[fingerprint] = await self.store.program(fingerprint)
        known = self._summaries[fingerprint]
        if known is None:  # not recorded yet (a store written before summaries): the owner checks it alone
            return None, None
        return known.summary, None

    async def row(self, case_id: object) -> CaseRow:
        case_id = inputs.check_case_id(case_id, new=False)
        row = await self.store.row(case_id)
        if row is None:
            raise CaseNotFound(case_id)
        return row

    async def send(self, case_id: str, msg: External, row: CaseRow | None = None) -> int:
        """Check an input as the owner would, then write it to the inbox (returns once committed): its inbox id,
        0 for a retried call whose input was applied (nothing written)."""
        if row is None:
            case_id = inputs.check_case_id(case_id, new=False)
            found = await self.store.row(case_id)
            if found is None:
                raise not_found_or_queued(self.store, case_id, msg.what)
            row = found
        if await applied(self.store, case_id, msg.request_id, inputs.kind_of(msg), msg.what):
            return 0  # a retried call whose input was applied (it may have ended the case): what it returned first
        if CaseState(row.state).ended:
            raise SignalRejected.ended(case_id, msg.what, row.state)
        if row.state == CaseState.QUEUED.value and not isinstance(msg, Cancel):  # as its owner refuses it
            item = self.store.read_queue_item(case_id)  # (retried, waiting in its queue: a cancel ends it there)
            raise SignalRejected.requeued(case_id, msg.what, None if item is None else item.queue)
        summary, models = await self.summary(row.fingerprint)
        if summary is not None:
            inputs.against_summary(msg, summary, case_id, models, row)
        body = inputs.inbox_body(msg, self.max_payload, case_id)
        return await self.store.inbox_put(
            case_id, inputs.kind_of(msg), body, request_id=msg.request_id, created_at=self.now()
        )

    async def lifecycle(self, case_id: str, kind: str, body: dict[str, Any]) -> None:
        """A `retry` or `fork` of a case for its owner: checked against the store as the owner checks it, written to
        the inbox, then followed until the owner has done it (or refused it: SignalRejected with its reason). With
        no owner running, it returns once queued (the next owner does it)."""
        row = await self.row(case_id)
        records = await self.store.journal(case_id)
        if kind == "retry":
            retry_record(case_id, row, records, self.now())
        else:
            new_id = body.get("new_case_id") or "new"
            fork_records(case_id, records, body["at"], new_id, self.now())
            if body.get("new_case_id") and await self.store.row(new_id) is not None:
                raise CaseExists(new_id)
        inbox_id = await self.store.inbox_put(case_id, kind, body, request_id=None, created_at=self.now())
        await self.follow(inbox_id, case_id, "be retried" if kind == "retry" else "be forked")

    async def backfill(self, name: str, start: object, end: object) -> list[str]:
        """A schedule's backfill for the owner (see `_schedules.backfill_request`), checked against the schedule the
        store keeps, written to the inbox and followed until the owner has done it (or refused it); with no owner
        running, it returns once queued. The ids of the slots' cases, oldest first."""
        ids, body = backfill_request(await self.store.schedules(), name, start, end, self.now())
        if ids:
            inbox_id = await self.store.inbox_put(ids[0], "backfill", body, request_id=None, created_at=self.now())
            await self.follow(inbox_id, ids[0], f"be started by a backfill of schedule {body['schedule']!r}")
        return ids

    async def follow(self, inbox_id: int, case_id: str, action: str) -> None:
        """Wait until the owner has taken inbox row `inbox_id` (SignalRejected with its reason if it refused it);
        with no owner running (a single-node store), return at once (the next owner takes it)."""
        if not self.store.shared and await self.store.owner() is None:
            return
        while True:
            found = await self.store.inbox_row(inbox_id)
            if found is None:
                return
            if found.refused is not None:
                raise SignalRejected.refused_by_owner(case_id, action, found.refused)
            await anyio.sleep(LIFECYCLE_POLL)

    async def update(self, case_id: str, msg: Signal, row: CaseRow | None = None) -> Any:
        """Send an update through the inbox, then wait for its answer on the case's row (see `_answers`)."""
        assert msg.request_id is not None
        if row is None:
            row = await self.row(case_id)
        if msg.request_id in (row.answers or {}):  # a retried call the owner answered already
            return row_result(row, msg.name, msg.request_id)[1]
        # (an ended case without this answer: `send` refuses a new update, and lets a retried applied one wait)
        inbox_id = await self.send(case_id, msg, row)
        return await remote_answer(self.store, case_id, msg.name, msg.request_id, inbox_id)

    async def version(self, workflow: str) -> tuple[str, str]:
        """(name, fingerprint) of the version a new case of `workflow` starts on."""
        if self.workflows is not None:
            return workflow, self.workflows.newest(workflow).fingerprint  # WorkflowNotRegistered if unknown
        if not isinstance(workflow, str):
            raise TypeError(
                f"a client starts cases by their registered workflow name (a str), got {type(workflow).__name__}"
            )
        found = await self.store.newest_program(workflow)
        if found is None:
            raise WorkflowNotRegistered(workflow, [], store=self.store.url)
        return workflow, found.fingerprint

    async def start(
        self, name: str, fingerprint: str, data: dict[str, Any] | None, case_id: str, deadline: float | None,
        seed: int | None, now: float | None = None, tags: Mapping[str, str] | None = None,
        sent: Mapping[str, Any] | None = None, model: type[BaseModel] | None = None,
    ) -> bool:
        """Queue a new case for the owner; False when `case_id` is that same case already (nothing written).
        `now`: its start time (default: this process's clock; a shared store's clients give database time).
        `sent`, `model`: a standby's caller's data as sent (JSON) where its input `model` made `data` of it."""
        journaled, _ = as_journaled(data or {}, "data", self.max_payload)
        now = self.now() if now is None else now
        start = start_record(case_id, name, fingerprint, journaled, seed, deadline, now, tags, sent=sent)
        row = CaseRow(
            case_id=case_id, workflow=name, fingerprint=fingerprint, state=CaseState.RUNNING.value, started_at=now,
            updated_at=now, data=dict(journaled),
        )
        try:
            await self.store.queue_case(CaseWrite(case_id, [start], row))
        except StoreConflict:
            await same_start(self.store, case_id, name, start, model)
            return False
        return True


async def applied(store: Store | None, case_id: str, request_id: str | None, kind: str, action: str) -> bool:
    """Whether the case's journal holds the input of `kind` with `request_id`: a call repeated with that id answers
    as the first one did. SignalRejected when an input of another kind used the id (see `_request_ids`)."""
    if store is None or request_id is None:
        return False
    return taken(await journaled_kinds(store, case_id, request_id), request_id, kind, case_id, action)


async def check_case_input(
    store: Store, row: CaseRow, kind: str, body: Mapping[str, Any], request_id: str | None = None
) -> None:
    """Check an input for an existing case as its owner would, against the program summary of the version the
    case recorded (`wfsub.lowlevel`; the `wfsub` command runs it before writing to the inbox): SignalRejected for
    an unknown signal or region, a payload that does not fit its model, or a request id an input of another kind
    used. A version without a summary in the store is left to the owner."""
    msg = inputs.shaped(kind, body, request_id, case_id=row.case_id)
    await applied(store, row.case_id, request_id, inputs.kind_of(msg), msg.what)  # (an id another kind used)
    found = await store.program(row.fingerprint)
    if found is not None:
        inputs.against_summary(msg, found.summary, row.case_id, row=row)


class EndWatcher:
    """Wakes the awaiters of cases that run elsewhere when their case ends (see the module)."""

    def __init__(self, store: Store, events: dict[str, anyio.Event] | None = None) -> None:
        self.store = store
        self.events: dict[str, anyio.Event] = {} if events is None else events  # awaited case id -> its wake-up
        self._recheck_at = 0.0

    def event(self, case_id: str) -> anyio.Event:
        event = self.events.get(case_id)
        if event is None:
            event = self.events[case_id] = anyio.Event()
        return event

    def close(self) -> None:
        for event in self.events.values():
            event.set()
        self.events.clear()

    async def run(self, tick: Callable[[], Any] | None = None) -> None:
        """Look at the awaited rows each time the store changes; `tick` runs at every look (a standby tries to
        take ownership there)."""
        store = self.store
        while True:
            try:
                await store.wait_changed(CHANGE_WAIT)
            except StoreError as exc:  # (the check itself failed: look again after a while, as after a change)
                _log.warning("could not look for changes in the store", error=str(exc))
                await anyio.sleep(CHANGE_WAIT)
            if tick is not None:
                await tick()
            await self.look()

    async def look(self) -> None:
        if not self.events:
            return
        store = self.store
        ended = store.drain_ended() if store.shared else None
        now = time.monotonic()
        if ended is not None and now >= self._recheck_at:
            ended = None
        if ended is None:
            self._recheck_at = now + RECHECK_EVERY
        for case_id in list(self.events):
            if ended is not None and case_id not in ended:
                continue
            try:
                row = await store.row(case_id)
            except StoreError as exc:
                _log.warning("could not read an awaited case's row; looking again at the next change",
                             case_id=case_id, error=str(exc))
                continue
            if row is None or CaseState(row.state).ended:
                event = self.events.pop(case_id, None)
                if event is not None:
                    event.set()

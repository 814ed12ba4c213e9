"""What a Substrate reads about its cases: their outcomes (awaited), status, data, listings and journals.

A case in memory answers from its actor; one that is not (ended before this run, evicted, on another node, queued)
from the store's row or its queue item. `status`, `data` and `cases` are synchronous: a durable case not in memory
is read on the calling thread (a small indexed read). The outcome helpers here are shared with `Client`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import anyio
from pydantic import BaseModel, ValidationError

from .._errors import CaseCancelled, CaseFailed, CaseNotFound, RestoredError, StoreError, SubstrateClosed
from .._store import CaseRow, Listing
from .._trace import get_logger
from . import _inputs as inputs
from ._children import children_in
from ._journal import JournalRecord
from ._persist import status_of
from ._queues import IN_QUEUE, QUEUED_ORDER, queued_page, queued_status, with_item
from ._status import FINAL, CaseState, CaseStatus

if TYPE_CHECKING:
    from ._case import CaseActor
    from ._table import CaseTable

_log = get_logger("wfsub.runtime")


class Reads:
    """The reads of one Substrate's cases (see the module)."""

    def __init__(self, table: CaseTable) -> None:
        self.t = table
        self.cases = table.cases  # (the same dict: read on every call)
        self.queues = table.queues

    # -- outcomes ----------------------------------------------------------------------------------------------

    async def left_queue(self, case_id: str) -> None:
        """A queued case: wait until it has started (CaseCancelled if it was cancelled while queued)."""
        if not self.queues.queues or case_id in self.cases:
            return
        item = self.queues.item(case_id)
        if item is None:
            return
        if item.state in ("queued", "started"):
            await self.queues.wait_moved(case_id, self.t.written)
            item = self.queues.item(case_id)
        if item is not None and item.state == "cancelled" and not self.t.written(case_id):
            raise CaseCancelled(case_id, IN_QUEUE)  # (with a store: ended as any case, its row says how)

    async def await_case(self, case_id: str, timeout: float | None, model: type[BaseModel] | None) -> Any:  # noqa: ASYNC109
        """`Substrate.await_case`, its timeout checked."""
        case_id = inputs.check_case_id(case_id, new=False)
        if self.t.store is not None and self.t.phase == "open":
            await self.t.deleted_elsewhere(case_id)  # an ended copy in memory: still in the store? (one row read)
        return validated(case_id, await self.outcome(case_id, None, timeout), model)

    async def outcome(self, case_id: str, actor: CaseActor | None, timeout: float | None) -> dict[str, Any]:  # noqa: ASYNC109
        if timeout is None:
            await self.left_queue(case_id)
            return await self.wait_end(case_id, actor, check_only=False)
        if timeout == 0:
            item = self.queues.item(case_id) if self.queues.queues and case_id not in self.cases else None
            if item is not None and item.state == "queued":
                raise TimeoutError(f"case {case_id!r} is queued on {item.queue!r}: it has not started yet")
            await self.left_queue(case_id)
            return await self.wait_end(case_id, actor, check_only=True)
        with self.t.clock.deadline_scope(timeout):
            await self.left_queue(case_id)
            return await self.wait_end(case_id, actor, check_only=False)
        raise TimeoutError(
            f"case {case_id!r} did not end within {timeout:g}s; it goes on running (await it again, or cancel it)"
        )

    async def wait_end(self, case_id: str, actor: CaseActor | None, *, check_only: bool) -> dict[str, Any]:
        """The outcome once the case has ended: from its actor, or from the store when it is not in memory."""
        while True:
            if actor is None or actor.evicted:
                actor = self.cases.get(case_id)
            if actor is not None and not actor.evicted:
                if actor.exited:
                    return actor.outcome()  # raises CaseFailed / CaseCancelled / SubstrateClosed
                if check_only:  # ended: its outcome once its `end` record is written, not waiting for its effects
                    if actor.state not in FINAL:
                        raise TimeoutError(not_ended(case_id))
                    await recorded(actor)
                    return actor.outcome()
                if actor.done is None:
                    actor.done = anyio.Event()
                await actor.done.wait()
                continue  # ended, closed, or evicted: look again
            store = self.t.store
            if store is None:
                raise CaseNotFound(case_id)
            row = await store.row(case_id)
            if row is None:
                raise CaseNotFound(case_id)
            if CaseState(row.state).ended:
                return row_outcome(row)
            if check_only:
                raise TimeoutError(not_ended(case_id))
            if self.t.phase != "open":
                raise SubstrateClosed(f"await case {case_id!r}: it stays live in the store; await it after re-opening")
            events = self.t.end_events
            event = events.get(case_id)
            if event is None:
                event = events[case_id] = anyio.Event()
            if case_id in self.cases:
                continue  # brought back while the row was read
            await event.wait()

    async def settled(self, case_id: str) -> CaseActor | None:
        """The case's actor in memory (None: none), once the `end` record of an ended one is written."""
        actor = self.cases.get(case_id)
        if actor is not None and actor.journal is not None and actor.state in FINAL:
            await recorded(actor)
        return actor

    # -- status and data -----------------------------------------------------------------------------------------

    def status(self, case_id: str) -> CaseStatus:
        """Where the case is, with the cases it started (`children`)."""
        try:
            return children_in(self.t, self.bare_status(case_id))
        except StoreError as exc:
            raise self.t.closed_or(exc, f"read the status of case {case_id!r}") from exc

    def of_actor(self, actor: CaseActor) -> CaseStatus:
        """The status of a case in memory, with its children (a handle's)."""
        try:
            return children_in(self.t, actor.status())
        except StoreError as exc:
            raise self.t.closed_or(exc, f"read the status of case {actor.case_id!r}") from exc

    def bare_status(self, case_id: str) -> CaseStatus:
        """The case's status, without its children."""
        case_id = inputs.check_case_id(case_id, new=False)
        actor = self.cases.get(case_id)
        if actor is not None:
            return self.with_queue(actor.status())
        if self.t.store is not None:
            row = self.t.row_now(case_id)
            if row is not None:
                return self.with_queue(status_of(row, self.t.opts.redact))
        if self.queues.queues:
            item = self.queues.item(case_id)
            if item is not None:
                return queued_status(item)
        return self.t.get(case_id).status()

    def with_queue(self, status: CaseStatus) -> CaseStatus:
        """A case's status with what its queue item says (when it started on a queue, or ended there)."""
        if not self.queues.queues:
            return status
        try:
            item = self.queues.item(status.case_id)
        except StoreError as exc:  # the store is away: a case in memory still answers, without its queue's fields
            _log.warning("cannot read a case's queue item; its status shows it without", case_id=status.case_id,
                         error=str(exc))
            return status
        return with_item(status, item)

    def is_live(self, case_id: str) -> bool:
        try:
            return self.status(case_id).state not in FINAL
        except CaseNotFound:
            return False

    def data(self, case_id: str) -> dict[str, Any]:
        """A copy of the case's data now (the final data once it has ended)."""
        case_id = inputs.check_case_id(case_id, new=False)
        actor = self.cases.get(case_id)
        if actor is not None:
            return actor.data()
        if self.t.store is not None:
            try:
                row = self.t.row_now(case_id)
            except StoreError as exc:
                raise self.t.closed_or(exc, f"read the data of case {case_id!r}") from exc
            if row is not None:
                return dict(row.data or {})
        return self.t.get(case_id).data()

    # -- listings ------------------------------------------------------------------------------------------------

    def cases_listed(
        self, state: str | None, workflow: str | None, limit: int, before: int | None, tags: Mapping[str, str] | None,
        id_prefix: str | None, started_after: float | None, started_before: float | None, parent: str | None,
    ) -> list[CaseStatus]:
        """`Substrate.cases`: queued cases first, then started ones, newest first."""
        if state is not None and state not in CaseState.__members__.values():
            known = ", ".join(s.value for s in CaseState)
            raise ValueError(f"state must be one of {known} (or None), got {state!r}")
        filters = inputs.listing(limit=limit, before=before, tags_given=tags, id_prefix=id_prefix,
                                 started_after=started_after, started_before=started_before, parent=parent)
        queued = self._queued_listed(state, workflow, limit, before, filters)
        if len(queued) == limit or (state == CaseState.QUEUED.value and self.t.store is None):
            return queued  # (with a store, retried cases waiting in their queues follow: rows in state queued)
        limit -= len(queued)
        if before is not None and before > QUEUED_ORDER:
            before = None  # (the queued cases come first: the next page starts at the newest started case)
        if self.t.store is None:
            return queued + self._memory_listed(state, workflow, limit, before, filters)
        return queued + self._stored_listed(state, workflow, limit, before, filters)

    def _queued_listed(
        self, state: str | None, workflow: str | None, limit: int, before: int | None, filters: dict[str, Any]
    ) -> list[CaseStatus]:
        if not (self.queues.queues or self.t.store):
            return []
        return queued_page(lambda n, below: self.queues.items("queued", None, n, below), state, workflow, limit,
                           before, filters)

    def _memory_listed(
        self, state: str | None, workflow: str | None, limit: int, before: int | None, filters: dict[str, Any]
    ) -> list[CaseStatus]:
        found = []
        match = Listing(state, workflow, limit, before, **filters)
        for actor in reversed(self.cases.values()):
            if before is not None and actor.order >= before:
                continue
            now = actor.status()
            row = CaseRow(now.case_id, actor.workflow or "", "", now.state.value, now.started_at or 0.0, 0.0,
                          tags=now.tags, parent=actor.parent)
            if match.matches(actor.order, row):
                found.append(self.with_queue(now))
                if len(found) == limit:
                    break
        return found

    def _stored_listed(
        self, state: str | None, workflow: str | None, limit: int, before: int | None, filters: dict[str, Any]
    ) -> list[CaseStatus]:
        store = self.t.store
        assert store is not None
        listed: list[CaseStatus] = []
        seen: set[str] = set()
        try:
            rows = store.read_cases(Listing(state, workflow, limit, before, **filters))
        except StoreError as exc:
            raise self.t.closed_or(exc, "list cases") from exc
        for row in rows:
            seen.add(row.case_id)
            live = self.cases.get(row.case_id)
            if live is None or live.exited or live.journal is None:
                listed.append(status_of(row, self.t.opts.redact))
                continue
            live.journal.order = row.order
            now = live.status()
            if state is None or now.state == state:  # else it has moved on since its row was written
                listed.append(now)
        if state is not None:  # cases in memory in that state whose row has not caught up yet
            listed += self._caught_up(state, workflow, limit, before, filters, seen)
            listed.sort(key=lambda status: -(status.order or 0))
        return [self.with_queue(status) for status in listed[:limit]]

    def _caught_up(
        self, state: str, workflow: str | None, limit: int, before: int | None, filters: dict[str, Any], seen: set[str],
    ) -> list[CaseStatus]:
        """Cases in memory in `state` that the store's rows do not list in it yet."""
        store = self.t.store
        assert store is not None
        found: list[CaseStatus] = []
        match = Listing(state, workflow, limit, None, **filters)
        for actor in list(self.cases.values()):
            j = actor.journal
            if (
                j is None or actor.exited or actor.case_id in seen or actor.state.value != state
                or not match.matches(0, CaseRow(actor.case_id, actor.workflow or "", "", state, actor.started_at,
                                                0.0, tags=dict(actor.tags or {}), parent=actor.parent))
            ):
                continue
            if not j.order:
                stored = store.read_row(actor.case_id)
                j.order = stored.order if stored is not None else 0
            if j.order and (before is None or j.order < before):
                found.append(actor.status())
        return found

    async def journal(self, case_id: str, newest: int | None) -> list[JournalRecord]:
        """Every record of a durable case's journal, in order (see `Substrate.journal`)."""
        store = self.t.store
        if store is None:
            raise ValueError("a Substrate without a store keeps no journal: pass store=... to make cases durable")
        case_id = inputs.check_case_id(case_id, new=False)
        try:
            records = await store.journal(case_id)
        except StoreError as exc:
            raise self.t.closed_or(exc, f"read the journal of case {case_id!r}") from exc
        if not records:
            raise CaseNotFound(case_id)
        return [JournalRecord.model_validate(r) for r in inputs.journal_part(records, newest)]


async def recorded(actor: CaseActor) -> None:
    """Wait until the `end` record of an ended durable case is written (at once for one without a store)."""
    if not actor.recorded:
        if actor.on_recorded is None:
            actor.on_recorded = anyio.Event()
        await actor.on_recorded.wait()


def not_ended(case_id: str) -> str:
    return f"case {case_id!r} has not ended; it goes on running (await it again, or cancel it)"


def validated(case_id: str, data: dict[str, Any], model: type[BaseModel] | None) -> Any:
    """A case's final data, validated into `model` when one is given."""
    if model is None:
        return data
    if not (isinstance(model, type) and issubclass(model, BaseModel)):
        raise TypeError(f"model must be a pydantic model class, got {model!r}")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ValueError(
            f"case {case_id!r} ended with data that does not fit {model.__name__}: {exc.error_count()} error(s):\n"
            f"{exc}\nawait it without model= to see the data as it is"
        ) from exc


def row_outcome(row: CaseRow) -> dict[str, Any]:
    """The outcome of a case that ended in an earlier run, from its row."""
    if row.state == CaseState.DONE.value:
        return dict(row.data or {})
    if row.state == CaseState.FAILED.value:
        error = row.error or {}
        failed = CaseFailed(row.case_id, str(error.get("path", "?")), str(error.get("message", "")))
        failed.traceback = error.get("traceback")
        failed.record = error.get("record")
        raise failed from RestoredError(str(error.get("type", "Exception")), str(error.get("message", "")))
    raise CaseCancelled(row.case_id, row.cancel_reason or "cancelled")

"""Where a checked input goes: a case in memory takes it in its mailbox; a case another process owns, through the
store's inbox; a case waiting in its queue, through the queue. One route per kind: signal, update (and the wait for
its answer), cancel, and the region operations.

The shape of an input is checked by `_inputs` (the one module that checks inputs) before it gets here; the case's
own check (`admit`) runs here, against the version the case runs, before anything is queued or written. Without a
store `signal` returns once the signal is in the case's mailbox; with one, once its record is committed and
applied. `cancel` of a case that has ended raises `SignalRejected`, as `signal` does.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import anyio

from .._errors import CaseNotFound, SignalRejected, StoreConflict, StoreError, SubstrateClosed, answer_gone
from .._store import CaseRow, Store
from .._trace import get_logger
from . import _inputs as inputs
from ._answers import ANSWERS_KEPT, MOVED, Pending, remote_answer, row_result
from ._answers import moved as updates_moved
from ._answers import of as of_actor
from ._answers import result as update_result
from ._control import CaseEvicted, Remote
from ._inputs import admit
from ._mailbox import Cancel, External, RegionAction, Reply, Signal
from ._options import DEFAULT_MAX_PAYLOAD
from ._outside import Outside, applied
from ._queues import cancel_queued, cancel_requeued
from ._status import FINAL, CaseState

if TYPE_CHECKING:
    from ._case import CaseActor
    from ._reads import Reads
    from ._table import CaseTable

_log = get_logger("wfsub.runtime")

ENDED_POLL = 2.0  # seconds between re-reads of the rows of awaited cases not in memory (a fallback to NOTIFY)


class Deliver:
    """The routes of one Substrate's inputs (see the module)."""

    def __init__(self, table: CaseTable, reads: Reads) -> None:
        self.t = table
        self.reads = reads
        self.cases = table.cases  # (the same dict: read on every input)
        self.max_payload = table.opts.max_payload

    async def live(self, case_id: str, what: str) -> CaseActor:
        """The case's actor, loaded from the store if it is parked there (raises for an unknown or ended case;
        `Remote` for a case another process owns)."""
        t = self.t
        t.check_open(what)
        case_id = inputs.check_case_id(case_id, new=False)
        actor = self.cases.get(case_id)
        if actor is not None and not (actor.state in FINAL and await t.deleted_elsewhere(case_id)):
            return actor
        if t.outside is not None:  # a standby: checked against the store, then through the inbox
            row = await t.outside.row(case_id)
            if CaseState(row.state).ended:
                raise SignalRejected.ended(case_id, what, row.state)
            raise Remote(row)
        if t.loader is None:
            item = t.queues.item(case_id) if t.queues.queues else None
            if item is not None and item.state == "cancelled":  # (without a store: ended in its queue)
                raise SignalRejected.ended(case_id, what, "cancelled")
            if item is not None and item.state == "queued":
                raise SignalRejected.queued(case_id, what, item.queue)
            raise CaseNotFound(case_id)
        return await t.loader.live(case_id, what)

    async def to_inbox(self, case_id: str, msg: External, row: CaseRow) -> int:
        """An input for a case another process owns: checked against its version's summary, then into the store's
        inbox, acknowledged once committed (its owner is woken by the store and journals it; a refusal is marked
        on the inbox row). Returns the inbox row's id (0: a retried call whose input was applied)."""
        inbox_id = await self.t.door().send(case_id, msg, row)
        actor = self.cases.get(case_id)
        if inbox_id and actor is not None:  # (taken over by this node meanwhile: its next input here reads it first)
            actor.inbox_ahead = True
        return inbox_id

    async def ask(self, actor: CaseActor, msg: External) -> int | None:
        """Send an input and wait for its answer (committed and applied, or refused). Returns the id of the inbox
        row it went to instead when the case moved to another owner meanwhile (else None)."""
        reply = msg.reply
        assert reply is not None
        while True:
            try:
                if self.t.router is not None:  # what waits for the case in the inbox was acknowledged first
                    await self.t.router.ahead(actor)
                await actor.send(msg)
                break
            except CaseEvicted:  # it left memory after we found it: bring it back and send again
                try:
                    actor = await self.live(actor.case_id, msg.what)
                except Remote as remote:  # fenced: another node has it now: the input goes to it through the inbox
                    msg.reply = None
                    return await self.to_inbox(actor.case_id, msg, remote.row)
                if actor.machine is not None:  # brought back on another version, maybe: its own check again
                    admit(msg, actor.machine, self.max_payload)
        await reply.event.wait()
        if reply.error is not None:
            store = self.t.store
            if actor.fenced and isinstance(reply.error, StoreConflict) and store is not None \
                    and store.shared:  # nothing was recorded: the case's owner takes it, through the inbox
                row = await store.row(actor.case_id)
                if row is None:
                    raise reply.error
                msg.reply = None
                return await self.to_inbox(actor.case_id, msg, row)
            raise reply.error
        return None

    # -- signals -------------------------------------------------------------------------------------------------

    async def signal(self, case_id: str, msg: Signal) -> None:
        """A checked signal to a case, wherever it is (a retried call whose signal was applied returns)."""
        try:
            try:
                actor = await self.live(case_id, msg.what)
            except Remote as remote:
                await self.to_inbox(case_id, msg, remote.row)
                return
            await self.send(actor, msg)
        except SignalRejected:
            if not await self.t.applied(case_id, msg.request_id, "signal", msg.what):
                raise
            # a retried call whose input was applied (it may have ended the case): answered as the first was

    async def send(self, actor: CaseActor, msg: Signal) -> int | None:
        """A checked signal (or update) to a case in memory: the case's own check (`admit`), then into its mailbox.
        Returns the id of the inbox row it went to instead when the case has moved to another owner (else None)."""
        if self.t.phase != "open":
            raise SubstrateClosed("send a signal")
        if actor.evicted:  # a handle's actor that has left memory since
            try:
                actor = await self.live(actor.case_id, msg.what)
            except Remote as remote:  # another node's now (taken over meanwhile): through the inbox
                return await self.to_inbox(actor.case_id, msg, remote.row)
        machine = actor.machine
        if machine is None or actor.state in FINAL:
            raise actor.ended_error(msg.what)
        if actor.journal is None:  # unknown names, bad payloads: refused here
            if actor.retried(msg.request_id, "update" if msg.update else "signal", msg.what):
                return None  # a retried call: applied once already
            admit(msg, machine, None)
            await actor.send(msg)
            return None
        admit(msg, machine, self.max_payload)  # and the payload as its record gives it back, before any write
        msg.reply = Reply()
        return await self.ask(actor, msg)

    # -- updates -------------------------------------------------------------------------------------------------

    async def update(self, case_id: str, msg: Signal, actor: CaseActor | None) -> Any:
        """A checked update to a case, wherever it is, and its answer (see `Substrate.update`)."""
        uid = msg.request_id
        assert uid is not None
        if actor is None or actor.evicted:
            actor = self.cases.get(case_id)
        if actor is None:
            try:
                actor = await self.live(case_id, msg.what)
            except Remote as remote:
                return await self.t.door().update(case_id, msg, remote.row)
            except SignalRejected as refused:  # an ended case: a retried call gets what the first got
                return await self._ended_answer(case_id, msg, uid, refused)
        updates = of_actor(actor)
        first = await self._first_call(actor, msg, uid)
        waiter = updates.waiter(uid)
        if first and uid in actor.request_ids:  # applied before: nothing is sent again
            if waiter.answer is None and not (actor.machine is not None and actor.machine.owes(uid)):
                updates.pending.pop(uid, None)  # and its answer is no longer kept
                raise answer_gone(case_id, msg.name, uid, ANSWERS_KEPT)
        elif first:
            try:
                if actor.state in FINAL:
                    raise actor.ended_error(msg.what)
                inbox_id = await self.send(actor, msg)
            except BaseException:
                if updates.pending.get(uid) is waiter:
                    del updates.pending[uid]
                raise
            if inbox_id is not None:  # the case moved to another owner before it took the update: sent there
                updates_moved(updates, uid)  # (and any other caller of this id reads the row too)
                return await self._answer_from_row(case_id, msg, inbox_id)
        await self._wait_answer(actor, waiter)
        assert waiter.answer is not None
        if waiter.answer[0] == MOVED:  # the case moved to another owner while we waited: its answer is there
            return await self._answer_from_row(case_id, msg, 0)
        return update_result(actor.case_id, msg.name, waiter.answer, actor.outcome)

    async def _first_call(self, actor: CaseActor, msg: Signal, uid: str) -> bool:
        """Whether this is the first call with the update's id here (no caller waits on it, no answer is kept);
        a call whose first gave up while its record was being committed waits for that commit to decide."""
        updates = of_actor(actor)
        journal = actor.journal
        while True:
            first = uid not in updates.pending and uid not in updates.answers
            if not (first and actor.retried(uid, "update", msg.what)):
                return first
            commit = None if journal is None else journal.committing.get(uid)
            if commit is None:  # applied before: nothing is sent again
                return first
            # Its first call gave up while its record was being committed: the commit decides. Written, the update
            # is applied (the vm owes its answer, or gave it); not written, the id is free and this call sends it.
            await commit.done.wait()
            if actor.fenced and commit.error is not None:
                raise commit.error

    async def _ended_answer(self, case_id: str, msg: Signal, uid: str, refused: SignalRejected) -> Any:
        """The answer of an update to an ended case: the one its first call got (else `refused` is raised)."""
        store = self.t.store
        row = await store.row(case_id) if store is not None else None
        if row is None or not await applied(store, case_id, uid, "update", msg.what):
            raise refused
        found, value = row_result(row, msg.name, uid)
        if not found:
            raise answer_gone(case_id, msg.name, uid, ANSWERS_KEPT) from None
        return value

    async def _wait_answer(self, actor: CaseActor, waiter: Pending) -> None:
        """Wait for an update's answer here. A case that left memory and is now another node's (taken over while
        it was evicted: no actor of this node will answer) is noticed by a look at its row every ENDED_POLL s."""
        while True:
            with anyio.move_on_after(ENDED_POLL):  # (real time, as the polls of the store)
                await waiter.event.wait()
            if waiter.event.is_set():
                return
            store = self.t.store
            if store is None or not store.shared or self.cases.get(actor.case_id) is not None:
                continue
            try:
                row = await store.row(actor.case_id)
            except StoreError as exc:  # (looked at again at the next poll)
                _log.warning("could not read the row of a case an update waits on", case_id=actor.case_id,
                             error=str(exc))
                continue
            if row is None or row.owner != self.t.owner:
                updates_moved(of_actor(actor))
                return

    async def _answer_from_row(self, case_id: str, msg: Signal, inbox_id: int) -> Any:
        """An update's answer read from its case's row, written by the owner the case moved to (`inbox_id`: the
        inbox row the update went to, whose refusal is raised; 0: none, the update was journaled before)."""
        assert self.t.store is not None
        assert msg.request_id is not None
        return await remote_answer(self.t.store, case_id, msg.name, msg.request_id, inbox_id)

    # -- cancels -------------------------------------------------------------------------------------------------

    async def cancel(self, case_id: str, msg: Cancel) -> None:
        """A checked cancel to a case, wherever it is: in its queue (it never starts), suspended or queued again
        after a retry (ended here, as the owner), ended (SignalRejected), another process's (its inbox), live."""
        t = self.t
        t.check_open("cancel a case")
        if case_id not in self.cases:
            if t.store is None:
                if t.queues.queues and await self._cancel_memory_queued(case_id, msg):
                    return
            elif await self._cancel_stored(case_id, msg):
                return
        try:
            actor = await self.live(case_id, msg.what)
        except Remote as remote:
            await self.to_inbox(case_id, msg, remote.row)
            return
        await self.cancel_actor(actor, msg)

    async def _cancel_memory_queued(self, case_id: str, msg: Cancel) -> bool:
        """Without a store: True once a case waiting in its queue is cancelled there (it never starts);
        SignalRejected for one cancelled there before."""
        queues = self.t.queues
        if await queues.cancel(case_id, msg.reason, msg.request_id) is not None:
            return True
        item = queues.item(case_id)
        if item is not None and item.state == "cancelled":
            raise SignalRejected.ended(case_id, msg.what, "cancelled")
        return False

    async def _cancel_stored(self, case_id: str, msg: Cancel) -> bool:
        """A cancel of a durable case not in memory, where its row says it ends without its actor: True once
        done; False when it goes to the case (live, here or elsewhere)."""
        store = self.t.store
        assert store is not None
        row = await store.row(case_id)
        if row is None:
            if await self.cancel_queued(case_id, msg):
                return True  # it was queued: it ended there, and never starts
            # (cancelled there meanwhile, or started from there: a claimed case's start is written after its
            # claim, so a cancel in between waits for that start and goes to the case)
            await self.reads.left_queue(case_id)
            row = await store.row(case_id)
        loader = self.t.loader
        mine = row is not None and loader is not None and (not store.shared or row.owner == self.t.owner)
        if row is not None and mine and loader is not None and row.state == CaseState.SUSPENDED.value:
            inputs.bounded_reason(msg, self.max_payload, case_id)
            await loader.end_suspended(row, msg.reason, msg.request_id)  # (else: the owner's inbox)
            return True
        if row is not None and mine and row.state == CaseState.QUEUED.value:
            inputs.bounded_reason(msg, self.max_payload, case_id)  # a retried case waiting in its queue
            if await cancel_requeued(store, row, msg.reason, msg.request_id, self.t.clock.now()):
                return True  # it ended there
            row = await store.row(case_id)  # a node claimed it meanwhile: it starts, the cancel goes to it
        if row is not None and CaseState(row.state).ended:
            if await self.t.applied(case_id, msg.request_id, "cancel", msg.what):
                return True  # a retried cancel that was applied (and ended the case): what it returned first
            raise SignalRejected.ended(case_id, msg.what, row.state)
        return False

    async def cancel_queued(self, case_id: str, msg: Cancel) -> bool:
        """Cancel a durable case that waits in its queue (True: it ended there); False when it does not wait there
        (no such item, or it has started: its cancel goes to the case)."""
        inputs.bounded_reason(msg, self.max_payload, case_id)
        versions = self.t.workflows.versions

        def mine(name: str) -> str | None:  # (for a store that holds no version of it)
            found = versions.get(name)
            return found[-1].fingerprint if found else None

        return await self.t.queues.cancel(case_id, msg.reason, msg.request_id, mine) is not None

    async def cancel_actor(self, actor: CaseActor, msg: Cancel) -> None:
        """A checked cancel to a case found in memory (one that left memory since goes the whole route)."""
        self.t.check_open("cancel a case")
        if actor.evicted:
            await self.cancel(actor.case_id, msg)
            return
        if actor.state in FINAL:
            if await self.t.applied(actor.case_id, msg.request_id, "cancel", msg.what):
                return  # a retried cancel that was applied (and ended the case): what it returned first
            raise actor.ended_error(msg.what)
        if actor.journal is None:
            if actor.retried(msg.request_id, "cancel", msg.what):
                return  # a retried cancel that was applied (the case may still be compensating): not sent again
            actor.post(msg)
            return
        inputs.bounded_reason(msg, self.max_payload, actor.case_id)  # (`admit` of a cancel: its reason's size)
        msg.reply = Reply()
        await self.ask(actor, msg)

    # -- regions -------------------------------------------------------------------------------------------------

    async def region(
        self, case_id: str, action: RegionAction, region: str, items: Sequence[Any] | None, request_id: str | None
    ) -> None:
        """A region operation (cancel, complete, add or close instances), checked, to a case wherever it is; it
        returns once the case has applied it."""
        case_id = inputs.check_case_id(case_id, new=False)
        msg = inputs.region(action, region, items, request_id, case_id)
        try:
            try:
                actor = await self.live(case_id, msg.what)
            except Remote as remote:
                await self.to_inbox(case_id, msg, remote.row)
                return
            machine = actor.machine
            if machine is None or actor.state in FINAL:
                raise actor.ended_error(msg.what)
            admit(msg, machine, None if actor.journal is None else self.max_payload)  # before anything is queued
            msg.reply = Reply()
            await self.ask(actor, msg)
        except SignalRejected:
            if not await self.t.applied(case_id, msg.request_id, action.kind, msg.what):
                raise
            # a retried call whose input was applied (it may have ended the case): answered as the first was


# -- the route of a process that does not own the case (a Client, the command) -----------------------------------


async def send_outside(store: Store, case_id: str, msg: External, row: CaseRow | None, limit: int) -> int:
    """An input for a case no process here runs, checked as its owner will check it (its row, a retried request
    id, the program summary of its version, its size), then put in the store's inbox (see `_outside`): the inbox
    row's id, 0 for a retried call whose input was applied (nothing written)."""
    return await Outside(store, None, limit, time.time).send(case_id, msg, row)


async def cancel_waiting(store: Store, case_id: str, msg: Cancel, now: float, limit: int) -> bool:
    """A cancel, from a process that does not own the store, of a case that waits in its queue: True once it
    ended there (it never starts); False when it does not wait there (the cancel goes to the case)."""
    inputs.bounded_reason(msg, limit, case_id)
    return await cancel_queued(store, case_id, msg.reason, msg.request_id, now) is not None


async def send_input(
    store: Store, row: CaseRow, kind: str, body: dict[str, Any], request_id: str | None = None,
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD,
) -> int:
    """An input given as its inbox body (`kind`: signal, cancel, a region kind), checked as the API and its owner
    check it, then sent to case `row` as `send_outside` sends it: the inbox row's id, 0 for a retried call whose
    input was applied. What the `wfsub` command steers a case with."""
    msg = inputs.shaped(kind, body, request_id, case_id=row.case_id)
    return await send_outside(store, row.case_id, msg, row, max_payload_bytes)


async def cancel_in_queue(
    store: Store, case_id: str, reason: str, request_id: str | None, now: float,
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD,
) -> bool:
    """`cancel_waiting` for a cancel given by its reason (the `wfsub` command's): checked as `Substrate.cancel`
    checks one; True once the case ended in its queue."""
    msg = inputs.cancel(reason, True, request_id, case_id)
    return await cancel_waiting(store, case_id, msg, now, max_payload_bytes)

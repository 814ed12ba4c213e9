"""The inbox of a store, taken: `InboxRouter` hands each input someone else wrote (the `wfsub` command, an
outside writer, another node) to its case, or marks it refused with the reason.

An inbox row goes the route of every input (`_inputs`): shaped from its kind and body, then checked by its case
(`admit`) and posted to the case's mailbox; the case journals it with its inbox id, which takes it out of the
inbox in the same commit. Nothing an outside writer sends can fail the case or stop the Substrate: a refusal is
marked on the row; a store error leaves the row for the next poll (`Background.changes_loop`), whether it meets
the loading of the case or the case's own commit of the input (the case answers the input's `Reply` then, and a
row whose input was answered with an error is handed over again while it is still in the inbox).

Order. A case takes its inputs in the order they were acknowledged, whichever door took them: an input this
Substrate sends a case it owns (`ahead`, before the input goes into the case's mailbox) lets the case's rows
already in the inbox go first: rows a standby or an earlier owner left there before a takeover, or that a caller
put there through another door (the command, a client, a standby, another node) before this call. Hand-overs
take turns (`handing`), so one case's rows reach its mailbox in inbox order whoever hands them over.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio

from .._errors import SignalRejected, StoreError, SubstrateClosed, WfsubError
from .._store import CaseRow, CaseWrite, InboxRow, Store
from .._trace import get_logger
from . import _inputs as inputs
from ._case import CaseActor
from ._control import Remote
from ._loader import CaseLoader
from ._mailbox import Cancel, External, Reply
from ._outside import applied
from ._refusals import log_refused, named
from ._status import FINAL, CaseState

_log = get_logger("wfsub.runtime")

AHEAD_BATCH = 1000  # inbox rows of one case read at a time before an input of this Substrate goes to it


class InboxRouter:
    """Takes inbox rows for this Substrate's cases (see the module)."""

    def __init__(
        self, store: Store, loader: CaseLoader, live: Callable[[str, str], Awaitable[CaseActor]], max_payload: int,
        *, lifecycle: Callable[[InboxRow], Awaitable[None]],
        cancel_requeued: Callable[[CaseRow, str, str | None, list[int]], Awaitable[bool]],
    ) -> None:
        self.store = store
        self.loader = loader
        self.live = live  # the case's actor, in memory or loaded (`Deliver.live`)
        self.max_payload = max_payload
        # Inbox rows handed to a case: answered None once committed (kept until a read no longer lists the row: a
        # read begun before that commit may still list it), with an error when the case did not commit it.
        self.moving: dict[int, Reply] = {}
        # `retry` and `fork` rows (`_inputs.LIFECYCLE_KINDS`): done by the Substrate, which takes the row out of
        # the inbox in the same write; a refusal it raises is marked on the row
        self.lifecycle = lifecycle
        self.handing = anyio.Lock()  # one hand-over at a time (`take`, `ahead`): a case's rows stay in order
        # Cancels a retried case waiting in its queue (`_queues.cancel_requeued`: row, reason, request id, inbox
        # rows done): False when a node claimed it meanwhile (the input then waits for the case, which is starting)
        self.cancel_requeued = cancel_requeued

    async def take(self, rows: list[InboxRow]) -> None:
        """Hand over the rows of one read of the inbox (all of it, in id order): each once, except that a row whose
        case answered it with an error (a store fault at its commit, the case ended or moved meanwhile) is handed
        over again. A row that fails here with StoreError holds its case's later rows until the next read."""
        async with self.handing:
            moving = self.moving
            listed = {row.id for row in rows}
            # (a row handed over since this read began, by `ahead`, is not listed: kept until its case answers it)
            for inbox_id in [i for i, reply in moving.items() if i not in listed and reply.event.is_set()]:
                del moving[inbox_id]
            held: set[str] = set()
            for row in rows:
                if row.case_id in held:
                    continue
                try:
                    await self.hand(row)
                except StoreError as exc:  # acknowledged to its sender: never refused for a passing fault
                    held.add(row.case_id)
                    _log.warning("could not hand an inbox input to its case; trying again at the next poll",
                                 case_id=row.case_id, kind=row.kind, error=str(exc))

    async def ahead(self, actor: CaseActor) -> None:
        """Before an input of this Substrate goes into the mailbox of `actor` (a case it owns): hand over the case's
        rows waiting in the inbox, which were acknowledged before that input (see the module). The store says
        cheaply whether any waits (SQLite, memory); where it cannot tell without a read (Postgres), they are read
        when the case may have some: it was loaded from the store (a takeover, a restart, a parked case brought
        back), or this Substrate put an input for it in the inbox (`CaseActor.inbox_ahead`). StoreError when they
        could not be handed over: the input is not sent (its caller may send it again), so it never overtakes."""
        waiting = self.store.inbox_waiting(actor.case_id)
        if waiting is False or (waiting is None and not actor.inbox_ahead):
            return
        async with self.handing:
            actor.inbox_ahead = False  # (set again meanwhile by an input put in the inbox: read again next time)
            try:
                after = 0
                while True:
                    rows = await self.store.inbox_pending(actor.case_id, AHEAD_BATCH, after)
                    for row in rows:
                        await self.hand(row)
                    if len(rows) < AHEAD_BATCH:
                        return
                    after = rows[-1].id
            except BaseException:
                actor.inbox_ahead = True
                raise

    async def hand(self, row: InboxRow) -> None:
        """Hand one inbox row to its case unless it is on its way already (a row whose case answered it with an
        error is handed over again)."""
        moving = self.moving
        reply = moving.get(row.id)
        if reply is not None:
            if not reply.event.is_set() or reply.error is None:
                return  # on its way into the journal, or in it already
            del moving[row.id]
        await self.route(row)

    async def route(self, row: InboxRow) -> None:
        """Hand an inbox input to its case, or mark it refused with the reason."""
        try:
            if row.kind in inputs.LIFECYCLE_KINDS:
                await self.lifecycle(row)
                return
            actor, msg = await self.message(row)
        except Remote:
            return  # taken over by another node meanwhile: its owner takes the input
        except StoreError:
            raise  # the store failed to load the case: the input is tried again, never refused for it
        except SubstrateClosed:
            return  # this Substrate is closing: the row stays in the inbox for the store's next owner
        except (WfsubError, TypeError, ValueError, KeyError) as exc:
            try:
                await self.not_taken(row, exc)
            except SignalRejected as reused:  # its request id was used by an input of another kind
                await self.refuse(row, str(reused))
            return
        except Exception as exc:  # a bug of ours: refuse the input, log it, keep the Substrate running
            _log.exception("could not take an input from the inbox", case_id=row.case_id, kind=row.kind)
            await self.refuse(row, f"internal error: {exc!r}")
            return
        msg.reply = self.moving[row.id] = Reply()
        actor.post(msg)

    async def not_taken(self, row: InboxRow, exc: Exception) -> None:
        """An inbox input its case did not take (`exc`): a retried call that was applied is done, a cancel of a
        suspended case ends it, anything else is refused with the reason."""
        reason = str(exc)
        if isinstance(exc, SignalRejected) and await applied(
            self.store, row.case_id, row.request_id, row.kind, _what(row)
        ):
            await self.store.write(CaseWrite(row.case_id, inbox_done=[row.id]))  # a retried call: taken once
            return
        if row.kind == "cancel" and isinstance(exc, SignalRejected):
            stored = await self.store.row(row.case_id)
            if stored is not None and stored.state == CaseState.QUEUED.value:  # retried, waiting in its queue
                why = row.body.get("reason", inputs.DEFAULT_REASON) if isinstance(row.body, dict) else ""
                # (False: a node claimed it meanwhile; it is starting, and the next poll hands the cancel to it)
                await self.cancel_requeued(stored, str(why), row.request_id, [row.id])
                return
        if row.kind == "cancel" and isinstance(exc, SignalRejected) and "suspended" in reason:
            stored = await self.store.row(row.case_id)
            if stored is not None:  # the sender's reason, kept (it was checked before the case was looked up)
                why = row.body.get("reason", inputs.DEFAULT_REASON) if isinstance(row.body, dict) else ""
                await self.loader.end_suspended(stored, why, row.request_id, inbox_done=[row.id])
                return
        await self.refuse(row, reason)

    async def refuse(self, row: InboxRow, reason: str) -> None:
        """Mark an inbox input refused, log it, and have the case's status read its refusals again."""
        await self.store.write(CaseWrite(row.case_id, inbox_refused=[(row.id, reason)]))
        log_refused(row.case_id, row.kind, named(row.kind, row.body), reason, row.request_id)
        actor = self.loader.cases.get(row.case_id)
        if actor is not None and actor.journal is not None:
            actor.journal.refused = None

    async def message(self, row: InboxRow) -> tuple[CaseActor, External]:
        """The case's actor and the message an inbox row stands for, checked as the API checks its own calls."""
        msg = inputs.shaped(row.kind, row.body, row.request_id, case_id=row.case_id, inbox_id=row.id)
        if type(msg) is Cancel:  # (before the case is looked up: a suspended case's cancel keeps its reason too)
            inputs.bounded_reason(msg, self.max_payload, row.case_id)
        actor = await self.live(row.case_id, msg.what)
        machine = actor.machine
        if machine is None or actor.state in FINAL:
            raise actor.ended_error(msg.what)
        inputs.admit(msg, machine, self.max_payload)
        return actor, msg


def _what(row: InboxRow) -> str:
    """What an inbox input asks of its case, in a refusal's words ("take signal 'go'", "cancel")."""
    try:
        return inputs.shaped(row.kind, row.body, row.request_id, case_id=row.case_id).what
    except (WfsubError, TypeError, ValueError):
        return f"take a {row.kind} input"

"""`CaseTable`: what every room of a Substrate shares, so that no room holds the Substrate itself.

It holds the cases in memory, the ended ones kept for their awaiters, the awaiters of cases not in memory, the
starts being written, the counters, and the parts the Substrate's mode built (the store, and as its owner the
loader and the inbox router; as a standby the door to the owner). The rooms (`_starts`, `_deliver`, `_reads`,
`_ownership`) are functions and small classes over it.
"""

from __future__ import annotations

import itertools
import secrets
from collections import deque
from typing import TYPE_CHECKING, Any

import anyio

from .._errors import CaseExists, CaseNotFound, StoreError, SubstrateClosed, WfsubError
from .._store import CaseRow, Store
from .._terms import Term
from . import _inputs as inputs
from ._outside import Outside, applied
from ._status import FINAL

if TYPE_CHECKING:
    from ._case import CaseActor, Shared
    from ._clock import Clock
    from ._loader import CaseLoader
    from ._options import Options
    from ._queues import Queues
    from ._registry import Workflows
    from ._routing import InboxRouter


class CaseTable:
    """The cases of one Substrate and the state its rooms share (see the module)."""

    def __init__(self, opts: Options, workflows: Workflows, store: Store | None, clock: Clock, queues: Queues) -> None:
        self.opts = opts
        self.workflows = workflows
        self.store = store
        self.clock = clock  # (a node on a shared store replaces the real clock with the database's)
        self.queues = queues
        self.owner = opts.owner
        self.phase = "new"  # new -> open -> closed
        self.cases: dict[str, CaseActor] = {}
        self.ended: deque[str] = deque()  # ended cases kept in memory, oldest first (at most `retain_ended`)
        self.end_events: dict[str, anyio.Event] = {}  # awaiters of cases not in memory, by case id
        self.ended_poll_at = 0.0  # monotonic time when those awaiters next re-read their rows
        # case id -> (its start: workflow, data, sent; set once its start is written or failed) of a start being
        # written now
        self.starting: dict[str, tuple[dict[str, Any], anyio.Event]] = {}
        self.children: dict[str, list[str]] = {}  # parent id -> children (no store: all; else: last read)
        self.queued_terms: dict[str, Term] = {}  # without a store: queued cases of unregistered terms
        self.ids = itertools.count(1)
        self.orders = itertools.count(1)  # cases() paging order of cases without a store
        self.prefix = secrets.token_hex(6)  # generated ids must not meet an earlier run's in a store
        self.counts = {"started": 0, "done": 0, "failed": 0, "cancelled": 0, "evicted": 0, "idle_evicted": 0,
                       "live": 0}  # live: case actors running here (started, recovered or brought back) not exited
        # Built by the mode, once it is known (`_ownership`): what every actor shares; with a store, as its owner,
        # the loader and the inbox router; as a standby, the door to the owner (None again once it owns the store).
        self.shared: Shared | None = None
        self.loader: CaseLoader | None = None
        self.router: InboxRouter | None = None
        self.outside: Outside | None = None

    # -- state ---------------------------------------------------------------------------------------------

    def check_open(self, what: str) -> None:
        if self.phase != "open":
            raise SubstrateClosed(what)

    def is_open(self) -> bool:
        return self.phase == "open"

    def busy(self, n: int) -> None:
        if self.shared is not None:
            self.shared.busy += n

    def closed_or(self, exc: StoreError, what: str) -> WfsubError:
        """A read of the store that failed after the Substrate closed (and its store with it) is SubstrateClosed,
        not the store's advice to open it; any other failure is what it was."""
        return SubstrateClosed(what) if self.phase == "closed" else exc

    # -- finding cases ---------------------------------------------------------------------------------------

    def get(self, case_id: str) -> CaseActor:
        case_id = inputs.check_case_id(case_id, new=False)
        actor = self.cases.get(case_id)
        if actor is None:
            raise CaseNotFound(case_id)
        return actor

    def row_now(self, case_id: str) -> CaseRow | None:
        """A durable case's row, read on this thread (status, data and cases are synchronous)."""
        assert self.store is not None
        return self.store.read_row(case_id)

    def written(self, case_id: str) -> bool:
        """Whether a case has been started (in memory here, or its row in the store)."""
        return case_id in self.cases or (self.store is not None and self.row_now(case_id) is not None)

    def memory_ended(self, case_id: str) -> bool | None:
        """Without a store: whether a case has ended (None: it is not in memory)."""
        actor = self.cases.get(case_id)
        return None if actor is None else actor.state in FINAL

    async def deleted_elsewhere(self, case_id: str) -> bool:
        """Whether an ended case kept in memory here is no longer what the store holds under its id (another node,
        a standby, a client or the command deleted it, and perhaps started its id again): it leaves memory, so
        its id starts a new case, and inputs and awaiters reach the store's case, rather than the deleted run."""
        return self.loader is not None and await self.loader.stale_end(case_id)

    def new_id(self, case_id: object) -> str:
        """`case_id` checked and not taken here (CaseExists), or a new generated id for None."""
        if case_id is None:
            new = self.generated_id()
            while new in self.cases:
                new = self.generated_id()
            return new
        case_id = inputs.check_case_id(case_id)
        if case_id in self.cases:
            raise CaseExists(case_id)
        return case_id

    def generated_id(self) -> str:
        return f"case-{self.prefix}-{next(self.ids)}"

    async def applied(self, case_id: str, request_id: str | None, kind: str, what: str) -> bool:
        """Whether the case took the input of `kind` with `request_id`: a call repeated with that id answers as the
        first one did (SignalRejected when an input of another kind took the id). A case without a store keeps its
        ids itself; a durable one's are in its journal."""
        actor = self.cases.get(case_id)
        if actor is not None and actor.journal is None and self.store is None:
            return actor.retried(request_id, kind, what)
        return await applied(self.store, case_id, request_id, kind, what)

    def door(self) -> Outside:
        """The door to the store's inbox for a case another process owns (a standby's own, or one made for it)."""
        assert self.store is not None
        return self.outside or Outside(self.store, self.workflows, self.opts.max_payload, self.clock.now)

    # -- a case ends -----------------------------------------------------------------------------------------

    def on_end(self, actor: CaseActor) -> None:
        """An actor exits (every actor spawned calls this once): counted, its awaiters woken, the oldest ended
        cases beyond `retain_ended` let go."""
        self.counts["live"] -= 1
        if actor.end_unwritten and self.loader is not None:
            # Ended in memory, its `end` refused by a store fault: the store still holds the case live, so it leaves
            # memory as an evicted case does (awaiters and inputs look to the store), and the sweep brings it back
            # soon (backing off while the store fails) to replay it to its end and write that.
            actor.evicted = True
            if self.cases.get(actor.case_id) is actor:
                del self.cases[actor.case_id]
            self.loader.bring_back(actor.case_id)
            return
        if actor.closed or actor.evicted:
            return  # it stays live in the store (closed with the Substrate, or evicted while idle)
        if self.queues.queues:
            self.queues.nudge()  # (it may have made room in its queue)
        if self.loader is not None:
            self.loader.parked.pop(actor.case_id, None)
        event = self.end_events.pop(actor.case_id, None)
        if event is not None:
            event.set()
        state = actor.state
        if state in FINAL:
            self.counts[state] += 1  # (a StrEnum: the key "done" is found by its member)
        ended = self.ended
        ended.append(actor.case_id)
        cases = self.cases
        while len(ended) > self.opts.retain:
            old = ended.popleft()
            if old in cases and cases[old].state in FINAL:
                del cases[old]
                self.counts["evicted"] += 1

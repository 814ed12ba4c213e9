"""`CaseHandle`: a started case, over the delivery routes (`_deliver`) and the reads (`_reads`) of its Substrate.

The handle keeps its case's actor while the case is in memory, so its inputs and reads skip the lookup, and its
outcome, so `result()` works even after the Substrate's retention bound has dropped the case from its registry.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from .._errors import CaseNotFound, update_timeout
from . import _inputs as inputs
from ._mailbox import RegionAction
from ._options import check_await_timeout
from ._reads import validated
from ._status import FINAL, CaseStatus

if TYPE_CHECKING:
    from ._case import CaseActor
    from ._deliver import Deliver


class CaseHandle:
    """A started case: `case_id`, `await result()`, `status()`, `data()`, `done()`, `await signal(...)`,
    `await update(...)`, `await cancel()`.

    The handle keeps its case's outcome, so `result()` works even after the Substrate's retention bound has
    dropped the case from its registry.
    """

    __slots__ = ("_deliver", "_actor", "case_id")

    def __init__(self, deliver: Deliver, actor: CaseActor | None, case_id: str | None = None) -> None:
        self._deliver = deliver
        self._actor = actor  # None: the case runs elsewhere (another node) or is not in memory yet
        self.case_id = actor.case_id if actor is not None else case_id or ""

    async def result(self, timeout: float | None = None, *, model: type[BaseModel] | None = None) -> Any:  # noqa: ASYNC109
        """The final data (validated into `model` if given); raises CaseFailed, CaseCancelled, or TimeoutError
        (the case goes on). `timeout=0` checks without waiting."""
        reads = self._deliver.reads
        if timeout is None and model is None:  # the common case, kept short
            actor = self._actor
            if actor is not None and actor.exited and not actor.evicted:
                return actor.outcome()  # ended and exited: nothing to wait for
            if actor is None:
                await reads.left_queue(self.case_id)  # (a queued case: until it starts)
            return await reads.wait_end(
                self.case_id, actor if actor is not None and not actor.evicted else self._current(), check_only=False
            )
        check_await_timeout(timeout)
        return validated(self.case_id, await reads.outcome(self.case_id, self._current(), timeout), model)

    def _current(self) -> CaseActor | None:
        """The case's actor in memory (None while it is elsewhere: evicted into the store, on another node)."""
        actor = self._actor
        if actor is None or actor.evicted:
            found = self._deliver.cases.get(self.case_id)
            if found is None:
                return None
            self._actor = actor = found
        return actor

    def status(self) -> CaseStatus:
        actor = self._current()
        reads = self._deliver.reads
        return reads.status(self.case_id) if actor is None else reads.of_actor(actor)

    def data(self) -> dict[str, Any]:
        """A copy of the case's data now (the final data once it has ended)."""
        actor = self._current()
        return actor.data() if actor is not None else self._deliver.reads.data(self.case_id)

    def done(self) -> bool:
        """Whether the case has ended (its result is ready), without waiting."""
        actor = self._current()
        if actor is None:
            return self._deliver.reads.status(self.case_id).ended
        return actor.state in FINAL and actor.recorded

    async def signal(self, name: str, payload: Any = None, *, request_id: str | None = None) -> None:
        """Send signal `name` to this case (see Substrate.signal)."""
        msg = inputs.signal(name, payload, request_id, self.case_id)
        actor = self._actor
        if actor is None or actor.evicted:
            actor = self._current()
        if actor is None or request_id is not None:  # (a retry of a signal that ended the case returns, as the
            await self._deliver.signal(self.case_id, msg)  # first call did: the whole route says so)
        else:
            await self._deliver.send(actor, msg)

    async def update(
        self, name: str, payload: Any = None, *, request_id: str | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 (how long to wait for the answer)
    ) -> Any:
        """Send update `name` to this case and return its answer (see Substrate.update)."""
        check_await_timeout(timeout)
        msg = inputs.update(name, payload, request_id, self.case_id)
        deliver = self._deliver
        if timeout is None:
            return await deliver.update(self.case_id, msg, self._current())
        with deliver.t.clock.deadline_scope(timeout):
            return await deliver.update(self.case_id, msg, self._current())
        raise update_timeout(self.case_id, msg.name, timeout)

    async def cancel(self, compensate: bool = True, *, reason: str = "cancelled") -> None:
        """Cancel this case (see Substrate.cancel)."""
        msg = inputs.cancel(reason, compensate, None, self.case_id)
        actor = self._current()
        if actor is None:
            await self._deliver.cancel(self.case_id, msg)
        else:
            await self._deliver.cancel_actor(actor, msg)

    async def close_instances(self, region: str) -> None:
        """Close the dynamic mi `region` of this case (see Substrate.close_instances)."""
        await self._deliver.region(self.case_id, RegionAction.CLOSE_INSTANCES, region, None, None)

    def __repr__(self) -> str:
        return f"<CaseHandle {self.case_id!r} {self.status().state.value}>"


def handle_of(deliver: Deliver, case_id: str) -> CaseHandle:
    """A handle to an existing case (CaseNotFound if there is none): in memory, in the store, or in its queue."""
    t = deliver.t
    t.check_open("get a case's handle")
    case_id = inputs.check_case_id(case_id, new=False)
    actor = t.cases.get(case_id)
    if actor is not None and not actor.evicted:
        return CaseHandle(deliver, actor)
    if t.store is not None and t.row_now(case_id) is not None:
        return CaseHandle(deliver, None, case_id)
    if t.queues.queues and t.queues.item(case_id) is not None:  # waiting in its queue, or cancelled there
        return CaseHandle(deliver, None, case_id)
    raise CaseNotFound(case_id)

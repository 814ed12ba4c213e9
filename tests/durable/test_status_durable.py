"""A durable case shows an ended state only once its `end` record is committed: `status()`, `done()`, the journal
and `await_case` agree, and a crash can never take back an end that `status()` showed."""

from __future__ import annotations

import anyio
import pytest

from wfsub import CaseCancelled, CaseState, Substrate, seq, wait
from wfsub._store import CaseWrite
from wfsub.stores import MemoryStore


class EndHeld(MemoryStore):
    """A store whose commit of an `end` record waits until the test lets it through."""

    def __init__(self) -> None:
        super().__init__()
        self.end_reached = anyio.Event()
        self.release = anyio.Event()

    async def write(self, change: CaseWrite, *, wait: bool = True) -> list[bool]:
        if any(r.get("kind") == "end" for r in change.records or ()):
            self.end_reached.set()
            await self.release.wait()
        return await super().write(change, wait=wait)


@pytest.mark.parametrize("compensate", [True, False])
async def test_a_case_shows_cancelled_only_once_its_end_record_is_committed(compensate: bool) -> None:
    """While the end record of a cancelled case commits, status() says running (not cancelled) and done() is
    false; once it commits, status(), done(), the journal and await_case all say it ended."""
    store = EndHeld()
    async with Substrate(store=store, workflows={"w": seq(wait("go"))}) as sub:
        handle = await sub.new_case("w", {}, case_id="c")
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: sub.cancel("c", compensate=compensate))
            await store.end_reached.wait()
            try:
                seen = sub.status("c")
                done = handle.done()
            finally:
                store.release.set()  # a failed check must not leave the end's commit (shielded) waiting for ever
        assert (seen.state, seen.ended_at, done) == (CaseState.RUNNING, None, False)
        with pytest.raises(CaseCancelled):
            await sub.await_case("c")
        status = sub.status("c")
        assert status.state == CaseState.CANCELLED and status.ended_at is not None
        assert handle.done()
        assert [r.kind for r in await sub.journal("c")][-1] == "end"

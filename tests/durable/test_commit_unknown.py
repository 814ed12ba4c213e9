"""A commit whose outcome is unknown (the group committed, its answer lost) never leaves a case running on a
state its journal does not have: the case is read back from its journal."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from wfsub import Substrate, seq, task, wait
from wfsub._errors import CommitUnknown
from wfsub._store import CaseWrite
from wfsub.stores import MemoryStore


class AnswerLost(MemoryStore):
    """A store that commits the first write carrying a signal record, then loses the answer."""

    def __init__(self) -> None:
        super().__init__()
        self.lost = 0

    async def write(self, change: CaseWrite, *, wait: bool = True) -> list[bool]:
        appended = await super().write(change, wait=wait)
        if self.lost == 0 and any(r.get("kind") == "signal" for r in change.records or ()):
            self.lost += 1
            raise CommitUnknown("memory:", "committing: the answer was lost after the commit")
        return appended


async def test_a_signal_whose_commit_answer_was_lost_is_applied_once_and_the_case_goes_on() -> None:
    """The signal is in the journal though its sender heard CommitUnknown: the case is read back, goes on, ends."""
    store = AnswerLost()
    flow = seq(wait("go"), task(lambda ctx: {"went": ctx["go"]}))
    async with Substrate(store=store, workflows={"w": flow}) as sub:
        await sub.new_case("w", {}, case_id="c")
        with pytest.raises(CommitUnknown):
            await sub.signal("c", "go", 1, request_id="r1")
        await sub.signal("c", "go", 1, request_id="r1")  # the careful caller's retry: applied once already
        with anyio.fail_after(30):
            result: dict[str, Any] = await sub.await_case("c")
        assert result == {"go": 1, "went": 1}
        assert [r.kind for r in await sub.journal("c")] == ["start", "signal", "end"]

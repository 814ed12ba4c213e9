"""Attacks on the case lifecycle (retry, fork, delete, compaction, queues, schedules) where the store fails at
the wrong moment: a commit whose answer is lost, a Postgres connection cut mid-write, a process restarted."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from wfsub import CaseExists, CaseFailed, SignalRejected, Substrate, loop, seq, task, wait
from wfsub.stores import CommitUnknown, MemoryStore, PostgresStore

from ..stores import _pg
from ..stores._proxy import Proxy


class LosesAnswer(MemoryStore):
    """Loses the answer of the first write whose records include one of kind `kind` (once set): committed first
    when `commit`, else not written at all. What a caller hears either way is CommitUnknown."""

    def __init__(self) -> None:
        super().__init__()
        self.kind: str | None = None
        self.commit = True
        self.lost = 0

    async def write(self, change: Any, *, wait: bool = True) -> list[bool]:
        hit = self.kind is not None and not self.lost and any(
            r.get("kind") == self.kind for r in (change.records or ())
        )
        if hit and not self.commit:
            self.lost += 1
            raise CommitUnknown("memory:", "committing: the connection was lost before the answer")
        appended: list[bool] = await super().write(change, wait=wait)
        if hit:
            self.lost += 1
            raise CommitUnknown("memory:", "committing: the answer was lost after the commit")
        return appended


def failing_until_fixed() -> tuple[dict[str, bool], Any]:
    fixed = {"ok": False}

    def step(ctx: Any) -> dict[str, Any]:
        if not fixed["ok"]:
            raise RuntimeError("not fixed yet")
        return {"done": True}

    return fixed, seq(task(step, name="step"))


@pytest.mark.parametrize("commit", [True, False])
async def test_a_retry_whose_commit_answer_was_lost_still_runs_the_case(commit: bool) -> None:
    """retry() raised CommitUnknown: committed, the re-opened case is brought back and runs to its end (not left
    running in the store and in no memory); not committed, it is still failed and a retry again re-opens it."""
    store = LosesAnswer()
    fixed, flow = failing_until_fixed()
    async with Substrate(store=store, workflows={"w": flow}) as sub:
        h = await sub.new_case("w", {}, case_id="c")
        with pytest.raises(CaseFailed):
            await h.result()
        fixed["ok"] = True
        store.kind, store.commit = "retry", commit
        with pytest.raises(CommitUnknown):
            await sub.retry("c")
        if commit:
            with pytest.raises(SignalRejected, match="it is running"):
                await sub.retry("c")  # re-opened already: the refusal says so
        else:
            await sub.retry("c")
        with anyio.fail_after(15):  # brought back at once (the periodic sweep alone would take 30 s)
            assert await sub.await_case("c") == {"done": True}
        kinds = [r.kind for r in await sub.journal("c")]
        assert kinds.count("retry") == 1 and kinds[-1] == "end"


@pytest.mark.parametrize("commit", [True, False])
async def test_a_fork_whose_commit_answer_was_lost_can_be_repeated_and_runs(commit: bool) -> None:
    """fork() raised CommitUnknown: the same fork repeated (same new_case_id, origin and at) answers with the
    case, which runs to its end; a fork with that id of another record is still refused with CaseExists."""
    store = LosesAnswer()
    flow = seq(wait("go"), task(lambda ctx: {"went": ctx["go"]}))
    async with Substrate(store=store, workflows={"w": flow}) as sub:
        await sub.new_case("w", {}, case_id="c")
        await sub.signal("c", "go", 1)
        assert await sub.await_case("c") == {"go": 1, "went": 1}
        store.kind, store.commit = "start", commit
        with pytest.raises(CommitUnknown):
            await sub.fork("c", at=0, new_case_id="f")
        fork = await sub.fork("c", at=0, new_case_id="f")  # the careful caller's repeat
        assert fork.case_id == "f"
        with pytest.raises(CaseExists):
            await sub.fork("c", at=1, new_case_id="f")
        await sub.signal("f", "go", 2)
        with anyio.fail_after(15):
            assert await sub.await_case("f") == {"go": 2, "went": 2}
        assert [r.kind for r in await sub.journal("f")] == ["start", "signal", "end"]

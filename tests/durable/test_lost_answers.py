"""Calls whose store answer was lost (CommitUnknown after the write committed): repeated, they find what happened."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from wfsub import CaseExists, Substrate, seq, task, wait
from wfsub._store import CaseWrite
from wfsub.stores import CommitUnknown, SqliteStore


def done(ctx: Mapping[str, Any]) -> dict[str, Any]:
    return {"done": True}


FLOWS = {"wait": seq(wait("go", into="go"), task(done))}


class LosesStartAnswer(SqliteStore):
    """Commits the first start write it is given, then reports CommitUnknown for it, as a lost answer does."""

    lost = 0

    async def write(self, change: CaseWrite, *, wait: bool = True) -> list[bool]:
        appended = await super().write(change, wait=wait)
        if not self.lost and change.records and change.records[0]["kind"] == "start":
            self.lost += 1
            raise CommitUnknown(self.url, "committing a start write: the connection was lost before its answer")
        return appended


async def test_new_case_repeated_after_commit_unknown_answers_with_the_case_that_was_started(tmp_path: Path) -> None:
    """new_case raising CommitUnknown after its start committed: the same call again returns that case, which runs;
    other start data for the id is CaseExists."""
    store = LosesStartAnswer(tmp_path / "cases.db")
    async with Substrate(store=store, workflows=FLOWS) as sub:
        with pytest.raises(CommitUnknown):
            await sub.new_case("wait", {"n": 1}, case_id="c")
        assert store.lost == 1
        handle = await sub.new_case("wait", {"n": 1}, case_id="c")
        await sub.signal("c", "go", 5)
        assert await handle.result() == {"n": 1, "go": 5, "done": True}
        assert [r.kind for r in await sub.journal("c")] == ["start", "signal", "end"]
        with pytest.raises(CaseExists):
            await sub.new_case("wait", {"n": 2}, case_id="c")

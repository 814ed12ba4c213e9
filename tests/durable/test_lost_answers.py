"""Calls whose store answer was lost (CommitUnknown after the write committed): repeated, they find what happened."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio
import pytest

from wfsub import CaseExists, Substrate, effect, seq, task, wait
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


async def call_out(ctx: Mapping[str, Any]) -> dict[str, Any]:
    return {"called": True}


class LosesEffectAnswer(SqliteStore):
    """Commits the first effect record it is given, then reports CommitUnknown for it, as a lost answer does."""

    lost = 0

    async def write(self, change: CaseWrite, *, wait: bool = True) -> list[bool]:
        appended = await super().write(change, wait=wait)
        if not self.lost and any(r["kind"] == "effect" for r in change.records):
            self.lost += 1
            raise CommitUnknown(self.url, "committing an effect result: the connection was lost before its answer")
        return appended


async def test_a_case_whose_effect_result_answer_was_lost_comes_back_from_its_journal(tmp_path: Path) -> None:
    """An effect result committed with its answer lost: the case's resend is refused (seq taken), and the case,
    still this node's, is brought back from its journal and completes with one effect record."""
    store = LosesEffectAnswer(tmp_path / "cases.db")
    async with Substrate(store=store, workflows={"call": seq(effect(call_out), task(done))}) as sub:
        await sub.new_case("call", {}, case_id="c")
        with anyio.fail_after(30):
            assert await sub.await_case("c") == {"called": True, "done": True}
        assert store.lost == 1
        assert [r.kind for r in await sub.journal("c")] == ["start", "effect", "end"]

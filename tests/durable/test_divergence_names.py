"""A replay divergence names each task by its name and its node path (`task 'roll' at seq[0].task`), wherever the
case is brought back (a restart on MemoryStore, SQLite and Postgres) and in `replay()`'s report."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from wfsub import SignalRejected, Substrate, replay, seq, task, wait
from wfsub.stores import MemoryStore
from wfsub.testing import VirtualClock

from ._util import same_store as reopenable

DRAWS = {"next": 1}  # global state the tasks read: nondeterministic tasks



def roll(ctx: Mapping[str, Any]) -> dict[str, Any]:
    DRAWS["next"] += 1
    return {"roll": DRAWS["next"]}


def shuffle(ctx: Mapping[str, Any]) -> dict[str, Any]:  # unnamed in the term: its function's name is its name
    return {"order": DRAWS["next"]}


FLOW = seq(task(roll, name="roll"), task(shuffle), wait("go"), wait("more"))


@pytest.fixture(autouse=True)
def _fresh() -> None:
    DRAWS["next"] = 1




@pytest.mark.parametrize("kind", ["memory", "sqlite", "postgres"])
async def test_a_divergence_after_a_restart_names_each_task_and_its_path(kind: str, tmp_path: Path) -> None:
    """Restarted where the tasks give other outputs, the case is suspended naming `task 'roll' at seq[0].task`."""
    store = reopenable(kind, tmp_path)
    same_node: dict[str, Any] = {"node_id": "n1"} if kind == "postgres" else {}
    clock = VirtualClock()
    async with Substrate(store=store(), workflows={"w": FLOW}, clock=clock, **same_node) as sub:
        await sub.new_case("w", case_id="c")
        await clock.advance(0)
        assert sub.status("c").state == "waiting_signal"
        await sub.signal("c", "go")  # the journal's signal record carries the tasks' digest
        await clock.advance(0)
        assert sub.status("c").signals == ("more",)
        journal = await sub.journal("c")
    async with Substrate(store=store(), workflows={"w": FLOW}, clock=clock, **same_node) as sub:
        await clock.advance(0)
        with pytest.raises(SignalRejected, match="suspended"):  # brought back by the signal: suspended instead
            await sub.signal("c", "more")
        reason = sub.status("c").suspended_reason or ""
    for text in (reason, str(replay(FLOW, journal).divergence)):
        assert "task 'roll' at seq[0].task, task 'shuffle' at seq[1].task" in text, text


def test_replay_divergence_keeps_paths_and_names_apart() -> None:
    """ReplayDivergence.tasks keeps the node paths and .task_names the names, in the same order."""
    journal = _journal_of_a_run()
    divergence = replay(FLOW, journal).divergence
    assert divergence is not None
    assert divergence.tasks == ["seq[0].task", "seq[1].task"]
    assert divergence.task_names == ["roll", "shuffle"]


def _journal_of_a_run() -> list[Any]:
    import anyio

    async def run() -> list[Any]:
        clock = VirtualClock()
        async with Substrate(store=MemoryStore(), workflows={"w": FLOW}, clock=clock) as sub:
            await sub.new_case("w", case_id="c")
            await clock.advance(0)
            await sub.signal("c", "go")
            await clock.advance(0)
            return list(await sub.journal("c"))

    return anyio.run(run)

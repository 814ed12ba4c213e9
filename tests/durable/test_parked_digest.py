"""The data a case parked with is protected like any other: a task that ran after the case's last record and
gives another output when the case is brought back (after eviction, after a restart) suspends the case with a
ReplayDivergence naming the task, before anything runs on the other output. MemoryStore and SQLite."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from wfsub import SignalRejected, Substrate, effect, seq, task, wait
from wfsub.stores import MemoryStore, SqliteStore
from wfsub.testing import VirtualClock

DRAWS = {"next": 1}  # global state the task reads: a nondeterministic task
CHARGED: list[Any] = []


def draw(ctx: Mapping[str, Any]) -> dict[str, Any]:
    value = DRAWS["next"]
    DRAWS["next"] += 1
    return {"discount": value}


async def charge(ctx: Mapping[str, Any]) -> dict[str, Any]:
    CHARGED.append(ctx["discount"])
    return {"charged": True}


FLOWS = {"pay": seq(task(draw, name="draw"), wait("approved"), effect(charge, name="charge"))}


@pytest.fixture(autouse=True)
def _fresh() -> None:
    DRAWS["next"] = 1
    CHARGED.clear()


def store_of(kind: str, tmp_path: Path) -> Any:
    return MemoryStore() if kind == "memory" else SqliteStore(tmp_path / "cases.db")


async def diverged(sub: Substrate) -> None:
    """The signal finds the case suspended, its reason naming the task; the effect never ran. A signal sent again
    finds it suspended still (the task gives yet another output: it is not run on it either)."""
    for _ in range(2):
        with pytest.raises(SignalRejected, match="suspended"):
            await sub.signal("c", "approved")
        status = sub.status("c")
        assert status.state == "suspended"
        assert status.suspended_reason is not None and "seq[0].task" in status.suspended_reason  # the task
        assert CHARGED == []


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
async def test_a_task_that_changes_its_output_after_eviction_suspends_the_case(kind: str, tmp_path: Path) -> None:
    """Evicted after a task gave 1, brought back where it gives 2: the case is suspended, naming the task."""
    clock = VirtualClock()
    async with Substrate(store=store_of(kind, tmp_path), workflows=FLOWS, clock=clock, evict_after=1) as sub:
        await sub.new_case("pay", case_id="c")
        await clock.advance(0)
        assert sub.data("c") == {"discount": 1}
        await clock.advance(5)
        assert sub.statistics().cases_in_memory == 0
        await diverged(sub)


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
async def test_a_task_that_changes_its_output_after_a_restart_suspends_the_case(kind: str, tmp_path: Path) -> None:
    """Parked after a task gave 1, restarted where it gives 2: the case is suspended, naming the task."""
    store = store_of(kind, tmp_path)
    clock = VirtualClock()
    async with Substrate(store=store, workflows=FLOWS, clock=clock) as sub:
        await sub.new_case("pay", case_id="c")
        await clock.advance(0)
        assert sub.status("c").state == "waiting_signal"
    async with Substrate(store=store_of(kind, tmp_path) if kind == "sqlite" else store, workflows=FLOWS,
                         clock=clock) as sub:
        await diverged(sub)


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
async def test_a_task_that_gives_the_same_output_again_resumes_the_case(kind: str, tmp_path: Path) -> None:
    """A task that gives the same output when the case comes back: the case resumes and runs on."""
    clock = VirtualClock()
    async with Substrate(store=store_of(kind, tmp_path), workflows=FLOWS, clock=clock, evict_after=1) as sub:
        await sub.new_case("pay", case_id="c")
        await clock.advance(0)
        await clock.advance(5)
        assert sub.statistics().cases_in_memory == 0
        DRAWS["next"] = 1
        await sub.signal("c", "approved")
        assert (await sub.await_case("c"))["charged"]
    assert CHARGED == [1]

"""Idle eviction: `Substrate(evict_after=)` drops parked durable cases from memory; inputs and timers bring them
back."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio
import pytest

from wfsub import Substrate, effect, seq, sleep, task, wait
from wfsub.stores import MemoryStore
from wfsub.testing import VirtualClock

GO = seq(task(lambda c: {"started": True}, name="begin"), wait("go"), task(lambda c: {"went": True}, name="end"))
NAP = seq(sleep(100), task(lambda c: {"woke": True}, name="woke"))
FLOWS = {"go": GO, "nap": NAP}


async def test_a_parked_case_leaves_memory_and_a_signal_brings_it_back() -> None:
    """After evict_after seconds parked, the case is out of memory; status reads the store; a signal resumes it."""
    clock = VirtualClock()
    async with Substrate(store=MemoryStore(), workflows=FLOWS, clock=clock, evict_after=10) as sub:
        handle = await sub.new_case("go", case_id="c")
        await clock.advance(11)
        stats = sub.statistics()
        assert (stats.cases_in_memory, stats.cases_idle_evicted) == (0, 1)
        assert handle.status().state == "waiting_signal" and handle.status().signals == ("go",)
        assert handle.data() == {"started": True} and not handle.done()
        await handle.signal("go")
        assert await handle.result() == {"started": True, "go": None, "went": True}
        assert handle.done()


async def test_an_evicted_case_timer_fires_at_its_due_time_without_it_in_memory() -> None:
    """A sleeping case is evicted; the store's due-time index brings it back when its timer falls due."""
    clock = VirtualClock()
    async with Substrate(store=MemoryStore(), workflows=FLOWS, clock=clock, evict_after=5) as sub:
        handle = await sub.new_case("nap", case_id="n")
        await clock.advance(50)
        assert sub.statistics().cases_in_memory == 0
        assert handle.status().state == "waiting_timer"
        await clock.advance(51)
        assert await handle.result(timeout=0) == {"woke": True}


async def test_an_awaiter_does_not_reload_an_evicted_case_and_gets_its_result() -> None:
    """await_case on an evicted case waits without loading it; the case ends after a signal and the awaiter wakes."""
    clock = VirtualClock()
    async with Substrate(store=MemoryStore(), workflows=FLOWS, clock=clock, evict_after=1) as sub:
        handle = await sub.new_case("go", case_id="c")
        results: list[Any] = []
        async with anyio.create_task_group() as tg:

            async def awaiter() -> None:
                results.append(await sub.await_case("c"))

            tg.start_soon(awaiter)
            await clock.advance(5)
            assert sub.statistics().cases_in_memory == 0  # awaited, yet out of memory
            await sub.signal("c", "go", 1)
        assert results == [{"started": True, "go": 1, "went": True}]
        assert await handle.result() == results[0]


async def test_a_case_with_an_effect_in_flight_is_never_evicted() -> None:
    """Only cases waiting for a signal or a timer leave memory; one waiting for an effect stays."""
    clock = VirtualClock()
    release = anyio.Event()

    async def slow(ctx: Mapping[str, Any]) -> dict[str, Any]:
        await release.wait()
        return {"slow": True}

    async with Substrate(store=MemoryStore(), workflows={"e": seq(effect(slow))}, clock=clock, evict_after=1) as sub:
        handle = await sub.new_case("e")
        for _ in range(5):
            await anyio.sleep(0.01)
            await clock.advance(2)
        assert sub.statistics().cases_idle_evicted == 0 and handle.status().state == "waiting_effect"
        release.set()
        assert await handle.result() == {"slow": True}


async def test_inputs_racing_with_eviction_apply_exactly_once(tmp_path: Path) -> None:
    """Signals sent while cases are being evicted (real clock, SQLite) each apply once; every case completes."""
    flow = seq(wait("go"), wait("go"), task(lambda c: {"done": True}, name="done"))
    async with Substrate(store=tmp_path / "s.db", workflows={"f": flow}, evict_after=0.05) as sub:
        ids = [(await sub.new_case("f")).case_id for _ in range(60)]
        for round_ in range(2):
            await anyio.sleep(0.04 + 0.02 * round_)  # around the eviction moment
            async with anyio.create_task_group() as tg:
                for case_id in ids:
                    tg.start_soon(sub.signal, case_id, "go")
        with anyio.fail_after(20):
            for case_id in ids:
                assert await sub.await_case(case_id) == {"go": None, "done": True}
        for case_id in ids[:5]:
            kinds = [r.kind for r in await sub.journal(case_id)]
            assert kinds == ["start", "signal", "signal", "end"]


async def test_an_evicted_case_reloads_from_the_snapshot_written_when_it_left(tmp_path: Path) -> None:
    """Eviction after inputs stores a snapshot; the case then survives a restart and resumes from it."""
    flow = seq(wait("a"), wait("b"), task(lambda c: {"done": True}, name="done"))
    path = tmp_path / "s.db"
    async with Substrate(store=path, workflows={"f": flow}, evict_after=0.05) as sub:
        await sub.new_case("f", case_id="c")
        await sub.signal("c", "a", 1)
        with anyio.fail_after(5):
            while sub.statistics().cases_idle_evicted == 0:  # noqa: ASYNC110 - the eviction loop's own pace
                await anyio.sleep(0.02)
        stored = await sub._store.load("c")  # type: ignore[union-attr]
        assert stored is not None and stored.snapshot is not None and stored.snapshot.seq == 1
    async with Substrate(store=path, workflows={"f": flow}, evict_after=0.05) as sub:
        await sub.signal("c", "b", 2)
        assert await sub.await_case("c") == {"a": 1, "b": 2, "done": True}


def test_evict_after_needs_a_store_and_a_positive_number() -> None:
    """evict_after without a store, or not a positive number, is refused with the fix."""
    with pytest.raises(ValueError, match="evict_after needs a store"):
        Substrate(evict_after=1)
    for bad in (0, -1, float("nan"), "1"):
        with pytest.raises((ValueError, TypeError), match="evict_after"):
            Substrate(store=MemoryStore(), evict_after=bad)  # type: ignore[arg-type]


@pytest.mark.long
async def test_ten_thousand_parked_cases_leave_memory_and_signals_and_timers_still_reach_them() -> None:
    """10,000 parked cases with evict_after leave memory, and signals and timers still reach and end them."""
    # Signals reach a sample; the sleepers' timers fire from the store's due-time index, each case ending as it
    # would have in memory. (`make bench` parks a million; 10,000 is a hundred times what stays in memory, and keeps
    # the suite within its five minutes on two loaded cores: 50,000 took eight of them there.)
    total, sleepers = 10_000, 100
    flows = {"go": GO, "nap": seq(sleep(1.5), task(lambda c: {"woke": True}, name="woke"))}
    async with Substrate(store=MemoryStore(), workflows=flows, evict_after=0.2, trace_level="none",
                         retain_ended=0) as sub:
        async def starter(first: int) -> None:
            for i in range(first, total, 50):
                await sub.new_case("nap" if i < sleepers else "go", case_id=f"c{i}")

        async with anyio.create_task_group() as tg:
            for k in range(50):
                tg.start_soon(starter, k)
        with anyio.fail_after(60):
            while sub.statistics().cases_in_memory > sleepers:  # noqa: ASYNC110 - the eviction loop's pace
                await anyio.sleep(0.1)
            sample = [f"c{i}" for i in range(sleepers, total, total // 200)]
            for case_id in sample:
                await sub.signal(case_id, "go", 1)
            for case_id in sample:
                assert await sub.await_case(case_id) == {"started": True, "go": 1, "went": True}
            for i in range(sleepers):
                assert await sub.await_case(f"c{i}") == {"woke": True}
        assert sub.statistics().cases_idle_evicted >= total - sleepers

"""Durable timers: advancing a VirtualClock over a long span costs what falls due in it; timers computed from the
case data keep their due times across a restart and are recomputed the same by replay."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from wfsub import Substrate, defer, scope, seq, sleep, task, wait
from wfsub.stores import MemoryStore
from wfsub.testing import VirtualClock

from ._util import same_store as reopenable

YEAR = 365 * 86400.0



def store_for(kind: str, tmp_path: Path) -> Any:
    return MemoryStore() if kind == "memory" else str(tmp_path / "cases.db")


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
@pytest.mark.parametrize("evict_after", [None, 60.0])
async def test_advancing_a_year_fires_the_clock_a_bounded_number_of_times(
    kind: str, evict_after: float | None, tmp_path: Path
) -> None:
    """A year-long timer on a durable store completes with a handful of clock firings, whatever the span's length."""
    clock = VirtualClock()
    wf = seq(sleep(YEAR), task(lambda c: {"woke": True}))
    async with Substrate(store=store_for(kind, tmp_path), clock=clock, workflows={"w": wf},
                         evict_after=evict_after) as sub:
        handle = await sub.new_case("w")
        await clock.advance(YEAR - 1)
        assert not handle.done()
        await clock.advance(1)
        assert await handle.result() == {"woke": True}
    assert clock.fired <= 10, f"{clock.fired} clock firings for one timer"


T0 = 1_800_000_000.0  # 2027-01-15T08:00:00Z


def due_in(ctx: Any) -> Any:
    return ctx["wait_for"]


def due_at(ctx: Any) -> Any:
    return ctx["until"]


def shifted(ctx: Any) -> dict[str, Any]:
    return {"wait_for": ctx["wait_for"] * 2}  # data changed after the timer started: the timer keeps its length


FROM_DATA = seq(
    sleep(due_in), task(shifted), sleep(until=due_at), task(lambda c: {"woke": True}, name="woke")
)


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
async def test_a_year_long_timer_from_data_completes_with_bounded_firings(kind: str, tmp_path: Path) -> None:
    """sleep(until=fn) a year ahead on a durable store: done after the year, with a handful of clock firings."""
    clock = VirtualClock(start=T0)
    wf = seq(sleep(until=due_at), task(lambda c: {"woke": True}, name="woke"))
    async with Substrate(store=store_for(kind, tmp_path), clock=clock, workflows={"w": wf}) as sub:
        handle = await sub.new_case("w", {"until": "2028-01-15T08:00:00+00:00"})
        await clock.advance(0)
        assert [t.due for t in handle.status().timers] == [T0 + YEAR]
        await clock.advance(YEAR)
        assert (await handle.result())["woke"] is True
    assert clock.fired <= 10, f"{clock.fired} clock firings for one timer"




@pytest.mark.parametrize("kind", ["memory", "sqlite", "postgres"])
async def test_timers_from_data_keep_their_due_times_across_a_restart(kind: str, tmp_path: Path) -> None:
    """Timers computed from data are re-armed after a restart at the due times computed when they started, and the
    journal replays without divergence (replay recomputes the same values)."""
    from wfsub import replay

    store = reopenable(kind, tmp_path)
    same_node: dict[str, Any] = {"node_id": "n1"} if kind == "postgres" else {}  # the restarted node owns its cases
    clock = VirtualClock(start=T0)
    data = {"wait_for": 100, "until": "2027-01-15T09:00:00Z"}
    async with Substrate(store=store(), clock=clock, workflows={"w": FROM_DATA}, **same_node) as sub:
        handle = await sub.new_case("w", data, case_id="c")
        await clock.advance(0)
        assert [t.due for t in handle.status().timers] == [T0 + 100]
    clock = VirtualClock(start=T0 + 50)
    async with Substrate(store=store(), clock=clock, workflows={"w": FROM_DATA}, **same_node) as sub:
        await clock.advance(0)
        assert [t.due for t in sub.status("c").timers] == [T0 + 100]
        await clock.advance(50)
        assert [t.due for t in sub.status("c").timers] == [T0 + 3600]  # until=, not the changed wait_for
    clock = VirtualClock(start=T0 + 100)
    async with Substrate(store=store(), clock=clock, workflows={"w": FROM_DATA}, **same_node) as sub:
        await clock.advance(0)
        assert [t.due for t in sub.status("c").timers] == [T0 + 3600]
        await clock.advance(3500)
        assert await sub.await_case("c") == {"wait_for": 200, "until": data["until"], "woke": True}
        journal = await sub.journal("c")
    report = replay(FROM_DATA, journal)
    assert report.divergence is None and report.state == "done"
    assert [r.kind for r in journal] == ["start", "timer", "timer", "end"]


PARKED = {f"w{i}": seq(sleep(2 + i), task(lambda c: {"woke": True}, name="woke")) for i in range(5)}


@pytest.mark.parametrize("kind", ["memory", "sqlite", "postgres"])
@pytest.mark.parametrize("away", ["restart", "evicted"])
async def test_timers_of_parked_cases_fire_within_the_advance_that_passes_them(
    kind: str, away: str, tmp_path: Path
) -> None:
    """Five parked cases (restarted or evicted) due at 2..6 s all fire within one advance(10), though the first
    one brought back is still in memory, its row due, when the due-timer loop looks for the next due time."""
    store = reopenable(kind, tmp_path)
    same_node: dict[str, Any] = {"node_id": "n1"} if kind == "postgres" else {}
    evict: dict[str, Any] = {"evict_after": 0.5} if away == "evicted" else {}
    clock = VirtualClock()
    async with Substrate(store=store(), clock=clock, workflows=PARKED, **same_node, **evict) as sub:
        for i in range(5):
            await sub.new_case(f"w{i}", case_id=f"c{i}")
        await clock.advance(1)  # all parked (and, with evict_after, out of memory)
        if away == "evicted":
            assert sub.statistics().cases_in_memory == 0
            await clock.advance(9)
            assert [sub.status(f"c{i}").state for i in range(5)] == ["done"] * 5
            return
    clock = VirtualClock(start=1)
    async with Substrate(store=store(), clock=clock, workflows=PARKED, **same_node) as sub:
        await clock.advance(9)
        assert [sub.status(f"c{i}").state for i in range(5)] == ["done"] * 5
        assert [(await sub.journal(f"c{i}"))[1].time for i in range(5)] == [2.0, 3.0, 4.0, 5.0, 6.0]


def late(ctx: Any) -> dict[str, Any]:
    return {"late": ctx["error"]["message"]}


DEADLINES = seq(
    scope("approval", wait("approve", deadline=due_at), on_error=task(late, name="late")),
    defer({"go": task(lambda c: {"went": True}, name="went")}, deadline=lambda c: c["until"],
          on_timeout=task(lambda c: {"expired": True}, name="expired")),
)


@pytest.mark.parametrize("kind", ["none", "memory", "sqlite", "postgres"])
async def test_wait_and_defer_deadlines_from_data_hold_across_a_restart(kind: str, tmp_path: Path) -> None:
    """wait(deadline=fn) and defer(deadline=fn) arm a timer at the time the data names, keep it across a restart,
    time out there (the wait's WaitTimeout names its deadline) and replay without divergence."""
    from wfsub import replay

    store = reopenable(kind, tmp_path)
    same_node: dict[str, Any] = {"node_id": "n1"} if kind == "postgres" else {}
    clock = VirtualClock(start=T0)
    data = {"until": "2027-01-15T09:00:00Z"}
    async with Substrate(store=store(), clock=clock, workflows={"w": DEADLINES}, **same_node) as sub:
        handle = await sub.new_case("w", data, case_id="c")
        await clock.advance(0)
        assert [t.due for t in handle.status().timers] == [T0 + 3600]
        if kind in ("none", "memory"):
            await clock.advance(3599)
            assert not handle.done()
            await clock.advance(1)  # (the defer's deadline has passed when it parks: it times out at once)
            final = await handle.result()
            assert final["expired"] is True
            assert "wait('approve') saw no signal by its deadline 2027-01-15T09:00:00Z" in final["late"]
            return
    clock = VirtualClock(start=T0 + 1800)
    async with Substrate(store=store(), clock=clock, workflows={"w": DEADLINES}, **same_node) as sub:
        await clock.advance(0)
        assert [t.due for t in sub.status("c").timers] == [T0 + 3600]
        await clock.advance(1800)
        final = await sub.await_case("c")
        assert "wait('approve') saw no signal by its deadline 2027-01-15T09:00:00Z" in final["late"]
        assert final["expired"] is True
        journal = await sub.journal("c")
    report = replay(DEADLINES, journal)
    assert report.divergence is None and report.state == "done"


@pytest.mark.parametrize("kind", ["none", "memory", "sqlite", "postgres"])
async def test_a_due_time_further_than_the_longest_timer_fails_its_step_and_replays_the_same(
    kind: str, tmp_path: Path
) -> None:
    """sleep(until=fn) (and deadline=fn) more than 1e9 s (about 31 years) after the step starts fails the step
    naming the bound, as sleep(seconds) above it is refused; replay computes the same failure."""
    from wfsub import CaseFailed, replay

    wf = seq(sleep(until=due_at), task(lambda c: {"woke": True}, name="woke"))
    store = reopenable(kind, tmp_path)
    same_node: dict[str, Any] = {"node_id": "n1"} if kind == "postgres" else {}
    clock = VirtualClock(start=T0)
    async with Substrate(store=store(), clock=clock, workflows={"w": wf}, **same_node) as sub:
        far = await sub.new_case("w", {"until": "9999-01-01T00:00:00Z"}, case_id="far")
        await clock.advance(0)
        assert far.done()  # (a check, not a wait: without the bound the case sleeps for 8,000 years)
        with pytest.raises(CaseFailed, match=r"sleep until function due_at returned '9999-01-01T00:00:00Z', "
                                             r"2.5\d*e\+11 s after the step started: more than the longest timer "
                                             r"wfsub arms \(1e\+09 s, about 31 years\)"):
            await far.result()
        near = await sub.new_case("w", {"until": T0 + 1e9}, case_id="near")
        await clock.advance(0)
        assert [t.due for t in near.status().timers] == [T0 + 1e9]
        journal = [] if kind == "none" else await sub.journal("far")
    if journal:
        report = replay(wf, journal)
        assert report.divergence is None and report.state == "failed"

"""Clocks: the VirtualClock fires timers in deadline order and only when advanced; the real clock is real."""

from __future__ import annotations

import time

import anyio
import pytest

from wfsub import RealClock
from wfsub.testing import VirtualClock


async def test_virtual_sleepers_wake_in_deadline_order_only_when_advanced() -> None:
    """Sleepers wake in deadline order, each seeing now() == its deadline, and not before advance()."""
    clock = VirtualClock()
    woke: list[tuple[str, float]] = []

    async def sleeper(name: str, seconds: float) -> None:
        await clock.sleep(seconds)
        woke.append((name, clock.now()))

    async with anyio.create_task_group() as tg:
        for name, seconds in (("c", 3), ("a", 1), ("b", 2)):
            tg.start_soon(sleeper, name, seconds)
        await clock.advance(0)
        assert woke == []
        assert clock.pending_timers == 3
        assert clock.next_deadline() == 1
        await clock.advance(2.5)
        assert woke == [("a", 1.0), ("b", 2.0)]
        assert clock.now() == 2.5
        await clock.advance(10)
    assert woke == [("a", 1.0), ("b", 2.0), ("c", 3.0)]
    assert clock.now() == 12.5


async def test_timers_armed_while_advancing_fire_in_the_same_window() -> None:
    """A sleep started by a woken task fires within the same advance() when it falls due inside the window."""
    clock = VirtualClock()
    stamps: list[float] = []

    async def twice() -> None:
        await clock.sleep(1)
        stamps.append(clock.now())
        await clock.sleep(1)
        stamps.append(clock.now())

    async with anyio.create_task_group() as tg:
        tg.start_soon(twice)
        await clock.advance(2)
    assert stamps == [1.0, 2.0]


async def test_deadline_scope_cancels_at_its_deadline() -> None:
    """deadline_scope(s) is cancelled once s seconds of the clock pass; cancelled_caught tells so."""
    clock = VirtualClock(start=100)
    outcome: list[bool] = []

    async def guarded() -> None:
        with clock.deadline_scope(5) as scope:
            await anyio.sleep_forever()
        outcome.append(scope.cancelled_caught)

    async with anyio.create_task_group() as tg:
        tg.start_soon(guarded)
        await clock.advance(4.9)
        assert outcome == []
        await clock.advance(0.1)
    assert outcome == [True]
    assert clock.now() == 105


async def test_virtual_clock_refuses_to_go_backwards() -> None:
    """advance() with a negative amount raises ValueError."""
    with pytest.raises(ValueError, match="backwards"):
        await VirtualClock().advance(-1)


async def test_real_clock_sleeps_and_times_out() -> None:
    """RealClock.now() is wall-clock time; its deadline scope cancels for real."""
    clock = RealClock()
    assert abs(clock.now() - time.time()) < 1
    with clock.deadline_scope(0.01) as scope:
        await clock.sleep(5)
    assert scope.cancelled_caught

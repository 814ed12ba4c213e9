"""Timers from data through the runtime: sleep(fn), sleep(until=fn) and timeout=fn on wait and defer fire on the
Substrate's clock at the time the case data gave; a bad value fails the case at the node."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import anyio
import pytest

from wfsub import CaseFailed, Retry, StepFailed, Substrate, WaitTimeout, defer, effect, seq, sleep, task, wait
from wfsub.testing import VirtualClock

from ..harness import running

T0 = 1_800_000_000.0  # a VirtualClock starting here reads as epoch time (2027-01-15T08:00:00Z)


def delay(ctx: Mapping[str, Any]) -> Any:
    return ctx["delay"]


def deadline(ctx: Mapping[str, Any]) -> Any:
    return ctx["deadline"]


def woke(ctx: Mapping[str, Any]) -> dict[str, Any]:
    return {"woke": True}


async def test_sleep_seconds_from_data_fires_after_that_many_seconds() -> None:
    """sleep(fn) parks the case for fn(ctx) seconds of the clock, not a moment less."""
    async with running() as (sub, clock, _):
        handle = await sub.new_case(seq(sleep(delay), task(woke)), {"delay": 30})
        await clock.advance(29.5)
        assert handle.status().state == "waiting_timer" and [t.due for t in handle.status().timers] == [30.0]
        await clock.advance(0.5)
        assert await handle.result() == {"delay": 30, "woke": True}


async def test_sleep_until_an_iso_time_fires_at_that_time() -> None:
    """sleep(until=fn) with an ISO 8601 time with a timezone fires when the clock reaches that instant."""
    clock = VirtualClock(start=T0)
    async with Substrate(clock=clock) as sub:
        handle = await sub.new_case(seq(sleep(until=deadline), task(woke)), {"deadline": "2027-01-15T10:00:00+01:00"})
        await clock.advance(3599)
        assert [t.due for t in handle.status().timers] == [T0 + 3600]
        await clock.advance(1)
        assert (await handle.result())["woke"] is True


async def test_sleep_until_a_past_time_fires_at_once() -> None:
    """A time already passed fires at the next advance, without waiting."""
    async with running() as (sub, clock, _):
        handle = await sub.new_case(seq(sleep(until=deadline), task(woke)), {"deadline": -5})
        await clock.advance(0)
        assert (await handle.result())["woke"] is True


async def test_wait_and_defer_timeouts_from_data_fire_at_their_time() -> None:
    """timeout=fn on wait fails it after fn(ctx) seconds; on defer it takes the timeout branch."""
    async with running() as (sub, clock, _):
        waiting = await sub.new_case(wait("approved", timeout=delay), {"delay": 10})
        choosing = await sub.new_case(
            defer({"approved": task(woke)}, timeout=delay, on_timeout=task(lambda c: {"expired": True})), {"delay": 20}
        )
        await clock.advance(10)
        with pytest.raises(CaseFailed) as caught:
            await waiting.result()
        assert isinstance(caught.value.__cause__, WaitTimeout) and "timeout of 10s" in str(caught.value.__cause__)
        assert not choosing.done()
        await clock.advance(10)
        assert (await choosing.result())["expired"] is True


async def test_a_naive_time_fails_the_case_at_the_node_with_the_fix() -> None:
    """A naive ISO time fails the case at the sleep's path, the message saying to add a timezone."""
    async with running() as (sub, clock, _):
        handle = await sub.new_case(seq(task(woke), sleep(until=deadline)), {"deadline": "2027-01-15T09:00:00"})
        with pytest.raises(CaseFailed) as caught:
            await handle.result()
    cause = caught.value.__cause__
    assert isinstance(cause, StepFailed) and cause.path == "seq[1].sleep"
    assert "a time without a timezone (add 'Z' or an offset such as '+00:00')" in str(cause)
    assert handle.status().failure is not None and handle.status().failure.path == "seq[1].sleep"


def test_on_trio_timers_from_data_and_unlimited_retries() -> None:
    """On trio: sleep(fn), sleep(until=fn), a defer timeout from data and Retry(max_attempts=None) all work."""

    async def main() -> None:
        calls: list[float] = []
        clock = VirtualClock(start=T0)

        async def flaky(ctx: Any) -> dict[str, Any]:
            calls.append(clock.now())
            if len(calls) < 5:
                raise ConnectionError("busy")
            return {"paid": True}

        wf = seq(
            sleep(delay),
            sleep(until=deadline),
            defer({"go": task(woke)}, timeout=delay, on_timeout=task(lambda c: {"expired": True})),
            effect(flaky, retry=Retry(None, initial=1, max_elapsed=60)),
        )
        async with Substrate(clock=clock) as sub:
            handle = await sub.new_case(wf, {"delay": 10, "deadline": "2027-01-15T08:01:00Z"})
            await clock.advance(10)
            assert handle.status().timers[0].due == T0 + 60
            await clock.advance(50 + 10 + 100)
            assert (await handle.result())["paid"] is True
        assert calls[0] == T0 + 70 and len(calls) == 5

    anyio.run(main, backend="trio")

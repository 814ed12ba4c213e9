"""Heartbeats through the runtime, on asyncio and trio: `wfsub.heartbeat()`, `heartbeat_timeout=`, what the next
attempt and the status see. Time is a VirtualClock: the effects wait on it, nothing sleeps for real."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import anyio
import pytest

import wfsub
from wfsub import CaseFailed, HeartbeatTimeout, Retry, effect, effect_info, heartbeat, seq, task

from ..harness import running


def test_heartbeat_outside_an_effect_says_where_to_call_it() -> None:
    """heartbeat() outside an effect raises RuntimeError naming effect() as the place to call it from."""
    with pytest.raises(RuntimeError, match=r"heartbeat\(\) is called outside an effect.*given to effect\(\)"):
        heartbeat({"x": 1})


async def test_details_that_are_not_json_fail_the_effect_with_the_path_of_the_bad_value() -> None:
    """heartbeat(details) with a datetime inside raises TypeError naming the effect, its path and the bad value."""
    async def poll(ctx: Any) -> None:
        heartbeat({"since": datetime(2026, 1, 1)})

    async with running() as (sub, _, _):
        handle = await sub.new_case(effect(poll, name="poll"))
        with pytest.raises(CaseFailed) as caught:
            await handle.result()
    cause = caught.value.__cause__
    assert isinstance(cause, TypeError)
    assert "heartbeat details of effect 'poll' at effect are not JSON" in str(cause)
    assert 'details["since"]: datetime is not JSON' in str(cause)


def watched_poller(clock: Any, beats: int, every: float, log: list[Any]) -> Any:
    """An effect that sends `beats` heartbeats `every` seconds apart (attempt 1 then hangs forever), recording what
    `effect_info().heartbeat` showed each attempt."""
    async def poll(ctx: Any) -> dict[str, Any]:
        info = effect_info()
        log.append((info.attempt, info.heartbeat))
        start = (info.heartbeat or {}).get("page", 0)
        for page in range(start + 1, start + beats + 1):
            await clock.sleep(every)
            heartbeat({"page": page})
        if info.attempt == 1:
            await anyio.sleep_forever()  # stuck: only the heartbeat timeout notices
        return {"pages": start + beats}

    return poll


async def scenario_timeout_then_retry_resumes_from_the_heartbeat() -> None:
    async with running() as (sub, clock, sink):
        log: list[Any] = []
        wf = effect(watched_poller(clock, 3, 1.0, log), name="poll", heartbeat_timeout=2.0, retry=Retry(2, initial=1))
        handle = await sub.new_case(wf)
        await clock.advance(3)  # three heartbeats, one a second: no timeout
        status = handle.status()
        [running_effect] = status.effects
        assert running_effect.last_heartbeat is not None
        assert (running_effect.last_heartbeat.details, running_effect.last_heartbeat.at) == ({"page": 3}, 3.0)
        assert running_effect.attempt == 1
        await clock.advance(1.5)
        assert handle.status().effects[0].attempt == 1  # 1.5 s since the last heartbeat: still within 2 s
        await clock.advance(0.5)  # 2 s without a heartbeat: cancelled, failed, retried after 1 s
        await clock.advance(1)
        assert handle.status().effects[0].attempt == 2
        await clock.advance(3)
        assert await handle.result() == {"pages": 6}
        retries = [e for e in sink.for_case(handle.case_id) if e.kind == "effect_retry"]
    assert log == [(1, None), (2, {"page": 3})]
    assert [r.detail["type"] for r in retries] == ["HeartbeatTimeout"]
    assert "sent no heartbeat for 2s (its heartbeat_timeout) in attempt 1" in retries[0].detail["error"]


async def test_a_silent_attempt_fails_with_heartbeat_timeout_and_the_retry_resumes_from_its_details() -> None:
    """An attempt that stops heartbeating is cancelled after heartbeat_timeout (not before) and retried; the retry
    reads the last heartbeat's details through effect_info().heartbeat; status shows the newest heartbeat."""
    await scenario_timeout_then_retry_resumes_from_the_heartbeat()


def test_heartbeat_timeout_and_retry_on_trio() -> None:
    """On trio: the same heartbeat timeout, retry and resumed details as on asyncio."""
    anyio.run(scenario_timeout_then_retry_resumes_from_the_heartbeat, backend="trio")


async def test_without_retry_a_heartbeat_timeout_fails_the_case_with_the_last_details() -> None:
    """No retry policy: the case fails with HeartbeatTimeout as the cause, carrying the attempt's last details."""
    async with running() as (sub, clock, _):
        wf = effect(watched_poller(clock, 1, 1.0, []), name="poll", heartbeat_timeout=5.0)
        handle = await sub.new_case(wf)
        await clock.advance(5.5)
        assert not handle.done()  # 4.5 s since the heartbeat at 1 s
        await clock.advance(0.5)
        with pytest.raises(CaseFailed) as caught:
            await handle.result()
    cause = caught.value.__cause__
    assert isinstance(cause, HeartbeatTimeout) and isinstance(cause, TimeoutError)
    assert (cause.timeout, cause.attempt, cause.details) == (5.0, 1, {"page": 1})


async def test_heartbeat_timeout_can_be_made_non_retryable() -> None:
    """Retry(non_retryable=(HeartbeatTimeout,)) fails at the first silent attempt, without a second one."""
    log: list[Any] = []
    async with running() as (sub, clock, _):
        wf = effect(watched_poller(clock, 0, 1.0, log), heartbeat_timeout=1.0,
                    retry=Retry(5, initial=1, non_retryable=(HeartbeatTimeout,)))
        handle = await sub.new_case(wf)
        await clock.advance(1)
        with pytest.raises(CaseFailed, match="HeartbeatTimeout"):
            await handle.result()
    assert log == [(1, None)]


async def test_an_effect_that_finishes_without_heartbeats_is_untouched_by_the_timeout() -> None:
    """heartbeat_timeout bounds silence, not the effect: one that returns in time needs no heartbeat; and an effect
    without heartbeat_timeout may heartbeat freely (status shows it, nothing times out)."""
    async def quick(ctx: Any) -> dict[str, Any]:
        return {"quick": True}

    async with running() as (sub, clock, _):
        async def chatty(ctx: Any) -> dict[str, Any]:
            for i in range(3):
                heartbeat(i)
                await clock.sleep(100)
            return {"chatty": True}

        handle = await sub.new_case(seq(effect(quick, heartbeat_timeout=1.0), effect(chatty)))
        await clock.advance(150)
        beat = handle.status().effects[0].last_heartbeat
        assert beat is not None and (beat.details, beat.at, beat.attempt) == (1, 100.0, 1)
        await clock.advance(200)
        assert await handle.result() == {"quick": True, "chatty": True}


async def test_details_are_copied_when_sent() -> None:
    """Changing the details object after heartbeat() does not change the heartbeat kept."""
    async with running() as (sub, clock, _):
        async def mutate(ctx: Any) -> None:
            details = {"items": [1]}
            heartbeat(details)
            details["items"].append(2)
            await clock.sleep(10)

        handle = await sub.new_case(seq(effect(mutate), task(lambda c: None)))
        await clock.advance(1)
        beat = handle.status().effects[0].last_heartbeat
        assert beat is not None and beat.details == {"items": [1]}
        await clock.advance(10)
        await handle.result()


def test_validate_refuses_a_bad_heartbeat_timeout() -> None:
    """validate reports a heartbeat_timeout that is not a positive number, at the effect's path, with the fix."""
    async def f(ctx: Any) -> None:
        return None

    for bad in (0, -1, "5", True, float("nan")):
        issues = wfsub.validate(seq(task(lambda c: None), effect(f, heartbeat_timeout=bad)))
        assert [i.path for i in issues] == ["seq[1].effect"], bad
        assert "heartbeat_timeout" in issues[0].message and "positive number of seconds" in issues[0].message
    assert wfsub.validate(effect(f, heartbeat_timeout=2e9))[0].message.startswith("heartbeat_timeout=2000000000.0 is")

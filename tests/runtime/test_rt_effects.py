"""Effects: concurrency, per-attempt timeouts and Retry backoff on the injected clock, failure, withdrawal."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from wfsub import CaseFailed, Retry, effect, par, scope, seq, sleep, task, wait

from ..harness import Recorder, running, trace_of


async def test_retry_backs_off_on_the_clock_and_succeeds() -> None:
    """A failing effect is retried after initial * multiplier**(i-1) seconds of the clock, then succeeds."""
    async with running() as (sub, clock, _):
        attempts: list[float] = []

        async def flaky(ctx: Any) -> dict[str, Any]:
            attempts.append(clock.now())
            if len(attempts) < 3:
                raise ConnectionError("gateway busy")
            return {"paid": True}

        wf = effect(flaky, retry=Retry(max_attempts=3, initial=1.0, multiplier=2.0, max_interval=30))
        handle = await sub.new_case(wf)
        await clock.advance(1)
        assert attempts == [0.0, 1.0]
        await clock.advance(2)
        assert await handle.result() == {"paid": True}
    assert attempts == [0.0, 1.0, 3.0]


async def test_retries_exhausted_fail_the_case_with_the_original_cause() -> None:
    """After the last attempt the case fails: CaseFailed names case and path; __cause__ is the effect's error."""
    async with running() as (sub, clock, _):
        calls = 0

        async def broken(ctx: Any) -> None:
            nonlocal calls
            calls += 1
            raise ValueError(f"card declined #{calls}")

        wf = seq(task(lambda c: {"ok": 1}), effect(broken, retry=Retry(max_attempts=2, initial=5)))
        handle = await sub.new_case(wf, case_id="order-7")
        await clock.advance(5)
        with pytest.raises(CaseFailed) as info:
            await handle.result()
        status = handle.status()
    assert calls == 2
    err = info.value
    assert isinstance(err.__cause__, ValueError)
    assert str(err.__cause__) == "card declined #2"
    assert "'order-7'" in str(err)
    assert "seq[1].effect" in str(err)
    assert "broken" in str(err)
    assert status.state == "failed"
    assert status.error == str(err)


async def test_no_retry_means_one_attempt() -> None:
    """Without retry= an effect gets exactly one attempt."""
    calls = 0

    async def once(ctx: Any) -> None:
        nonlocal calls
        calls += 1
        raise RuntimeError("boom")

    async with running() as (sub, _, _):
        with pytest.raises(CaseFailed, match="RuntimeError: boom"):
            await (await sub.new_case(effect(once))).result()
    assert calls == 1


async def test_attempt_timeout_runs_on_the_clock_and_is_retried() -> None:
    """`timeout=` bounds each attempt on the injected clock; timed-out attempts are retried, then fail."""
    async with running() as (sub, clock, _):
        rec = Recorder(clock)
        wf = rec.effect("lookup", hang=True, timeout=5, retry=Retry(2, initial=1))
        handle = await sub.new_case(wf)
        await clock.advance(5)
        assert rec.calls == ["lookup"]
        await clock.advance(1)
        assert rec.calls == ["lookup", "lookup"]
        await clock.advance(5)
        with pytest.raises(CaseFailed, match="timeout") as info:
            await handle.result()
    assert isinstance(info.value.__cause__, TimeoutError)
    assert rec.cancelled == ["lookup", "lookup"]


async def test_effect_returning_a_non_mapping_fails_at_once() -> None:
    """An effect must return a Mapping or None; anything else fails the case without retries."""
    calls = 0

    async def wrong(ctx: Any) -> Any:
        nonlocal calls
        calls += 1
        return 42

    async with running() as (sub, _, _):
        with pytest.raises(CaseFailed, match="returned int: an effect must return a Mapping") as info:
            await (await sub.new_case(effect(wrong, retry=Retry(3)))).result()
    assert calls == 1
    assert isinstance(info.value.__cause__, TypeError)


async def test_effect_sees_a_read_only_ctx() -> None:
    """The effect's ctx is the token's data view; writing to it raises, returning updates works."""
    seen: dict[str, Any] = {}

    async def peek(ctx: Any) -> dict[str, Any]:
        seen.update(ctx)
        with pytest.raises(TypeError):
            ctx["x"] = 2
        return {"y": ctx["x"] + 1}

    async with running() as (sub, _, _):
        assert await (await sub.new_case(effect(peek), {"x": 1})).result() == {"x": 1, "y": 2}
    assert seen == {"x": 1}


async def test_effects_of_a_case_run_concurrently() -> None:
    """Effects of parallel branches are in flight together in the case's task group."""
    async with running() as (sub, clock, _):
        rec = Recorder(clock)
        handle = await sub.new_case(par(*(rec.effect(f"e{i}", delay=1) for i in range(5))))
        await clock.advance(0)
        assert (rec.active, sorted(rec.calls)) == (5, [f"e{i}" for i in range(5)])
        assert handle.status().effects_pending == 5
        await clock.advance(1)
        assert await handle.result() == {f"e{i}": True for i in range(5)}
        assert clock.now() == 1.0


async def test_result_of_a_withdrawn_effect_is_discarded_and_traced() -> None:
    """A result that arrives after its token was withdrawn is dropped, and the trace says so."""
    gate = anyio.Event()

    async def slow(ctx: Any) -> dict[str, Any]:
        await gate.wait()
        return {"late": True}

    rec = Recorder()
    async with running() as (sub, clock, sink):
        wf = seq(scope("s", effect(slow, name="slow"), on_cancel=rec.step("gave_up", {"gave_up": True})), sleep(1))
        handle = await sub.new_case(wf)
        await clock.advance(0)
        gate.set()  # the effect finishes in the same round as the region is cancelled
        await sub.cancel_region(handle.case_id, "s")
        await clock.advance(1)
        result = await handle.result()
        await sink.wait_for("case_done", case_id=handle.case_id)
    assert (result, rec.steps) == ({"gave_up": True}, ["gave_up"])
    events = sink.for_case(handle.case_id)
    ((_, _, requested),) = trace_of(events, "effect_requested")
    assert trace_of(events, "effect_discarded") == [("effect_discarded", "", {"effect_id": requested["effect_id"]})]


async def test_scripted_effect_plays_its_outcomes_in_order() -> None:
    """testing.ScriptedEffect raises and returns its scripted outcomes in order and records each ctx."""
    from wfsub.testing import ScriptedEffect

    charge = ScriptedEffect(ConnectionError("down"), ConnectionError("still down"), {"charged": 10}, name="charge")
    async with running() as (sub, clock, _):
        handle = await sub.new_case(effect(charge, retry=Retry(3, initial=1)), {"amount": 10})
        await clock.advance(3)
        assert await handle.result() == {"amount": 10, "charged": 10}
    assert charge.calls == [{"amount": 10}] * 3
    with pytest.raises(TypeError, match="outcomes are mappings"):
        ScriptedEffect(42)  # type: ignore[arg-type]


async def test_effect_withdrawn_in_the_burst_that_requested_it_never_starts() -> None:
    """A cancelling join that fires in the same burst as a branch's effect request: the effect never runs."""
    rec = Recorder()
    branches = (rec.effect("charge", {"charged": True}), rec.step("quick", {"quick": True}))
    wf = seq(par(*branches, join="first", cancel_remaining=True), wait("go"))
    async with running() as (sub, _, _):
        handle = await sub.new_case(wf)
        await handle.signal("go")
        assert await handle.result() == {"quick": True, "go": None}
    assert (rec.calls, rec.cancelled, rec.steps) == ([], [], ["quick"])


async def test_retry_without_a_count_limit_retries_until_success() -> None:
    """Retry(max_attempts=None) keeps retrying a failing effect, backing off on the clock, until it succeeds."""
    async with running() as (sub, clock, _):
        attempts: list[float] = []

        async def flaky(ctx: Any) -> dict[str, Any]:
            attempts.append(clock.now())
            if len(attempts) < 12:
                raise ConnectionError("gateway busy")
            return {"paid": True}

        wf = effect(flaky, retry=Retry(max_attempts=None, initial=1.0, multiplier=2.0, max_interval=4.0))
        handle = await sub.new_case(wf)
        await clock.advance(1000)
        assert await handle.result() == {"paid": True}
    assert attempts[:5] == [0.0, 1.0, 3.0, 7.0, 11.0]  # 1, 2, 4, then capped at 4
    assert len(attempts) == 12


async def test_retry_max_elapsed_bounds_unlimited_retries() -> None:
    """With max_elapsed, no attempt starts later than that after the first one started; the last error is the case's."""
    async with running() as (sub, clock, _):
        attempts: list[float] = []

        async def broken(ctx: Any) -> None:
            attempts.append(clock.now())
            raise ConnectionError(f"down at {clock.now():g}")

        wf = effect(broken, retry=Retry(max_attempts=None, initial=2.0, multiplier=1.0, max_elapsed=7.0))
        handle = await sub.new_case(wf)
        await clock.advance(100)
        with pytest.raises(CaseFailed) as caught:
            await handle.result()
    assert attempts == [0.0, 2.0, 4.0, 6.0]  # the next one would start at 8 > 7
    assert str(caught.value.__cause__) == "down at 6"


async def test_retry_count_and_elapsed_bound_together_stop_at_the_first_reached() -> None:
    """max_attempts and max_elapsed together: whichever is reached first ends the retries."""
    async with running() as (sub, clock, _):
        attempts: list[float] = []

        async def broken(ctx: Any) -> None:
            attempts.append(clock.now())
            raise ConnectionError("down")

        handle = await sub.new_case(effect(broken, retry=Retry(max_attempts=3, initial=1.0, max_elapsed=100.0)))
        await clock.advance(100)
        with pytest.raises(CaseFailed):
            await handle.result()
    assert attempts == [0.0, 1.0, 3.0]


def test_retry_arguments_are_validated_with_their_values_and_the_fix() -> None:
    """validate reports each bad Retry argument at the effect's path, with the value given and what to write."""
    from wfsub import validate

    async def charge(ctx: Any) -> None:
        return None

    def messages(retry: Any) -> list[str]:
        return [f"{i.path}: {i.message}" for i in validate(seq(task(lambda c: None), effect(charge, retry=retry)))]

    assert messages(Retry(max_attempts=None, initial=1.0)) == []
    assert messages(Retry(max_attempts=None, max_elapsed=60)) == []
    assert messages(Retry(max_attempts=0)) == [
        "seq[1].effect: Retry.max_attempts=0 must be an int >= 1, or None to retry without a count limit"
    ]
    assert messages(Retry(max_attempts=None, max_elapsed=-1)) == [
        "seq[1].effect: Retry.max_elapsed=-1 must be a positive number of seconds, or None for no time limit"
    ]
    assert messages(Retry(initial=float("nan"), multiplier=-2)) == [
        "seq[1].effect: Retry initial=nan, multiplier=-2: initial, multiplier and max_interval must be non-negative "
        "finite numbers"
    ]
    (forever,) = messages(Retry(max_attempts=None, initial=0))
    assert "retry a failing effect forever without a pause" in forever and "max_elapsed=seconds" in forever
    assert "Retry.max_elapsed=10000000000.0 is longer" in messages(Retry(max_elapsed=1e10))[0]
    assert messages(Retry(max_attempts=True)) == [  # type: ignore[arg-type]
        "seq[1].effect: Retry.max_attempts=True must be an int >= 1, or None to retry without a count limit"
    ]


async def test_a_retry_whose_initial_wait_is_above_max_interval_is_refused_at_its_path() -> None:
    """Retry(initial=60) under the default max_interval=30 would wait 30 s without a word: validate refuses it at
    the effect's path, saying both values and the fix, and so does new_case; initial == max_interval is fine."""
    from wfsub import InvalidWorkflow, Substrate, validate

    async def charge(ctx: Any) -> None:
        return None

    flow = seq(task(lambda c: None), scope("pay", effect(charge, retry=Retry(3, initial=60))))
    assert [f"{i.path}: {i.message}" for i in validate(flow)] == [
        "seq[1].scope.effect: Retry(initial=60) is above max_interval=30.0, which caps every wait between attempts "
        "(30 s unless given): the first retry would wait max_interval, not initial; give max_interval >= 60, or a "
        "smaller initial"
    ]
    assert validate(effect(charge, retry=Retry(3, initial=60, max_interval=60))) == []
    async with Substrate() as sub:
        with pytest.raises(InvalidWorkflow, match=r"seq\[1\]\.scope\.effect: Retry\(initial=60\) is above"):
            await sub.new_case(flow)


def test_retry_repr_and_fingerprint_leave_out_an_unset_max_elapsed() -> None:
    """A Retry written without max_elapsed reads (and fingerprints) as it did before the field existed."""
    from wfsub import compile as compile_

    assert repr(Retry(3)) == "Retry(max_attempts=3, initial=0.1, multiplier=2.0, max_interval=30.0, non_retryable=())"
    assert repr(Retry(None, max_elapsed=5)).endswith("non_retryable=(), max_elapsed=5)")

    async def charge(ctx: Any) -> None:
        return None

    bounded = compile_(effect(charge, retry=Retry(3, max_elapsed=5))).fingerprint
    assert compile_(effect(charge, retry=Retry(3))).fingerprint != bounded

"""Faults found by attacking the runtime through its public API, one regression test (or more) each.

A case's failure never disturbs another case or the Substrate, and nothing a user gave is lost: each test
below pins one way that promise was once broken.
"""

from __future__ import annotations

import asyncio
import gc
import math
import threading
import tracemalloc
from collections.abc import Mapping
from typing import Any

import anyio
import pytest
import structlog

from wfsub import (
    CallbackSink,
    CaseCancelled,
    CaseFailed,
    MemorySink,
    Retry,
    Substrate,
    call,
    effect,
    mi,
    par,
    scope,
    seq,
    sleep,
    task,
    validate,
    wait,
)
from wfsub.testing import CapturingSink, EventsDropped, ScriptedEffect, VirtualClock


def ok(ctx: Mapping[str, Any]) -> dict[str, Any]:
    return {"ok": True}


# -- 1. a CancelledError nobody issued is a failed attempt, not a cancellation -------------------------------


async def awaits_a_cancelled_future(ctx: Mapping[str, Any]) -> None:
    future = asyncio.get_running_loop().create_future()
    future.cancel()
    await future  # raises CancelledError although nothing cancelled this effect


async def test_a_stray_cancelled_error_is_a_failed_attempt_that_the_retry_policy_handles() -> None:
    """An effect re-raising a stray CancelledError is a failed attempt its retry policy handles; the case ends done."""
    # Its siblings and the Substrate carry on; the case does not end 'cancelled: substrate closed'.
    calls: list[str] = []

    async def flaky(ctx: Mapping[str, Any]) -> dict[str, Any]:
        calls.append("flaky")
        if len(calls) == 1:
            await awaits_a_cancelled_future(ctx)
        return {"flaky": True}

    sibling_cancelled = []

    async def sibling(ctx: Mapping[str, Any]) -> dict[str, Any]:
        try:
            await anyio.sleep(0.01)
        except anyio.get_cancelled_exc_class():
            sibling_cancelled.append(True)
            raise
        return {"sibling": True}

    wf = par(effect(flaky, retry=Retry(2, initial=0)), effect(sibling))
    async with Substrate() as sub:
        result = await (await sub.new_case(wf)).result()
        assert result == {"flaky": True, "sibling": True}
        assert (calls, sibling_cancelled) == (["flaky", "flaky"], [])
        assert (await (await sub.new_case(task(ok))).result()) == {"ok": True}


async def test_a_stray_cancelled_error_after_the_last_attempt_fails_the_case_with_its_own_error() -> None:
    """When every attempt raises a stray CancelledError the case fails (CaseFailed), naming what happened."""
    async with Substrate() as sub:
        handle = await sub.new_case(effect(awaits_a_cancelled_future, retry=Retry(2, initial=0)))
        with pytest.raises(CaseFailed, match="nothing cancelled it") as info:
            await handle.result()
        assert isinstance(info.value.__cause__.__cause__, asyncio.CancelledError)  # type: ignore[union-attr]


# -- 2. trace events are dropped only where a sink is truly slower --------------------------------------------


async def test_many_cases_started_in_a_loop_lose_no_trace_events_at_default_settings() -> None:
    """12,000 one-task cases started without yielding deliver every event to a MemorySink."""
    sink = MemorySink()
    async with Substrate(sinks=[sink], retain_ended=12_000) as sub:
        handles = [await sub.new_case(task(ok)) for _ in range(12_000)]
        for handle in handles:
            await handle.result()
        with anyio.fail_after(10):
            while len(sink) < sub.statistics().trace_events:
                await anyio.lowlevel.checkpoint()
        stats = sub.statistics()
    assert stats.trace_dropped == 0
    assert len(sink) == stats.trace_events == 3 * 12_000


async def test_a_waiter_on_a_sink_that_lost_events_is_told_instead_of_hanging() -> None:
    """CapturingSink.wait_for raises EventsDropped when events meant for it were dropped."""
    sink = CapturingSink()
    release = anyio.Event()
    original = sink.write

    async def slow_write(events: Any) -> None:
        await release.wait()
        await original(events)

    sink.write = slow_write  # type: ignore[method-assign]
    with structlog.testing.capture_logs():
        async with Substrate(sinks=[sink], trace_buffer=1) as sub:
            for _ in range(20):  # each case in its own round, so its batch reaches the sink on its own
                await (await sub.new_case(task(ok))).result()
            with anyio.fail_after(5), pytest.raises(EventsDropped, match="dropped"):
                await sink.wait_for("case_done", count=20)
            release.set()
    assert sink.dropped_events > 0


# -- 4. a huge mi is refused before allocating, and a big one never freezes the other cases ---------------


async def test_an_mi_beyond_the_instance_limit_fails_its_case_before_allocating() -> None:
    """count=10**9 fails at the mi with the limit named; almost nothing is allocated; other cases go on."""
    gc.collect()
    tracemalloc.start()
    try:
        async with Substrate() as sub:
            handle = await sub.new_case(mi(task(ok), count=lambda c: 10**9))
            with pytest.raises(CaseFailed, match=r"1,000,000,000 instances, more than the limit of 100,000"):
                await handle.result()
            _, peak = tracemalloc.get_traced_memory()
            assert await (await sub.new_case(task(ok))).result() == {"ok": True}
    finally:
        tracemalloc.stop()
    assert peak < 20 * 2**20


async def test_a_big_mi_starts_its_instances_a_burst_at_a_time_while_other_cases_answer() -> None:
    """A 200,000-instance mi spawns a burst at a time: a signal to another case round-trips before it ends."""
    # The event loop was never held for the whole spawn (max= raises the instance limit).
    async with Substrate(trace_level="none") as sub:
        big = await sub.new_case(mi(task(ok), count=200_000, max=200_000, collect="outs"))
        ping = await sub.new_case(seq(wait("ping"), task(ok)))
        await ping.signal("ping")
        assert await ping.result() == {"ok": True, "ping": None}
        assert not big.status().ended
        assert len((await big.result())["outs"]) == 200_000


async def test_the_substrate_instance_limit_is_configurable() -> None:
    """Substrate(max_instances=n) refuses an mi past n, and add_instances past it is rejected."""
    async with Substrate(max_instances=3) as sub:
        with pytest.raises(CaseFailed, match="more than the limit of 3"):
            await (await sub.new_case(mi(task(ok), count=4))).result()
        assert len((await (await sub.new_case(mi(task(ok), count=3, collect="o"))).result())["o"]) == 3


# -- 5. a retained failure keeps its story, not its frames ----------------------------------------------------


async def test_failed_cases_do_not_pin_the_frames_of_the_failing_effect() -> None:
    """Failed cases do not pin the failing effect's frames; the failure keeps type, message, path and traceback."""
    # 500 failed effects that each held 1 MiB leave next to nothing resident.

    async def heavy(ctx: Mapping[str, Any]) -> None:
        ballast = bytearray(2**20)
        raise RuntimeError(f"out of luck with {len(ballast)} bytes")

    async with Substrate(retain_ended=1_000) as sub:
        gc.collect()
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            handles = [await sub.new_case(effect(heavy)) for _ in range(500)]
            for handle in handles:
                with pytest.raises(CaseFailed):
                    await handle.result()
            gc.collect()
            kept = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
        with pytest.raises(CaseFailed, match="out of luck") as info:
            await handles[0].result()
    assert kept < 50 * 2**20, f"{kept / 2**20:.0f} MiB kept by 500 failed cases"
    assert info.value.__cause__ is not None and info.value.__cause__.__traceback__ is None
    assert info.value.traceback is not None and "in heavy" in info.value.traceback
    assert info.value.path == "effect"


# -- 6. a steep backoff never overflows --------------------------------------------------------------------------


def test_retry_delay_is_capped_before_it_can_overflow() -> None:
    """Retry.delay of a huge attempt number or a steep multiplier is max_interval, never OverflowError."""
    assert Retry(2000, 0.1, 2.0, 30).delay(1025) == 30
    assert Retry(3, 1.0, 1e308, 5).delay(3) == 5
    assert Retry(3, 0.0, 2.0, 5).delay(10**6) == 0
    assert Retry(5, 0.5, 2.0, 30).delay(2) == 1.0


async def test_a_steep_multiplier_retries_and_fails_with_the_effects_own_error() -> None:
    """An effect retried with a multiplier that would overflow still retries, then fails with its own error."""
    clock = VirtualClock()
    flaky = ScriptedEffect(ConnectionError("gateway down"), name="flaky")
    async with Substrate(clock=clock) as sub:
        handle = await sub.new_case(effect(flaky, retry=Retry(4, initial=1, multiplier=1e300, max_interval=2)))
        for _ in range(4):
            await clock.advance(2)
        with pytest.raises(CaseFailed) as info:
            await handle.result()
    assert isinstance(info.value.__cause__, ConnectionError) and len(flaky.calls) == 4


# -- 7. the library is validated per workflow, as far as the workflow reaches --------------------------------


async def test_library_workflows_are_checked_on_their_own_and_only_when_reachable() -> None:
    """Two library entries with a region 'payment' each, and a broken entry nobody calls, start cases fine."""
    library = {
        "charge": scope("payment", task(lambda c: {"charged": True})),
        "refund": mi(task(ok), count=1, name="payment"),
        "broken": seq(),
    }
    async with Substrate(library=library) as sub:
        assert await (await sub.new_case(seq(call("charge"), call("refund")))).result() == {"charged": True}


# -- 8. a sink given twice gets each event once ---------------------------------------------------------------


async def test_tracing_a_case_into_a_sink_the_substrate_already_has_delivers_each_event_once() -> None:
    """trace(case_id, level, sink=S) with S among the Substrate's sinks does not duplicate events."""
    sink = CapturingSink()
    async with Substrate(sinks=[sink]) as sub:
        handle = await sub.new_case(seq(wait("go"), task(ok)))
        sub.trace(handle.case_id, "min", sink=sink)
        await handle.signal("go")
        await handle.result()
        events = await sink.wait_for("case_done", case_id=handle.case_id)
    seqs = [e.seq for e in sink.for_case(handle.case_id)]
    assert len(events) == 1 and len(seqs) == len(set(seqs))


# -- 9. cancel right after new_case stops everything ---------------------------------------------------------


async def test_cancel_right_after_new_case_runs_nothing() -> None:
    """Once cancel() returned, no task runs and no effect starts: the case ends cancelled."""
    ran: list[str] = []
    started: list[str] = []

    async def charge(ctx: Mapping[str, Any]) -> None:
        started.append("charge")

    async with Substrate() as sub:
        tasks_only = await sub.new_case(seq(task(lambda c: ran.append("a")), task(lambda c: ran.append("b"))))
        await tasks_only.cancel()
        with_effect = await sub.new_case(seq(task(lambda c: ran.append("c")), effect(charge)))
        await sub.cancel(with_effect.case_id)
        for handle in (tasks_only, with_effect):
            with pytest.raises(CaseCancelled):
                await handle.result()
    assert (ran, started) == ([], [])


# -- 10. a BaseException from a step fails that case only ---------------------------------------------------


class Fatal(BaseException):
    """A BaseException subclass a step might raise."""


@pytest.mark.parametrize("error", [Fatal("from the app"), GeneratorExit(), asyncio.CancelledError()])
async def test_a_base_exception_from_a_task_fails_that_case_only(error: BaseException) -> None:
    """A task raising a BaseException (not KeyboardInterrupt/SystemExit) fails its case with it as cause."""

    def boom(ctx: Mapping[str, Any]) -> None:
        raise error

    async with Substrate() as sub:
        other = await sub.new_case(seq(wait("go"), task(ok)))
        with pytest.raises(CaseFailed) as info:
            await (await sub.new_case(task(boom))).result()
        assert info.value.__cause__ is error
        await other.signal("go")
        assert await other.result() == {"ok": True, "go": None}


@pytest.mark.parametrize("error", [Fatal("from the app"), GeneratorExit()])
async def test_a_base_exception_from_an_effect_fails_that_case_only(error: BaseException) -> None:
    """An effect raising a BaseException (not KeyboardInterrupt/SystemExit) fails its case with it as cause."""

    async def boom(ctx: Mapping[str, Any]) -> None:
        raise error

    async with Substrate() as sub:
        other = await sub.new_case(seq(wait("go"), task(ok)))
        with pytest.raises(CaseFailed) as info:
            await (await sub.new_case(effect(boom))).result()
        assert info.value.__cause__ is error
        await other.signal("go")
        assert await other.result() == {"ok": True, "go": None}


# -- 11. deep frame trees are withdrawn without recursion ----------------------------------------------------


def deep_library(depth: int) -> dict[str, Any]:
    def down(ctx: Mapping[str, Any]) -> dict[str, Any]:
        return {"d": ctx.get("d", 0) + 1}

    from wfsub import xor

    return {"r": seq(task(down), xor((lambda c: c["d"] < depth, call("r")), default=scope("leaf", wait("x"))))}


async def test_a_case_a_thousand_frames_deep_cancels_and_unwinds() -> None:
    """Cancelling a case 1,500 calls deep ends it cancelled; withdrawing its innermost region unwinds it."""
    from wfsub import compile as compile_term
    from wfsub.lowlevel import Machine

    program = compile_term(call("r"), library=deep_library(1_500), max_call_depth=2_000)
    machine = Machine(program)
    assert machine.run(10**6).status == "blocked"
    machine.cancel()
    assert machine.status == "cancelled"
    machine = Machine(program)
    machine.run(10**6)
    machine.cancel_region("leaf")  # the innermost thread ends withdrawn: every frame above it closes in turn
    assert machine.run(10).status == "cancelled"


# -- smaller points --------------------------------------------------------------------------------------------


async def test_bad_start_arguments_are_refused_with_the_fix() -> None:
    """Non-str data keys, an empty case_id and an infinite timeout are refused before anything starts."""
    async with Substrate() as sub:
        with pytest.raises(TypeError, match="keys must be str"):
            await sub.new_case(task(ok), {1: "x"})  # type: ignore[dict-item]
        with pytest.raises(ValueError, match="empty"):
            await sub.new_case(task(ok), case_id="")
        with pytest.raises(ValueError, match="pass None for no limit"):
            await sub.new_case(task(ok), timeout=math.inf)
        assert sub.statistics().cases_started == 0


def test_absurd_durations_are_validation_issues() -> None:
    """sleep(1e300) and an effect timeout past the longest timer are reported with the limit."""
    assert [i.path for i in validate(seq(sleep(1e300), effect(ScriptedEffect(), timeout=1e12)))] == [
        "seq[0].sleep",
        "seq[1].effect",
    ]


async def test_items_that_are_a_string_fail_at_the_mi() -> None:
    """items=lambda c: 'abc' is a mistake (one instance per character): the case fails saying so."""
    async with Substrate() as sub:
        with pytest.raises(CaseFailed, match="returned a str"):
            await (await sub.new_case(mi(task(ok), items=lambda c: "abc"))).result()


async def test_shutdown_names_effects_that_ignore_cancellation_and_still_leaves_nothing_running() -> None:
    """An effect shielded from cancellation is logged by name after shutdown_timeout and waited for."""
    finished: list[str] = []

    async def stubborn(ctx: Mapping[str, Any]) -> None:
        with anyio.CancelScope(shield=True):
            await anyio.sleep(0.3)
        finished.append("stubborn")

    with structlog.testing.capture_logs() as logs:
        async with Substrate(shutdown_timeout=0.05) as sub:
            await sub.new_case(effect(stubborn))
            await anyio.sleep(0.01)
    warnings = [entry for entry in logs if entry["log_level"] == "warning"]
    assert finished == ["stubborn"]
    assert len(warnings) == 1 and any("'stubborn' at effect" in e for e in warnings[0]["effects"])


async def test_a_callback_sink_sees_every_event_of_a_failing_case() -> None:
    """A failing case still delivers its events, ending in case_failed, to a sink."""
    seen: list[str] = []
    async with Substrate(sinks=[CallbackSink(lambda e: seen.append(e.kind))]) as sub:
        with pytest.raises(CaseFailed):
            await (await sub.new_case(task(lambda c: 1 / 0))).result()
    assert seen[0] == "case_started" and seen[-1] == "case_failed"


# -- found while porting the tests: VirtualClock on trio, drop warnings ------------------------------------


def test_virtual_clock_settles_only_after_new_effects_arm_their_timers_on_trio() -> None:
    """On trio, settle waits for started effects to arm their timers, so advance(2) always finishes the case."""
    # Two sequential effects each sleep 1s on the clock; settle waits for an effect task started but not yet run.

    async def main() -> None:
        for _ in range(40):
            clock = VirtualClock()

            async def nap(ctx: Mapping[str, Any], clock: VirtualClock = clock) -> None:
                await clock.sleep(1)

            async with Substrate(clock=clock) as sub:
                handle = await sub.new_case(seq(effect(nap, name="a"), effect(nap, name="b")))
                await clock.advance(2)
                assert handle.status().state == "done"

    anyio.run(main, backend="trio")


async def test_a_slow_sink_losing_events_is_logged_once_per_thousand() -> None:
    """The first drop for a sink is logged as a warning, whatever the batch sizes."""

    class Stuck:
        async def write(self, events: Any) -> None:
            await anyio.sleep_forever()

    with structlog.testing.capture_logs() as logs:
        async with Substrate(sinks=[Stuck()], trace_buffer=4, shutdown_timeout=0.05) as sub:
            for _ in range(50):
                await (await sub.new_case(task(ok))).result()
            dropped = sub.statistics().trace_dropped
    warnings = [e for e in logs if e["event"] == "trace sink is too slow; events dropped"]
    assert dropped > 0 and len(warnings) == 1


async def test_result_of_a_case_whose_data_holds_an_uncopyable_object_is_readable() -> None:
    """result() and data() of an in-memory case holding a lock hand the lock out as it is, not a TypeError."""
    lock = threading.Lock()  # copy.deepcopy raises TypeError on it
    async with Substrate() as sub:
        handle = await sub.new_case(seq(task(lambda ctx: {"n": 1})), {"lock": lock, "items": [lock]})
        result = await handle.result()
        assert result["lock"] is lock and result["items"][0] is lock and result["n"] == 1
        assert sub.data(handle.case_id)["lock"] is lock

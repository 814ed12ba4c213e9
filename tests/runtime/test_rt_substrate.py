"""The Substrate's API: errors that teach, status, timeouts, retention, mailbox behaviour, tracing, shutdown."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import anyio
import pytest
import structlog

import wfsub
from wfsub import (
    CaseCancelled,
    CaseExists,
    CaseFailed,
    CaseNotFound,
    InvalidWorkflow,
    JsonlSink,
    MemorySink,
    SignalRejected,
    Substrate,
    SubstrateClosed,
    TraceEvent,
    loop,
    mi,
    scope,
    seq,
    sleep,
    task,
    wait,
)
from wfsub.testing import CapturingSink, VirtualClock

from ..harness import Recorder, running

WAIT_GO = seq(wait("go"), task(lambda c: {"went": True}))


# -- errors ---------------------------------------------------------------------------------------------------


async def test_unknown_case_ids_raise_case_not_found() -> None:
    """signal, status, await_case, cancel and region calls on an unknown id raise CaseNotFound naming it."""
    async with running() as (sub, _, _):
        with pytest.raises(CaseNotFound, match="no case 'nope'"):
            await sub.signal("nope", "go")
        with pytest.raises(CaseNotFound, match="'nope'"):
            sub.status("nope")
        with pytest.raises(CaseNotFound):
            await sub.await_case("nope")
        with pytest.raises(CaseNotFound):
            await sub.cancel("nope")
        with pytest.raises(CaseNotFound):
            await sub.cancel_region("nope", "r")


async def test_duplicate_case_id_with_other_data_raises_case_exists() -> None:
    """new_case with the id of a case started with other data raises CaseExists naming what differs and how to fix
    it (the same start again is that case: see test_rt_idempotent)."""
    async with running() as (sub, _, _):
        await sub.new_case(WAIT_GO, {"n": 1}, case_id="a")
        with pytest.raises(CaseExists, match="'a' already exists with other start data .*'n'.*pass another case_id"):
            await sub.new_case(WAIT_GO, {"n": 2}, case_id="a")


async def test_signals_the_case_cannot_take_are_rejected() -> None:
    """Unknown signal names and signals to ended cases raise SignalRejected with a clear message."""
    async with running() as (sub, _, _):
        handle = await sub.new_case(WAIT_GO)
        with pytest.raises(SignalRejected, match="never waits for signal 'stop' .*waits for: go"):
            await sub.signal(handle.case_id, "stop")
        await handle.signal("go")
        await handle.result()
        with pytest.raises(SignalRejected, match="has already ended \\(done\\)"):
            await sub.signal(handle.case_id, "go")


async def test_region_operations_the_case_cannot_take_are_rejected() -> None:
    """Unknown regions, non-dynamic mis and ended regions raise SignalRejected in the caller."""
    wf = seq(mi(wait("go"), count=1, name="static"), scope("later", sleep(1)))
    async with running() as (sub, clock, _):
        handle = await sub.new_case(wf)
        await clock.advance(0)
        with pytest.raises(SignalRejected, match="no region 'ghost'.*regions: later, static"):
            await sub.cancel_region(handle.case_id, "ghost")
        with pytest.raises(SignalRejected, match="not dynamic"):
            await sub.add_instances(handle.case_id, "static", [1])
        with pytest.raises(SignalRejected, match="'later' is not active"):
            await sub.complete_region(handle.case_id, "later")
        with pytest.raises(TypeError, match="sequence of items"):
            await sub.add_instances(handle.case_id, "static", "abc")


async def test_invalid_workflow_is_rejected_before_anything_starts() -> None:
    """new_case validates first: InvalidWorkflow lists every issue and no case is registered."""
    async def not_a_task(ctx: Any) -> None:
        return None

    bad = seq(task(not_a_task), loop(task(lambda c: None)))  # type: ignore[arg-type]
    async with running() as (sub, _, _):
        with pytest.raises(InvalidWorkflow) as info:
            await sub.new_case(bad, case_id="bad")
        assert [issue.path for issue in info.value.issues] == ["seq[0].task", "seq[1].loop"]
        with pytest.raises(CaseNotFound):
            sub.status("bad")
        assert sub.statistics().cases_started == 0


async def test_bad_argument_types_raise_type_error() -> None:
    """Non-mapping data, non-str signal names, ids and regions, and non-terms raise TypeError."""
    async with running() as (sub, _, _):
        with pytest.raises(TypeError, match="case data must be a mapping"):
            await sub.new_case(WAIT_GO, [("a", 1)])  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="workflow term"):
            await sub.new_case(lambda c: None)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="case_id must be a str"):
            await sub.new_case(WAIT_GO, case_id=7)  # type: ignore[arg-type]
        handle = await sub.new_case(WAIT_GO)
        with pytest.raises(TypeError, match="signal names are str"):
            await sub.signal(handle.case_id, 3)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="region names are str"):
            await sub.cancel_region(handle.case_id, None)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="trace level"):
            sub.trace(handle.case_id, "loud")  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="not a trace sink"):
            sub.trace(handle.case_id, "min", object())  # type: ignore[arg-type]


def test_bad_options_raise_at_construction() -> None:
    """Substrate options are checked when it is built."""
    with pytest.raises(ValueError, match="trace_level"):
        Substrate(trace_level="all")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="quanta"):
        Substrate(quanta=0)
    with pytest.raises(TypeError, match="sequence of sinks"):
        Substrate(sinks=MemorySink())  # type: ignore[arg-type]


async def test_use_outside_the_async_with_raises_substrate_closed() -> None:
    """Calls before entering or after leaving the Substrate raise SubstrateClosed saying how to use it."""
    sub = Substrate()
    with pytest.raises(SubstrateClosed, match="cannot start a case: the Substrate is not open"):
        await sub.new_case(WAIT_GO)
    async with sub:
        handle = await sub.new_case(WAIT_GO)
    with pytest.raises(SubstrateClosed, match="async with Substrate"):
        await sub.new_case(WAIT_GO)
    with pytest.raises(SubstrateClosed):
        await sub.signal(handle.case_id, "go")
    with pytest.raises(SubstrateClosed):
        await handle.signal("go")
    with pytest.raises(RuntimeError, match="entered only once"):
        async with sub:
            pass
    with pytest.raises(CaseCancelled, match="substrate closed"):
        await sub.await_case(handle.case_id)


# -- outcomes, status, timeouts ------------------------------------------------------------------------------


async def test_status_follows_the_case_through_its_states() -> None:
    """status() reports initializing, the waiting states, and done with times and steps."""
    async with running() as (sub, clock, _):
        rec = Recorder(clock)
        wf = seq(wait("go"), sleep(5), rec.effect("pay", delay=1))
        handle = await sub.new_case(wf)
        assert handle.status().state == "initializing"
        await clock.advance(0)
        status = handle.status()
        assert (status.state, status.signals) == ("waiting_signal", ("go",))
        await handle.signal("go")
        await clock.advance(0)
        status = handle.status()
        assert (status.state, status.timers_armed) == ("waiting_timer", 1)
        await clock.advance(5)
        assert handle.status().state == "waiting_effect"
        await clock.advance(1)
        await handle.result()
        status = sub.status(handle.case_id)
    assert status.state == "done"
    assert status.ended
    assert (status.started_at, status.ended_at) == (0.0, 6.0)
    assert status.steps >= 4
    assert status.error is None


async def test_failed_case_keeps_error_and_path_and_others_go_on() -> None:
    """A raising task fails its case (cause kept, path named); other cases are not disturbed."""
    def boom(ctx: Any) -> None:
        raise KeyError("sku")

    async with running() as (sub, _, _):
        bad = await sub.new_case(seq(task(lambda c: None), task(boom)), case_id="bad")
        good = await sub.new_case(WAIT_GO)
        with pytest.raises(CaseFailed, match="case 'bad' failed at seq\\[1\\].task") as info:
            await bad.result()
        assert isinstance(info.value.__cause__, KeyError)
        await good.signal("go")
        assert await good.result() == {"go": None, "went": True}
        stats = sub.statistics()
    assert (stats.cases_failed, stats.cases_done, stats.cases_live) == (1, 1, 0)


async def test_await_timeout_leaves_the_case_running() -> None:
    """await_case(timeout=) raises TimeoutError on the Substrate's clock; the case goes on."""
    async with running() as (sub, clock, _):
        handle = await sub.new_case(WAIT_GO)
        async with anyio.create_task_group() as tg:
            outcome: list[BaseException] = []

            async def waiter() -> None:
                try:
                    await sub.await_case(handle.case_id, timeout=10)
                except TimeoutError as exc:
                    outcome.append(exc)

            tg.start_soon(waiter)
            await clock.advance(10)
        (timeout,) = outcome
        assert "did not end within 10s; it goes on running" in str(timeout)
        await handle.signal("go")
        assert (await handle.result(timeout=10))["went"] is True


async def test_case_timeout_cancels_the_case() -> None:
    """new_case(timeout=) cancels the case on the clock with reason "timeout"; its effects are cancelled."""
    async with running() as (sub, clock, _):
        rec = Recorder(clock)
        handle = await sub.new_case(seq(rec.effect("slow", hang=True), wait("go")), timeout=30)
        await clock.advance(29)
        assert handle.status().state == "waiting_effect"
        await clock.advance(1)
        with pytest.raises(CaseCancelled, match="timeout"):
            await handle.result()
        assert handle.status().cancel_reason == "timeout"
    assert rec.cancelled == ["slow"]


async def test_cancel_cancels_effects_and_awaiters_get_case_cancelled() -> None:
    """cancel() withdraws the case's work at once; awaiters get CaseCancelled; cancelling again is SignalRejected."""
    async with running() as (sub, clock, _):
        rec = Recorder(clock)
        handle = await sub.new_case(rec.effect("work", hang=True))
        await clock.advance(0)
        await handle.cancel()
        with pytest.raises(CaseCancelled, match="was cancelled: cancelled"):
            await sub.await_case(handle.case_id)
        with pytest.raises(SignalRejected, match="cannot cancel: it has already ended"):
            await sub.cancel(handle.case_id)
        assert handle.status().state == "cancelled"
    assert rec.cancelled == ["work"]


async def test_retention_bound_drops_the_oldest_ended_cases() -> None:
    """Only `retain_ended` ended cases stay queryable; a handle keeps its own outcome regardless."""
    async with running(retain_ended=2) as (sub, _, _):
        handles = [await sub.new_case(task(lambda c: {"i": c["i"]}), {"i": i}) for i in range(4)]
        results = [await h.result() for h in handles]
        with pytest.raises(CaseNotFound, match="retain_ended"):
            await sub.await_case(handles[0].case_id)
        assert await sub.await_case(handles[3].case_id) == {"i": 3}
        stats = sub.statistics()
    assert results == [{"i": i} for i in range(4)]
    assert (stats.cases_retained, stats.cases_evicted) == (2, 2)


async def test_ids_are_fresh_and_unique() -> None:
    """Default case ids are unique strings."""
    async with running() as (sub, _, _):
        ids = {(await sub.new_case(WAIT_GO)).case_id for _ in range(50)}
    assert len(ids) == 50
    assert all(isinstance(i, str) for i in ids)


# -- mailbox --------------------------------------------------------------------------------------------------


async def test_a_burst_of_signals_costs_one_wake_up() -> None:
    """100 signals queued while the case is parked are drained after a single wake-up."""
    wf = loop(wait("tick"), times=100)
    async with running() as (sub, clock, _):
        handle = await sub.new_case(wf)
        await clock.advance(0)
        before = handle.status().wakeups
        for i in range(100):
            await handle.signal("tick", i)
        await handle.result()
        assert handle.status().wakeups - before == 1


async def test_full_mailbox_makes_senders_wait() -> None:
    """With mailbox_size=2 the third queued signal waits until the case drains; nothing is lost."""
    wf = loop(seq(wait("n"), task(lambda c: {"seen": [*c["seen"], c["n"]]})), times=6)
    async with running(mailbox_size=2) as (sub, clock, _):
        handle = await sub.new_case(wf, {"seen": []})
        await clock.advance(0)
        sent: list[int] = []

        async def producer() -> None:
            for i in range(6):
                await handle.signal("n", i)
                sent.append(i)

        async with anyio.create_task_group() as tg:
            tg.start_soon(producer)
            await anyio.lowlevel.checkpoint()
            assert sent == [0, 1]  # blocked on the third until the case drains
        result = await handle.result()
    assert result["seen"] == [0, 1, 2, 3, 4, 5]


# -- tracing ---------------------------------------------------------------------------------------------------


async def test_trace_changes_one_case_and_adds_a_per_case_sink() -> None:
    """trace(case_id, level, sink) sets that case's level and sends only its events to the sink."""
    async with Substrate(trace_level="none", clock=VirtualClock()) as sub:
        mine = await sub.new_case(WAIT_GO)
        other = await sub.new_case(WAIT_GO)
        sink = CapturingSink()
        sub.trace(mine.case_id, "full", sink)
        await mine.signal("go")
        await other.signal("go")
        await mine.result()
        await other.result()
        await sink.wait_for("case_done")
    assert {e.case_id for e in sink.events} == {mine.case_id}
    assert "step" in sink.kinds()
    assert "signal_consumed" in sink.kinds()


async def test_min_trace_reaches_every_sink_kind(tmp_path: Path) -> None:
    """MemorySink, JsonlSink (str and Path), StructlogSink and CallbackSink (sync and async) get the events."""
    from wfsub import CallbackSink, StructlogSink

    memory = MemorySink()
    seen_sync: list[str] = []
    seen_async: list[str] = []

    async def on_async(event: TraceEvent) -> None:
        seen_async.append(event.kind)

    sinks: list[Any] = [
        memory,
        JsonlSink(tmp_path / "a.jsonl"),
        JsonlSink(str(tmp_path / "b.jsonl")),
        StructlogSink(),
        CallbackSink(lambda e: seen_sync.append(e.kind)),
        CallbackSink(on_async),
    ]
    with structlog.testing.capture_logs() as logs:
        async with Substrate(sinks=sinks) as sub:
            handle = await sub.new_case(seq(task(lambda c: {"a": 1}), wait("go")))
            await handle.signal("go", 5)
            await handle.result()
    kinds = memory.kinds(handle.case_id)
    assert kinds[0] == "case_started"
    assert kinds[-1] == "case_done"
    assert "task" in kinds
    lines = (tmp_path / "a.jsonl").read_text().splitlines()
    assert [json.loads(line)["kind"] for line in lines] == kinds
    assert TraceEvent.model_validate_json(lines[0]).case_id == handle.case_id
    assert (tmp_path / "b.jsonl").read_text().splitlines() == lines
    assert seen_sync == kinds
    assert seen_async == kinds
    assert [entry["kind"] for entry in logs if entry.get("event") == "trace"] == kinds


async def test_a_sink_that_raises_is_counted_and_never_hurts_cases() -> None:
    """Sink errors are counted in statistics and logged; every case still completes."""
    class Broken:
        writes = 0

        async def write(self, events: Any) -> None:
            self.writes += 1
            raise OSError("disk full")

    good = MemorySink()
    with structlog.testing.capture_logs() as logs:
        broken = Broken()
        async with Substrate(sinks=[broken, good]) as sub:
            handles = [await sub.new_case(task(lambda c: {"ok": True})) for _ in range(20)]
            assert [await h.result() for h in handles] == [{"ok": True}] * 20
            with anyio.fail_after(5):  # a guard against hanging, not a speed check
                while len(good) < sub.statistics().trace_events:
                    await anyio.lowlevel.checkpoint()
            stats = sub.statistics()
    assert stats.sink_errors == broken.writes >= 1
    assert stats.cases_done == 20
    assert len(good.kinds()) == stats.trace_events
    assert any(entry["event"] == "trace sink write raised" for entry in logs)


async def test_a_slow_sink_drops_events_but_never_blocks_cases() -> None:
    """A never-returning sink loses only its own (counted) events: cases finish and the other sink gets every event."""
    class Stuck:
        async def write(self, events: Any) -> None:
            await anyio.sleep_forever()

    good = MemorySink()
    with structlog.testing.capture_logs():
        async with Substrate(sinks=[Stuck(), good], trace_buffer=4, shutdown_timeout=0.05) as sub:
            # one case after another, so each case's events reach the sinks in a batch of their own
            with anyio.fail_after(5):  # a guard against hanging, not a speed check
                for _ in range(200):
                    assert await (await sub.new_case(task(lambda c: {"ok": True}))).result() == {"ok": True}
                while len(good) < sub.statistics().trace_events:
                    await anyio.lowlevel.checkpoint()
            stats = sub.statistics()
    assert stats.cases_done == 200
    assert len(good.kinds()) == stats.trace_events
    assert 0 < stats.trace_dropped < stats.trace_events


# -- shutdown ----------------------------------------------------------------------------------------------------


async def test_leaving_cancels_live_cases_and_leaves_nothing_running() -> None:
    """Exiting the async with cancels live cases (awaiters get CaseCancelled), stopping every effect and task."""
    before = len(asyncio.all_tasks())
    outcomes: list[BaseException] = []
    clock = VirtualClock()
    rec = Recorder(clock)

    async def awaiter(sub: Substrate, case_id: str) -> None:
        try:
            await sub.await_case(case_id)
        except CaseCancelled as exc:
            outcomes.append(exc)

    async with anyio.create_task_group() as waiters:
        async with Substrate(clock=clock) as sub:
            handles = [
                await sub.new_case(WAIT_GO),
                await sub.new_case(rec.effect("hang", hang=True)),
                await sub.new_case(seq(sleep(100), wait("go"))),
            ]
            for h in handles:
                waiters.start_soon(awaiter, sub, h.case_id)
            await clock.advance(0)
        assert [h.status().state for h in handles] == ["cancelled"] * 3
    assert len(outcomes) == 3
    assert all(o.reason == "substrate closed" for o in outcomes)  # type: ignore[attr-defined]
    assert rec.cancelled == ["hang"]
    assert len(asyncio.all_tasks()) == before


# -- supervision and fairness ---------------------------------------------------------------------------------------


async def test_an_actor_crash_fails_only_its_case(monkeypatch: pytest.MonkeyPatch) -> None:
    """An unexpected exception inside a case actor fails that case (logged); other cases carry on."""
    from wfsub.lowlevel import Machine

    async with running() as (sub, clock, _):
        broken = await sub.new_case(WAIT_GO)
        healthy = await sub.new_case(WAIT_GO)
        await clock.advance(0)
        target = broken._actor.machine
        real_run = Machine.run

        def run(self: Machine, quanta: int = 1000, **given: Any) -> Any:
            if self is target:
                raise RuntimeError("vm invariant broken")
            return real_run(self, quanta, **given)

        monkeypatch.setattr(Machine, "run", run)
        with structlog.testing.capture_logs() as logs:
            await broken.signal("go")
            with pytest.raises(CaseFailed, match="internal error in the case actor: RuntimeError") as info:
                await broken.result()
        assert isinstance(info.value.__cause__, RuntimeError)
        assert any(entry["event"] == "case actor crashed; the case is failed" for entry in logs)
        await healthy.signal("go")
        assert (await healthy.result())["went"] is True


async def test_long_cases_yield_between_bursts() -> None:
    """A case running thousands of steps yields every `quanta` steps, so a short case started later finishes first."""
    long_wf = loop(task(lambda c: {"n": c["n"] + 1}), times=20_000)
    async with Substrate(trace_level="none", quanta=100) as sub:
        long = await sub.new_case(long_wf, {"n": 0})
        short = await sub.new_case(task(lambda c: {"short": True}))
        assert await short.result() == {"short": True}
        assert long.status().state == "running"
        assert (await long.result())["n"] == 20_000


async def test_leaving_right_after_starting_still_settles_every_case() -> None:
    """Cases whose actors never got to run before the exit still end (cancelled), and awaiters hear of it."""
    async with Substrate(trace_level="none") as sub:
        handles = [await sub.new_case(WAIT_GO) for _ in range(50)]
    for handle in handles:
        with pytest.raises(CaseCancelled, match="substrate closed"):
            await handle.result()
    assert sub.statistics().cases_cancelled == 50


async def test_each_workflow_term_is_compiled_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """new_case compiles a term the first time it is used and reuses the program for every later case."""
    import wfsub._runtime._registry as registry_module

    compiled: list[object] = []
    real = registry_module.compile_workflow

    def counting(term: Any, **kwargs: Any) -> Any:
        compiled.append(term)
        return real(term, **kwargs)

    monkeypatch.setattr(registry_module, "compile_workflow", counting)
    other = seq(wait("go"), task(lambda c: None))
    async with running() as (sub, _, _):
        for _ in range(5):
            await sub.new_case(WAIT_GO)
        await sub.new_case(other)
    assert compiled == [WAIT_GO, other]


async def test_region_caller_is_answered_when_the_actor_crashes(monkeypatch: pytest.MonkeyPatch) -> None:
    """A region operation that hits an unexpected error reaches its caller, and the case ends failed."""
    from wfsub.lowlevel import Machine

    def broken(self: Machine, name: str) -> None:
        raise RuntimeError("vm invariant broken")

    monkeypatch.setattr(Machine, "cancel_region", broken)
    async with wfsub.Substrate() as sub:
        handle = await sub.new_case(wfsub.scope("a", wfsub.wait("go")))
        with anyio.fail_after(5), pytest.raises(RuntimeError, match="vm invariant broken"):
            await sub.cancel_region(handle.case_id, "a")
        with anyio.fail_after(5), pytest.raises(wfsub.CaseFailed, match="internal error in the case actor"):
            await handle.result()


async def test_virtual_clock_refuses_to_advance_past_a_case_that_never_parks() -> None:
    """advance() raises a clear error when a case keeps running and never parks."""
    from wfsub.testing import VirtualClock

    clock = VirtualClock()
    clock.MAX_ROUNDS, clock.MAX_SECONDS = 50, 0.0
    spin = wfsub.loop(wfsub.task(lambda c: None), while_=lambda c: True)
    async with wfsub.Substrate(clock=clock, trace_level="none") as sub:
        await sub.new_case(spin)
        with pytest.raises(RuntimeError, match="never parks"):
            await clock.advance(1)

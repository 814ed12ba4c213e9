"""Trace sinks and the trace-sink actor on their own: models, fan-out, drops and errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest
import structlog

from wfsub import CallbackSink, JsonlSink, MemorySink, TraceEvent
from wfsub._runtime._hub import TraceHub
from wfsub.lowlevel import VmEvent
from wfsub.testing import CapturingSink


def vm_events(n: int) -> list[VmEvent]:
    return [VmEvent((i + 1, "task", f"seq[{i}].task", {"name": f"t{i}"})) for i in range(n)]


async def test_sink_actor_fans_out_global_and_per_case_sinks() -> None:
    """Global sinks get every event; a case's own sinks get only that case's events, in order."""
    everything = MemorySink()
    mine = MemorySink()
    actor = TraceHub([everything])
    async with anyio.create_task_group() as tg:
        tg.start_soon(actor.run)
        actor.submit("a", 1.0, vm_events(2), (mine,))
        actor.submit("b", 2.0, vm_events(3), ())
        actor.close()
    assert [(e.case_id, e.seq) for e in everything.events] == [("a", 1), ("a", 2), ("b", 1), ("b", 2), ("b", 3)]
    assert [e.case_id for e in mine.events] == ["a", "a"]
    assert everything.events[0] == TraceEvent(case_id="a", seq=1, kind="task", path="seq[0].task",
                                              detail={"name": "t0"}, time=1.0)
    assert actor.stats.events == 5


async def test_past_the_buffer_the_hub_asks_producers_to_wait_and_drops_nothing() -> None:
    """Past its buffer the hub reports a backlog and drops nothing; waiting producers are released as it drains."""
    # submit() never waits and never drops while the hub is open.
    sink = MemorySink()
    hub = TraceHub([sink], buffer=2)
    for _ in range(5):
        hub.submit("a", 0.0, vm_events(3), ())
    assert hub.backlogged and hub.stats.dropped == 0
    async with anyio.create_task_group() as tg:
        tg.start_soon(hub.run)
        with anyio.fail_after(5):
            await hub.caught_up()
        assert not hub.backlogged
        hub.close()
    assert len(sink) == 15 and hub.stats.dropped == 0


async def test_raising_sink_is_counted_and_keeps_receiving() -> None:
    """A sink whose write raises is counted each time and still gets later batches."""
    calls = 0

    def flaky(event: TraceEvent) -> None:
        nonlocal calls
        calls += 1
        raise RuntimeError("nope")

    actor = TraceHub([CallbackSink(flaky)])
    with structlog.testing.capture_logs():
        async with anyio.create_task_group() as tg:
            tg.start_soon(actor.run)
            actor.submit("a", 0.0, vm_events(1), ())
            while calls < 1:
                await anyio.lowlevel.checkpoint()
            actor.submit("a", 0.0, vm_events(1), ())
            actor.close()
    assert (calls, actor.stats.sink_errors) == (2, 2)


async def test_jsonl_sink_accepts_str_and_path_and_rejects_others(tmp_path: Path) -> None:
    """JsonlSink takes a str or path-like; anything else is a TypeError."""
    event = TraceEvent(case_id="c", seq=1, kind="task", path="task", detail={}, time=0.0)
    for target in (tmp_path / "p.jsonl", str(tmp_path / "s.jsonl")):
        sink = JsonlSink(target)
        await sink.write([event, event])
        await sink.aclose()
        lines = Path(target).read_text().splitlines()  # noqa: ASYNC240 - a tiny file in a test
        assert [TraceEvent.model_validate_json(line) for line in lines] == [event, event]
    with pytest.raises(TypeError, match="str or path-like"):
        JsonlSink(3)  # type: ignore[arg-type]


async def test_capturing_sink_wait_for() -> None:
    """CapturingSink.wait_for returns once enough events of a kind have arrived."""
    sink = CapturingSink()
    got: list[Any] = []

    async def waiter() -> None:
        got.extend(await sink.wait_for("task", count=2))

    async with anyio.create_task_group() as tg:
        tg.start_soon(waiter)
        await anyio.lowlevel.checkpoint()
        await sink.write([TraceEvent(case_id="c", seq=1, kind="task", path="", detail={}, time=0.0)])
        await anyio.lowlevel.checkpoint()
        assert got == []
        await sink.write([TraceEvent(case_id="c", seq=2, kind="task", path="", detail={}, time=0.0)])
    assert [e.seq for e in got] == [1, 2]


def test_trace_event_format_is_one_readable_line() -> None:
    """TraceEvent.format() shows time, case, seq, kind, path and detail on one line."""
    event = TraceEvent(case_id="o-1", seq=3, kind="effect_requested", path="seq[1].effect",
                       detail={"name": "charge"}, time=1.5)
    assert event.format() == '       1.500  o-1  #3    effect_requested   seq[1].effect  name="charge"'


async def test_per_case_sink_is_closed_when_its_last_case_ends() -> None:
    """A sink given to cases with trace() is closed (aclose) once every case using it has ended."""
    from wfsub import Substrate, seq, task, wait

    class Closing(MemorySink):
        closed = 0

        async def aclose(self) -> None:
            self.closed += 1

    shared = Closing()
    async with Substrate(trace_level="none") as sub:
        first = await sub.new_case(seq(wait("go"), task(lambda c: None)))
        second = await sub.new_case(seq(wait("go"), task(lambda c: None)))
        sub.trace(first.case_id, "min", shared)
        sub.trace(second.case_id, "min", shared)
        await first.signal("go")
        await first.result()
        for _ in range(5):
            await anyio.lowlevel.checkpoint()
        assert shared.closed == 0
        await second.signal("go")
        await second.result()
        with anyio.fail_after(5):  # a guard against hanging, not a speed check
            while not shared.closed:
                await anyio.lowlevel.checkpoint()
        assert shared.kinds().count("case_done") == 2


async def test_case_started_names_the_registered_workflow() -> None:
    """A case started by name says which workflow in its `case_started` event; one started from a term does not."""
    from wfsub import Substrate, seq, task

    flow = seq(task(lambda c: {"x": 1}))
    sink = MemorySink()
    async with Substrate(workflows={"orders": flow}, sinks=[sink], trace_level="min") as sub:
        await (await sub.new_case("orders", case_id="named")).result()
        await (await sub.new_case(seq(task(lambda c: {"y": 2})), case_id="bare")).result()
    started = {e.case_id: e.detail for e in sink.events if e.kind == "case_started"}
    assert started == {"named": {"workflow": "orders"}, "bare": {}}

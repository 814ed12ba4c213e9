"""A case's own trace, `Substrate.trace(case_id, level, sink)`, through the public API: the level and sink it gives
hold for that case across idle evictions and reloads."""

from __future__ import annotations

import anyio

from wfsub import Substrate, seq, task, wait
from wfsub.stores import MemoryStore
from wfsub.testing import CapturingSink, VirtualClock


async def _out_of_memory(sub: Substrate) -> None:
    with anyio.fail_after(5):
        while sub.statistics().cases_in_memory:  # noqa: ASYNC110 - eviction happens in the background
            await anyio.sleep(0.01)


async def test_a_sink_given_by_trace_keeps_the_case_after_it_was_evicted_and_came_back() -> None:
    """sub.trace(case_id, level, sink) keeps sending that case's events to the sink across evictions."""
    clock = VirtualClock()
    sink = CapturingSink()
    flows = {"go": seq(wait("a"), wait("b"), task(lambda c: {"went": True}, name="went"))}
    async with Substrate(store=MemoryStore(), workflows=flows, clock=clock, evict_after=10) as sub:
        await sub.new_case("go", case_id="c")
        sub.trace("c", "full", sink)
        for name in "ab":
            await clock.advance(11)
            await _out_of_memory(sub)
            await sub.signal("c", name)
        assert (await sub.await_case("c"))["went"]
        with anyio.fail_after(5):
            await sink.wait_for("case_done", case_id="c")
        assert sink.count("case_left", "c") == 2
        assert sink.count("case_resumed", "c") == 2
        kinds = [e.kind for e in sink.events]
        after = kinds[len(kinds) - 1 - kinds[::-1].index("case_resumed"):]
        assert "task" in after and "step" in after  # the level trace() gave ("full") holds after the resumes

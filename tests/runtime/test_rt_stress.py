"""Many cases at once: isolation of failures, many producers to one case, a storm of cancels."""

from __future__ import annotations

import asyncio
from typing import Any

import anyio
import pytest
import structlog

from wfsub import CaseCancelled, CaseFailed, Substrate, effect, loop, seq, task, wait


async def test_one_in_ten_failing_cases_never_disturb_the_rest() -> None:
    """1,000 cases where every tenth raises: those fail with their own error, the rest finish correctly."""
    async def double(ctx: Any) -> dict[str, Any]:
        await anyio.lowlevel.checkpoint()
        if ctx["i"] % 10 == 0:
            raise ValueError(f"bad input {ctx['i']}")
        return {"double": ctx["i"] * 2}

    wf = seq(task(lambda c: {"seen": True}), effect(double), task(lambda c: {"plus": c["double"] + 1}))
    with structlog.testing.capture_logs():
        async with Substrate(trace_level="none") as sub:
            handles = [await sub.new_case(wf, {"i": i}) for i in range(1000)]
            failed: list[int] = []
            for i, h in enumerate(handles):
                if i % 10 == 0:
                    with pytest.raises(CaseFailed) as info:
                        await h.result()
                    assert str(info.value.__cause__) == f"bad input {i}"
                    failed.append(i)
                else:
                    assert await h.result() == {"i": i, "seen": True, "double": 2 * i, "plus": 2 * i + 1}
            stats = sub.statistics()
    assert len(failed) == 100
    assert (stats.cases_done, stats.cases_failed) == (900, 100)


async def test_hundred_producers_ten_signals_each_consumed_exactly_once() -> None:
    """100 concurrent producers send 10 signals each to one case: every one is consumed exactly once."""
    wf = loop(seq(wait("item"), task(lambda c: {"got": [*c["got"], c["item"]]})), times=1000)
    async with Substrate(trace_level="none", mailbox_size=16) as sub:
        handle = await sub.new_case(wf, {"got": []})

        async def producer(p: int) -> None:
            for k in range(10):
                await sub.signal(handle.case_id, "item", (p, k))

        async with anyio.create_task_group() as tg:
            for p in range(100):
                tg.start_soon(producer, p)
        result = await handle.result()
    got = result["got"]
    assert len(got) == 1000
    assert sorted(got) == [(p, k) for p in range(100) for k in range(10)]
    for p in range(100):  # FIFO per producer
        assert [k for q, k in got if q == p] == list(range(10))


async def test_cancel_storm_ends_every_case_and_leaves_nothing_running() -> None:
    """1,000 cases cancelled while their effects run: all end cancelled and every effect saw the cancel."""
    started = 0
    observed = 0

    async def work(ctx: Any) -> None:
        nonlocal started, observed
        started += 1
        try:
            await anyio.sleep_forever()
        except anyio.get_cancelled_exc_class():
            observed += 1
            raise

    before = len(asyncio.all_tasks())
    async with Substrate(trace_level="none") as sub:
        handles = [await sub.new_case(seq(effect(work), wait("never"))) for _ in range(1000)]
        while started < 1000:
            await anyio.lowlevel.checkpoint()
        for h in handles:
            await h.cancel()
        for h in handles:
            with pytest.raises(CaseCancelled):
                await h.result()
        assert all(h.status().state == "cancelled" for h in handles)
        assert observed == 1000
        stats = sub.statistics()
        assert (stats.cases_cancelled, stats.cases_live) == (1000, 0)
        await anyio.lowlevel.checkpoint()
        assert len(asyncio.all_tasks()) == before + 1  # only the trace-sink actor is left
    assert len(asyncio.all_tasks()) == before

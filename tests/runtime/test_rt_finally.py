"""scope(finally_=) through the runtime, on asyncio and trio: effects in a finally_ run after the body's effect is
cancelled by a cancel of the case or of the region, after a failure, and not after cancel(compensate=False)."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from wfsub import CaseCancelled, CaseFailed, Retry, scope, seq

from ..harness import Recorder, running


async def scenario() -> None:
    async with running() as (sub, clock, _):
        rec = Recorder(clock)

        def flow() -> Any:
            return seq(scope("work", rec.effect("job", hang=True), finally_=rec.effect("cleanup", delay=1)),
                       rec.effect("after"))

        cancelled = await sub.new_case(flow())
        await clock.advance(0)
        await cancelled.cancel()
        await clock.advance(1)
        with pytest.raises(CaseCancelled):
            await cancelled.result()
        assert (rec.calls, rec.cancelled) == (["job", "cleanup"], ["job"])

        rec.calls.clear()
        region = await sub.new_case(seq(scope("work", rec.effect("job", hang=True), on_cancel=rec.effect("undo"),
                                              finally_=rec.effect("cleanup")), rec.effect("after")))
        await clock.advance(0)
        await sub.cancel_region(region.case_id, "work")
        assert await region.result() == {"undo": True, "cleanup": True, "after": True}
        assert rec.calls == ["job", "undo", "cleanup", "after"]

        rec.calls.clear()
        failing = await sub.new_case(seq(scope("work", rec.effect("job", returns=_fail, retry=Retry(1)),
                                               finally_=rec.effect("cleanup")), rec.effect("after")))
        with pytest.raises(CaseFailed, match="job"):
            await failing.result()
        assert rec.calls == ["job", "cleanup"]

        rec.calls.clear()
        hard = await sub.new_case(flow())
        await clock.advance(0)
        await hard.cancel(compensate=False)
        with pytest.raises(CaseCancelled):
            await hard.result()
        assert rec.calls == ["job"]


def _fail(ctx: Any) -> Any:
    raise ConnectionError("job failed")


async def test_finally_effects_run_after_cancel_region_cancel_and_failure_on_asyncio() -> None:
    """On asyncio: a case cancel runs the finally_ effect after the body's effect is cancelled; a region cancel runs
    on_cancel then finally_ and goes on; a failure runs finally_ before the case fails; a hard cancel runs none."""
    await scenario()


def test_finally_effects_on_trio() -> None:
    """On trio: the same finally_ behaviour as on asyncio."""
    anyio.run(scenario, backend="trio")

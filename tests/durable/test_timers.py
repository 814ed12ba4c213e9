"""Durable timers: advancing a VirtualClock over a long span costs what falls due in it; timers computed from the
case data keep their due times across a restart and are recomputed the same by replay."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from wfsub import Substrate, seq, sleep, task
from wfsub.stores import MemoryStore
from wfsub.testing import VirtualClock

YEAR = 365 * 86400.0


def store_for(kind: str, tmp_path: Path) -> Any:
    return MemoryStore() if kind == "memory" else str(tmp_path / "cases.db")


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
@pytest.mark.parametrize("evict_after", [None, 60.0])
async def test_advancing_a_year_fires_the_clock_a_bounded_number_of_times(
    kind: str, evict_after: float | None, tmp_path: Path
) -> None:
    """A year-long timer on a durable store completes with a handful of clock firings, whatever the span's length."""
    clock = VirtualClock()
    wf = seq(sleep(YEAR), task(lambda c: {"woke": True}))
    async with Substrate(store=store_for(kind, tmp_path), clock=clock, workflows={"w": wf},
                         evict_after=evict_after) as sub:
        handle = await sub.new_case("w")
        await clock.advance(YEAR - 1)
        assert not handle.done()
        await clock.advance(1)
        assert await handle.result() == {"woke": True}
    assert clock.fired <= 10, f"{clock.fired} clock firings for one timer"

"""Update round trip beside the signal round trip, measured in the same run, in memory and on SQLite.

A signal round trip here is `await handle.signal(...)` then `await handle.result()` on a case that takes the signal
and ends; an update round trip is `await handle.update(...)` on a case whose wait takes it and answers with
`reply=` (the call returns the answer). On SQLite both calls return once the input is committed and applied: the
update also waits for its answer. Each figure is p50 / p99 over the probes; no target is set for updates (the
figure to watch is its ratio to the signal's, same run).
"""

from __future__ import annotations

import gc
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel

from wfsub import Substrate, seq, task, wait

from ._figures import percentile, record

N_TRIPS = 1_000

SIGNALLED = seq(wait("ping"), task(lambda c: {"pong": True}, name="pong"))
UPDATED = seq(wait("ping", reply=lambda c: c["ping"]), task(lambda c: {"pong": True}, name="pong"))


async def _trips(store: Any, trips: int) -> tuple[list[float], list[float]]:
    """(signal round trips, update round trips) in seconds, interleaved probe by probe on one Substrate."""
    workflows = {"signalled": SIGNALLED, "updated": UPDATED}
    async with Substrate(trace_level="none", store=store, workflows=workflows) as sub:
        signalled = [await sub.new_case("signalled", {}) for _ in range(trips)]
        updated = [await sub.new_case("updated", {}) for _ in range(trips)]
        for h in (*signalled, *updated):
            while h.status().state != "waiting_signal":
                await anyio.lowlevel.checkpoint()
        gc.collect()
        signals, updates = [], []
        for s, u in zip(signalled, updated, strict=True):
            start = time.perf_counter()
            await s.signal("ping", 1)
            await s.result()
            signals.append(time.perf_counter() - start)
            start = time.perf_counter()
            answer = await u.update("ping", 1)
            updates.append(time.perf_counter() - start)
            assert answer == 1
    return signals, updates


def _lines(where: str, key: str, signals: list[float], updates: list[float]) -> list[str]:
    s50, s99 = percentile(signals, 0.5) * 1e6, percentile(signals, 0.99) * 1e6
    u50, u99 = percentile(updates, 0.5) * 1e6, percentile(updates, 0.99) * 1e6
    record(f"update_round_trip_{key}_p50_us", u50, "us")
    record(f"update_round_trip_{key}_p99_us", u99, "us")
    record(f"update_signal_round_trip_{key}_p50_us", s50, "us")
    return [
        f"update round trip, {where:<8}  p50 {u50:8.1f} us, p99 {u99:8.1f} us (no target)   "
        f"signal round trip same run: p50 {s50:8.1f} us, p99 {s99:8.1f} us ({u50 / s50:4.2f}x at p50)",
    ]


async def _main(lines: list[str]) -> None:
    signals, updates = await _trips(None, N_TRIPS)
    lines.extend(_lines("memory", "memory", signals, updates))
    with tempfile.TemporaryDirectory() as tmp:
        signals, updates = await _trips(str(Path(tmp) / "bench.db"), N_TRIPS // 5)
    lines.extend(_lines("SQLite", "sqlite", signals, updates))


def run() -> list[str]:
    lines = ["== updates (round trip beside the signal's, same run; asyncio) =="]
    anyio.run(_main, lines)
    return lines


if __name__ == "__main__":
    for line in run():
        print(line)

"""Idle eviction: a million parked durable cases in one process (SQLite store, `evict_after`).

Cases are started by 100 concurrent starters, each parks on a signal and leaves memory after `evict_after`.
Reported: the time to park them all, resident memory per evicted case (RSS growth over the run divided by the
number of cases, in a process of its own: what the process keeps, fragmentation included), and the latency of a signal to an evicted case
(it is loaded from the store, the signal committed and applied) beside a signal to a parked case still in memory.

`WFSUB_BENCH_EVICT_CASES` sets the number of cases (default 1,000,000: several minutes on 2 cores).
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio

from wfsub import Substrate, seq, task, wait

from ._figures import percentile, record

N_CASES = int(os.environ.get("WFSUB_BENCH_EVICT_CASES", "1000000"))
STARTERS = 100
EVICT_AFTER = 0.5
N_PROBES = 200

GO = seq(wait("go"), task(lambda ctx: {"went": True}, name="went"))


def rss() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0



async def evicted(path: Path, n: int) -> tuple[float, float, list[float], list[float]]:
    """(seconds to park n cases until all are out of memory, RSS bytes per case, signal latencies to evicted
    cases, signal latencies to cases parked in memory)."""
    async with Substrate(
        store=path, workflows={"go": GO}, evict_after=EVICT_AFTER, trace_level="none", retain_ended=0
    ) as sub:
        gc.collect()
        before = rss()
        start = time.perf_counter()

        async def starter(first: int) -> None:
            for i in range(first, n, STARTERS):
                await sub.new_case("go", case_id=f"c{i}")

        async with anyio.create_task_group() as tg:
            for k in range(STARTERS):
                tg.start_soon(starter, k)
        while sub.statistics().cases_in_memory:
            await anyio.sleep(0.05)
        took = time.perf_counter() - start
        gc.collect()
        per_case = (rss() - before) / n
        cold = []
        for i in range(0, n, max(1, n // N_PROBES)):
            begin = time.perf_counter()
            await sub.signal(f"c{i}", "go")
            cold.append(time.perf_counter() - begin)
        warm_ids = [(await sub.new_case("go")).case_id for _ in range(N_PROBES)]
        await anyio.sleep(0.05)
        warm = []
        for case_id in warm_ids:
            begin = time.perf_counter()
            await sub.signal(case_id, "go")
            warm.append(time.perf_counter() - begin)
        return took, per_case, cold, warm


N_BASELINE = 20_000  # cases the same-run baseline keeps parked in memory


async def in_memory(path: Path, n: int) -> float:
    """The baseline: RSS bytes per durable case parked on the same store kind without eviction (n of them)."""
    async with Substrate(store=path, workflows={"go": GO}, trace_level="none", retain_ended=0) as sub:
        gc.collect()
        before = rss()

        async def starter(first: int) -> None:
            for i in range(first, n, STARTERS):
                await sub.new_case("go", case_id=f"m{i}")

        async with anyio.create_task_group() as tg:
            for k in range(STARTERS):
                tg.start_soon(starter, k)
        while any(sub.status(f"m{i}").state != "waiting_signal" for i in range(n)):
            await anyio.sleep(0.05)
        gc.collect()
        return (rss() - before) / n


def _child(call: str, *args: str) -> Any:
    """Run `call` from this module in a fresh process and return what it printed as JSON: RSS growth means
    something only from a clean start (after other work the allocator reuses freed memory: no growth at all)."""
    code = f"import json, sys, anyio; from pathlib import Path; from bench.eviction_bench import *; print(json.dumps({call}))"
    done = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, check=True,
        cwd=Path(__file__).resolve().parent.parent,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def _measure(folder: str) -> tuple[float, float, list[float], list[float]]:
    """`evicted`, in a process of its own (see `_child`)."""
    took, per_case, cold, warm = _child(
        "anyio.run(evicted, Path(sys.argv[1]) / 'evict.db', int(sys.argv[2]))", folder, str(N_CASES)
    )
    return took, per_case, cold, warm


def run() -> list[str]:
    lines = [f"== idle eviction ({N_CASES:,} parked cases, SQLite, evict_after={EVICT_AFTER:g}s) =="]
    with tempfile.TemporaryDirectory(prefix="wfsub-bench-") as folder:
        took, per_case, cold, warm = _measure(folder)
        baseline = _child("anyio.run(in_memory, Path(sys.argv[1]) / 'mem.db', int(sys.argv[2]))", folder,
                          str(N_BASELINE))
    record("evicted_bytes_per_case", per_case, "B")
    c50 = record("evicted_signal_p50_us", percentile(cold, 0.5) * 1e6, "us")
    c99 = percentile(cold, 0.99) * 1e6
    lines.append(
        f"parking {N_CASES:,} cases until all are evicted   {took:7.1f} s ({N_CASES / took:,.0f} cases/s, no target)"
    )
    lines.append(
        f"resident memory per evicted case        {per_case:7,.0f} B (target <= 1,024) "
        f"{'PASS' if per_case <= 1024 else 'FAIL'}   (RSS growth over the run / cases)   "
        f"a case parked in memory {baseline:7,.0f} B (RSS growth over {N_BASELINE:,})"
    )
    lines.append(
        f"signal to an evicted case               p50 {c50 / 1e3:5.2f} ms p99 {c99 / 1e3:5.2f} ms (no target)   "
        f"to a case parked in memory p50 {percentile(warm, 0.5) * 1e3:5.2f} ms p99 {percentile(warm, 0.99) * 1e3:5.2f} ms"
    )
    return lines

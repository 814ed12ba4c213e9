"""Queued cases against unqueued ones, in the same run: the cost of waiting in a queue (SQLite store).

Each run starts N one-step cases and awaits them all: started directly, on a queue without limits, and on a queue
of concurrency 50. Reported: cases per second of each, and the queued runs' cost per case beside the direct one
(the queue item's write, the claim's transaction, the state change it makes).

`WFSUB_BENCH_QUEUE_CASES` sets N (default 2,000).
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import anyio

from wfsub import Queue, Substrate, seq, task

from ._figures import record

N_CASES = int(os.environ.get("WFSUB_BENCH_QUEUE_CASES", "2000"))
STARTERS = 20
ONE_STEP = seq(task(lambda ctx: {"ran": True}, name="ran"))


async def _through(path: Path, queue: str | None) -> float:
    """Seconds to start N cases (on `queue`, or directly) from STARTERS tasks and await every one."""
    queues = {"open": Queue(), "fifty": Queue(concurrency=50)}
    async with Substrate(store=path, workflows={"one": ONE_STEP}, queues=queues, trace_level="none") as sub:
        begin = time.perf_counter()

        async def starter(first: int) -> None:
            for i in range(first, N_CASES, STARTERS):
                handle = await sub.new_case("one", case_id=f"c{i}", queue=queue)
                await handle.result()

        async with anyio.create_task_group() as tg:
            for k in range(STARTERS):
                tg.start_soon(starter, k)
        return time.perf_counter() - begin


def run() -> list[str]:
    lines = [f"== queues ({N_CASES:,} one-step cases, SQLite, {STARTERS} starters awaiting each) =="]
    with tempfile.TemporaryDirectory(prefix="wfsub-bench-") as folder:
        direct = anyio.run(_through, Path(folder) / "direct.db", None)
        open_ = anyio.run(_through, Path(folder) / "open.db", "open")
        fifty = anyio.run(_through, Path(folder) / "fifty.db", "fifty")
    record("queued_case_us", open_ / N_CASES * 1e6, "us")
    record("queued_50_case_us", fifty / N_CASES * 1e6, "us")
    record("unqueued_case_us", direct / N_CASES * 1e6, "us")
    lines.append(f"unqueued                                {N_CASES / direct:8,.0f} cases/s (baseline)")
    for label, took in (("queued, no limit", open_), ("queued, concurrency=50", fifty)):
        lines.append(
            f"{label:<40}{N_CASES / took:8,.0f} cases/s ({took / direct:4.2f}x the unqueued time, "
            f"+{(took - direct) / N_CASES * 1e6:,.0f} us per case, no target)"
        )
    return lines

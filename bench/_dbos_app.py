"""The durable workload of `bench.peers_bench` as a DBOS Transact app, written the way DBOS's docs write one.

One async workflow of three async `@DBOS.step()` steps, each returning a small dict that the workflow merges into
its data; started with `DBOS.start_workflow_async` and awaited with the handle's `get_result()`. DBOS is set up
as its docs say (`DBOS(config=...)`, then `DBOS.launch()`) with a SQLite system database, and leaves SQLite at its
defaults (rollback journal, synchronous=FULL). Imported only when the `peers` extra is installed.
"""

from __future__ import annotations

import asyncio
import gc
import time
from pathlib import Path
from typing import Any

from dbos import DBOS


@DBOS.step()
async def step_a(data: dict[str, Any]) -> dict[str, Any]:
    return {"a": 1}


@DBOS.step()
async def step_b(data: dict[str, Any]) -> dict[str, Any]:
    return {"b": 2}


@DBOS.step()
async def step_c(data: dict[str, Any]) -> dict[str, Any]:
    return {"c": 3}


@DBOS.workflow()
async def three_steps() -> dict[str, Any]:
    data: dict[str, Any] = {}
    data.update(await step_a(data))
    data.update(await step_b(data))
    data.update(await step_c(data))
    return data


async def _started_and_awaited(n: int) -> float:
    gc.collect()
    start = time.perf_counter()
    handles = [await DBOS.start_workflow_async(three_steps) for _ in range(n)]
    for handle in handles:
        assert await handle.get_result() == {"a": 1, "b": 2, "c": 3}
    return time.perf_counter() - start


def throughput(path: Path, n: int) -> float:
    """Seconds for n workflows started one after another by one coroutine, then awaited, on a new system database
    at `path` (launching DBOS is outside the time, as entering the Substrate is on the wfsub side)."""
    DBOS(config={
        "name": "wfsub-bench-peers",
        "system_database_url": f"sqlite:///{path}",
        "run_admin_server": False,  # no HTTP port: nothing here needs it, and other programs may hold 3001
        "log_level": "WARNING",  # its INFO lines (launch, shutdown) would interleave with the figures
    })
    try:
        DBOS.launch()
        return asyncio.run(_started_and_awaited(n))
    finally:
        DBOS.destroy()

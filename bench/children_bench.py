"""Child cases: one parent starts 10,000 children from an mi and waits for each (`start_case(wait=True)`), in memory
and on SQLite; the same-run baseline is 10,000 unparented cases of the same workflow started (and awaited) by
100 concurrent callers.

`WFSUB_BENCH_CHILDREN` sets the number of children (default 10,000).
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio

from wfsub import Substrate, mi, start_case, task

from ._figures import record

N = int(os.environ.get("WFSUB_BENCH_CHILDREN", "10000"))
STARTERS = 100

CHILD = task(lambda ctx: {"y": ctx["x"] * 2}, name="double")
PARENT = mi(start_case("child", data=lambda ctx: {"x": ctx["index"]}, into="out"), count=lambda ctx: ctx["n"],
            collect="outs")
WORKFLOWS = {"child": CHILD, "parent": PARENT}


async def _children(store: Any) -> float:
    async with Substrate(store=store, workflows=WORKFLOWS, trace_level="none", retain_ended=N + 10) as sub:
        start = time.perf_counter()
        result = await (await sub.new_case("parent", {"n": N}, case_id="P")).result()
        took = time.perf_counter() - start
    assert len(result["outs"]) == N and result["outs"][-1]["out"]["y"] == 2 * (N - 1)
    return took


async def _unparented(store: Any) -> float:
    async with Substrate(store=store, workflows=WORKFLOWS, trace_level="none", retain_ended=N + 10) as sub:
        start = time.perf_counter()

        async def starter(first: int) -> None:
            for i in range(first, N, STARTERS):
                await (await sub.new_case("child", {"x": i}, case_id=f"c{i}")).result()

        async with anyio.create_task_group() as tg:
            for s in range(STARTERS):
                tg.start_soon(starter, s)
        return time.perf_counter() - start


def _measure(kind: str, folder: str) -> tuple[float, float]:
    def store(name: str) -> Any:
        return None if kind == "memory" else str(Path(folder) / f"{name}.db")

    children = anyio.run(_children, store("children"))
    baseline = anyio.run(_unparented, store("plain"))
    return children, baseline


def run() -> list[str]:
    lines = [f"== child cases ({N:,} children of one parent's mi, each waited for) =="]
    with tempfile.TemporaryDirectory(prefix="wfsub-bench-") as folder:
        for kind in ("memory", "sqlite"):
            children, baseline = _measure(kind, folder)
            record(f"children_{kind}_per_s", N / children, "cases/s")
            lines.append(
                f"{kind:<7} {N:,} children from one mi  {children:7.2f} s ({N / children:9,.0f}/s, no target)   "
                f"{N:,} unparented cases, {STARTERS} callers {baseline:7.2f} s ({N / baseline:9,.0f}/s)"
            )
    return lines

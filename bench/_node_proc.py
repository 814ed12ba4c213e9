"""A node process for bench/nodes_bench.py: `python -m bench._node_proc MODE DSN SCHEMA NODE_ID N`.

- `throughput`: waits for a line on stdin, then starts N three-effect cases one after another and awaits them;
  prints the seconds it took.
- `parked`: starts N cases parked on a signal (ids p0..), prints `parked`, then serves until killed.
- `serve`: serves (takes over, answers inputs) until stdin closes.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping
from typing import Any

import anyio

from wfsub import Substrate, effect, seq, task, wait
from wfsub.stores import PostgresStore


async def _a(ctx: Mapping[str, Any]) -> dict[str, Any]:
    return {"a": 1}


FLOWS = {
    "three": seq(effect(_a, name="a"), effect(_a, name="b"), effect(_a, name="c")),
    "parked": seq(wait("go"), task(lambda ctx: {"went": True}, name="went")),
}


async def main(mode: str, dsn: str, schema: str, node_id: str, n: int) -> None:
    store = PostgresStore(dsn, schema=schema, lease_seconds=2.0)
    async with Substrate(store=store, workflows=FLOWS, node_id=node_id, trace_level="none", retain_ended=n) as sub:
        if mode == "throughput":
            await anyio.to_thread.run_sync(sys.stdin.readline)
            start = time.perf_counter()
            handles = [await sub.new_case("three") for _ in range(n)]
            for handle in handles:
                await handle.result()
            print(f"{time.perf_counter() - start:.6f}", flush=True)
            await anyio.to_thread.run_sync(sys.stdin.read)
        elif mode == "parked":
            for i in range(n):
                await sub.new_case("parked", case_id=f"p{i}")
            print("parked", flush=True)
            await anyio.sleep_forever()
        else:
            print("serving", flush=True)
            await anyio.to_thread.run_sync(sys.stdin.read)


if __name__ == "__main__":
    anyio.run(main, sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]))

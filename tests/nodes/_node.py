"""A node process of the many-nodes tests: `python -m tests.nodes._node DSN SCHEMA NODE_ID FIRST COUNT [WORKFLOW]`.

It starts cases c{FIRST}..c{FIRST+COUNT-1} of WORKFLOW ("order" unless named) on itself, prints `started`,
then serves (its own cases, cases it takes over, inputs through the inbox) until its stdin closes, or until it
is killed. Its lease: WFSUB_TEST_LEASE seconds (2 unless set).
"""

from __future__ import annotations

import os
import sys

import anyio

from wfsub import Substrate
from wfsub.stores import PostgresStore

from ._flows import FLOWS


async def main(dsn: str, schema: str, node_id: str, first: int, count: int, workflow: str) -> None:
    lease = float(os.environ.get("WFSUB_TEST_LEASE", "2.0"))
    store = PostgresStore(dsn, schema=schema, lease_seconds=lease)
    async with Substrate(store=store, workflows=FLOWS, node_id=node_id, trace_level="none") as sub:
        for i in range(first, first + count):
            await sub.new_case(workflow, {"n": i}, case_id=f"c{i}")
        print("started", flush=True)
        await anyio.to_thread.run_sync(sys.stdin.read)  # until the test closes our stdin


if __name__ == "__main__":
    anyio.run(main, sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]),
              sys.argv[6] if len(sys.argv) > 6 else "order")

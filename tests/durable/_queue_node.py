"""A node that runs one case of a queue until it is killed: `python -m tests.durable._queue_node STORE NODE_ID CASE_ID`
(cwd: the repo root). STORE: a Postgres URL (`?schema=...&lease_seconds=...`).

It enters a Substrate as node NODE_ID with queue `q` (per_node=1), starts case CASE_ID of workflow `waits` on it,
prints `running CASE_ID` once the case waits for its signal here, and serves until the test kills it (SIGKILL) or
closes its stdin.
"""

from __future__ import annotations

import sys

import anyio

from wfsub import Queue, Substrate

from .test_queues import WORKFLOWS


async def main(store: str, node_id: str, case_id: str) -> None:
    async with Substrate(store=store, workflows=WORKFLOWS, queues={"q": Queue(per_node=1)}, node_id=node_id) as sub:
        await sub.new_case("waits", queue="q", case_id=case_id)
        with anyio.fail_after(60):
            while sub.status(case_id).state != "waiting_signal":  # noqa: ASYNC110 - claimed by its queue runner
                await anyio.sleep(0.02)
        print(f"running {case_id}", flush=True)
        await anyio.to_thread.run_sync(sys.stdin.read)  # until the test closes our stdin (or kills us)


if __name__ == "__main__":
    anyio.run(main, sys.argv[1], sys.argv[2], sys.argv[3])

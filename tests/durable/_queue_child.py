"""A process that dies between claiming a queued case and writing its start: `python -m tests.durable._queue_child
STORE CASE_ID` (cwd: the repo root). STORE: a SQLite path, or a Postgres URL (`?schema=...&lease_seconds=...`).

It enters a Substrate with a node id of its own (random) and a queue `q` of concurrency 1, queues case CASE_ID of
workflow `job`, and SIGKILLs itself as soon as its queue has claimed the case in the store (before the case's start
is written): the claim is committed, nothing else is.
"""

from __future__ import annotations

import os
import signal
import sys
import uuid

import anyio

from wfsub import Queue, Substrate
from wfsub._runtime import _queues
from wfsub._store._queueing import QueueItem

from .test_queues import WORKFLOWS


async def die(self: _queues.Queues, item: QueueItem) -> None:  # the claim is committed: die before starting it
    print(f"claimed {item.case_id} {item.node}", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


async def main(store: str, case_id: str) -> None:
    _queues.Queues._start = die  # type: ignore[method-assign]
    async with Substrate(store=store, workflows=WORKFLOWS, queues={"q": Queue(concurrency=1)},
                         node_id=f"doomed-{uuid.uuid4().hex[:8]}") as sub:
        await sub.new_case("job", {"k": 1}, queue="q", case_id=case_id)
        await anyio.sleep_forever()


if __name__ == "__main__":
    anyio.run(main, sys.argv[1], sys.argv[2])

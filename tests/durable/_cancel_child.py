"""A process that dies between its parent case's cancel and the cancel of the children the parent waits for:
`python -m tests.durable._cancel_child STORE` (cwd: the repo root; STORE a SQLite path or a Postgres URL).

It starts parent `P` (`start_case` waiting for children that wait for a signal, two of them through a queue of
concurrency 1, so one of them, either, stays queued), cancels the parent once they are there, and SIGKILLs itself
where the runtime would send the first child's cancel, once the parent's end is in the store (it prints "parent-ended"
then; "parent-live" if the end never came).
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

import anyio

from wfsub import Substrate
from wfsub._runtime import _children

from .test_children_crash import CHILD_ID, QUEUES, WORKFLOWS


async def die(actor: Any, req: Any, sub: Any, child_id: str) -> None:
    with anyio.CancelScope(shield=True):
        store = sub.table.store
        assert store is not None
        for _ in range(2000):  # (a bound: the parent's end is written while this step is being withdrawn)
            row = await store.row(actor.case_id)
            if row is not None and row.ended_at is not None:
                print("parent-ended", flush=True)
                break
            await anyio.sleep(0.01)
        else:
            print("parent-live", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)


async def main(store: str) -> None:
    _children._cancel_child = die  # type: ignore[assignment]
    async with Substrate(store=store, workflows=WORKFLOWS, queues=QUEUES) as sub:
        await sub.new_case("parent", {}, case_id="P")
        while True:
            try:
                first, *queued = (sub.status(c).state for c in (CHILD_ID, "queued-a", "queued-b"))
                if first == "waiting_signal" and sorted(queued) == ["queued", "waiting_signal"]:
                    break  # (the queue takes either queued child first: they are started side by side)
            except Exception:  # noqa: BLE001 - not started yet
                pass
            await anyio.sleep(0.01)
        await sub.cancel("P")
        await anyio.sleep_forever()


if __name__ == "__main__":
    anyio.run(main, sys.argv[1])

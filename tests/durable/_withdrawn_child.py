"""A process that dies between withdrawing a parent's waiting `start_case` step and cancelling its child, while
the parent lives on: `python -m tests.durable._withdrawn_child STORE WHEN` (cwd: the repo root; STORE a SQLite
path or a Postgres URL).

It starts parent `P` (see `test_children_withdrawn`), cancels its region "kids" once the children are there, and
SIGKILLs itself where the runtime would send the first withdrawn child's cancel: at once with WHEN "live" (the
`cancel_region` record is durable, the parent's row still says it runs), or with WHEN "parked" once the parent's
row says it waits for a signal with nothing in flight (so the next Substrate does not recover it at start). It
prints WHEN before it dies ("late" if the parked row never came).
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

import anyio

from wfsub import Substrate
from wfsub._runtime import _children

from .test_children_withdrawn import QUEUES, WORKFLOWS


def killer(when: str) -> Any:
    async def die(actor: Any, req: Any, sub: Any, child_id: str) -> None:
        with anyio.CancelScope(shield=True):
            store = sub.table.store
            assert store is not None
            said = when
            if when == "parked":
                for _ in range(2000):  # (a bound: the parked row is being written)
                    row = await store.row(actor.case_id)
                    if row is not None and row.state == "waiting_signal" and not row.effects:
                        break
                    await anyio.sleep(0.01)
                else:
                    said = "late"
            print(said, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)

    return die


async def main(store: str, when: str) -> None:
    _children._cancel_child = killer(when)  # type: ignore[assignment]
    waited = ["waited", "abandoned"] + (["kept"] if when == "live" else [])
    async with Substrate(store=store, workflows=WORKFLOWS, queues=QUEUES) as sub:
        await sub.new_case(when, {}, case_id="P")
        for _ in range(6000):  # (a bound: the children start at their own pace)
            try:
                queued = sorted(sub.status(c).state for c in ("queued-a", "queued-b"))  # (either runs first)
                if all(sub.status(c).state == "waiting_signal" for c in waited) and \
                        queued == ["queued", "waiting_signal"]:
                    break
            except Exception:  # noqa: BLE001 - not started yet
                pass
            await anyio.sleep(0.01)
        else:
            print("children-not-there", flush=True)
            return
        await sub.cancel_region("P", "kids")
        await anyio.sleep_forever()


if __name__ == "__main__":
    anyio.run(main, sys.argv[1], sys.argv[2])

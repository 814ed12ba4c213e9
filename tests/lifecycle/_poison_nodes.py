"""A Postgres node the takeover poison test starts again and again, each with a node id of its own:
`python -m tests.lifecycle._poison_nodes MODE DSN SCHEMA NODE_ID`.

    start      start case "p", whose effect SIGKILLs this process
    takeover   wait until this node has taken "p" over from the dead node before it (which SIGKILLs this
               process again), or until "p" is suspended; report its state and reason (with the node id of
               the node before it: a restart, which recovers "p" at once)
    linger     as `_poison`'s linger, on a node

Modes that report print one JSON line last."""

from __future__ import annotations

import sys
import time

import anyio

from wfsub import Substrate
from wfsub.stores import PostgresStore
from wfsub.testing import VirtualClock

from ._poison import MAX_RECOVERIES, WORKFLOWS, linger, report

LEASE = 1.0  # seconds: a dead node's cases are taken over about a second after it died


async def main(mode: str, dsn: str, schema: str, node_id: str) -> None:
    store = PostgresStore(dsn, schema=schema, lease_seconds=LEASE)
    clock = VirtualClock(time.time()) if mode == "linger" else None
    async with Substrate(
        store=store, workflows=WORKFLOWS, max_recoveries=MAX_RECOVERIES, node_id=node_id, clock=clock
    ) as sub:
        if mode == "linger":
            assert clock is not None
            await linger(sub, clock)
            return
        if mode == "start":
            await sub.new_case("w", case_id="p")
            await sub.await_case("p")
        with anyio.fail_after(60):
            while sub.status("p").state.value != "suspended":  # noqa: ASYNC110 (killed unless it is suspended)
                await anyio.sleep(0.02)
        status = sub.status("p")
        report(state=status.state.value, reason=status.suspended_reason)


if __name__ == "__main__":
    anyio.run(main, *sys.argv[1:5])

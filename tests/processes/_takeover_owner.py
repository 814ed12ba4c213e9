"""An owner process of the takeover tests, killed by them: `python -m tests.processes._takeover_owner sqlite PATH`
owns the SQLite file PATH; `... postgres DSN SCHEMA NODE_ID LEASE [WORKFLOW:CASE_ID ...]` is a node of that
Postgres schema (lease of LEASE seconds) that starts the cases named. Either runs the workflows below, prints
`ready`, and serves until its stdin closes (or it is killed)."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Mapping
from typing import Any

import anyio

from wfsub import Substrate, effect, loop, seq, wait


def _last(ctx: Mapping[str, Any]) -> bool:
    return ctx.get("n") == -1


def _answer(ctx: Mapping[str, Any]) -> Any:
    return {"total": ctx["add"]["n"] * 10}


KILL_IN_PAY = "TAKEOVER_KILL_IN_PAY"  # set for an owner process: its `pay` effect SIGKILLs it
GATE: dict[str, anyio.Event] = {}  # in the test's process: `pay` returns once the test sets GATE["pay"]


async def pay(ctx: Mapping[str, Any]) -> dict[str, Any]:
    if os.environ.get(KILL_IN_PAY):
        os.kill(os.getpid(), signal.SIGKILL)
    await GATE["pay"].wait()
    return {"paid": True}


async def hold(ctx: Mapping[str, Any]) -> dict[str, Any]:
    if os.environ.get(KILL_IN_PAY):
        await anyio.sleep_forever()  # in flight when the owner dies
    await GATE["pay"].wait()
    return {"held": True}


# "ordered": takes signals "n" one after another until n == -1 (its journal keeps the order it took them in)
# "adding": answers one update "add", then waits for "end"
# "paying": answers one update "add", then pays (an effect), then waits for "end"
# "holding": an effect in flight until the test lets it end (in an owner process that pays: for ever)
WORKFLOWS = {
    "ordered": loop(wait("n"), until=_last),
    "adding": seq(wait("add", reply=_answer), wait("end")),
    "paying": seq(wait("add", reply=_answer), effect(pay), wait("end")),
    "holding": seq(effect(hold)),
}


async def main(argv: list[str]) -> None:
    if argv[0] == "sqlite":
        store: Any = argv[1]
        node_id, starts = None, []
    else:
        from wfsub.stores import PostgresStore

        store = PostgresStore(argv[1], schema=argv[2], lease_seconds=float(argv[4]))
        node_id, starts = argv[3], [start.split(":") for start in argv[5:]]
    async with Substrate(store=store, workflows=WORKFLOWS, node_id=node_id, trace_level="none", standby=False) as sub:
        for workflow, case_id in starts:
            await sub.new_case(workflow, {}, case_id=case_id)
        print("ready", flush=True)
        await anyio.to_thread.run_sync(sys.stdin.read)  # until the test closes our stdin


if __name__ == "__main__":
    anyio.run(main, sys.argv[1:])

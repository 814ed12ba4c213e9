"""The endless cases the compaction kill test runs in a child: `python -m tests.durable._endless PATH ROUNDS FIRST`
(cwd: the repo root; FIRST: per case, comma-separated, the first round to send) starts the cases (or finds them: a
start is idempotent), then sends each its rounds from FIRST to ROUNDS - 1 as signals with request ids (the
parent passes the first round not acknowledged: a round in flight at a kill is sent again and applies once; an
acknowledged one is never sent again, so a lost one would show in the totals), printing `ack CASE ROUND` as each
call returns and `alldone` at the end. Every round goes through an effect, so effects are in flight when the
child is killed, and the journals are compacted every COMPACT_AFTER records."""

from __future__ import annotations

import sys
from typing import Any

import anyio

from wfsub import Substrate, effect, loop, seq, task, wait

COMPACT_AFTER = 7


async def echo(ctx: Any) -> dict[str, Any]:
    return {"echoed": ctx["item"]}


def count(ctx: Any) -> dict[str, Any]:
    return {"n": ctx.get("n", 0) + 1, "total": ctx.get("total", 0) + ctx["echoed"]}


ENDLESS_FX = loop(seq(wait("add", into="item"), effect(echo, name="echo"), task(count)), while_=lambda d: True)
WORKFLOWS = {"cart": ENDLESS_FX}


def case_id(i: int) -> str:
    return f"e{i}"


async def child(path: str, rounds: int, first: list[int]) -> None:
    cases = len(first)
    async with Substrate(store=path, workflows=WORKFLOWS, compact_after=COMPACT_AFTER) as sub:
        for i in range(cases):
            await sub.new_case("cart", {}, case_id=case_id(i))
        print("ready", flush=True)

        async def serve(i: int) -> None:
            cid = case_id(i)
            for r in range(first[i], rounds):
                await sub.signal(cid, "add", r, request_id=f"{cid}-{r}")
                print(f"ack {cid} {r}", flush=True)

        async with anyio.create_task_group() as tg:
            for i in range(cases):
                tg.start_soon(serve, i)
        with anyio.fail_after(60):
            while not all(sub.data(case_id(i)).get("n") == rounds for i in range(cases)):  # noqa: ASYNC110 - tasks run
                await anyio.sleep(0.01)
        print("alldone", flush=True)


if __name__ == "__main__":
    path, rounds, first = sys.argv[1:]
    anyio.run(child, path, int(rounds), [int(f) for f in first.split(",")])

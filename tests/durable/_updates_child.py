"""The workflow and child process of the update kill tests (`test_update_kill9.py`):
`python -m tests.durable._updates_child PATH WHEN` owns the SQLite file PATH, starts case "u1", sends it update
"add" with request id "k1" and SIGKILLs itself: inside the reply function (WHEN=in-reply: the update is journaled,
its answer computed by nobody yet) or right after the answer came back (WHEN=after-answer; it prints the answer
first)."""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Mapping
from typing import Any

import anyio

from wfsub import Substrate, reply, seq, task, wait

KILL_IN_REPLY = False


def add(ctx: Mapping[str, Any]) -> dict[str, Any]:
    return {"n": ctx["n"] + ctx["add"]}


def answer(ctx: Mapping[str, Any]) -> Any:
    if KILL_IN_REPLY:
        os.kill(os.getpid(), signal.SIGKILL)
    return {"n": ctx["n"]}


WORKFLOWS = {"counter": seq(wait("add"), task(add), reply("add", answer), wait("done"))}


async def child(path: str, when: str) -> None:
    global KILL_IN_REPLY
    KILL_IN_REPLY = when == "in-reply"
    async with Substrate(store=path, workflows=WORKFLOWS) as sub:
        await sub.new_case("counter", {"n": 1}, case_id="u1")
        got = await sub.update("u1", "add", 41, request_id="k1")
        print(json.dumps(got), flush=True)
        os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    anyio.run(child, *sys.argv[1:])

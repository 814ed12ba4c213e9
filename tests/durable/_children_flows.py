"""Workflows of the child-case tests, and the process the kill tests start and SIGKILL:

    python -m tests.durable._children_flows PATH WHERE     (cwd: the repo root)

runs a parent whose `start_case` waits for its child on the SQLite file PATH, and SIGKILLs itself at WHERE:
"before-start" (in the step's data function: the child's start record is not written) or "child-started" (in the
child's first task: its start record is written, the parent's step has no outcome yet). The kill happens once: the
hook leaves a marker file beside PATH, so a recovered run goes on.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

import anyio

from wfsub import Substrate, seq, signal_case, start_case, task, wait

PARENT_ID = "P"
CHILD_ID = "P/seq[0].start_case"


def _kill_once(where: str) -> None:
    armed = os.environ.get("WFSUB_CHILDREN_KILL")
    if armed is None or not armed.endswith(where):
        return
    marker = Path(armed)
    if marker.exists():
        return
    marker.write_text("killed")
    os.kill(os.getpid(), signal.SIGKILL)


def child_data(ctx: Any) -> dict[str, Any]:
    _kill_once("before-start")
    return {"x": ctx["n"]}


def child_first(ctx: Any) -> dict[str, Any]:
    _kill_once("child-started")
    return {"y": ctx["x"] * 10}


CHILD = seq(task(child_first), wait("go"), task(lambda c: {"done": True}))
PARENT = seq(
    start_case("child", data=child_data, into="kid"),
    signal_case("thanks", case_id=lambda c: c["peer"], payload=lambda c: c["kid"]["y"]),
)
PEER = seq(wait("thanks"), task(lambda c: {"seen": c["thanks"]}))
WORKFLOWS: dict[str, Any] = {"parent": PARENT, "child": CHILD, "peer": PEER}


async def main(path: str, where: str) -> None:
    os.environ["WFSUB_CHILDREN_KILL"] = str(Path(path).with_suffix(f".{where}"))
    async with Substrate(store=path, workflows=WORKFLOWS) as sub:
        await sub.new_case("peer", {}, case_id="peer")
        await sub.new_case("parent", {"n": 4, "peer": "peer"}, case_id=PARENT_ID)
        await anyio.sleep_forever()  # the hook kills the process


if __name__ == "__main__":
    anyio.run(main, sys.argv[1], sys.argv[2])

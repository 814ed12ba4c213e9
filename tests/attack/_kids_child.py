"""A process SIGKILLed while a parent's withdrawn children compensate: `python -m tests.attack._kids_child STORE
SHAPE` (cwd: the repo root; STORE a SQLite path or a Postgres URL; env WFSUB_KIDS_DIR a folder).

It starts parent `P` of SHAPE (see `test_attack_children2`), cancels its region "kids" once its children wait,
and dies by SIGKILL in the first compensation a child runs (before it is logged), leaving the other children's
cancels sent or not. Every compensation that completes appends the child's name to `undone` in WFSUB_KIDS_DIR.
It prints "ready" before the region cancel.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

import anyio

from wfsub import Queue, Substrate, effect, mi, par, saga, scope, start_case, wait


async def do(ctx: Any) -> None:
    return None


async def undo(ctx: Any) -> None:
    folder = Path(os.environ["WFSUB_KIDS_DIR"])
    marker = folder / "killed"
    if not marker.exists():
        marker.write_text(ctx["who"])
        os.kill(os.getpid(), signal.SIGKILL)
    with (folder / "undone").open("a") as f:
        f.write(ctx["who"] + "\n")


WHO = ("a", "b", "c")
CHILD = saga((effect(do, name="do"), effect(undo, name="undo")), wait("go"))
# A child that itself waits for a grandchild "G", and compensates its own step when cancelled.
MID = saga((effect(do, name="do"), effect(undo, name="undo")),
           start_case("child", data=lambda c: {"who": "G"}, case_id=lambda c: "G"))
WORKFLOWS: dict[str, Any] = {
    "mi": par(scope("kids", mi(start_case("child", data=lambda c: {"who": c["item"]}), items=lambda c: list(WHO))),
              wait("never")),
    "queued": par(scope("kids", mi(start_case("child", data=lambda c: {"who": c["item"]}, queue="kids"),
                                   items=lambda c: list(WHO))), wait("never")),
    "nested": par(scope("kids", start_case("mid", data=lambda c: {"who": "M"}, case_id=lambda c: "M")),
                  wait("never")),
    "child": CHILD,
    "mid": MID,
}
QUEUES = {"kids": Queue(concurrency=2)}


def waiting(shape: str) -> list[str]:
    """The children that wait for a signal (or, queued, in their queue) once P's region may be cancelled."""
    if shape == "nested":
        return ["M", "G"]
    return [f"P/par[0].scope.mi.start_case/{i}" for i in range(len(WHO))]


async def main(store: str, shape: str) -> None:
    async with Substrate(store=store, workflows=WORKFLOWS, queues=QUEUES) as sub:
        await sub.new_case(shape, {}, case_id="P")
        for _ in range(6000):  # (a bound: the children start at their own pace)
            try:
                states = [sub.status(c).state for c in waiting(shape)]
            except Exception:  # noqa: BLE001 - not started yet
                states = []
            if shape == "queued" and sorted(states) == ["queued", "waiting_signal", "waiting_signal"]:
                break
            if shape != "queued" and states and all(s == "waiting_signal" or s == "waiting_effect" for s in states) \
                    and sub.status(waiting(shape)[-1]).state == "waiting_signal":
                break
            await anyio.sleep(0.01)
        else:
            print("children-not-there", flush=True)
            return
        print("ready", flush=True)
        await sub.cancel_region("P", "kids")
        await anyio.sleep_forever()


if __name__ == "__main__":
    anyio.run(main, sys.argv[1], sys.argv[2])

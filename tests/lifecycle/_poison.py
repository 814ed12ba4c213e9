"""A process the poison-case test starts again and again: `python -m tests.lifecycle._poison MODE PATH`.

    start PATH      start case "p", whose effect SIGKILLs this process (unless POISON_FIXED=1)
    recover PATH    open the store (recovery runs); report the case's state once it is suspended or done
    retry PATH      retry the case and report its outcome

Modes that report print one JSON line last."""

from __future__ import annotations

import json
import os
import signal
import sys
from typing import Any

import anyio

from wfsub import Substrate, effect, seq, task

MAX_RECOVERIES = 2


def prepare(c: dict[str, Any]) -> dict[str, Any]:
    return {"prepared": True}


async def crash(c: dict[str, Any]) -> dict[str, Any]:
    if os.environ.get("POISON_FIXED") != "1":
        os.kill(os.getpid(), signal.SIGKILL)
    return {"survived": True}


WORKFLOWS = {"w": seq(task(prepare), effect(crash, name="crash"), task(lambda c: {"finished": True}))}


def report(**found: Any) -> None:
    print(json.dumps(found), flush=True)


async def settled(sub: Substrate) -> None:
    with anyio.fail_after(60):
        while sub.status("p").state not in ("suspended", "done"):  # noqa: ASYNC110 (killed unless it settles)
            await anyio.sleep(0.01)


async def main(mode: str, path: str) -> None:
    async with Substrate(store=path, workflows=WORKFLOWS, max_recoveries=MAX_RECOVERIES) as sub:
        if mode == "start":
            await sub.new_case("w", case_id="p")
            await sub.await_case("p")
        elif mode == "recover":
            await settled(sub)
        else:
            await (await sub.retry("p")).result()
        status = sub.status("p")
        report(state=status.state.value, reason=status.suspended_reason, data=sub.data("p"))


if __name__ == "__main__":
    anyio.run(main, sys.argv[1], sys.argv[2])

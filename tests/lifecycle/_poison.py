"""A process the poison-case test starts again and again: `python -m tests.lifecycle._poison MODE PATH`.

    start PATH      start case "p", whose effect SIGKILLs this process (unless POISON_FIXED=1)
    recover PATH    open the store (recovery runs); report the case's state once it is suspended or done
    retry PATH      retry the case and report its outcome
    linger PATH     open the store on a VirtualClock and let the Substrate settle (the background version check
                    included), run another case to its end, send "p" a signal; report "p"'s state, the signal's
                    refusal and the other case's data (killed if anything ran "p" again)

Modes that report print one JSON line last."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from typing import Any

import anyio

from wfsub import SignalRejected, Substrate, effect, seq, task, wait
from wfsub.testing import VirtualClock

MAX_RECOVERIES = 2


def prepare(c: dict[str, Any]) -> dict[str, Any]:
    return {"prepared": True}


async def crash(c: dict[str, Any]) -> dict[str, Any]:
    if os.environ.get("POISON_FIXED") != "1":
        os.kill(os.getpid(), signal.SIGKILL)
    return {"survived": True}


async def harmless(c: dict[str, Any]) -> dict[str, Any]:
    return {"harmless": True}


WORKFLOWS = {
    "w": seq(task(prepare), effect(crash, name="crash"), task(lambda c: {"finished": True})),
    "ok": seq(effect(harmless, name="harmless"), wait("go"), task(lambda c: {"ok": True})),
}


def report(**found: Any) -> None:
    print(json.dumps(found), flush=True)


async def settled(sub: Substrate) -> None:
    with anyio.fail_after(60):
        while sub.status("p").state not in ("suspended", "done"):  # noqa: ASYNC110 (killed unless it settles)
            await anyio.sleep(0.01)


async def linger(sub: Substrate, clock: VirtualClock) -> None:
    """Let every background pass of an open run, then run another case and send the poison case a signal."""
    await clock.settle()
    handle = await sub.new_case("ok", case_id=f"ok-{os.getpid()}")
    await handle.signal("go")
    data = await handle.result()
    try:
        await sub.signal("p", "go")
        refused = None
    except SignalRejected as exc:
        refused = str(exc)
    status = sub.status("p")
    report(state=status.state.value, reason=status.suspended_reason, refused=refused, ok=data.get("ok"))


async def main(mode: str, path: str) -> None:
    clock = VirtualClock(time.time()) if mode == "linger" else None
    async with Substrate(store=path, workflows=WORKFLOWS, max_recoveries=MAX_RECOVERIES, clock=clock) as sub:
        if mode == "linger":
            assert clock is not None
            await linger(sub, clock)
            return
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

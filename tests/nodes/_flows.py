"""The workflows the many-nodes tests run, importable by the node processes as by the tests."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import Any

from wfsub import Retry, effect, effect_info, seq, sleep, task, wait

CALLS = os.environ.get("WFSUB_TEST_CALLS")  # a file the effects append their idempotency keys to


async def work(ctx: Mapping[str, Any]) -> dict[str, Any]:
    info = effect_info()
    if CALLS:
        with open(CALLS, "a", encoding="utf-8") as out:  # noqa: ASYNC230 - a few bytes, the test's own log
            out.write(f"{info.idempotency_key}\n")
    return {f"did_{info.name}": True}


ORDER = seq(
    effect(work, name="first"),
    sleep(0.3),
    wait("go"),
    effect(work, name="second"),
    task(lambda ctx: {"done": True}, name="finish"),
)


async def flaky(ctx: Mapping[str, Any]) -> dict[str, Any]:
    """Fails until the effect has been called 8 times in all (on every node); logs each call as
    `pid attempt monotonic-time` (one monotonic clock for every process of the machine)."""
    path = os.environ["WFSUB_TEST_CALLS"]  # (read at each call: the test process sets it too)
    with open(path, "a", encoding="utf-8") as out:  # noqa: ASYNC230 - a few bytes, the test's own log
        out.write(f"{os.getpid()} {effect_info().attempt} {time.monotonic()}\n")
    with open(path, encoding="utf-8") as log:  # noqa: ASYNC230
        if len(log.readlines()) < 8:
            raise RuntimeError("not yet")
    return {"charged": True}


RETRYING = seq(effect(flaky, name="charge", retry=Retry(max_attempts=20, initial=1.0, multiplier=1.0)))
FLOWS = {"order": ORDER, "retrying": RETRYING}

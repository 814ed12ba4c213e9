"""The workflows the many-nodes tests run, importable by the node processes as by the tests."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from wfsub import effect, effect_info, seq, sleep, task, wait

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
FLOWS = {"order": ORDER}

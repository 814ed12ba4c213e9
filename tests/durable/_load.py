"""The kill -9 load test's child: a durable Substrate on a SQLite file running hundreds of cases with effects
(some failing their first attempt), real-clock timers and signals the child sends to its own cases with request
ids. Every acknowledged call is printed at once (`start ID`, `signal ID`), so the parent knows what was
acknowledged when it kills the process. Run again on the same file, the child recovers, starts the cases it has
not started (CaseExists for those it has), re-sends every signal with the same request id, and awaits them all.
"""

from __future__ import annotations

import random
import sys
from collections.abc import Mapping
from typing import Any

import anyio

import wfsub
from wfsub import CaseExists, Retry, SignalRejected, Substrate, effect, par, seq, sleep, task, wait, xor

from ._flows import SIDE, log_call


def prep(ctx: Mapping[str, Any]) -> dict[str, Any]:
    return {"prepped": ctx["i"] + 1}


async def first(ctx: Mapping[str, Any]) -> dict[str, Any]:
    line = log_call("first")
    await anyio.sleep(random.random() * 0.02)
    if ctx["i"] % 5 == 0 and line["attempt"] == 1:
        raise ConnectionError("flaky on the first attempt")
    return {"first": ctx["i"] * 2}


async def middle(ctx: Mapping[str, Any]) -> dict[str, Any]:
    log_call("middle")
    await anyio.sleep(0.05 + random.random() * 0.1)  # in flight for a while: kills land on many such cases
    return {"middle": True}


async def second(ctx: Mapping[str, Any]) -> dict[str, Any]:
    log_call("second")
    await anyio.sleep(random.random() * 0.02)
    return {"second": ctx["first"] + len(ctx["sig"])}


def even(ctx: Mapping[str, Any]) -> bool:
    return bool(ctx["i"] % 2 == 0)


def total(ctx: Mapping[str, Any]) -> dict[str, Any]:
    return {"total": ctx["prepped"] + ctx["first"] + ctx["second"]}


LOAD = seq(
    task(prep),
    effect(first, retry=Retry(max_attempts=3, initial=0.01)),
    effect(middle),
    par(xor((even, sleep(0.05)), default=sleep(0.25)), wait("sig", into="sig")),
    effect(second),
    task(total),
)
WORKFLOWS = {"load": LOAD}


def case_id(i: int) -> str:
    return f"L-{i}"


def expected(i: int) -> dict[str, Any]:
    sig = f"s{i}"
    return {"i": i, "prepped": i + 1, "first": i * 2, "middle": True, "sig": sig, "second": i * 2 + len(sig),
            "total": i + 1 + i * 2 + i * 2 + len(sig)}


async def child(path: str, side: str, seed: int, n: int) -> None:
    SIDE.path = side
    random.seed(seed)
    out = sys.stdout

    def say(line: str) -> None:
        out.write(line + "\n")
        out.flush()

    async with Substrate(store=path, workflows=WORKFLOWS) as sub:
        say("ready")
        started: list[int] = []
        todo = list(range(n))

        async def starter() -> None:
            while todo:
                i = todo.pop(0)
                try:
                    await sub.new_case("load", {"i": i}, case_id=case_id(i))
                    say(f"start {case_id(i)}")
                except CaseExists:
                    say(f"exists {case_id(i)}")
                started.append(i)

        async def signaller() -> None:
            sent = 0
            while sent < n:
                if sent >= len(started):
                    await anyio.sleep(0.002)
                    continue
                i = started[sent]
                sent += 1
                await anyio.sleep(random.random() * 0.003)
                try:
                    await sub.signal(case_id(i), "sig", f"s{i}", request_id=f"sig-{case_id(i)}")
                    say(f"signal {case_id(i)}")
                except SignalRejected:  # it ended in an earlier run: the signal was applied then
                    say(f"ended {case_id(i)}")

        async with anyio.create_task_group() as tg:
            for _ in range(8):
                tg.start_soon(starter)
            tg.start_soon(signaller)
        for i in range(n):
            try:
                await sub.await_case(case_id(i))
            except wfsub.WfsubError as exc:
                say(f"error {case_id(i)} {type(exc).__name__} {exc}")
        say("alldone")

"""Workflows, effects and restart scenarios shared by the durable tests and the processes they kill.

The parent test process and its children import this module under the same name (`tests.durable._flows`), so a
workflow has the same fingerprint on both sides of a crash.

Effects append one JSON line per call to a side file (`SIDE.path`): `{"key", "attempt", "name", "case"}`; a line
is written with one `write(2)` on an O_APPEND descriptor, so a SIGKILL never leaves half a line.

A restart scenario is a `phase1(sub, halt)` that runs until `halt` stops it at a chosen point (a clean exit from
`async with`, or a SIGKILL of the process), and a `phase2(sub)` that finishes the case(s) in a new Substrate on
the same store and returns what it found, for the test to check.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import anyio

import wfsub
from wfsub import Substrate, Term, effect, mi, saga, scope, seq, sleep, task, wait

from ._util import eventually

# -- the side file -------------------------------------------------------------------------------------------


class Side:
    path: str | None = None


SIDE = Side()


def log_call(name: str, **extra: Any) -> dict[str, Any]:
    """Append this effect call to the side file (key, attempt, name, case) and return what was written."""
    info = wfsub.effect_info()
    line = {"key": info.idempotency_key, "attempt": info.attempt, "name": name, "case": info.case_id, **extra}
    if SIDE.path is not None:
        fd = os.open(SIDE.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, (json.dumps(line) + "\n").encode())
        finally:
            os.close(fd)
    return line


def read_side(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    try:
        with open(path) as f:
            return [json.loads(line) for line in f if line.endswith("\n")]
    except FileNotFoundError:
        return []


# -- halting at a chosen point -------------------------------------------------------------------------------


class Halted(Exception):
    """Raised in the parent to leave `async with Substrate(...)` at the chosen point (a clean exit)."""


class Halt:
    """Stops a scenario's first phase at `point`: mode "kill" SIGKILLs this process there, mode "exit" leaves the
    Substrate's `async with` (an effect at the point stays in flight until the Substrate cancels it), mode "off"
    (the second phase) never stops."""

    def __init__(self, point: str | None, mode: str) -> None:
        self.point = point
        self.mode = mode
        self.event = anyio.Event()

    async def here(self, point: str, *, in_effect: bool = False) -> None:
        if self.mode == "off" or point != self.point or self.event.is_set():
            return
        if self.mode == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        self.event.set()
        if in_effect:
            await anyio.sleep_forever()
        raise Halted(point)

    async def wait(self) -> None:
        """Block until an effect reached the point (then leave the Substrate)."""
        await self.event.wait()
        if self.mode == "kill":  # pragma: no cover - the process is dead by now
            await anyio.sleep_forever()
        raise Halted(self.point)


HALT = Halt(None, "off")


# -- effects and tasks ---------------------------------------------------------------------------------------


async def charge(ctx: Mapping[str, Any]) -> dict[str, Any]:
    log_call("charge")
    return {"charged": ctx.get("n", 0) * 10}


async def charge_gate(ctx: Mapping[str, Any]) -> dict[str, Any]:
    log_call("charge_gate")
    await HALT.here("in-effect", in_effect=True)
    return {"charged": ctx.get("n", 0) * 10}


async def book(ctx: Mapping[str, Any]) -> dict[str, Any]:
    log_call("book")
    return {"booked": True}


async def unbook_gate(ctx: Mapping[str, Any]) -> dict[str, Any]:
    log_call("unbook")
    await HALT.here("in-effect", in_effect=True)
    return {"unbooked": True}


async def refund_gate(ctx: Mapping[str, Any]) -> dict[str, Any]:
    log_call("refund")
    await HALT.here("in-effect", in_effect=True)
    return {"refunded": True}


def prep(ctx: Mapping[str, Any]) -> dict[str, Any]:
    return {"prepped": ctx.get("n", 0) + 1}


def finish(ctx: Mapping[str, Any]) -> dict[str, Any]:
    return {"finished": True}


def who(ctx: Mapping[str, Any]) -> list[Any]:
    return list(ctx["who"])


def payload_kind(ctx: Mapping[str, Any]) -> dict[str, Any]:
    return {"go_type": type(ctx.get("go")).__name__}


WORKFLOWS: dict[str, Term] = {
    "basic": seq(task(prep), effect(charge), task(finish)),
    "gated": seq(task(prep), effect(charge_gate), task(finish)),
    "charge_then_wait": seq(effect(charge), wait("go", into="go"), task(finish)),
    "wait_then_charge": seq(wait("go", into="go"), task(payload_kind), effect(charge), task(finish)),
    "sleep_long": seq(sleep(0.5), task(finish)),
    "sleep_short": seq(sleep(0.05), task(finish)),
    "saga": seq(saga((effect(book), effect(unbook_gate)), wait("go")), task(finish)),
    "region": seq(
        scope("pay", seq(effect(charge), wait("never")), on_cancel=effect(refund_gate)), task(finish)
    ),
    "complete": seq(mi(wait("ok", into="ok"), count=3, name="rev", collect="out"), task(finish)),
    "dynamic": seq(mi(wait("ok", into="ok"), items=who, dynamic=True, name="rev", collect="out"), task(finish)),
}


# -- restart scenarios ---------------------------------------------------------------------------------------


async def until_state(sub: Substrate, case_id: str, *states: str, limit: float = 30.0) -> None:
    """Poll the case's status until it is in one of `states` (a bound only against a hang, not a timing)."""
    await eventually(lambda: sub.status(case_id).state.value in states, limit)


@dataclass
class Found:
    """What phase 2 found: the outcome of each case ("done" data, or the exception's type name) and journals."""

    outcomes: dict[str, Any] = field(default_factory=dict)
    journals: dict[str, list[wfsub.JournalRecord]] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)


HANG = 10.0  # seconds after which a case that has not ended counts as hung (a bound, not an expected duration)


async def outcome(sub: Substrate, case_id: str, hang: float | None = None) -> Any:
    """The case's final data, or the name of the error await_case raised ("hung" past the bound)."""
    try:
        return await sub.await_case(case_id, timeout=hang or HANG)
    except TimeoutError:
        return "hung"
    except wfsub.WfsubError as exc:
        return type(exc).__name__


@dataclass(frozen=True)
class Scenario:
    name: str
    workflow: str
    point: str  # where phase 1 stops: "after-call" (right after a call returned) or "in-effect"
    phase1: Callable[[Substrate, Halt], Awaitable[None]]
    phase2: Callable[[Substrate], Awaitable[Any]]
    kinds: tuple[str, ...]  # the journal's kinds, in order, once the case has ended
    result: Any  # the case's final data, or the name of the error await_case raises
    calls: dict[str, int]  # effect name -> how many times it must have run at least (-1: exactly once)


CID = "case-1"


async def _start(sub: Substrate, workflow: str, data: dict[str, Any] | None = None) -> None:
    await sub.new_case(workflow, data or {"n": 2}, case_id=CID)


async def p1_start(sub: Substrate, halt: Halt) -> None:
    await _start(sub, "basic")
    await halt.here("after-call")


async def p1_effect_in_flight(sub: Substrate, halt: Halt) -> None:
    await _start(sub, "gated")
    await halt.wait()


async def until_stored(sub: Substrate, case_id: str, *states: str, limit: float = 30.0) -> None:
    """Poll the store's row of the case until it records one of `states` (a parked case's row is written
    without waiting for it: a SIGKILL before it lands would leave the row of an earlier state)."""
    store = sub._store
    assert store is not None
    with anyio.fail_after(limit):
        while True:
            row = await store.row(case_id)
            if row is not None and row.state in states:
                return
            await anyio.sleep(0.005)


async def until_parked(sub: Substrate, case_id: str, state: str = "waiting_signal") -> None:
    await until_state(sub, case_id, state)
    await until_stored(sub, case_id, state)


async def p1_effect_done(sub: Substrate, halt: Halt) -> None:
    await _start(sub, "charge_then_wait")
    await until_parked(sub, CID)
    await halt.here("after-call")


async def p2_signal_go(sub: Substrate) -> None:
    await sub.signal(CID, "go", "late")


async def p1_signal(sub: Substrate, halt: Halt) -> None:
    await _start(sub, "wait_then_charge")
    await until_parked(sub, CID)
    await sub.signal(CID, "go", (1, 2), request_id="go-1")
    await halt.here("after-call")


async def p1_sleep_long(sub: Substrate, halt: Halt) -> None:
    await _start(sub, "sleep_long")
    await until_parked(sub, CID, "waiting_timer")
    await halt.here("after-call")


async def p1_sleep_short(sub: Substrate, halt: Halt) -> None:
    await _start(sub, "sleep_short")
    await until_state(sub, CID, "waiting_timer", "done")
    await halt.here("after-call")


async def p1_cancel(sub: Substrate, halt: Halt) -> None:
    await _start(sub, "saga")
    await until_parked(sub, CID)
    await sub.cancel(CID, compensate=True, request_id="cancel-1")
    await halt.wait()


async def p1_cancel_region(sub: Substrate, halt: Halt) -> None:
    await _start(sub, "region")
    await until_parked(sub, CID)
    await sub.cancel_region(CID, "pay", request_id="cr-1")
    await halt.wait()


async def p1_complete_region(sub: Substrate, halt: Halt) -> None:
    await _start(sub, "complete")
    await until_parked(sub, CID)
    await sub.signal(CID, "ok", "first")
    await sub.complete_region(CID, "rev", request_id="cp-1")
    await halt.here("after-call")


async def p1_add_instances(sub: Substrate, halt: Halt) -> None:
    await _start(sub, "dynamic", {"who": ["a", "b"]})
    await until_parked(sub, CID)
    await sub.add_instances(CID, "rev", ["c"], request_id="add-1")
    await halt.here("after-call")


async def p2_close_and_signal(sub: Substrate) -> None:
    await sub.close_instances(CID, "rev")
    for i in range(3):
        await sub.signal(CID, "ok", i)


async def p1_close_instances(sub: Substrate, halt: Halt) -> None:
    await _start(sub, "dynamic", {"who": ["a", "b"]})
    await until_parked(sub, CID)
    await sub.add_instances(CID, "rev", ["c"], request_id="add-1")
    await sub.close_instances(CID, "rev", request_id="close-1")
    await halt.here("after-call")


async def p2_three_oks(sub: Substrate) -> None:
    for i in range(3):
        await sub.signal(CID, "ok", i)


async def p2_nothing(sub: Substrate) -> None:
    return None


_OUT3 = [{"ok": 0}, {"ok": 1}, {"ok": 2}]

SCENARIOS = {
    s.name: s
    for s in [
        Scenario("start", "basic", "after-call", p1_start, p2_nothing, ("start", "effect", "end"),
                 {"n": 2, "prepped": 3, "charged": 20, "finished": True}, {"charge": 1}),
        Scenario("effect-in-flight", "gated", "in-effect", p1_effect_in_flight, p2_nothing,
                 ("start", "effect", "end"), {"n": 2, "prepped": 3, "charged": 20, "finished": True},
                 {"charge_gate": 2}),
        Scenario("effect-completed", "charge_then_wait", "after-call", p1_effect_done, p2_signal_go,
                 ("start", "effect", "signal", "end"), {"n": 2, "charged": 20, "go": "late", "finished": True},
                 {"charge": -1}),
        Scenario("signal", "wait_then_charge", "after-call", p1_signal, p2_nothing,
                 ("start", "signal", "effect", "end"),
                 {"n": 2, "go": [1, 2], "go_type": "list", "charged": 20, "finished": True}, {"charge": 1}),
        Scenario("timer-armed", "sleep_long", "after-call", p1_sleep_long, p2_nothing, ("start", "timer", "end"),
                 {"n": 2, "finished": True}, {}),
        Scenario("timer-overdue", "sleep_short", "after-call", p1_sleep_short, p2_nothing,
                 ("start", "timer", "end"), {"n": 2, "finished": True}, {}),
        Scenario("cancel-compensating", "saga", "in-effect", p1_cancel, p2_nothing,
                 ("start", "effect", "cancel", "effect", "end"), "CaseCancelled", {"book": -1, "unbook": 2}),
        Scenario("cancel-region", "region", "in-effect", p1_cancel_region, p2_nothing,
                 ("start", "effect", "cancel_region", "effect", "end"),
                 {"n": 2, "charged": 20, "refunded": True, "finished": True}, {"charge": -1, "refund": 2}),
        Scenario("complete-region", "complete", "after-call", p1_complete_region, p2_nothing,
                 ("start", "signal", "complete_region", "end"),
                 {"n": 2, "out": [{"ok": "first"}, None, None], "finished": True}, {}),
        Scenario("add-instances", "dynamic", "after-call", p1_add_instances, p2_close_and_signal,
                 ("start", "add_instances", "close_instances", "signal", "signal", "signal", "end"),
                 {"who": ["a", "b"], "out": _OUT3, "finished": True}, {}),
        Scenario("close-instances", "dynamic", "after-call", p1_close_instances, p2_three_oks,
                 ("start", "add_instances", "close_instances", "signal", "signal", "signal", "end"),
                 {"who": ["a", "b"], "out": _OUT3, "finished": True}, {}),
    ]
}


async def run_phase1(scenario: Scenario, store: Any, mode: str) -> None:
    """Phase 1 of a scenario on `store`; returns once halted (mode "exit"), or never (mode "kill")."""
    global HALT
    HALT = Halt(scenario.point, mode)
    try:
        async with Substrate(store=store, workflows=WORKFLOWS) as sub:
            await scenario.phase1(sub, HALT)
    except Halted:
        return
    finally:
        HALT = Halt(None, "off")
    raise AssertionError(f"scenario {scenario.name!r} ran to its end without reaching {scenario.point!r}")


async def run_phase2(scenario: Scenario, store: Any) -> Found:
    found = Found()
    async with Substrate(store=store, workflows=WORKFLOWS) as sub:
        found.extra["status_after_restart"] = sub.status(CID)
        found.extra["phase2"] = await scenario.phase2(sub)
        found.outcomes[CID] = await outcome(sub, CID)
        found.journals[CID] = await sub.journal(CID)
    return found

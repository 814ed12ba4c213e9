"""Random inputs against a workflow that nests every construct: no crash, no silent hang, exact restore."""

from __future__ import annotations

import json
import random
from collections.abc import Mapping
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

import wfsub
from wfsub import (
    WfsubError,
    call,
    critical,
    defer,
    effect,
    interleave,
    loop,
    mi,
    milestone,
    par,
    scope,
    seq,
    sleep,
    task,
    terminate,
    wait,
    xor,
)
from wfsub._terms import Term
from wfsub.lowlevel import Machine, RunResult, Seeded


async def work(ctx: Mapping[str, Any]) -> dict[str, Any]:
    return {"e": 1}


def bump(key: str) -> Term:
    def step(ctx: Mapping[str, Any]) -> dict[str, Any]:
        return {key: ctx.get(key, 0) + 1}

    step.__qualname__ = f"bump_{key}"
    return task(step)


LIBRARY = {
    "rec": xor(
        (
            lambda c: c.get("depth", 0) < 2,
            seq(bump("depth"), par(call("rec"), scope("rs", wait("z")), join="first")),
        ),
        default=bump("leaf"),
    )
}
WORKFLOW = seq(
    scope(
        "outer",
        par(
            interleave(
                critical("L", seq(bump("a"), effect(work))),
                par(wait("s1"), bump("b"), join="first"),
                scope("is", sleep(2)),
                order=[(0, 1)],
            ),
            mi(
                seq(interleave(bump("m1"), scope("ms", wait("s2"))), milestone("M", effect(work))),
                count=3, join=2, name="mm", collect="mo", cancel_remaining=False,
            ),
            loop(seq(critical("L", bump("c")), xor((lambda c: c.get("c", 0) > 5, terminate()), default=bump("w"))),
                 times=2),
            call("rec"),
            mi(scope("dyn_s", wait("s3")), count=1, dynamic=True, name="dyn", join="all"),
            defer({"s1": bump("d1"), "s2": bump("d2")}, timeout=3, on_timeout=bump("dt")),
            join=5,
        ),
        on_cancel=bump("oc"),
    ),
    bump("end"),
)
PROGRAM = wfsub.compile(WORKFLOW, library=LIBRARY)
REGIONS = sorted(PROGRAM.regions)


class Driver:
    """A machine plus the effects and timers it has asked for and not yet had answered or cancelled."""

    def __init__(self, machine: Machine) -> None:
        self.m = machine
        self.effects: set[int] = set()
        self.timers: set[int] = set()

    def run(self, quanta: int) -> RunResult:
        r = self.m.run(quanta)
        self.effects |= {x.effect_id for x in r.effects}
        self.timers |= {x.timer_id for x in r.timers}
        self.effects -= set(r.cancelled_effects)
        self.timers -= set(r.cancelled_timers)
        return r

    def give(self, action: tuple[Any, ...]) -> None:
        kind, arg = action
        try:
            if kind == "effect":
                self.effects.discard(arg)
                self.m.complete_effect(arg, {"o": arg})
            elif kind == "timer":
                self.timers.discard(arg)
                self.m.fire_timer(arg)
            elif kind == "add":
                self.m.add_instances("dyn", [arg])
            elif kind == "signal":
                self.m.deliver_signal(arg, 1)
            else:
                getattr(self.m, kind)(arg)
        except WfsubError:
            pass  # an input the case cannot take now: it must say so, and change nothing


def pick_action(rnd: random.Random, d: Driver) -> tuple[Any, ...]:
    roll = rnd.random()
    if roll < 0.1:
        return (rnd.choice(["cancel_region", "complete_region"]), rnd.choice(REGIONS))
    if roll < 0.15:
        return ("add", rnd.randrange(100))
    if roll < 0.45 and d.effects:
        return ("effect", rnd.choice(sorted(d.effects)))
    if roll < 0.6 and d.timers:
        return ("timer", rnd.choice(sorted(d.timers)))
    return ("signal", rnd.choice(["s1", "s2", "s3", "z"]))


@settings(max_examples=120, deadline=None)
@given(st.integers(0, 2**32))
def test_random_inputs_never_crash_or_hang_and_restore_is_exact(seed: int) -> None:
    """Any sequence of inputs ends the case or leaves it waiting on something; a machine restored from
    JSON snapshots at random points behaves exactly like one that never was."""
    rnd = random.Random(seed)
    plain = Driver(Machine(PROGRAM, {}, scheduler=Seeded(seed), trace_level="min"))
    restored = Driver(Machine(PROGRAM, {}, scheduler=Seeded(seed), trace_level="min"))
    for _ in range(300):
        quanta = rnd.choice([1, 3, 50])
        r = plain.run(quanta)
        assert restored.run(quanta).status == r.status
        if r.status in ("done", "failed", "cancelled"):
            break
        if r.status == "blocked":
            assert r.signals or plain.effects or plain.timers, "blocked with nothing that could wake it"
        if rnd.random() < 0.2:
            snap = json.loads(json.dumps(restored.m.snapshot()))
            restored.m = Machine.restore(PROGRAM, snap)
        action = pick_action(rnd, plain)
        plain.give(action)
        restored.give(action)
    assert (restored.m.status, restored.m.data) == (plain.m.status, plain.m.data)
    assert [e.as_tuple() for e in restored.m.take_events()] == [e.as_tuple() for e in plain.m.take_events()]

"""Random inputs against a workflow of nets nesting regions, sagas, mi, effects, timers and signals: no crash, no
silent hang, exact restore, and a net's place counts always match the frames and tokens it holds."""

from __future__ import annotations

import json
import random
from collections.abc import Mapping
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

import wfsub
from wfsub import WfsubError, effect, mi, net, par, saga, scope, seq, sleep, task, wait
from wfsub._terms import Term
from wfsub._vm._net import NetFrame, NodeFrame
from wfsub._vm._records import Frame, members
from wfsub.lowlevel import Machine, RunResult, Seeded


async def work(ctx: Mapping[str, Any]) -> dict[str, Any]:
    return {"e": 1}


def bump(key: str) -> Term:
    def step(ctx: Mapping[str, Any]) -> dict[str, Any]:
        return {key: ctx.get(key, 0) + 1}

    step.__qualname__ = f"bump_{key}"
    return task(step)


def below(key: str, n: int) -> Any:
    def pred(ctx: Mapping[str, Any]) -> bool:
        return bool(ctx.get(key, 0) < n)

    pred.__qualname__ = f"{key}_below_{n}"
    return pred


INNER = net(
    {
        "w": scope("inner_w", wait("s1")),
        "e": saga((bump("charge"), bump("refund")), effect(work)),
        "j": bump("ij"),
    },
    [("start", "w"), ("start", "e"), ("w", "j"), ("e", "j"), ("j", "end")],
    join={"j": "or"},
)
WORKFLOW = seq(
    scope(
        "outer",
        net(
            {
                "fork": bump("fork"),
                "inner": INNER,
                "many": mi(seq(wait("s2"), bump("m")), count=2, join=1, cancel_remaining=False),
                "timed": scope("t", sleep(2), on_cancel=bump("t_cancelled")),
                "loop": seq(bump("lp"), effect(work)),
                "sync": bump("sync"),
                "all": bump("all"),
                "bg": mi(effect(work), count=2, join=None),
            },
            [
                ("start", "fork"),
                ("fork", "inner"),
                ("fork", "many"),
                ("fork", "timed"),
                ("fork", "loop"),
                ("fork", "bg"),
                ("loop", "loop", below("lp", 3)),
                ("loop", "sync"),
                ("inner", "sync"),
                ("many", "all"),
                ("timed", "all"),
                ("sync", "all"),
                ("all", "end"),
                ("bg", "end"),
            ],
            split={"loop": "xor"},
            join={"sync": "or", "all": "and"},
        ),
        on_cancel=bump("outer_cancelled"),
    ),
    par(wait("s3"), bump("after")),
)
PROGRAM = wfsub.compile(WORKFLOW)
REGIONS = sorted(PROGRAM.regions)


class Driver:
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
            elif kind == "signal":
                self.m.deliver_signal(arg, 1)
            elif kind == "cancel":
                self.m.cancel()
            else:
                getattr(self.m, kind)(arg)
        except WfsubError:
            pass  # an input the case cannot take now: it must say so, and change nothing


def pick_action(rnd: random.Random, d: Driver) -> tuple[Any, ...]:
    roll = rnd.random()
    if roll < 0.08:
        return (rnd.choice(["cancel_region", "complete_region"]), rnd.choice(REGIONS))
    if roll < 0.1:
        return ("cancel", None)
    if roll < 0.5 and d.effects:
        return ("effect", rnd.choice(sorted(d.effects)))
    if roll < 0.6 and d.timers:
        return ("timer", rnd.choice(sorted(d.timers)))
    return ("signal", rnd.choice(["s1", "s2", "s3"]))


def check_places(frame: Frame) -> None:
    """Every live net activation's counts agree with what it holds (walks the whole frame tree)."""
    stack = [frame]
    while stack:
        here = stack.pop()
        children = [c for c in members(here) if isinstance(c, Frame)]
        stack.extend(children)
        if not isinstance(here, NetFrame) or not here.alive:
            continue
        spec = here.spec
        assert here.checks == [] and not here.busy
        holding = [0] * spec.node_places
        for child in children:
            if isinstance(child, NodeFrame) and child.attached:
                holding[spec.place_of[child.node]] += 1
        assert here.occ[: spec.node_places] == holding
        assert here.occ[spec.node_places :] == [len(w) for w in here.waiting]
        for j, n in here.held.items():
            assert n == sum(here.occ[p] for p in spec.in_places[j]) > 0
        assert all(here.occ[p] == 0 for j in spec.or_joins + spec.and_joins if j not in here.held
                   for p in spec.in_places[j])


@settings(max_examples=80, deadline=None)
@given(st.integers(0, 2**32))
def test_random_inputs_to_nets_never_crash_or_hang_and_restore_is_exact(seed: int) -> None:
    """Random inputs never crash or hang a net, its place counts stay exact, and restoring changes nothing."""
    rnd = random.Random(seed)
    plain = Driver(Machine(PROGRAM, {}, scheduler=Seeded(seed), trace_level="min"))
    restored = Driver(Machine(PROGRAM, {}, scheduler=Seeded(seed), trace_level="min"))
    for _ in range(300):
        quanta = rnd.choice([1, 3, 50])
        r = plain.run(quanta)
        assert restored.run(quanta).status == r.status
        check_places(plain.m._vm.root)
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

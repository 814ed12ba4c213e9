"""Nets under every scheduler: Deterministic results that never depend on quanta, Seeded runs that Replay
repeats, and snapshots taken at every step that restore exactly (NetFrame and NodeFrame included)."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

import wfsub
from wfsub import effect, mi, net, par, seq, sleep, task, wait
from wfsub._terms import Term
from wfsub.lowlevel import Deterministic, Machine, Replay, Scheduler, Seeded


def bump(key: str) -> Term:
    def step(ctx: Mapping[str, Any]) -> dict[str, Any]:
        return {key: ctx.get(key, 0) + 1, "order": f"{ctx.get('order', '')}{key} "}

    step.__qualname__ = f"bump_{key}"
    return task(step)


async def call_out(ctx: Mapping[str, Any]) -> None:
    return None


def looping(ctx: Mapping[str, Any]) -> bool:
    return bool(ctx["lp"] < 3)


WORKFLOW = seq(
    bump("a0"),
    net(
        {
            "fork": bump("fork"),
            "pay": seq(bump("p"), effect(call_out, name="pay")),
            "ship": par(bump("s1"), seq(sleep(1), bump("s2"))),
            "audit": mi(seq(bump("m"), effect(call_out, name="m_eff")), count=2),
            "loop": bump("lp"),
            "sync": bump("sync"),
            "both": bump("both"),
            "go": wait("go"),
        },
        [
            ("start", "fork"),
            ("fork", "pay"),
            ("fork", "ship"),
            ("fork", "audit"),
            ("fork", "go"),
            ("pay", "loop"),
            ("loop", "loop", looping),
            ("loop", "sync"),
            ("ship", "sync"),
            ("sync", "both"),
            ("audit", "both"),
            ("both", "end"),
            ("go", "end"),
        ],
        split={"loop": "or"},
        join={"sync": "or", "both": "and"},
    ),
    bump("z"),
)


def drive(m: Machine, quanta: int = 1) -> None:
    """Run to the end, answering each block with the oldest effect, timer or awaited signal."""
    for _ in range(100_000):
        r = m.run(quanta)
        if r.status in ("done", "failed", "cancelled"):
            return
        if r.status == "blocked":
            answer(m, r.signals)
    raise AssertionError("did not finish")


def answer(m: Machine, signals: tuple[str, ...]) -> None:
    if m.effect_ids():
        m.complete_effect(m.effect_ids()[0], None)
    elif m.timer_ids():
        m.fire_timer(m.timer_ids()[0])
    else:
        assert signals, "blocked with nothing to answer"
        m.deliver_signal(sorted(signals)[0], None)


def traced(scheduler: Scheduler, quanta: int = 1) -> tuple[dict[str, Any], list[Any]]:
    m = Machine(wfsub.compile(WORKFLOW), scheduler=scheduler, trace_level="full")
    drive(m, quanta)
    assert m.status == "done", m.error_message
    return m.data, [e.as_tuple() for e in m.take_events()]


def counts(data: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in data.items() if k != "order"}


EXPECTED = {"a0": 1, "fork": 1, "p": 1, "s1": 1, "s2": 1, "go": None, "lp": 3, "sync": 3, "both": 1, "z": 1}


def test_deterministic_results_never_depend_on_quanta() -> None:
    """With Deterministic the data and the full trace of a net are the same for every quanta."""
    first = traced(Deterministic(), 1)
    assert counts(first[0]) == EXPECTED
    for quanta in (2, 3, 7, 1000):
        assert traced(Deterministic(), quanta) == first


def test_replay_reproduces_a_seeded_net_run() -> None:
    """Replay(log) of a Seeded run of a net makes the same choices: same data, same trace."""
    seeded = Seeded(11)
    first = traced(seeded)
    assert seeded.log
    assert traced(Replay(seeded.log)) == first


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 10_000))
def test_any_interleaving_ends_the_net_with_the_same_counts(seed: int) -> None:
    """Whatever order Seeded(seed) runs the threads in, the net ends done with the same task counts and discards."""
    data, events = traced(Seeded(seed), quanta=3)
    assert counts(data) == EXPECTED
    discarded = [e for e in events if e[1] == "net_discarded"]
    assert [e[3]["tokens"] for e in discarded] == [{"sync": 2}]


def _snapshot_everywhere(scheduler_factory: Callable[[], Scheduler]) -> None:
    program = wfsub.compile(WORKFLOW)
    reference = Machine(program, scheduler=scheduler_factory(), trace_level="full")
    drive(reference)
    want = (reference.status, reference.data, [e.as_tuple() for e in reference.take_events()])
    base = Machine(program, scheduler=scheduler_factory(), trace_level="full")
    seen: set[str] = set()
    for checked in range(100_000):
        snap = json.loads(json.dumps(base.snapshot()))
        seen |= {obj["type"] for obj in snap["objects"]}
        restored = Machine.restore(program, snap)
        drive(restored)
        got = (restored.status, restored.data, [e.as_tuple() for e in restored.take_events()])
        assert json.loads(json.dumps(got)) == json.loads(json.dumps(want)), f"diverged after {checked} steps"
        r = base.run(1)
        if r.status in ("done", "failed", "cancelled"):
            break
        if r.status == "blocked":
            answer(base, r.signals)
    assert {"NetFrame", "NodeFrame"} <= seen


def test_snapshot_at_every_step_of_a_net_restores_exactly() -> None:
    """Snapshot (through JSON) after every step of a net, restore, continue: same outcome, data and trace."""
    _snapshot_everywhere(Deterministic)


def test_snapshot_of_a_seeded_net_run_restores_exactly() -> None:
    """A restored Seeded machine inside a net continues with the same choices."""
    _snapshot_everywhere(lambda: Seeded(5))


def test_trace_level_can_change_mid_net() -> None:
    """Turning tracing on and off while a net runs changes only what is recorded, never the outcome."""
    program = wfsub.compile(WORKFLOW)
    plain = Machine(program)
    drive(plain)
    m = Machine(program)
    for i in range(100_000):
        m.trace_level = ("none", "min", "full")[i % 3]
        r = m.run(1)
        if r.status in ("done", "failed", "cancelled"):
            break
        if r.status == "blocked":
            answer(m, r.signals)
    assert (m.status, m.data) == (plain.status, plain.data)

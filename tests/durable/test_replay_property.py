"""Replay as a property: generated workflows (seq, par, xor, loop, mi, scope with on_error/on_cancel, saga, wait,
sleep, effect) are driven on a `Machine` by generated inputs landing at generated step positions, and journaled as
the runtime journals them (step, time, running digest). Replaying the journal gives the live run's state and data,
and so does every snapshot taken along the way plus the records after it. A task that reads randomness is reported
as a divergence naming its node path."""

from __future__ import annotations

import contextlib
import json
import random
from collections.abc import Mapping
from typing import Any

from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

import wfsub
from wfsub import SignalRejected, WfsubError, effect, loop, mi, par, saga, scope, seq, sleep, task, wait, xor
from wfsub._runtime._replay import Replayer
from wfsub.lowlevel import Machine, Program, RunResult

SIGNALS = ("a", "b")

# -- building workflows -------------------------------------------------------------------------------------------


def bump(key: str) -> wfsub.Term:
    def fn(ctx: Mapping[str, Any]) -> dict[str, Any]:
        return {key: ctx.get(key, 0) + 1}

    fn.__qualname__ = fn.__name__ = f"bump_{key}"
    return task(fn)


def boom(ctx: Mapping[str, Any]) -> None:
    raise ValueError("boom")


def handled(ctx: Mapping[str, Any]) -> dict[str, Any]:
    return {"handled": ctx.get("handled", 0) + 1}


def even(ctx: Mapping[str, Any]) -> bool:
    return bool(sum(v for v in ctx.values() if isinstance(v, int)) % 2 == 0)


async def never_called(ctx: Mapping[str, Any]) -> None:  # the Machine driver answers effects itself
    raise AssertionError("a Machine never calls an effect")


class Builder:
    """Draws a workflow term; keeps the region names it used."""

    def __init__(self, data: st.DataObject) -> None:
        self.data = data
        self.n = 0
        self.scopes: list[str] = []
        self.mis: list[str] = []
        self.dynamic: list[str] = []

    def draw(self, strategy: st.SearchStrategy[Any]) -> Any:
        return self.data.draw(strategy)

    def fresh(self) -> int:
        self.n += 1
        return self.n

    def term(self, depth: int) -> wfsub.Term:
        leaves = ["task", "task", "wait", "wait", "sleep", "effect", "effect"]
        if depth == 0 and self.draw(st.integers(0, 3)) == 0:
            leaves.append("boom")
        composites = ["seq", "seq", "par", "par", "xor", "loop", "mi", "mi", "scope", "scope", "saga", "saga"]
        kinds = leaves + (composites * 2 if depth > 0 else [])
        kind = self.draw(st.sampled_from(kinds))
        if kind == "task":
            return bump(f"k{self.draw(st.integers(0, 3))}")
        if kind == "boom":
            return task(boom)
        if kind == "wait":
            name = self.draw(st.sampled_from(SIGNALS))
            return wait(name, into=f"got_{name}")
        if kind == "sleep":
            return sleep(self.draw(st.integers(1, 3)))
        if kind == "effect":
            return effect(never_called, name=f"e{self.fresh()}")
        sub = depth - 1
        if kind == "seq":
            return seq(*(self.term(sub) for _ in range(self.draw(st.integers(1, 3)))))
        if kind == "par":
            join = self.draw(st.sampled_from(["all", "first"]))
            return par(self.term(sub), self.term(sub), join=join, cancel_remaining=self.draw(st.booleans()))
        if kind == "xor":
            return xor((even, self.term(sub)), default=self.term(sub))
        if kind == "loop":
            return loop(self.term(sub), times=self.draw(st.integers(1, 2)))
        if kind == "mi":
            name = f"m{self.fresh()}"
            dynamic = self.draw(st.booleans())
            (self.dynamic if dynamic else self.mis).append(name)
            return mi(self.term(sub), count=self.draw(st.integers(1, 2)), name=name, dynamic=dynamic,
                      collect=f"out_{name}")
        if kind == "scope":
            name = f"s{self.fresh()}"
            self.scopes.append(name)
            on_error = task(handled) if self.draw(st.booleans()) else None
            on_cancel = self.term(0) if self.draw(st.booleans()) else None
            return scope(name, self.term(sub), on_error=on_error, on_cancel=on_cancel)
        # saga: one (action, compensation) pair and a plain step
        return saga((self.term(sub), self.term(0)), self.term(sub))


# -- driving a machine as the runtime does, and journaling its inputs -----------------------------------------


class Live:
    """A Machine driven one input at a time, each input journaled as the case actor journals it."""

    def __init__(self, program: Program) -> None:
        self.m = Machine(program, {}, case_id="p")
        self.m.digesting = True
        self.effects: list[tuple[int, str, str]] = []  # (id, path, name) in flight
        self.timers: list[tuple[int, str]] = []
        self.time = 0.0
        self.records: list[dict[str, Any]] = [{
            "seq": 0, "kind": "start", "case_id": "p", "workflow": "gen", "fingerprint": program.fingerprint,
            "data": {}, "scheduler": {"kind": "deterministic"}, "deadline": None, "time": 0.0,
        }]
        self.snapshots: list[tuple[dict[str, Any], int, float]] = []

    def run(self, quanta: int) -> None:
        if self.m.ended:
            return
        r: RunResult = self.m.run(quanta)
        self.effects += [(e.effect_id, e.path, e.name) for e in r.effects]
        self.timers += [(t.timer_id, t.path) for t in r.timers]
        self.effects = [e for e in self.effects if e[0] not in set(r.cancelled_effects)]
        self.timers = [t for t in self.timers if t[0] not in set(r.cancelled_timers)]

    def in_flight(self) -> list[tuple[int, str, str]]:
        """The effects still in flight (one withdrawn since the last run is cancelled by the runtime: no result;
        see test_a_late_result_of_an_effect_withdrawn_before_a_snapshot_replays_from_that_snapshot)."""
        live = set(self.m.effect_ids())
        return [e for e in self.effects if e[0] in live]

    def armed(self) -> list[tuple[int, str]]:
        live = set(self.m.timer_ids())
        return [t for t in self.timers if t[0] in live]

    def record(self, kind: str, **fields: Any) -> None:
        digest, _ = self.m.take_digest()
        self.time += 1.0
        self.records.append({"seq": len(self.records), "kind": kind, "step": self.m.steps, "time": self.time,
                             "digest": digest, **fields})

    def give(self, action: tuple[str, int], regions: Mapping[str, list[str]]) -> None:
        kind, arg = action
        m = self.m
        if kind == "run":
            self.run(arg)
        elif m.ended:
            return
        elif kind == "signal":
            name = SIGNALS[arg % len(SIGNALS)]
            try:
                payload = m.check_signal(name, arg)
            except SignalRejected:
                return  # refused before anything is journaled
            self.record("signal", name=name, payload=payload)
            m.deliver_signal(name, payload)
        elif kind in ("effect_ok", "effect_err") and self.in_flight():
            eid, path, name = self.effects.pop(self.effects.index(self.in_flight()[arg % len(self.in_flight())]))
            if kind == "effect_ok":
                self.record("effect", effect_id=eid, path=path, name=name, result={f"r{eid}": arg})
                m.complete_effect(eid, {f"r{eid}": arg})
            else:
                self.record("effect", effect_id=eid, path=path, name=name,
                            error={"type": "ConnectionError", "message": f"down {arg}"})
                m.complete_effect(eid, None, error=ConnectionError(f"down {arg}"))
        elif kind == "timer" and self.armed():
            tid, path = self.timers.pop(self.timers.index(self.armed()[arg % len(self.armed())]))
            self.record("timer", timer_id=tid, path=path)
            m.fire_timer(tid)
        elif kind in ("cancel_region", "complete_region", "add_instances", "close_instances"):
            names = regions["dynamic"] if kind in ("add_instances", "close_instances") else regions["any"]
            if not names:
                return
            region = names[arg % len(names)]
            m.check_region(kind.replace("_", " "), region)
            fields: dict[str, Any] = {"region": region}
            if kind == "add_instances":
                fields["items"] = [arg]
            self.record(kind, **fields)
            # refused at its step: journaled, changes nothing (the replay refuses it alike)
            with contextlib.suppress(WfsubError, TypeError):
                getattr(m, kind)(region, *([[arg]] if kind == "add_instances" else []))
        elif kind == "cancel" and arg > 9:  # rarely: it ends the case
            self.record("cancel", reason="cancelled", compensate=bool(arg % 2))
            m.cancel("cancelled", compensate=bool(arg % 2))

    def snap(self) -> None:
        state = json.loads(json.dumps(self.m.snapshot()))  # as a store keeps it
        self.snapshots.append((state, self.records[-1]["seq"], self.time))

    def finish(self, regions: Mapping[str, list[str]]) -> None:
        """Answer whatever the case waits for (effects, timers, signals) until it ends or 60 inputs were given."""
        for _ in range(60):
            for _ in range(1000):
                self.run(1000)
                if self.m.ended or self.m.status != "yielded":
                    break
            if self.m.ended:
                break
            if self.in_flight():
                self.give(("effect_ok", 0), regions)
            elif self.armed():
                self.give(("timer", 0), regions)
            elif self.m.awaited_signals():
                self.give(("signal", SIGNALS.index(self.m.awaited_signals()[0])), regions)
            else:
                break
            self.snap()
        for _ in range(1000):
            self.run(1000)
            if self.m.ended or self.m.status != "yielded":
                break
        if self.m.ended:
            self.time += 1.0
            self.records.append({"seq": len(self.records), "kind": "end", "time": self.time,
                                 "outcome": str(self.m.status), "digest": self.m.take_digest()[0],
                                 **({"result": json.loads(json.dumps(self.m.data, default=repr))}
                                    if self.m.status == "done" else {})})


ACTIONS = st.lists(
    st.tuples(
        st.sampled_from(["run", "run", "run", "signal", "signal", "effect_ok", "effect_ok", "effect_err", "timer",
                         "timer", "cancel_region", "complete_region", "add_instances", "close_instances", "cancel"]),
        st.integers(1, 12),
    ),
    max_size=40,
)


def resumed(program: Program, start: dict[str, Any], snapshot: tuple[dict[str, Any], int, float],
            records: list[dict[str, Any]]) -> tuple[str, dict[str, Any]]:
    state, seq, time = snapshot
    r = Replayer(program, start, snapshot={"machine": state, "time": time, "seq": seq, "timers": {}})
    for rec in records:
        if rec["seq"] > seq:
            r.apply(rec)
    if records[-1]["kind"] != "end":
        r.run()
    return str(r.machine.status), dict(r.machine.data)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(st.data(), ACTIONS, st.integers(1, 7))
def test_replay_and_every_snapshot_plus_suffix_equal_the_live_run(data: st.DataObject,
                                                                    actions: list[tuple[str, int]],
                                                                    quanta: int) -> None:
    """Replaying a generated case's journal, or a snapshot plus the records after it, gives the live state and data."""
    builder = Builder(data)
    term = seq(*(builder.term(3) for _ in range(data.draw(st.integers(1, 3)))))
    assume(not wfsub.validate(term))
    program = wfsub.compile(term)
    live = Live(program)
    regions = {"any": builder.scopes + builder.mis + builder.dynamic, "dynamic": builder.dynamic}
    live.run(quanta)
    live.snap()
    for action in actions:
        live.give(action, regions)
        live.snap()
    live.finish(regions)
    live.snap()
    records = live.records
    event(f"status {live.m.status}")
    event(f"records {min(len(records) // 4 * 4, 16)}+")
    report = wfsub.replay(term, records, trace_level="none")
    assert report.divergence is None, report.divergence
    assert (report.state, report.data) == (str(live.m.status), live.m.data)
    for snapshot in live.snapshots:
        assert resumed(program, records[0], snapshot, records) == (report.state, report.data), snapshot[1:]


# -- randomness in a task -------------------------------------------------------------------------------------


def noisy(ctx: Mapping[str, Any]) -> dict[str, Any]:
    return {"noise": random.random()}


def journal_of(term: wfsub.Term, signals: list[str]) -> tuple[list[dict[str, Any]], Machine]:
    live = Live(wfsub.compile(term))
    live.run(1000)
    for i, name in enumerate(signals):
        live.give(("signal", SIGNALS.index(name) + len(SIGNALS) * i), {"any": [], "dynamic": []})
        live.run(1000)
    live.finish({"any": [], "dynamic": []})
    return live.records, live.m


def test_a_task_that_reads_randomness_is_a_divergence_naming_its_path() -> None:
    """A task reading random.random() before a journaled input: the replay diverges there, naming the task."""
    term = seq(wait("a"), bump("k0"), task(noisy), wait("b"), bump("k1"))
    records, live = journal_of(term, ["a", "b"])
    assert [r["kind"] for r in records] == ["start", "signal", "signal", "end"]
    report = wfsub.replay(term, records)
    divergence = report.divergence
    assert divergence is not None
    assert (divergence.seq, divergence.kind) == (2, "signal")
    assert "seq[2].task" in divergence.tasks and "seq[2].task" in str(divergence)
    assert report.data["noise"] != live.data["noise"]


def test_a_task_that_reads_randomness_after_the_last_input_is_a_divergence() -> None:
    """A task reading randomness after the last input: the replay reports a divergence naming it."""
    term = seq(wait("a"), task(noisy))
    records, live = journal_of(term, ["a"])
    assert records[-1]["kind"] == "end"
    report = wfsub.replay(term, records)
    assert report.data != live.data  # the replay computed other data ...
    assert report.divergence is not None and "seq[1].task" in report.divergence.tasks  # ... and says nothing


def test_a_late_result_of_an_effect_withdrawn_before_a_snapshot_replays_from_that_snapshot() -> None:
    """Snapshot + suffix equals the full replay when the suffix holds the discarded result of a withdrawn effect."""
    term = seq(scope("s", effect(never_called, name="slow"), on_cancel=bump("k0")), wait("a"))
    program = wfsub.compile(term)
    live = Live(program)
    live.run(100)
    eid, path, name = live.effects[0]
    live.give(("cancel_region", 0), {"any": ["s"], "dynamic": []})  # withdraws the effect
    live.run(100)
    live.snap()  # as a parked case writes it
    live.record("effect", effect_id=eid, path=path, name=name, result={"late": True})  # the late result arrives
    assert live.m.complete_effect(eid, {"late": True}) is False  # discarded
    live.give(("signal", 0), {"any": [], "dynamic": []})
    live.finish({"any": [], "dynamic": []})
    report = wfsub.replay(term, live.records)
    assert report.divergence is None and report.state == "done"
    assert resumed(program, live.records[0], live.snapshots[0], live.records) == (report.state, report.data)

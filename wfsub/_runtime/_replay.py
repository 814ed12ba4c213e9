"""Replaying a journal: rebuild a case from its start record (or a snapshot) and the records after it.

A compacted journal starts with a `snapshot` record instead of `start`: the replay restores it and checks the
records after it (what that verifies, and what it cannot, is said in `_compact`). Replay builds on compaction:
`replayer_for` reads a journal's first record with `_compact`'s helpers, and `_compact` never imports replay.

The vm runs to each record's step count before the record is applied (no effect runs: recorded outcomes are
fed back; tasks re-run), so the replayed case passes through exactly the states the live one did. A record that
does not apply is a divergence, named precisely (`ReplayDivergence`): an effect or timer id the program never
requested or requested at another node path, a case that blocked or ended before the record's step, a signal
the case cannot take, a different outcome at the end, a digest of task outputs that differs (a task that is not
deterministic, or a changed workflow). A journal replayed on its own program never diverges.

`Replayer` is the engine: recovery uses it to rebuild a live case, migration to try a journal on a newer
version, and `replay()` (the public function) to re-run a case offline with a trace.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .._compiler import compile_workflow
from .._errors import ReplayDivergence, RestoredError, SignalRejected, SnapshotMismatch, compacted_divergence
from .._program import Program
from .._terms import Term
from .._trace import TraceEvent
from .._vm import EffectRequest, Machine, RunResult, Scheduler, Seeded, TimerRequest
from ._compact import base_state, is_snapshot, start_of
from ._journal import INPUT_KINDS, JournalRecord, effective
from ._request_ids import RequestKinds, input_kind, kept_kinds

Record = dict[str, Any]


def scheduler_of(start: Mapping[str, Any]) -> Scheduler | None:
    """The scheduler a start record names (None: the deterministic default)."""
    spec = start.get("scheduler") or {"kind": "deterministic"}
    if spec.get("kind") == "seeded":
        return Seeded(int(spec["seed"]))
    return None


def as_record(record: Mapping[str, Any] | JournalRecord) -> Record:
    return record.model_dump() if isinstance(record, JournalRecord) else dict(record)


class Replayer:
    """A machine rebuilt from a journal, and the requests it has open (effects in flight, timers with due times).

    `time` is the acceptance time of the last record applied: a timer armed after it is due `time + seconds`.
    """

    def __init__(
        self,
        program: Program,
        start: Mapping[str, Any],
        *,
        trace_level: str = "none",
        snapshot: Mapping[str, Any] | None = None,
        max_instances: int | None = None,
    ) -> None:
        self.case_id: str | None = start.get("case_id")
        self.effects: dict[int, EffectRequest] = {}
        self.timers: dict[int, tuple[TimerRequest, float]] = {}
        self.requested: set[int] = set()  # every effect id the program asked for (pending or since withdrawn)
        self.armed: set[int] = set()
        self.events: list[TraceEvent] = []
        self.cancel_reason: str | None = None  # of the last `cancel` record applied (a case being cancelled)
        self.request_ids: RequestKinds = kept_kinds(snapshot)  # request id -> input kind (see `_request_ids`)
        self.run_count = int(snapshot.get("run", 0)) if snapshot is not None else 0  # retries applied so far
        self.requested_before = 0  # effect ids below it were requested before the snapshot the replay starts from
        extra = {} if max_instances is None else {"max_instances": max_instances}
        if snapshot is None:
            self.machine = Machine(
                program, start["data"], scheduler=scheduler_of(start), trace_level=trace_level, case_id=self.case_id,
                workflow=start.get("workflow"), **extra,
            )
            self.time = float(start["time"])
            self.seq = 0
        else:
            self.machine = Machine.restore(program, snapshot["machine"], case_id=self.case_id)
            self.machine.trace_level = trace_level
            self.time = float(snapshot["time"])
            self.seq = int(snapshot["seq"])
            effects, timers = self.machine.pending_requests()
            # Effects requested before the snapshot and withdrawn since may still answer late (a result the vm
            # discards): their ids are below the machine's next effect id.
            self.requested_before = self.machine.next_effect_id
            due = {int(k): float(v) for k, v in snapshot.get("timers", {}).items()}
            for req in effects:
                self.effects[req.effect_id] = req
                self.requested.add(req.effect_id)
            for timer in timers:
                self.timers[timer.timer_id] = (timer, due.get(timer.timer_id, timer.due(self.time)))
                self.armed.add(timer.timer_id)
        self.machine.digesting = True
        self.last: RunResult | None = None

    # -- running -------------------------------------------------------------------------------------------

    def absorb(self, r: RunResult) -> None:
        """Keep the books a driver keeps: the effects and timers the run opened or withdrew."""
        for req in r.effects:
            self.effects[req.effect_id] = req
            self.requested.add(req.effect_id)
        for timer in r.timers:
            self.timers[timer.timer_id] = (timer, timer.due(self.time))
            self.armed.add(timer.timer_id)
        for eid in r.cancelled_effects:
            self.effects.pop(eid, None)
        for tid in r.cancelled_timers:
            self.timers.pop(tid, None)
        if self.machine.trace_level != "none":
            self.events.extend(
                TraceEvent(case_id=self.case_id or "", seq=e[0], kind=e[1], path=e[2], detail=e[3], time=self.time)
                for e in self.machine.take_events()
            )
        self.last = r

    def run(self, until_step: int | None = None, quanta: int = 10_000) -> None:
        """Run until the machine reaches `until_step`, or (None) until it blocks or ends."""
        m = self.machine
        while not m.ended:
            if until_step is not None:
                left = until_step - m.steps
                if left <= 0:
                    return
                r = m.run(min(left, quanta), time=self.time)
            else:
                r = m.run(quanta, time=self.time)
            self.absorb(r)
            if r.status == "blocked":
                return
        if self.last is None or self.last.status not in ("done", "failed", "cancelled"):
            self.absorb(m.run(0, time=self.time))

    # -- applying records ----------------------------------------------------------------------------------

    def diverged(
        self, rec: Mapping[str, Any], expected: str, happened: str, tasks: Sequence[str] = ()
    ) -> ReplayDivergence:
        return ReplayDivergence(self.case_id, int(rec.get("seq", -1)), str(rec.get("kind")), expected, happened, tasks)

    def apply(self, rec: Mapping[str, Any]) -> None:
        """Run to the record's step and apply it; raise ReplayDivergence where it does not apply."""
        kind = rec["kind"]
        if kind == "end":
            self.check_end(rec)
            return
        if kind not in INPUT_KINDS:
            raise self.diverged(rec, "an input record", f"the journal holds an unknown record kind {kind!r}")
        m = self.machine
        step = int(rec["step"])
        self.run(step)
        if m.ended and kind == "version" and m.steps == step:
            # a migration decided where the replay on the new version ran to its end (a retried case whose fixed
            # step finishes it): the record changes nothing in the vm, and the `end` after it closes the case
            self.time, self.seq = float(rec["time"]), int(rec["seq"])
            return
        if m.ended:
            raise self.diverged(rec, f"a {kind} at step {step}", f"the case had already ended ({m.status})")
        if m.steps != step:
            waits = ", ".join(m.awaited_signals()) or "no signal"
            raise self.diverged(
                rec, f"a {kind} at step {step}", f"the case blocked at step {m.steps} (waiting for {waits})"
            )
        digest, tasks = m.take_digest()
        if rec.get("digest") is not None and digest != rec["digest"]:
            raise self.diverged(
                rec, f"task outputs with digest {rec['digest']}", f"the tasks gave digest {digest}", tasks
            )
        self.time = float(rec["time"])
        self.seq = int(rec["seq"])
        request_id = rec.get("request_id")
        if request_id is not None:
            self.request_ids[request_id] = input_kind(rec)
        self._input(rec, kind)

    def _input(self, rec: Mapping[str, Any], kind: str) -> None:
        if kind == "effect":
            self._effect(rec)
        elif kind == "timer":
            self._timer(rec)
        elif kind == "signal":
            self._signal(rec)
        elif kind == "cancel":
            self.cancel_reason = rec.get("reason", "cancelled")
            self.machine.cancel(self.cancel_reason, compensate=bool(rec.get("compensate", True)))
        elif kind in ("cancel_region", "complete_region", "add_instances", "close_instances"):
            self._region(rec, kind)
        elif kind == "retry":
            self.run_count = int(rec.get("run") or self.run_count + 1)
            # the failed run it re-opens was dropped (`effective`); the case goes on from here
        elif kind == "version":  # a migration: the records after it were made by the version being replayed, and
            self.pin_timers(rec.get("timers") or {})  # the timers armed before it keep their due times

    def _effect(self, rec: Mapping[str, Any]) -> None:
        eid = int(rec["effect_id"])
        req = self.effects.get(eid)
        if eid not in self.requested and eid >= self.requested_before:
            raise self.diverged(
                rec, f"a result for effect {eid} ({rec.get('name')}) at {rec.get('path')}",
                "the program never requested that effect",
            )
        if req is not None and req.path != rec.get("path"):
            raise self.diverged(
                rec, f"effect {eid} at {rec.get('path')}", f"the program requested effect {eid} at {req.path}"
            )
        error = rec.get("error")
        failure = None if error is None else RestoredError(error.get("type", "Exception"), error.get("message", ""))
        self.effects.pop(eid, None)
        self.machine.complete_effect(eid, rec.get("result"), error=failure)

    def _timer(self, rec: Mapping[str, Any]) -> None:
        tid = int(rec["timer_id"])
        armed = self.timers.get(tid)
        if tid not in self.armed:
            raise self.diverged(rec, f"timer {tid} at {rec.get('path')}", "the program never armed that timer")
        if armed is not None and armed[0].path != rec.get("path"):
            raise self.diverged(
                rec, f"timer {tid} at {rec.get('path')}", f"the program armed timer {tid} at {armed[0].path}"
            )
        self.timers.pop(tid, None)
        self.machine.fire_timer(tid)

    def _signal(self, rec: Mapping[str, Any]) -> None:
        m = self.machine
        try:
            name, payload = rec["name"], rec.get("payload")
            if rec.get("update"):  # its answer is computed again (not journaled), under its request id
                if name not in m.program.updates:
                    m.check_update(name, payload)  # (raises: this version answers no such update)
                m.deliver_update(name, payload, str(rec["request_id"]), checked=True)
            elif m.program.guarded:  # a check= ran when a wait took it, as it runs again here: not at a door
                if name not in m.program.signals:
                    m.check_signal(name, payload)  # (raises: this version never waits for it)
                m.deliver_signal(name, payload, checked=True)
            else:
                m.deliver_signal(name, payload)
        except SignalRejected as exc:
            raise self.diverged(rec, f"signal {rec['name']!r} taken at step {rec['step']}", str(exc)) from None

    def _region(self, rec: Mapping[str, Any], kind: str) -> None:
        m = self.machine
        try:
            if kind == "cancel_region":
                m.cancel_region(rec["region"])
            elif kind == "complete_region":
                m.complete_region(rec["region"])
            elif kind == "add_instances":
                m.add_instances(rec["region"], rec["items"])
            else:
                m.close_instances(rec["region"])
        except SignalRejected:
            pass  # refused in the live run too: an input refused at its step changes nothing

    def pin_timers(self, dues: Mapping[str, Any]) -> None:
        """Give armed timers the due times a `version` record carries (timer id -> due)."""
        for key, due in dues.items():
            armed = self.timers.get(int(key))
            if armed is not None:
                self.timers[int(key)] = (armed[0], float(due))

    def check_end(self, rec: Mapping[str, Any]) -> None:
        self.run()
        m = self.machine
        outcome = rec.get("outcome")
        if m.ended and m.status == outcome:
            digest, tasks = m.take_digest()
            if rec.get("digest") is not None and digest != rec["digest"]:  # the tasks after the last input
                raise self.diverged(
                    rec, f"task outputs with digest {rec['digest']}", f"the tasks gave digest {digest}", tasks
                )
            return
        happened = f"the case ended {m.status}" if m.ended else f"the case is {m.status}, waiting"
        raise self.diverged(rec, f"the case to end {outcome}", happened)


def replayer_for(
    program: Program, first: Mapping[str, Any], *, trace_level: str = "none", max_instances: int | None = None
) -> Replayer:
    """A Replayer at the first record of a journal: the `start`, or a compaction's `snapshot` (restored)."""
    if not is_snapshot(first):
        return Replayer(program, first, trace_level=trace_level, max_instances=max_instances)
    state = base_state(first, program)
    try:
        return Replayer(program, start_of(first), trace_level=trace_level, snapshot=state,
                        max_instances=max_instances)
    except SnapshotMismatch as exc:  # (the record's own fingerprint said otherwise: a damaged record)
        raise compacted_divergence(
            start_of(first).get("case_id"), int(first.get("seq", -1)), first.get("fingerprint"),
            program.fingerprint, str(exc),
        ) from None


@dataclass(frozen=True)
class ReplayReport:
    """What an offline replay found: the state reached, the data, the trace, and the first divergence (or None)."""

    state: str
    data: dict[str, Any]
    events: list[TraceEvent] = field(default_factory=list)
    divergence: ReplayDivergence | None = None


def replay(
    workflow: Term | Program,
    journal: Sequence[Mapping[str, Any] | JournalRecord],
    *,
    trace_level: str = "full",
    library: Mapping[str, Term] | None = None,
) -> ReplayReport:
    """Re-run a case offline from its journal on `workflow` (no effect runs; recorded outcomes are fed back).

    The report's `divergence` is None when the whole journal applies, else the first record that does not.
    """
    records = [as_record(r) for r in journal]
    if not records or records[0].get("kind") not in ("start", "snapshot"):
        raise ValueError(
            "a journal starts with its start record (or, compacted, its snapshot record): pass sub.journal(case_id) "
            "(or `wfsub journal`) whole"
        )
    program = workflow if isinstance(workflow, Program) else compile_workflow(workflow, library=library)
    try:
        replayer = replayer_for(program, records[0], trace_level=trace_level)
    except ReplayDivergence as exc:  # a compacted journal on a program its snapshot cannot be restored on
        return ReplayReport("unknown", {}, [], exc)
    divergence = None
    records = effective(records)
    try:
        for rec in records[1:]:
            replayer.apply(rec)
        if records[-1].get("kind") != "end":
            replayer.run()
    except ReplayDivergence as exc:
        divergence = exc
    m = replayer.machine
    return ReplayReport(str(m.status), dict(m.data), replayer.events, divergence)

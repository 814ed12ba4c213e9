"""Differential tests: random terms and inputs, run by the reference interpreter and by the compiled vm, agree.

Both sides run until nothing can move; then the next input of the generated script goes to both. At each such
quiescent point the outcome, the data, the task runs (in order), the effects in flight, the armed timers and the
awaited signals must be the same.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import wfsub
from wfsub import (
    SignalRejected,
    add_instances,
    call,
    cancel_region,
    close_instances,
    complete_region,
    mi,
    par,
    scope,
    seq,
    task,
    xor,
)
from wfsub._program import SPAWN_CHUNK
from wfsub._terms import Term
from wfsub.lowlevel import Machine

from .gen import Recorder, a_task, scripts, terms
from .reference import Reference, Rejected


def normalized(value: Any) -> Any:
    """Data with error records' messages blanked: the reference keeps the type and node path, not the text."""
    if isinstance(value, Mapping):
        out = {k: normalized(v) for k, v in value.items()}
        if {"type", "message", "path", "compensated", "cause"} <= set(out):
            out["message"] = None
        return out
    if isinstance(value, list):
        return [normalized(v) for v in value]
    return value


class VmSide:
    """The compiled vm, with the effects and timers it asked for and has not had answered or cancelled."""

    def __init__(self, program: wfsub.Program, quanta: int) -> None:
        self.m = Machine(program)
        self.quanta = quanta
        self.effects: dict[int, str] = {}
        self.timers: set[int] = set()
        self.lengths: dict[int, tuple[float, float | None]] = {}  # every timer asked for: (seconds, epoch due)
        self.status = "yielded"
        self.error: tuple[str | None, str | None] = (None, None)
        self.signals: tuple[str, ...] = ()
        self.answers: list[tuple[Any, ...]] = []  # update answers, as `answered` compares them
        self.passed: set[str] = set()  # updates refused: no wait for them can be reached (see `passed`)

    def run(self) -> None:
        for _ in range(100_000):
            r = self.m.run(self.quanta)
            self.take()
            self.effects.update({x.effect_id: x.path for x in r.effects})
            self.timers |= {x.timer_id for x in r.timers}
            self.lengths.update({x.timer_id: (x.seconds, x.at) for x in r.timers})
            for eid in r.cancelled_effects:
                self.effects.pop(eid, None)
            self.timers -= set(r.cancelled_timers)
            if r.status != "yielded":
                break
        self.status = str(r.status)
        self.signals = r.signals if r.status == "blocked" else ()
        if r.status == "failed":
            self.error = (type(r.error).__name__ if r.error is not None else None, r.error_path)
        if r.status in ("done", "failed", "cancelled"):
            self.effects.clear()
            self.timers.clear()

    def take(self) -> None:
        taken = self.m.take_answers()
        self.answers += answered(taken)
        self.passed |= passed(taken)


def answered(answers: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """What both sides must agree on of the update answers: (id, kind, value) of each answered, refused, failed or
    withdrawn update (a case's end answers the rest: that is the runtime's to say, from the outcome). An update the
    vm refused as "passed" (no wait can take it any more) is left out: the reference buffers it (see `passed`)."""
    return [(uid, kind, value if kind == "answer" else None)
            for uid, kind, _, value in answers if uid is not None and kind not in ("ended", "passed")]


def passed(answers: list[tuple[Any, ...]]) -> set[str]:
    """The updates the vm refused because no wait for them can be reached any more."""
    return {uid for uid, kind, _, _ in answers if kind == "passed"}


def _status(vm: VmSide) -> str:
    return "running" if vm.status == "blocked" else vm.status


def _apply(side: Any, action: tuple[Any, ...], effect_id: int | None, timer_id: int | None) -> Any:
    kind = action[0]
    if kind == "effect":
        if action[2] == "error":
            return side.complete_effect(effect_id, None, error=RuntimeError("effect failed"))
        return side.complete_effect(effect_id, {f"r{effect_id}": action[1]})
    if kind == "timer":
        return side.fire_timer(timer_id)
    if kind == "signal":
        return side.deliver_signal(action[1], action[2]) if isinstance(side, Machine) else side.signal(
            action[1], action[2]
        )
    if kind == "update":
        return side.deliver_update(action[1], action[2], action[3]) if isinstance(side, Machine) else side.update(
            action[1], action[2], action[3]
        )
    if kind == "cancel":
        return side.cancel(compensate=action[1])
    if kind == "add_instances":
        return side.add_instances(action[1], action[2])
    return getattr(side, kind)(action[1])


def check_agreement(term: Term, rec: Recorder, script: list[tuple[Any, ...]], quanta: int,
                    library: Mapping[str, Term] | None = None,
                    between: Callable[[VmSide], None] | None = None) -> None:
    """Run both sides through the script, comparing at every quiescent point; `between` may touch the vm side
    before each input (the fuzz test swaps in a machine restored from a snapshot)."""
    program = wfsub.compile(term, library=library)
    vm, ref = VmSide(program, quanta), Reference(term, library=library)
    vm_runs: list[Any] = []
    ref_runs: list[Any] = []
    where = f"{term!r}\n{program.dis()}"
    actions = list(script)
    done: list[Any] = []
    while True:
        rec.runs = vm_runs
        vm.run()
        rec.runs = ref_runs
        ref.run()
        context = f"{where}\ninputs so far: {done}"
        status, error_type, error_path = ref.outcome()
        assert (_status(vm), *vm.error) == (status, error_type, error_path), context
        assert Counter(vm_runs) == Counter(ref_runs), context
        assert vm_runs == ref_runs, context
        assert normalized(vm.m.data) == normalized(ref.data), context
        assert vm.effects == ref.effects(), context
        assert sorted(vm.timers) == ref.timers(), context
        assert {tid: vm.lengths[tid] for tid in vm.timers} == ref.timer_lengths(), context
        assert sorted(vm.signals) == ref.awaited(), context
        vm.take()  # (those an input made after the last burst)
        assert vm.answers == [a for a in answered(ref.e.answers) if a[0] not in vm.passed], context
        # an update refused as passed is one the reference never takes: it stays buffered there
        assert not vm.passed & {a[0] for a in answered(ref.e.answers)}, context
        if status != "running" or not actions:
            return
        action = actions.pop(0)
        if action[0] == "update":
            action = (*action, f"u{len(done)}")  # its id
        eid = sorted(vm.effects)[action[1] % len(vm.effects)] if action[0] == "effect" and vm.effects else None
        tid = sorted(vm.timers)[action[1] % len(vm.timers)] if action[0] == "timer" and vm.timers else None
        if action[0] in ("effect", "timer") and eid is None and tid is None:
            continue
        done.append(action)
        if between is not None:
            between(vm)
        if eid is not None:
            del vm.effects[eid]
        vm.timers.discard(tid or 0)
        rec.runs = vm_runs
        try:
            vm_said: Any = _apply(vm.m, action, eid, tid)
        except SignalRejected as exc:  # the one way a case refuses an input; anything else is a bug
            vm_said = ("rejected", type(exc).__name__)
        rec.runs = ref_runs
        try:
            ref_said: Any = _apply(ref, action, eid, tid)
        except Rejected:
            ref_said = ("rejected", None)
        assert vm_said == ref_said or (isinstance(vm_said, tuple) and isinstance(ref_said, tuple)), (
            f"{action}: vm {vm_said}, reference {ref_said}\n{context}"
        )


@pytest.mark.long
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data(), st.sampled_from([1, 3, 1000]))
def test_vm_agrees_with_reference_interpreter(data: st.DataObject, quanta: int) -> None:
    """Compiled bytecode gives the reference's outcome, data, task runs and run order, for any quanta and inputs."""
    rec = Recorder()
    term = data.draw(terms(rec))
    script = data.draw(scripts(rec))
    check_agreement(term, rec, script, quanta, rec.library)


# -- region steps written inside their own region, in the shapes a sliding window takes ----------------------------


def _window(rec: Recorder, name: str, last: Term | None = None, *, width: int = 4) -> Term:
    """A dynamic mi whose every instance runs a task, then adds the next instance (until `width`), then `last`."""
    def next_item(ctx: Mapping[str, Any]) -> list[int]:
        return [ctx["item"] + 1] if ctx["item"] + 1 < width else []

    body = [a_task(rec), add_instances(name, items=next_item)]
    if last is not None:
        body.append(xor((lambda c: c["item"] == width - 1, last), default=a_task(rec)))
    return mi(seq(*body), items=lambda c: [0], dynamic=True, name=name, collect=f"out_{name}")


def _shapes(rec: Recorder) -> dict[str, tuple[Term, dict[str, Term]]]:
    return {
        "call": (call("Inner"), {"Inner": _window(rec, "inner")}),
        "two calls": (par(call("Inner"), call("Inner")), {"Inner": _window(rec, "inner")}),
        "nested": (mi(_window(rec, "inner"), count=2, collect="outer"), {}),
        "nested in a call": (mi(call("Inner"), count=3, collect="outer"), {"Inner": _window(rec, "inner")}),
        "close": (mi(_window(rec, "inner", close_instances("inner")), count=2), {}),
        "complete": (mi(_window(rec, "inner", complete_region("inner"), width=3), count=2), {}),
        "cancel": (
            mi(scope("s", _window(rec, "inner", cancel_region("inner"), width=3), on_cancel=a_task(rec)), count=2),
            {},
        ),
        "cancel a scope": (
            mi(scope("s", seq(a_task(rec), cancel_region("s")), on_cancel=a_task(rec)), count=2), {}
        ),
        "complete via call": (
            par(call("Inner"), call("Inner")), {"Inner": _window(rec, "inner", complete_region("inner"), width=3)}
        ),
    }


@pytest.mark.parametrize("shape", list(_shapes(Recorder())))
@pytest.mark.parametrize("quanta", [1, 1000])
def test_region_step_inside_its_region_addresses_its_own_activation(shape: str, quanta: int) -> None:
    """A region step inside its own mi or scope (reached by call, or nested in another mi) agrees with the reference."""
    rec = Recorder()
    term, library = _shapes(rec)[shape]
    check_agreement(term, rec, [], quanta, library)
    vm = Machine(wfsub.compile(term, library=library))
    # never refused (a cancel of the mi the step runs in withdraws its own thread, and so the case's)
    assert vm.run(10**6).status == ("cancelled" if shape == "cancel" else "done"), vm.error_message


# -- an mi bigger than a spawn chunk: its instances start a chunk at a time, each chunk queued behind the last ------


def _big_shapes(rec: Recorder) -> dict[str, Term]:
    n = 2 * SPAWN_CHUNK + 7
    fork = seq(task(lambda c: {"it": c.get("item", "-")}), a_task(rec), par(a_task(rec), a_task(rec)))
    return {
        "bodies that fork": par(mi(seq(a_task(rec), par(a_task(rec), a_task(rec))), count=n, collect="o"), a_task(rec)),
        "until": mi(a_task(rec), count=n, join="all", until=lambda s: s.completed >= SPAWN_CHUNK + 3),
        "first": seq(mi(a_task(rec), count=n, join="first", collect="o"), a_task(rec)),
        "no join": seq(mi(seq(a_task(rec), a_task(rec)), count=n, join=None), a_task(rec)),
        "items": mi(a_task(rec), items=lambda c: [f"i{k}" for k in range(n)], collect="o"),
        "a big add": par(
            mi(fork, items=lambda c: [], dynamic="open", name="m0", collect="o"),
            seq(add_instances("m0", items=lambda c: [f"a{k}" for k in range(n)]), close_instances("m0")),
        ),
        "an add behind count= instances still starting": par(
            mi(fork, count=n, dynamic=True, name="m0", collect="o"),
            add_instances("m0", items=lambda c: [f"a{k}" for k in range(n)]),
        ),
        "an add behind items still starting": par(
            mi(fork, items=lambda c: [f"i{k}" for k in range(n)], dynamic=True, name="m0", collect="o"),
            add_instances("m0", items=lambda c: [f"a{k}" for k in range(7)]),
        ),
    }


@pytest.mark.parametrize("shape", list(_big_shapes(Recorder())))
@pytest.mark.parametrize("quanta", [1, 1000])
def test_an_mi_bigger_than_a_chunk_agrees_with_the_reference(shape: str, quanta: int) -> None:
    """Past one spawn chunk, the instances' run order, joins and until= see what the reference's do."""
    rec = Recorder()
    check_agreement(_big_shapes(rec)[shape], rec, [], quanta)


@pytest.mark.parametrize("finally_", [False, True])
@pytest.mark.parametrize("quanta", [1, 1000])
def test_a_multi_merge_that_ends_a_scope_goes_on_after_it_once_per_branch(finally_: bool, quanta: int) -> None:
    """par(join="each") as a scope's last step: what follows the scope (and its finally_) runs once per arriving
    branch, on the vm as in the reference."""
    rec = Recorder()
    body = par(a_task(rec), a_task(rec), join="each")
    region = scope("r0", body, finally_=a_task(rec)) if finally_ else scope("r0", body)
    check_agreement(seq(region, a_task(rec)), rec, [], quanta)

"""The vm, one opcode and one input method at a time."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pydantic
import pytest

import wfsub
from wfsub import (
    MachineStateError,
    SignalRejected,
    StepFailed,
    call,
    critical,
    defer,
    effect,
    interleave,
    loop,
    mi,
    milestone,
    multi_choice,
    par,
    scope,
    seq,
    sleep,
    task,
    terminate,
    wait,
    when_milestone,
    xor,
)
from wfsub._terms import Term
from wfsub.lowlevel import Machine, Op, RunResult


def put(key: str, value: Any) -> Term:
    def step(ctx: Mapping[str, Any]) -> dict[str, Any]:
        return {key: value}

    step.__qualname__ = f"put_{key}"
    return task(step)


def log(name: str, runs: list[str]) -> Term:
    def step(ctx: Mapping[str, Any]) -> None:
        runs.append(name)

    step.__qualname__ = name
    return task(step)


async def work(ctx: Mapping[str, Any]) -> None:
    return None


def machine(term: Term, data: dict[str, Any] | None = None, **kw: Any) -> Machine:
    return Machine(wfsub.compile(term, **kw), data)


def settle(m: Machine) -> RunResult:
    """Run until the machine needs an input or has ended; gather what every run asked for."""
    effects, timers, cancelled = [], [], []
    while True:
        r = m.run(1000)
        effects += r.effects
        timers += r.timers
        cancelled += r.cancelled_effects
        if r.status != "yielded":
            r.effects, r.timers, r.cancelled_effects = effects, timers, cancelled
            return r


def test_task_merges_updates_into_case_data() -> None:
    """TASK calls fn(ctx) with a read-only view and merges the returned mapping."""
    seen: list[Any] = []

    def read(ctx: Mapping[str, Any]) -> None:
        seen.append(dict(ctx))
        with pytest.raises(TypeError):
            ctx["a"] = 2  # type: ignore[index]

    m = machine(seq(put("a", 1), task(read)), {"x": 0})
    assert settle(m).status == "done"
    assert m.data == {"x": 0, "a": 1} and seen == [{"x": 0, "a": 1}]


def test_task_exception_fails_case_with_path() -> None:
    """A raising task fails the case; the error keeps the exception and the node path."""

    def boom(ctx: Mapping[str, Any]) -> None:
        raise ValueError("bad input")

    m = machine(seq(put("a", 1), task(boom)))
    r = settle(m)
    assert r.status == "failed" and isinstance(r.error, ValueError)
    assert r.error_path == "seq[1].task" and r.error_message == "task boom raised ValueError: bad input"


def test_task_returning_non_mapping_fails_case() -> None:
    """A task must return a mapping or None; anything else fails with a message that says so."""
    m = machine(task(lambda ctx: 3))
    r = settle(m)
    assert r.status == "failed" and "return a mapping of updates, or None" in (r.error_message or "")


def test_effect_parks_token_and_reports_request() -> None:
    """EFFECT parks its token, reports a request with a deterministic id, and resumes on completion."""
    m = machine(seq(effect(work, name="charge", timeout=2.0), put("after", True)))
    r = settle(m)
    assert r.status == "blocked" and [(e.effect_id, e.name, e.timeout) for e in r.effects] == [(1, "charge", 2.0)]
    assert r.effects[0].path == "seq[0].effect" and m.pending_effects == 1
    assert m.complete_effect(1, {"paid": 5}) is True
    assert settle(m).status == "done" and m.data == {"paid": 5, "after": True}


def test_parallel_effects_are_outstanding_at_once() -> None:
    """Several branches can each have an effect in flight; completion order does not matter."""
    m = machine(par(effect(work, name="a"), effect(work, name="b"), effect(work, name="c")))
    r = settle(m)
    assert [e.name for e in r.effects] == ["a", "b", "c"]
    for e in reversed(r.effects):
        m.complete_effect(e.effect_id, {e.name: 1})
    assert settle(m).status == "done" and m.data == {"a": 1, "b": 1, "c": 1}


def test_effect_error_fails_case() -> None:
    """complete_effect(error=...) fails the case with that exception."""
    m = machine(effect(work, name="ship"))
    eid = settle(m).effects[0].effect_id
    m.complete_effect(eid, error=ConnectionError("down"))
    r = settle(m)
    assert r.status == "failed" and isinstance(r.error, ConnectionError) and r.error_path == "effect"


def test_unknown_effect_and_timer_ids_raise() -> None:
    """Inputs naming ids the machine never issued raise MachineStateError."""
    m = machine(effect(work))
    settle(m)
    with pytest.raises(MachineStateError, match="unknown effect id 9"):
        m.complete_effect(9)
    with pytest.raises(MachineStateError, match="unknown timer id 4"):
        m.fire_timer(4)


def test_inputs_to_an_ended_machine_are_rejected() -> None:
    """Signals, cancels and region inputs to an ended machine raise SignalRejected."""
    m = machine(seq(put("a", 1)))
    assert settle(m).status == "done"
    with pytest.raises(SignalRejected, match="already ended"):
        m.cancel()
    with pytest.raises(SignalRejected, match="already ended"):
        m.cancel_region("r")


def test_xor_takes_first_true_branch_or_default_or_fails() -> None:
    """XOR picks the first branch whose predicate holds, else default, else fails naming the node."""
    wf = xor(
        (lambda c: c["n"] > 5, put("r", "big")), (lambda c: c["n"] > 0, put("r", "small")), default=put("r", "zero")
    )
    for n, want in [(9, "big"), (3, "small"), (0, "zero")]:
        m = machine(wf, {"n": n})
        settle(m)
        assert m.data["r"] == want
    m = machine(seq(put("a", 1), xor((lambda c: False, put("r", 1)))))
    r = settle(m)
    assert r.status == "failed" and r.error_path == "seq[1].xor" and isinstance(r.error, StepFailed)


def test_multi_choice_runs_every_true_branch_then_merges() -> None:
    """MC_SPLIT starts exactly the branches whose predicates hold; the merge waits for those."""
    runs: list[str] = []
    wf = seq(
        multi_choice(
            (lambda c: True, log("a", runs)), (lambda c: False, log("b", runs)), (lambda c: True, log("c", runs))
        ),
        log("after", runs),
    )
    settle(machine(wf))
    assert runs == ["a", "c", "after"]


@pytest.mark.parametrize(
    ("kw", "expected"),
    [
        ({"times": 3}, 3),
        ({"times": 0}, 0),
        ({"while_": lambda c: c.get("i", 0) < 4}, 4),
        ({"until": lambda c: c.get("i", 0) >= 2}, 2),
    ],
)
def test_loop_modes(kw: dict[str, Any], expected: int) -> None:
    """LOOP_ENTER/TEST/BACK run the body the right number of times for times, while_ and until."""
    m = machine(loop(task(lambda c: {"i": c.get("i", 0) + 1}), **kw))
    settle(m)
    assert m.data.get("i", 0) == expected


def test_loop_max_iterations_fails_case() -> None:
    """A loop that passes max_iterations fails the case with a message naming the limit."""
    m = machine(loop(put("x", 1), while_=lambda c: True, max_iterations=10))
    r = settle(m)
    assert r.status == "failed" and "max_iterations=10" in (r.error_message or "")


def test_wait_stores_payload_and_buffers_early_signal() -> None:
    """WAIT stores the payload at `into`; a signal sent before the wait is buffered (persistent)."""
    m = machine(seq(wait("go", into="g"), wait("go")))
    m.deliver_signal("go", 1)
    r = settle(m)
    assert r.status == "blocked" and r.signals == ("go",) and m.data == {"g": 1}
    m.deliver_signal("go", 2)
    assert settle(m).status == "done" and m.data == {"g": 1, "go": 2}


def test_signal_for_a_name_never_waited_on_is_rejected() -> None:
    """deliver_signal of an unknown name raises SignalRejected naming each known signal's wait and where the
    case waits now (never the workflow's root as if it were the place)."""
    m = machine(seq(wait("first"), wait("approve")))
    settle(m)
    with pytest.raises(SignalRejected) as info:
        m.deliver_signal("aprove")
    text = str(info.value)
    assert "never waits for signal 'aprove'" in text and "approve at seq[1].wait" in text
    assert "the case waits now for signal 'first' at seq[0].wait" in text and "(at seq)" not in text


def test_a_payload_refusal_names_the_wait_and_where_the_case_waits() -> None:
    """A payload its wait's model refuses names that wait's path and, when the case waits elsewhere, where."""

    class Decision(pydantic.BaseModel):
        approved: bool

    m = machine(seq(wait("first"), wait("decision", model=Decision)))
    settle(m)
    with pytest.raises(SignalRejected) as info:
        m.deliver_signal("decision", {"approved": "maybe"})
    text = str(info.value)
    assert "take signal 'decision' at seq[1].wait" in text and "does not fit Decision" in text
    assert "waits now for signal 'first' at seq[0].wait" in text and info.value.path == "seq[1].wait"
    m.deliver_signal("first")
    settle(m)
    with pytest.raises(SignalRejected) as info:
        m.deliver_signal("decision", {"approved": "maybe"})
    assert "at seq[1].wait" in str(info.value) and "waits now" not in str(info.value)


def test_a_signal_to_an_ended_case_does_not_name_the_root_as_its_place() -> None:
    """A signal to an ended machine says it ended, with no `(at seq)` that reads like a location."""
    m = machine(seq(put("a", 1)))
    settle(m)
    with pytest.raises(SignalRejected, match=r"cannot take signal 'go': it has already ended \(done\)"):
        m.deliver_signal("go")


def test_defer_first_signal_wins_and_timer_is_cancelled() -> None:
    """DEFER takes the first signal; the timeout timer is disarmed and the other branch never runs."""
    wf = defer({"yes": put("r", "yes"), "no": put("r", "no")}, timeout=5, on_timeout=put("r", "late"))
    m = machine(wf)
    r = settle(m)
    assert [(t.timer_id, t.seconds) for t in r.timers] == [(1, 5.0)]
    m.deliver_signal("no", "reason")
    r = settle(m)
    assert r.status == "done" and m.data == {"no": "reason", "r": "no"} and r.cancelled_effects == []
    assert m.fire_timer(1) is False


def test_defer_timeout_branch() -> None:
    """When the timer fires first, the timeout branch runs and later signals find nobody waiting."""
    m = machine(seq(defer({"yes": put("r", "yes")}, timeout=5, on_timeout=put("r", "late")), wait("yes", into="y")))
    settle(m)
    assert m.fire_timer(1) is True
    r = settle(m)
    assert m.data == {"r": "late"} and r.signals == ("yes",)


def test_sleep_arms_timer_and_resumes_when_fired() -> None:
    """SLEEP asks for a timer of the given length and continues when it fires."""
    m = machine(seq(sleep(2.5), put("woke", True)))
    r = settle(m)
    assert [(t.timer_id, t.seconds, t.path) for t in r.timers] == [(1, 2.5, "seq[0].sleep")]
    m.fire_timer(1)
    assert settle(m).status == "done" and m.data == {"woke": True}


def test_cancel_region_withdraws_tokens_effects_and_timers() -> None:
    """cancel_region withdraws a scope's tokens, cancels its effects and timers, and runs on_cancel."""
    wf = seq(scope("s", par(effect(work, name="e"), sleep(10)), on_cancel=put("undo", True)), put("after", True))
    m = machine(wf)
    r = settle(m)
    eid = r.effects[0].effect_id
    m.cancel_region("s")
    r = settle(m)
    assert r.status == "done" and r.cancelled_effects == [eid] and r.cancelled_timers == [1]
    assert m.data == {"undo": True, "after": True}
    assert m.complete_effect(eid, {"late": 1}) is False


def test_cancel_region_without_on_cancel_withdraws_the_thread() -> None:
    """A cancelled scope without on_cancel ends its thread; at the root that cancels the case."""
    m = machine(seq(scope("s", wait("x")), put("after", True)))
    settle(m)
    m.cancel_region("s")
    assert settle(m).status == "cancelled" and m.data == {}


def test_region_errors_are_clear() -> None:
    """Unknown or inactive regions raise SignalRejected saying which."""
    m = machine(seq(wait("go"), scope("s", wait("x"))))
    settle(m)
    with pytest.raises(SignalRejected, match="no region 'z' in this workflow"):
        m.cancel_region("z")
    with pytest.raises(SignalRejected, match="region 's' is not active now"):
        m.cancel_region("s")


def test_complete_region_on_scope_continues_after_it() -> None:
    """complete_region on a scope withdraws its body and carries on after the scope."""
    m = machine(seq(scope("s", wait("x"), on_cancel=put("undo", 1)), put("after", True)))
    settle(m)
    m.complete_region("s")
    assert settle(m).status == "done" and m.data == {"after": True}


def test_mi_instances_see_item_and_index_and_collect_outputs() -> None:
    """MI_START spawns one instance per item; each sees item/index; collect lists outputs in order."""
    body = task(lambda c: {"sq": c["item"] ** 2, "i": c["index"], "base": c["base"]})
    m = machine(mi(body, items=lambda c: [3, 1, 2], collect="out"), {"base": 7})
    settle(m)
    assert m.data["out"] == [{"sq": 9, "i": 0, "base": 7}, {"sq": 1, "i": 1, "base": 7}, {"sq": 4, "i": 2, "base": 7}]
    assert "sq" not in m.data


def test_mi_zero_instances_join_at_once() -> None:
    """An MI with no instances fires its join at once and collect gives []."""
    m = machine(seq(mi(put("x", 1), count=0, collect="out"), put("after", True)))
    settle(m)
    assert m.data == {"out": [], "after": True}


def test_mi_count_outside_bounds_fails() -> None:
    """A run-time count outside min/max fails the case naming the bounds."""
    m = machine(mi(put("x", 1), count=lambda c: 9, max=3))
    r = settle(m)
    assert r.status == "failed" and "outside min=None max=3" in (r.error_message or "")


def test_add_instances_to_dynamic_mi() -> None:
    """add_instances spawns more instances while a dynamic MI runs; non-dynamic ones refuse."""
    body = seq(effect(work, name="w"), task(lambda c: {"v": c["item"]}))
    m = machine(seq(mi(body, items=lambda c: [1], dynamic=True, name="d", collect="out"), put("after", 1)))
    first = settle(m).effects
    m.add_instances("d", [2, 3])
    more = settle(m).effects
    assert len(first) == 1 and len(more) == 2
    for e in first + more:
        m.complete_effect(e.effect_id)
    settle(m)
    assert m.data["out"] == [{"v": 1}, {"v": 2}, {"v": 3}]
    with pytest.raises(SignalRejected, match="already ended"):
        m.add_instances("d", [4])
    fixed = machine(mi(wait("x"), count=1, name="f"))
    settle(fixed)
    with pytest.raises(SignalRejected, match="is not dynamic"):
        fixed.add_instances("f", [1])


def test_close_instances_refuses_later_additions() -> None:
    """close_instances closes a dynamic MI to additions."""
    m = machine(mi(wait("x"), count=1, dynamic=True, name="d"))
    settle(m)
    m.close_instances("d")
    with pytest.raises(SignalRejected, match="is closed"):
        m.add_instances("d", [1])


def test_interleave_never_runs_two_branches_at_once() -> None:
    """ILV_START runs one branch at a time, in an order that respects `order`."""
    runs: list[str] = []
    b = seq(log("b1", runs), effect(work, name="bw"), log("b2", runs))
    a = seq(log("a1", runs), effect(work, name="aw"), log("a2", runs))
    m = machine(interleave(a, b, order=[(1, 0)]))
    r = settle(m)
    assert [e.name for e in r.effects] == ["bw"]
    m.complete_effect(r.effects[0].effect_id)
    r = settle(m)
    assert [e.name for e in r.effects] == ["aw"]
    m.complete_effect(r.effects[0].effect_id)
    settle(m)
    assert runs == ["b1", "b2", "a1", "a2"]


def test_critical_sections_exclude_each_other() -> None:
    """CRIT_ENTER lets one token in; the other waits until the first leaves."""
    runs: list[str] = []
    section = critical("db", seq(log("in", runs), effect(work), log("out", runs)))
    m = machine(par(section, section))
    r = settle(m)
    assert len(r.effects) == 1 and runs == ["in"]
    m.complete_effect(r.effects[0].effect_id)
    r = settle(m)
    assert len(r.effects) == 1 and runs == ["in", "out", "in"]


def test_when_milestone_waits_runs_or_is_withdrawn() -> None:
    """WHEN_MS waits before the milestone, runs inside it, and is withdrawn after it passed."""
    ms = milestone("m", wait("leave"))
    m = machine(par(when_milestone("m", put("during", 1)), seq(wait("enter"), ms)))
    settle(m)
    m.deliver_signal("enter")
    settle(m)
    assert m.data.get("during") == 1
    late = machine(par(seq(ms, put("left", 1)), seq(wait("go"), when_milestone("m", put("late", 1)), put("x", 1))))
    settle(late)
    late.deliver_signal("leave")
    settle(late)
    late.deliver_signal("go")
    assert settle(late).status == "done" and late.data == {"leave": None, "left": 1, "go": None}


def test_call_runs_library_workflow_and_limits_depth() -> None:
    """CALL runs a library workflow (recursively) and fails past the depth limit."""
    lib = {"count": xor((lambda c: c.get("n", 0) < 5, seq(task(lambda c: {"n": c.get("n", 0) + 1}), call("count"))),
                        default=put("done", True))}
    m = machine(call("count"), library=lib)
    assert settle(m).status == "done" and m.data == {"n": 5, "done": True}
    deep = Machine(wfsub.compile(call("count"), library=lib, max_call_depth=3))
    r = settle(deep)
    assert r.status == "failed" and "call depth limit 3" in (r.error_message or "")


def test_terminate_cancels_remaining_work_and_ends_done() -> None:
    """TERMINATE withdraws every other token (cancelling effects) and the case ends as done."""
    m = machine(par(effect(work), seq(wait("stop"), terminate())))
    eid = settle(m).effects[0].effect_id
    m.deliver_signal("stop")
    r = settle(m)
    assert r.status == "done" and r.cancelled_effects == [eid]


def test_cancel_ends_case_cancelled_and_cancels_effects() -> None:
    """cancel() withdraws everything and the case ends cancelled."""
    m = machine(par(effect(work), sleep(3)))
    eid = settle(m).effects[0].effect_id
    m.cancel()
    r = settle(m)
    assert r.status == "cancelled" and r.cancelled_effects == [eid] and r.cancelled_timers == [1]


def test_quanta_bounds_each_run() -> None:
    """run(quanta) stops after that many steps and reports yielded; the result does not depend on it."""
    wf = seq(*[put(f"k{i}", i) for i in range(10)])
    m = machine(wf)
    r = m.run(3)
    assert r.status == "yielded" and r.steps == 3
    assert settle(m).status == "done" and m.steps == 11 and len(m.data) == 10


def test_trace_levels() -> None:
    """Level none records nothing; min records tasks and lifecycle; full adds step events."""
    wf = seq(put("a", 1), put("b", 2))
    kinds = {}
    for level in ("none", "min", "full"):
        m = Machine(wfsub.compile(wf), trace_level=level)
        settle(m)
        kinds[level] = [e.kind for e in m.take_events()]
    assert kinds["none"] == []
    assert kinds["min"] == ["case_started", "task", "task", "case_done"]
    assert kinds["full"].count("step") == 3 and "task" in kinds["full"]


def test_disassembly_is_readable() -> None:
    """dis() lists each instruction with its opcode name, operand and node path."""
    program = wfsub.compile(seq(put("a", 1), par(put("b", 1), put("c", 1))))
    text = program.dis()
    assert "PAR " in text and "ARRIVE" in text and "seq[1].par[0].task" in text
    assert program.ops[-1] == Op.END


def test_fingerprint_is_stable_across_processes() -> None:
    """The same term structure gives the same fingerprint in another interpreter."""
    import subprocess
    import sys

    code = "from tests.core.test_vm import fingerprint_example as f; print(f())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == fingerprint_example()
    assert wfsub.compile(seq(task(work_sync))).fingerprint != fingerprint_example()


def test_a_workflow_run_as_a_script_has_the_fingerprint_it_has_when_imported(tmp_path: Path) -> None:
    """`python app.py` compiles module `__main__`; it fingerprints as `app`, as `import app` (wfsub replay) does."""
    import subprocess
    import sys

    (tmp_path / "app.py").write_text(
        "import wfsub\n"
        "def step(ctx):\n    return {'x': 1}\n"
        "flow = wfsub.seq(wfsub.task(step), wfsub.wait('go'))\n"
        "if __name__ == '__main__':\n    print(wfsub.compile(flow).fingerprint)\n"
    )
    as_script = subprocess.run([sys.executable, "app.py"], cwd=tmp_path, capture_output=True, text=True, check=True)
    imported = subprocess.run(
        [sys.executable, "-c", "import app, wfsub; print(wfsub.compile(app.flow).fingerprint)"],
        cwd=tmp_path, capture_output=True, text=True, check=True,
    )
    as_module = subprocess.run([sys.executable, "-m", "app"], cwd=tmp_path, capture_output=True, text=True, check=True)
    assert as_script.stdout == imported.stdout == as_module.stdout != ""


def test_an_edited_task_body_or_lambda_is_a_new_fingerprint() -> None:
    """The fingerprint covers each callable's code: same name, other body, other fingerprint; same code, same."""

    def make(k: int) -> Term:
        def step(ctx: Mapping[str, Any]) -> dict[str, Any]:
            return {"v": ctx.get("v", 0) + k}

        return seq(task(step), xor((lambda c: c["v"] > 1, task(step)), default=task(step)))

    def edited(ctx: Mapping[str, Any]) -> dict[str, Any]:
        return {"v": ctx.get("v", 0) * 2}

    edited.__qualname__ = make(1).steps[0].fn.__qualname__  # type: ignore[attr-defined]
    assert wfsub.compile(make(1)).fingerprint == wfsub.compile(make(2)).fingerprint  # captured values do not count
    assert wfsub.compile(seq(task(edited))).fingerprint != wfsub.compile(seq(make(1).steps[0])).fingerprint  # type: ignore[attr-defined]
    assert wfsub.compile(wait("x", timeout=1)).fingerprint != wfsub.compile(wait("x", timeout=2)).fingerprint


def fingerprint_example() -> str:
    return wfsub.compile(seq(task(work_sync), par(task(work_sync), wait("x")))).fingerprint


def work_sync(ctx: Mapping[str, Any]) -> None:
    return None


@pytest.mark.parametrize(
    ("join", "cancel", "runs_after", "cancelled"),
    [
        ("all", False, ["after"], 0),
        ("first", False, ["after"], 0),
        ("first", True, ["after"], 2),
        (2, True, ["after"], 1),
        ("each", False, ["after", "after", "after"], 0),
    ],
)
def test_par_split_and_join_policies(join: Any, cancel: bool, runs_after: list[str], cancelled: int) -> None:
    """PAR_SPLIT/ARRIVE: the join fires by its policy; cancel_remaining withdraws the rest."""
    runs: list[str] = []
    branches = par(effect(work), effect(work), effect(work), join=join, cancel_remaining=cancel)
    m = machine(seq(branches, log("after", runs)))
    effects = settle(m).effects
    m.complete_effect(effects[0].effect_id)
    r = settle(m)
    if join == "all":
        assert runs == [] and r.status == "blocked"
        for e in effects[1:]:
            m.complete_effect(e.effect_id)
        r = settle(m)
    elif join == 2 or join == "each":
        m.complete_effect(effects[1].effect_id)
        r = settle(m)
    assert len(r.cancelled_effects) == cancelled
    if r.status == "blocked":  # stragglers run on: the case ends only when they do
        for e in effects:
            m.complete_effect(e.effect_id)
        r = settle(m)
    assert r.status == "done" and runs == runs_after


def test_request_withdrawn_in_the_same_burst_is_never_reported() -> None:
    """An effect or timer made and withdrawn within one run() is neither requested nor cancelled."""
    wf = seq(par(effect(work), sleep(60), put("quick", True), join=1, cancel_remaining=True), wait("go"))
    m = machine(wf)
    r = m.run(1000)
    assert r.status == "blocked" and (r.effects, r.timers) == ([], [])
    assert (r.cancelled_effects, r.cancelled_timers) == ([], [])
    assert m.pending_effects == 0 and m.armed_timers == 0


def test_empty_unsynchronized_dynamic_mi_does_not_keep_the_case_open() -> None:
    """A dynamic mi with join=None and no instances closes at once: the case ends when its thread does."""
    m = machine(seq(mi(put("x", 1), count=0, dynamic=True, join=None, name="m"), put("after", 1)))
    assert settle(m).status == "done" and m.data == {"after": 1}


def test_refused_complete_region_changes_nothing() -> None:
    """complete_region raises before touching any activation when one of them has already joined."""
    inner = mi(
        xor((lambda c: c["item"] == "fast" and c["index"] == 0, put("fast", True)), default=wait("x")),
        count=2, join=1, cancel_remaining=False, name="in", collect="got",
    )
    m = Machine(wfsub.compile(mi(inner, items=lambda c: ["slow", "fast"], collect="outer")), trace_level="min")
    settle(m)
    m.take_events()
    with pytest.raises(SignalRejected, match="has already joined"):
        m.complete_region("in")
    assert m.take_events() == [] and m.live_regions() == ["in"]


def test_reentering_a_held_critical_section_fails_fast() -> None:
    """A thread that enters a critical section it already holds (through a call) fails instead of hanging."""
    lib = {"again": critical("L", put("x", 1))}
    m = machine(critical("L", call("again")), library=lib)
    r = settle(m)
    assert r.status == "failed" and "not reentrant" in (r.error_message or "")


def test_pending_requests_after_restore() -> None:
    """A restored machine lists the effects in flight and timers armed, for its driver to restart."""
    m = machine(par(effect(work, name="charge", timeout=3.0), sleep(5), defer({"go": put("g", 1)}, timeout=7,
                                                                             on_timeout=put("t", 1))))
    settle(m)
    restored = Machine.restore(m.program, m.snapshot())
    effects, timers = restored.pending_requests()
    assert [(e.effect_id, e.name, e.timeout) for e in effects] == [(1, "charge", 3.0)]
    assert sorted((t.timer_id, t.seconds) for t in timers) == [(1, 5.0), (2, 7.0)]
    restored.complete_effect(1)
    restored.fire_timer(1)
    restored.deliver_signal("go")
    assert settle(restored).status == "done" and restored.data == {"go": None, "g": 1}


def test_deadlock_fails_the_case_with_what_waits() -> None:
    """A case left with threads that only wait for a milestone nothing can enter fails, naming the wait."""
    wf = par(scope("s", seq(wait("go"), milestone("m", put("a", 1)))), when_milestone("m", put("b", 1)))
    m = machine(wf)
    assert settle(m).status == "blocked"
    m.cancel_region("s")
    r = settle(m)
    assert r.status == "failed" and r.error_path == "par[1].when_milestone"
    assert "deadlock" in (r.error_message or "") and "milestone 'm'" in (r.error_message or "")


def test_an_unknown_region_is_refused_without_the_root_as_its_place() -> None:
    """A region operation on a name no scope or mi has lists the regions, with no `(at seq)` read as a place."""
    m = machine(seq(scope("review", wait("go")), put("a", 1)))
    settle(m)
    with pytest.raises(SignalRejected) as info:
        m.cancel_region("reveiw")
    assert "cannot cancel region 'reveiw': no region 'reveiw' in this workflow (regions: review)" in str(info.value)

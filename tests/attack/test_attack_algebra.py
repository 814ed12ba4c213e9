"""An independent attack on the workflow algebra: scopes with on_error, sagas and cancel(compensate=), retries,
open mis, blocking joins, nets, snapshots and durable cases, checked against the documented semantics and the WCP
catalogue.

Tests marked xfail(strict=True) are faults found on the current code (each reason says what is wrong); the
others pin behaviour the existing suite left unpinned.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio
import pytest

import wfsub
from wfsub import (
    CaseCancelled,
    Substrate,
    call,
    effect,
    loop,
    mi,
    milestone,
    multi_choice,
    net,
    par,
    saga,
    scope,
    seq,
    task,
    validate,
    wait,
    when_milestone,
)
from wfsub.lowlevel import Machine, Seeded
from wfsub.testing import CapturingSink, VirtualClock

from ..harness import Case, Recorder, running, trace_of


def boom(rec: Recorder, name: str) -> Any:
    """A step named `name` that records itself, then raises ValueError."""

    def fail(ctx: Mapping[str, Any]) -> None:
        raise ValueError(f"{name} went wrong")

    return seq(rec.step(name), task(fail, name=f"{name}_raise"))


NOTHING = task(lambda c: None, name="nothing")


# == durable cases across a restart ===========================================================================
#
# Each of these runs a case on a SQLite store, closes the Substrate while an effect is in flight, and opens a new
# Substrate on the same file. The contract: "Recovery: entering a Substrate on a store resumes the cases that were
# running or had effects in flight ... No case is ever lost, corrupted or wedged".


class Gate:
    """Effects that record their calls; `held` ones wait until `open` is set (so a restart can catch them)."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.entered: dict[str, anyio.Event] = {}
        self.open = anyio.Event()

    def quick(self, name: str) -> Any:
        async def fn(ctx: Mapping[str, Any]) -> dict[str, Any]:
            self.calls.append(name)
            return {name: True}

        fn.__name__ = fn.__qualname__ = name
        return effect(fn, name=name)

    def held(self, name: str) -> Any:
        self.entered[name] = anyio.Event()

        async def fn(ctx: Mapping[str, Any]) -> dict[str, Any]:
            self.calls.append(name)
            self.entered[name].set()
            await self.open.wait()
            return {name: True}

        fn.__name__ = fn.__qualname__ = name
        return effect(fn, name=name)


async def test_a_compensation_chain_survives_a_restart_while_its_second_undo_runs(tmp_path: Path) -> None:
    """A cancelled saga whose first undo completed and whose second is in flight at shutdown finishes after restart."""
    gate = Gate()
    order = saga((gate.quick("reserve"), gate.held("release")), (gate.quick("charge"), gate.quick("refund")),
                 wait("confirm"))
    sink = CapturingSink()
    async with Substrate(store=tmp_path / "s.db", workflows={"order": order}, sinks=[sink], trace_level="min",
                         shutdown_timeout=1) as sub:
        await sub.new_case("order", case_id="o")
        await sink.wait_for("signal_waiting", case_id="o")
        await sub.cancel("o", reason="customer cancelled")  # refund runs and is journaled; release hangs
        await gate.entered["release"].wait()
    assert gate.calls == ["reserve", "charge", "refund", "release"]
    gate.open.set()
    async with Substrate(store=tmp_path / "s.db", workflows={"order": order}, shutdown_timeout=1) as sub:
        with anyio.fail_after(5):
            with pytest.raises(CaseCancelled):
                await sub.await_case("o")
        kinds = [r.kind for r in await sub.journal("o")]
    assert gate.calls == ["reserve", "charge", "refund", "release", "release"]
    assert kinds == ["start", "effect", "effect", "cancel", "effect", "effect", "end"]


async def test_wcp1_a_sequence_of_effects_survives_a_restart_during_its_second_effect(tmp_path: Path) -> None:
    """WCP1 durable: seq(effect, effect) closed while the second runs ends done after a restart, journal intact."""
    gate = Gate()
    flow = seq(gate.quick("first"), gate.held("second"), gate.quick("third"))
    async with Substrate(store=tmp_path / "s.db", workflows={"flow": flow}, shutdown_timeout=1) as sub:
        await sub.new_case("flow", case_id="f")
        await gate.entered["second"].wait()
    gate.open.set()
    async with Substrate(store=tmp_path / "s.db", workflows={"flow": flow}, shutdown_timeout=1) as sub:
        with anyio.fail_after(5):
            assert await sub.await_case("f") == {"first": True, "second": True, "third": True}
        assert [r.seq for r in await sub.journal("f")] == [0, 1, 2, 3, 4]


async def test_a_cancelled_case_recovered_while_compensating_keeps_its_cancel_reason(tmp_path: Path) -> None:
    """cancel(reason=) survives a restart during the compensation: awaiters, status and journal keep the reason."""
    undo = seq(wait("ack"), task(lambda c: {"undone": True}, name="undone"))
    flow = saga((task(lambda c: {"booked": True}, name="book"), undo), wait("confirm"))
    sink = CapturingSink()
    async with Substrate(store=tmp_path / "s.db", workflows={"flow": flow}, sinks=[sink], trace_level="min") as sub:
        await sub.new_case("flow", case_id="c")
        await sink.wait_for("signal_waiting", case_id="c")
        await sub.cancel("c", reason="customer asked")
        await sink.wait_for("signal_waiting", case_id="c", count=2)  # the compensation waits for its ack
    async with Substrate(store=tmp_path / "s.db", workflows={"flow": flow}) as sub:
        await sub.signal("c", "ack")
        with anyio.fail_after(5), pytest.raises(CaseCancelled) as info:
            await sub.await_case("c")
        assert sub.data("c")["undone"] is True
        end = (await sub.journal("c"))[-1]
        assert (sub.status("c").cancel_reason, end.reason) == ("customer asked", "customer asked")
    assert "customer asked" in str(info.value)


async def test_a_wait_timeout_overdue_after_downtime_compensates_and_is_caught(tmp_path: Path) -> None:
    """A wait(timeout=) that fell due while no Substrate ran fires on recovery: the saga compensates, on_error runs."""
    clock = VirtualClock()
    gate = Gate()
    flow = seq(
        scope("order", saga((gate.quick("charge"), gate.quick("refund")), wait("shipped", timeout=50)),
              on_error=task(lambda c: {"handled": c["error"]["type"]}, name="handle")),
        wait("archive"),
    )
    async with Substrate(store=tmp_path / "s.db", workflows={"flow": flow}, clock=clock) as sub:
        await sub.new_case("flow", case_id="c")
        await clock.settle()
    await clock.advance(100)  # downtime
    async with Substrate(store=tmp_path / "s.db", workflows={"flow": flow}, clock=clock) as sub:
        await clock.settle()
        data = sub.data("c")
        journal = await sub.journal("c")
    assert gate.calls == ["charge", "refund"]
    assert data["handled"] == "WaitTimeout" and data["error"]["compensated"] == ["refund"]
    assert data["error"]["path"] == "seq[0].scope.saga[1].wait"
    assert wfsub.replay(flow, journal).divergence is None


async def test_durable_blocking_join_and_open_mi_resume_after_a_restart_and_replay_cleanly(tmp_path: Path) -> None:
    """A blocking discriminator in a loop and an open mi, restarted between inputs, end as without restarts."""
    bump = {k: task(lambda c, k=k: {k: c.get(k, 0) + 1}, name=k) for k in ("A", "B", "n")}
    flow = seq(
        loop(seq(par(seq(wait("a"), bump["A"]), seq(wait("b"), bump["B"]), join="first", blocking=True), bump["n"]),
             times=2),
        mi(seq(wait("go"), task(lambda c: {"v": c["item"]}, name="v")), count=0, dynamic="open", name="m",
           collect="out"),
    )
    steps: list[tuple[str, Any]] = [("signal", "a"), ("signal", "a"), ("signal", "b"), ("add", [1, 2]),
                                    ("signal", "b"), ("signal", "go"), ("add", [3]), ("signal", "go"),
                                    ("signal", "go"), ("close", None)]
    results = []
    for restart in (False, True):
        path = tmp_path / f"s{restart}.db"
        sub_cm = Substrate(store=path, workflows={"flow": flow})
        sub = await sub_cm.__aenter__()
        try:
            await sub.new_case("flow", case_id="c")
            for kind, arg in steps:
                if kind == "signal":
                    await sub.signal("c", arg)
                elif kind == "add":
                    await sub.add_instances("c", "m", arg)
                else:
                    await sub.close_instances("c", "m")
                if restart and not sub.status("c").ended:
                    await sub_cm.__aexit__(None, None, None)
                    sub_cm = Substrate(store=path, workflows={"flow": flow})
                    sub = await sub_cm.__aenter__()
            with anyio.fail_after(5):
                results.append(await sub.await_case("c"))
            assert wfsub.replay(flow, await sub.journal("c")).divergence is None
        finally:
            await sub_cm.__aexit__(None, None, None)
    assert results[0] == results[1]
    assert results[0]["n"] == 2 and results[0]["out"] == [{"go": None, "v": 1}, {"go": None, "v": 2},
                                                          {"go": None, "v": 3}]


# == complete_region and compensations already running ========================================================


def test_complete_region_on_a_scope_never_stops_a_compensation_already_running() -> None:
    """A refund running inside a region (its saga was cancelled) finishes even when the region is completed."""
    rec = Recorder()
    inner = scope("inner", saga((rec.step("charge"), rec.effect("refund")), wait("x")))
    case = Case(seq(scope("order", par(inner, wait("y"))), rec.step("after")))
    case.run()
    case.cancel_region("inner")  # the refund starts
    assert case.pending_names() == ["refund"]
    case.complete_region("order")
    assert case.cancelled_effects == []  # "a compensation already running" is not stopped
    assert case.complete("refund").status == "done"


def test_wcp27_complete_mi_activity_never_stops_a_compensation_already_running() -> None:
    """WCP27 while an instance compensates: its refund is not cancelled by completing the mi."""
    rec = Recorder()
    body = scope("inst", saga((rec.step("book"), rec.effect("unbook")), wait("x")))
    case = Case(seq(mi(body, count=1, name="m"), rec.step("after")))
    case.run()
    case.cancel_region("inst")
    assert case.pending_names() == ["unbook"]
    case.complete_region("m")
    assert case.cancelled_effects == []


# == multiple instances ========================================================================================


def test_an_n_join_mi_with_until_and_zero_instances_is_withdrawn_like_any_mi_where_none_completed() -> None:
    """When n can no longer be reached and none completed, the mi is withdrawn, zero instances included."""
    until_zero = Case(seq(mi(NOTHING, count=lambda c: 0, join=2, until=lambda s: False, collect="o"),
                          task(lambda c: {"after": True}, name="after")))
    dynamic_zero = Case(seq(mi(NOTHING, count=lambda c: 0, join=2, dynamic=True, name="m", collect="o"),
                            task(lambda c: {"after": True}, name="after")))
    assert dynamic_zero.run().status == "cancelled"  # the root thread was withdrawn with the mi
    assert until_zero.run().status == "cancelled"


def test_an_open_mi_without_synchronization_takes_instances_until_it_is_closed() -> None:
    """dynamic='open' takes instances until close_instances (or validate refuses the combination with join=None)."""
    rec = Recorder()
    open_mi = mi(seq(wait("go"), rec.step("work")), count=0, dynamic="open", join=None, name="m")
    if validate(open_mi):
        return  # refusing the combination at design time is an acceptable answer too
    case = Case(seq(open_mi, wait("end")))
    assert case.run().status == "blocked"
    case.add_instances("m", ["x"])  # SignalRejected today: "region 'm' is not active now"
    case.signal("go")
    case.close_instances("m")
    assert case.signal("end").status == "done" and rec.steps == ["work"]


def test_an_open_mi_with_nothing_running_is_waiting_and_close_fires_its_join() -> None:
    """WCP15 strict form: an open mi starts empty, takes instances, waits while empty, joins at close."""
    rec = Recorder()
    case = Case(seq(mi(rec.step("i", lambda c: {"v": c["item"]}), count=0, dynamic="open", name="m", collect="out"),
                    rec.step("after")))
    assert case.run().status == "blocked"
    assert case.add_instances("m", [1, 2]).status == "blocked"  # both ended: still open, still waiting
    assert case.add_instances("m", [3]).status == "blocked"
    assert case.close_instances("m").status == "done"
    assert case.data["out"] == [{"v": 1}, {"v": 2}, {"v": 3}] and rec.steps == ["i", "i", "i", "after"]


def test_an_error_record_inside_an_mi_instance_stays_in_that_instances_output() -> None:
    """error_into inside an instance writes the instance's data: it shows in its collected output, not the case's."""
    body = scope("s", seq(task(lambda c: {"v": c["index"]}, name="v"),
                          task(lambda c: 1 / 0 if c["index"] == 1 else None, name="div")),
                 on_error=task(lambda c: {"handled": True}, name="h"))
    case = Case(mi(body, count=2, collect="out"))
    assert case.run().status == "done"
    first, second = case.data["out"]
    assert first == {"v": 0} and "error" not in case.data
    assert second["handled"] is True and second["error"]["type"] == "ZeroDivisionError"
    assert second["error"]["path"] == "mi.scope.seq[1].task"


# == validation ================================================================================================


def test_parallel_on_error_scopes_under_multi_choice_and_net_need_distinct_error_into() -> None:
    """Parallel scopes need distinct error_into keys; multi_choice and and-split net nodes run in parallel."""
    always = lambda c: True  # noqa: E731
    chosen = multi_choice(
        (always, scope("a", NOTHING, on_error=NOTHING)), (always, scope("b", NOTHING, on_error=NOTHING))
    )
    graph = net({"a": scope("a", NOTHING, on_error=NOTHING), "b": scope("b", NOTHING, on_error=NOTHING)},
                [("start", "a"), ("start", "b"), ("a", "end"), ("b", "end")])
    assert [i.path for i in validate(chosen)] == ["multi_choice[1].scope"]
    assert [i.path for i in validate(graph)] == ["net[b].scope"]


# == sagas withdrawn from inside ==============================================================================


def test_a_saga_withdrawn_by_cancelling_a_region_inside_it_compensates_its_completed_steps() -> None:
    """A saga is compensated whenever its work is withdrawn before it ended, here by an inner region."""
    rec = Recorder()
    case = Case(par(saga((rec.step("charge"), rec.step("refund")), scope("r", wait("x"))),
                    seq(wait("y"), rec.step("other"))), trace_level="min")
    case.run()
    case.cancel_region("r")
    assert ("withdrawn", "par[0].saga", {}) in trace_of(case.events, "withdrawn")  # the saga itself is withdrawn
    assert rec.steps == ["charge", "refund"]


def test_a_saga_withdrawn_by_a_passed_milestone_compensates_its_completed_steps() -> None:
    """WCP18 inside a saga: the late when_milestone withdraws the saga's thread, so the saga undoes what it did."""
    rec = Recorder()
    late = seq(wait("late"), when_milestone("m", rec.step("amend")))
    case = Case(par(saga((rec.step("charge"), rec.step("refund")), late), milestone("m", wait("leave"))))
    case.run()
    case.signal("leave")
    case.signal("late")
    assert rec.steps == ["charge", "refund"]


# == terminate reached from a cleanup branch ===================================================================


def test_terminate_reached_through_a_call_inside_a_compensation_is_a_validation_issue() -> None:
    """terminate() inside a compensation, on_cancel or on_error branch is a validation issue, via call too."""
    library = {"stop": seq(NOTHING, wfsub.terminate())}
    rec = Recorder()
    flow = saga((rec.step("charge"), call("stop")), boom(rec, "ship"))
    assert validate(flow, library=library) != [] or Case(flow, library=library).run().status == "failed"
    assert validate(scope("s", NOTHING, on_error=call("stop")), library=library) != []


# == cancellation and compensation, pinned ====================================================================


def test_a_case_cancel_during_a_caught_failures_compensation_lets_it_finish_and_compensates_the_rest() -> None:
    """cancel() while a caught failure compensates: the running undo finishes, a sibling saga undoes, no on_error."""
    rec = Recorder()
    failing = scope("pay", saga((rec.step("charge"), rec.effect("refund")), seq(wait("go"), boom(rec, "ship"))),
                    on_error=rec.step("handled"))
    case = Case(par(failing, saga((rec.step("hold"), rec.step("release")), wait("never"))))
    case.run()
    assert case.signal("go").status == "blocked" and case.pending_names() == ["refund"]
    assert case.cancel().status == "blocked" and case.cancelled_effects == []
    assert case.complete("refund").status == "cancelled"
    assert rec.steps == ["charge", "hold", "ship", "release"]


def test_a_failed_compensation_during_a_region_cancel_goes_to_the_enclosing_on_error() -> None:
    """cancel_region whose saga's undo fails: CompensationFailed, at the cancelled scope, is caught outside it."""
    rec = Recorder()
    region = scope("r", saga((rec.step("a"), boom(rec, "undo_a")), wait("x")))
    case = Case(seq(scope("outer", par(region, wait("y")), on_error=rec.step("h"), error_into="e"), rec.step("after")))
    case.run()
    assert case.cancel_region("r").status == "done"
    assert rec.steps == ["a", "undo_a", "h", "after"]
    assert case.data["e"]["type"] == "CompensationFailed"
    assert case.data["e"]["path"] == "seq[0].scope.par[0].scope"


def test_nested_sagas_record_what_they_compensated_innermost_first() -> None:
    """The error record's `compensated` lists the inner saga's undos before the outer saga's."""
    rec = Recorder()
    inner = saga((rec.step("i1"), rec.step("undo_i1")), boom(rec, "i2"))
    case = Case(scope("s", saga((rec.step("o1"), rec.step("undo_o1")), inner), on_error=NOTHING))
    assert case.run().status == "done"
    assert case.data["error"]["compensated"] == ["undo_i1", "undo_o1"]


def test_an_uncaught_compensation_failure_names_the_original_failure_as_cause() -> None:
    """Uncaught: CompensationFailed goes out with the original exception as __cause__ and its record as cause."""
    rec = Recorder()
    case = Case(saga((rec.step("a"), boom(rec, "undo_a")), boom(rec, "b")))
    r = case.run()
    assert r.status == "failed" and type(r.error).__name__ == "CompensationFailed"
    assert isinstance(r.error.__cause__, ValueError)
    record = case.m.failure_record
    assert record is not None and record["cause"]["message"] == "task b_raise raised ValueError: b went wrong"


# == blocking joins ============================================================================================


def test_wcp28_a_multi_merge_feeding_a_blocking_discriminator_holds_the_second_thread_until_reset() -> None:
    """WCP28 classic form: two threads reach a blocking discriminator; the second waits until the first resets."""
    rec = Recorder()
    blocking = par(seq(wait("a"), rec.step("A")), seq(wait("b"), rec.step("B")), join="first", blocking=True)
    case = Case(seq(par(rec.step("p"), rec.step("q"), join="each"), blocking, rec.step("after")))
    case.run()
    case.signal("a")
    assert rec.steps == ["p", "q", "A", "after"]
    case.signal("a")  # buffered: the second thread has not entered yet
    assert rec.steps == ["p", "q", "A", "after"]
    case.signal("b")  # the first activation resets; the second thread enters and takes the buffered a
    assert rec.steps == ["p", "q", "A", "after", "B", "A", "after"]
    assert case.signal("b").status == "done"


def test_a_blocking_join_in_a_called_workflow_blocks_per_call() -> None:
    """Two calls of a workflow with a blocking discriminator in a loop: each call's activation blocks alone."""
    rec = Recorder()
    body = loop(seq(par(seq(wait("a"), rec.step("A")), seq(wait("b"), rec.step("B")), join="first", blocking=True),
                    rec.step("after")), times=2)
    case = Case(par(call("w"), call("w")), library={"w": body})
    case.run()
    case.signal("a")
    case.signal("a")
    assert rec.steps == ["A", "after", "A", "after"]  # each call's first iteration fired; both now block


def test_cancelling_the_scope_around_a_blocked_reentry_resets_the_blocking_join() -> None:
    """A thread blocked before a blocking par is withdrawn with its scope; the next iteration enters at once."""
    rec = Recorder()
    blocking = par(seq(wait("a"), rec.step("A")), seq(wait("b"), rec.step("B")), join="first", blocking=True)
    case = Case(loop(scope("s", seq(blocking, rec.step("after")), on_cancel=rec.step("oc")), times=3))
    case.run()
    case.signal("a")
    assert case.cancel_region("s").signals == ("a", "b")  # iteration 3 entered the par
    case.signal("a")
    assert rec.steps == ["A", "after", "oc", "A", "after"]


# == snapshots and schedulers over the new constructs =========================================================


async def _noop(ctx: Mapping[str, Any]) -> None:
    return None


def _bump(key: str) -> Any:
    def step(ctx: Mapping[str, Any]) -> dict[str, Any]:
        return {key: ctx.get(key, 0) + 1, "order": ctx.get("order", "") + key}

    step.__qualname__ = f"bump_{key}"
    return task(step)


def _fail(key: str) -> Any:
    def step(ctx: Mapping[str, Any]) -> None:
        raise ValueError(key)

    step.__qualname__ = f"fail_{key}"
    return task(step)


NEW_CONSTRUCTS = {
    "saga_caught": seq(scope("s", saga((_bump("a"), seq(effect(_noop, name="u1"), _bump("ua"))),
                                       (seq(effect(_noop, name="x"), _bump("b")), seq(_bump("ub"), effect(_noop))),
                                       _fail("c")), on_error=_bump("h")), _bump("z")),
    "saga_cancelled": seq(_bump("a"), scope("o", saga((_bump("b"), seq(effect(_noop, name="u"), _bump("ub"))),
                                                      par(wait("kill"), wait("never"))), on_cancel=_bump("oc"))),
    "blocking_loop": loop(seq(par(seq(wait("a"), _bump("A")), seq(effect(_noop, name="e"), _bump("B")),
                                  join="first", blocking=True), _bump("L")), times=3),
    "mi_sagas": scope("all", mi(saga((_bump("m"), seq(_bump("um"), effect(_noop, name="ue"))),
                                     seq(effect(_noop, name="go"), task(lambda c: 1 / 0 if c["index"] == 1 else None,
                                                                        name="div"))), count=3),
                      on_error=_bump("handled")),
    "handler_fails": scope("outer", scope("inner", _fail("x"), on_error=seq(effect(_noop, name="h"), _fail("y"))),
                           on_error=_bump("oh"), error_into="e"),
}


def _drive(m: Machine, limit: int = 10_000) -> None:
    for _ in range(limit):
        r = m.run(1)
        if r.status in ("done", "failed", "cancelled"):
            return
        if r.status == "blocked":
            _answer(m, r.signals)
    raise AssertionError("did not finish")


def _answer(m: Machine, signals: tuple[str, ...]) -> None:
    if "kill" in signals and not m.effect_ids():
        m.cancel()
    elif m.effect_ids():
        m.complete_effect(m.effect_ids()[0], None)
    elif m.timer_ids():
        m.fire_timer(m.timer_ids()[0])
    else:
        m.deliver_signal(sorted(signals)[0], None)


@pytest.mark.parametrize("name", sorted(NEW_CONSTRUCTS))
@pytest.mark.parametrize("seed", [None, 5])
def test_a_snapshot_at_every_step_of_the_new_constructs_restores_exactly(name: str, seed: int | None) -> None:
    """Snapshot (through JSON) at every step, restore, drive on: same outcome, data and min trace as one run."""
    program = wfsub.compile(NEW_CONSTRUCTS[name])

    def machine() -> Machine:
        return Machine(program, scheduler=None if seed is None else Seeded(seed), trace_level="min")

    reference = machine()
    _drive(reference)
    want = (reference.status, reference.data, reference.error_message, [e[1:] for e in reference.take_events()])
    base = machine()
    for _ in range(10_000):
        restored = Machine.restore(program, json.loads(json.dumps(base.snapshot())))
        _drive(restored)
        got = (restored.status, restored.data, restored.error_message, [e[1:] for e in restored.take_events()])
        assert got == want
        r = base.run(1)
        if r.status in ("done", "failed", "cancelled"):
            break
        if r.status == "blocked":
            _answer(base, r.signals)


# == retries, at the runtime ===================================================================================


class Permanent(Exception):
    """Retrying will not help."""


class CardDeclined(Permanent):
    """A subclass of a non-retryable error."""


async def test_a_subclass_of_a_non_retryable_error_fails_at_once_after_earlier_retries() -> None:
    """Retry(non_retryable=(Base,)): a transient error is retried (traced at min), a Base subclass stops it."""
    calls: list[int] = []

    async def pay(ctx: Mapping[str, Any]) -> None:
        calls.append(1)
        raise ConnectionError("down") if len(calls) == 1 else CardDeclined("no")

    async with running(trace_level="min") as (sub, clock, sink):
        flow = scope("pay", effect(pay, retry=wfsub.Retry(5, initial=1, non_retryable=(Permanent,))),
                     on_error=task(lambda c: {"why": c["error"]["type"]}, name="why"))
        handle = await sub.new_case(flow)
        await clock.advance(1)
        result = await handle.result(timeout=0)
        retries = trace_of(sink.for_case(handle.case_id), "effect_retry")
    assert len(calls) == 2 and result["why"] == "CardDeclined"
    assert [(d["attempt"], d["delay"], d["type"], d["error"]) for _, _, d in retries] == [
        (1, 1.0, "ConnectionError", "down")
    ]

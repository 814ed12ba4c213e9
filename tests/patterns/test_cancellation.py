"""Cancellation and force-completion patterns at the vm level: cancel task (WCP19), cancel case (WCP20),
cancel region (WCP25), cancel MI activity (WCP26), complete MI activity (WCP27)."""

from __future__ import annotations

from typing import Any

import pytest

from wfsub import SignalRejected, mi, par, scope, seq, sleep, wait

from ..harness import Case, Recorder

# -- WCP19 cancel task -----------------------------------------------------------------------------


def test_wcp19_cancel_task_withdraws_the_running_step_and_the_thread_goes_on_through_on_cancel() -> None:
    """WCP19: cancelling a scope cancels its effect, runs on_cancel then the next step; the late result is discarded."""
    rec = Recorder()
    body = seq(rec.effect("a"), rec.step("a_done"))
    term = seq(scope("t", body, on_cancel=rec.step("undo")), rec.step("after"))
    case = Case(term)
    case.run()
    a = case.effect_id("a")
    r = case.cancel_region("t")
    assert (r.status, r.cancelled_effects, rec.steps) == ("done", [a], ["undo", "after"])
    assert case.m.complete_effect(a, {"x": 1}) is False
    assert case.data == {}


def test_wcp19_cancel_task_without_on_cancel_ends_that_thread_only() -> None:
    """WCP19: without on_cancel the cancelled thread ends at the scope; the join after the par does not wait for it."""
    rec = Recorder()
    term = seq(par(seq(scope("t", rec.effect("a")), rec.step("a_after")), rec.effect("b")), rec.step("joined"))
    case = Case(term)
    case.run()
    a = case.effect_id("a")
    r = case.cancel_region("t")
    assert (r.status, r.cancelled_effects, rec.steps, case.pending_names()) == ("blocked", [a], [], ["b"])
    assert (case.complete("b").status, rec.steps) == ("done", ["joined"])


def test_wcp19_cancelling_the_only_thread_ends_the_case_cancelled() -> None:
    """WCP19 edge: withdrawing the root thread (no on_cancel) ends the case as cancelled, not done."""
    rec = Recorder()
    case = Case(seq(scope("t", rec.effect("a")), rec.step("after")))
    case.run()
    a = case.effect_id("a")
    r = case.cancel_region("t")
    assert (r.status, r.cancelled_effects, rec.steps) == ("cancelled", [a], [])


def test_wcp19_cancel_task_parked_on_a_timer_cancels_the_timer() -> None:
    """WCP19: a cancelled task waiting on a timer has that timer reported cancelled; firing it is stale."""
    rec = Recorder()
    case = Case(seq(scope("t", sleep(60), on_cancel=rec.step("undo")), rec.step("after")))
    r = case.run()
    (timer,) = r.timers
    r = case.cancel_region("t")
    assert (r.status, r.cancelled_timers, rec.steps) == ("done", [timer.timer_id], ["undo", "after"])
    assert case.m.fire_timer(timer.timer_id) is False


def test_wcp19_cancel_region_that_is_not_active_is_rejected() -> None:
    """WCP19 edge: cancelling a region not yet entered, already ended or unknown is rejected and changes nothing."""
    rec = Recorder()
    case = Case(seq(rec.effect("first"), scope("t", rec.effect("a")), rec.effect("last")))
    case.run()
    with pytest.raises(SignalRejected, match="'t' is not active"):
        case.cancel_region("t")
    with pytest.raises(SignalRejected, match="no region 'nope'"):
        case.cancel_region("nope")
    case.complete("first")
    case.complete("a")
    with pytest.raises(SignalRejected, match="'t' is not active"):
        case.cancel_region("t")
    assert (case.pending_names(), case.cancelled_effects) == (["last"], [])
    assert case.complete("last").status == "done"


# -- WCP20 cancel case -----------------------------------------------------------------------------


def test_wcp20_cancel_case_withdraws_every_effect_timer_and_wait() -> None:
    """WCP20: cancel() ends the case as cancelled and reports every in-flight effect and armed timer."""
    rec = Recorder()
    case = Case(seq(par(rec.effect("a"), rec.effect("b"), sleep(10), wait("go")), rec.step("after")))
    r = case.run()
    effects = sorted(req.effect_id for req in r.effects)
    (timer,) = r.timers
    assert r.signals == ("go",)
    r = case.cancel()
    assert (r.status, sorted(r.cancelled_effects), r.cancelled_timers, rec.steps) == (
        "cancelled",
        effects,
        [timer.timer_id],
        [],
    )
    assert case.m.complete_effect(effects[0], {}) is False
    assert case.m.fire_timer(timer.timer_id) is False
    with pytest.raises(SignalRejected, match="already ended"):
        case.signal("go")


def test_wcp20_cancel_after_the_case_ended_is_rejected() -> None:
    """WCP20 edge: a case that has ended cannot be cancelled."""
    case = Case(Recorder().step("a"))
    assert case.run().status == "done"
    with pytest.raises(SignalRejected, match="already ended"):
        case.cancel()


# -- WCP25 cancel region ---------------------------------------------------------------------------


def test_wcp25_cancel_region_withdraws_all_work_inside_and_nothing_outside() -> None:
    """WCP25: cancelling a region withdraws its parallel effects, timers and waits; work outside runs on."""
    rec = Recorder()
    region = scope(
        "r",
        par(rec.effect("a"), seq(rec.effect("b"), rec.step("b_after")), sleep(30), wait("go")),
        on_cancel=rec.step("compensate"),
    )
    case = Case(seq(par(region, rec.effect("outside")), rec.step("after")))
    r = case.run()
    a, b = case.effect_id("a"), case.effect_id("b")
    (timer,) = r.timers
    case.complete(a, {"a": 1})
    r = case.cancel_region("r")
    assert (r.status, r.cancelled_effects, r.cancelled_timers) == ("blocked", [b], [timer.timer_id])
    assert (rec.steps, case.pending_names(), r.signals) == (["compensate"], ["outside"], ())
    assert case.m.complete_effect(b, {}) is False  # the withdrawn effect's late result is discarded
    assert (case.complete("outside").status, rec.steps) == ("done", ["compensate", "after"])
    assert case.data == {"a": 1}  # what finished inside the region before the cancel is kept


def test_wcp25_cancel_region_withdraws_nested_regions() -> None:
    """WCP25: a region nested in the cancelled one goes with it and is no longer active."""
    rec = Recorder()
    case = Case(seq(scope("outer", scope("inner", rec.effect("a")), on_cancel=rec.step("undo")), rec.step("after")))
    case.run()
    a = case.effect_id("a")
    assert case.m.live_regions() == ["outer", "inner"]
    r = case.cancel_region("outer")
    assert (r.status, r.cancelled_effects, rec.steps) == ("done", [a], ["undo", "after"])
    assert case.m.live_regions() == []


# -- WCP26 cancel MI activity ----------------------------------------------------------------------


def test_wcp26_cancel_mi_activity_withdraws_the_unfinished_instances_only() -> None:
    """WCP26: cancelling a named mi withdraws its unfinished instances; its thread stops, a parallel one goes on."""
    rec = Recorder()
    term = seq(
        par(seq(mi(rec.effect("work"), count=3, name="m", collect="out"), rec.step("mi_after")), rec.effect("o")),
        rec.step("after"),
    )
    case = Case(term)
    case.run()
    ids = case.effect_ids("work")
    case.complete(ids[1], {"v": 1})
    r = case.cancel_region("m")
    assert (r.status, sorted(r.cancelled_effects), rec.steps) == ("blocked", [ids[0], ids[2]], [])
    assert "out" not in case.data
    assert (case.complete("o").status, rec.steps) == ("done", ["after"])


def test_wcp26_cancel_mi_activity_in_the_root_thread_ends_the_case_cancelled() -> None:
    """WCP26 edge: when the cancelled mi holds the only thread, the case ends cancelled."""
    rec = Recorder()
    case = Case(seq(mi(rec.effect("work"), count=2, name="m"), rec.effect("after")))
    case.run()
    ids = case.effect_ids("work")
    r = case.cancel_region("m")
    assert (r.status, sorted(r.cancelled_effects), case.pending_names()) == ("cancelled", ids, [])


# -- WCP27 complete MI activity --------------------------------------------------------------------


def test_wcp27_complete_mi_activity_fires_the_join_at_once_with_partial_outputs() -> None:
    """WCP27: complete_region cancels the remaining instances and joins now; collect has None for the cancelled."""
    rec = Recorder()
    case = Case(seq(mi(rec.effect("work"), count=3, name="m", collect="out"), rec.step("after")))
    case.run()
    ids = case.effect_ids("work")
    case.complete(ids[1], {"v": 1})
    assert rec.steps == []
    r = case.complete_region("m")
    assert (r.status, rec.steps, sorted(r.cancelled_effects)) == ("done", ["after"], [ids[0], ids[2]])
    assert case.data["out"] == [None, {"v": 1}, None]


def test_wcp27_complete_mi_activity_before_any_instance_finished() -> None:
    """WCP27 edge: completing an mi with no finished instance still joins, with all outputs None."""
    rec = Recorder()
    case = Case(seq(mi(rec.effect("work"), count=2, name="m", collect="out"), rec.step("after")))
    case.run()
    ids = case.effect_ids("work")
    r = case.complete_region("m")
    assert (r.status, sorted(r.cancelled_effects), rec.steps) == ("done", ids, ["after"])
    assert case.data == {"out": [None, None]}


def test_wcp27_complete_region_after_the_join_fired_is_rejected() -> None:
    """WCP27 edge: an mi whose join already fired (join=None) has nothing left to complete."""
    rec = Recorder()
    case = Case(seq(mi(rec.effect("work"), count=1, join=None, name="m"), rec.effect("after")))
    case.run()
    with pytest.raises(SignalRejected, match="'m' has no join"):
        case.complete_region("m")
    assert sorted(case.pending_names()) == ["after", "work"]  # the rejected call changed nothing


# -- regions the thread has already left -----------------------------------------------------------


def _discriminator_in_scope(rec: Recorder, **kw: Any) -> Case:
    term = seq(scope("s", par(rec.effect("a"), rec.effect("b"), join="first"), **kw), rec.step("after"))
    case = Case(term)
    case.run()
    case.complete("a")
    assert rec.steps == ["after"]  # the thread left the scope; "b" still runs inside it
    return case


def test_wcp25_cancelling_a_left_region_withdraws_its_leftover_work_only() -> None:
    """WCP25 edge: cancelling a scope its thread already left withdraws the leftover effect only; nothing reruns."""
    rec = Recorder()
    case = _discriminator_in_scope(rec)
    b = case.effect_id("b")
    r = case.cancel_region("s")
    assert (r.status, r.cancelled_effects, rec.steps) == ("done", [b], ["after"])


def test_wcp25_cancelling_a_left_region_with_on_cancel_does_not_rerun_what_follows() -> None:
    """WCP25 edge: cancelling a left scope withdraws the leftover only: neither on_cancel nor what follows runs."""
    rec = Recorder()
    case = _discriminator_in_scope(rec, on_cancel=rec.step("undo"))
    b = case.effect_id("b")
    r = case.cancel_region("s")
    assert (r.status, r.cancelled_effects, rec.steps) == ("done", [b], ["after"])


def test_wcp25_completing_a_left_region_does_not_rerun_what_follows() -> None:
    """WCP25 edge: complete_region on a left scope withdraws the leftover effect and does not rerun what follows."""
    rec = Recorder()
    case = _discriminator_in_scope(rec)
    b = case.effect_id("b")
    r = case.complete_region("s")
    assert (r.status, r.cancelled_effects, rec.steps) == ("done", [b], ["after"])

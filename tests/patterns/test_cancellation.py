"""Cancellation and force-completion patterns at the vm level: cancel task (WCP19), cancel case (WCP20),
cancel region (WCP25), cancel MI activity (WCP26), complete MI activity (WCP27)."""

from __future__ import annotations

from typing import Any

import pytest

from wfsub import SignalRejected, mi, par, scope, seq, sleep, wait

from ._drive import Case, fx, step

# -- WCP19 cancel task -----------------------------------------------------------------------------


def test_wcp19_cancel_task_withdraws_the_running_step_and_the_thread_goes_on_through_on_cancel() -> None:
    """WCP19: cancelling the scope around one effect cancels that effect; with on_cancel the thread runs
    on_cancel and then the step after the scope; the late result is discarded."""
    log: list[str] = []
    term = seq(scope("t", seq(fx("a"), step(log, "a_done")), on_cancel=step(log, "undo")), step(log, "after"))
    case = Case(term)
    case.run()
    a = case.effect_id("a")
    case.m.cancel_region("t")
    r = case.run()
    assert (r.status, r.cancelled_effects, log) == ("done", [a], ["undo", "after"])
    assert case.m.complete_effect(a, {"x": 1}) is False
    assert case.data == {}


def test_wcp19_cancel_task_without_on_cancel_ends_that_thread_only() -> None:
    """WCP19: without on_cancel the cancelled task's thread ends at the scope; a parallel thread runs on,
    and the join after the par does not wait for the withdrawn one."""
    log: list[str] = []
    term = seq(par(seq(scope("t", fx("a")), step(log, "a_after")), fx("b")), step(log, "joined"))
    case = Case(term)
    case.run()
    case.m.cancel_region("t")
    r = case.run()
    assert (r.status, len(r.cancelled_effects), log) == ("blocked", 1, [])
    assert (case.complete("b").status, log) == ("done", ["joined"])


def test_wcp19_cancelling_the_only_thread_ends_the_case_cancelled() -> None:
    """WCP19 edge: withdrawing the root thread (no on_cancel) ends the case as cancelled, not done."""
    log: list[str] = []
    case = Case(seq(scope("t", fx("a")), step(log, "after")))
    case.run()
    case.m.cancel_region("t")
    assert (case.run().status, log) == ("cancelled", [])


def test_wcp19_cancel_task_parked_on_a_timer_cancels_the_timer() -> None:
    """WCP19: a cancelled task waiting on a timer has that timer reported cancelled; firing it is stale."""
    log: list[str] = []
    case = Case(seq(scope("t", sleep(60), on_cancel=step(log, "undo")), step(log, "after")))
    r = case.run()
    (timer,) = r.timers
    case.m.cancel_region("t")
    r = case.run()
    assert (r.status, r.cancelled_timers, log) == ("done", [timer.timer_id], ["undo", "after"])
    assert case.m.fire_timer(timer.timer_id) is False


def test_wcp19_cancel_region_that_is_not_active_is_rejected() -> None:
    """WCP19 edge: cancelling a region before it was entered (or after it ended) is rejected."""
    case = Case(seq(fx("first"), scope("t", fx("a"))))
    case.run()
    with pytest.raises(SignalRejected):
        case.m.cancel_region("t")
    with pytest.raises(SignalRejected):
        case.m.cancel_region("nope")


# -- WCP20 cancel case -----------------------------------------------------------------------------


def test_wcp20_cancel_case_withdraws_every_effect_timer_and_wait() -> None:
    """WCP20: cancel() ends the case as cancelled and reports every in-flight effect and armed timer."""
    log: list[str] = []
    case = Case(seq(par(fx("a"), fx("b"), sleep(10), wait("go")), step(log, "after")))
    r = case.run()
    effects = sorted(req.effect_id for req in r.effects)
    (timer,) = r.timers
    assert r.signals == ("go",)
    case.m.cancel()
    r = case.run()
    assert (r.status, sorted(r.cancelled_effects), r.cancelled_timers, log) == (
        "cancelled",
        effects,
        [timer.timer_id],
        [],
    )
    assert case.m.complete_effect(effects[0], {}) is False
    assert case.m.fire_timer(timer.timer_id) is False
    with pytest.raises(SignalRejected):
        case.m.deliver_signal("go")


def test_wcp20_cancel_after_the_case_ended_is_rejected() -> None:
    """WCP20 edge: a case that has ended cannot be cancelled."""
    case = Case(step([], "a"))
    assert case.run().status == "done"
    with pytest.raises(SignalRejected):
        case.m.cancel()


# -- WCP25 cancel region ---------------------------------------------------------------------------


def test_wcp25_cancel_region_withdraws_all_work_inside_and_nothing_outside() -> None:
    """WCP25: cancelling a region withdraws its parallel effects, timers and waits; work outside runs on."""
    log: list[str] = []
    region = scope(
        "r",
        par(fx("a"), seq(fx("b"), step(log, "b_after")), sleep(30), wait("go")),
        on_cancel=step(log, "compensate"),
    )
    case = Case(seq(par(region, fx("outside")), step(log, "after")))
    r = case.run()
    a, b = case.effect_id("a"), case.effect_id("b")
    (timer,) = r.timers
    case.complete("a")
    case.m.cancel_region("r")
    r = case.run()
    assert (r.status, r.cancelled_effects, r.cancelled_timers) == ("blocked", [b], [timer.timer_id])
    assert (log, case.pending_names(), r.signals) == (["compensate"], ["outside"], ())
    assert case.m.complete_effect(a, {}) is False
    assert (case.complete("outside").status, log) == ("done", ["compensate", "after"])


def test_wcp25_cancel_region_withdraws_nested_regions() -> None:
    """WCP25: a region nested in the cancelled one goes with it and is no longer active."""
    log: list[str] = []
    case = Case(seq(scope("outer", scope("inner", fx("a")), on_cancel=step(log, "undo")), step(log, "after")))
    case.run()
    case.m.cancel_region("outer")
    assert (case.run().status, log) == ("done", ["undo", "after"])
    assert case.m.live_regions() == []


# -- WCP26 cancel MI activity ----------------------------------------------------------------------


def test_wcp26_cancel_mi_activity_withdraws_the_unfinished_instances_only() -> None:
    """WCP26: cancelling a named mi withdraws its running instances (their effects reported cancelled);
    finished instances are unaffected; the mi's thread does not go on, a parallel one does."""
    log: list[str] = []
    term = seq(
        par(seq(mi(fx("work"), count=3, name="m", collect="out"), step(log, "mi_after")), fx("other")),
        step(log, "after"),
    )
    case = Case(term)
    case.run()
    ids = case.effect_ids("work")
    case.complete(ids[1], {"v": 1})
    case.m.cancel_region("m")
    r = case.run()
    assert (r.status, sorted(r.cancelled_effects), log) == ("blocked", [ids[0], ids[2]], [])
    assert "out" not in case.data
    assert (case.complete("other").status, log) == ("done", ["after"])


def test_wcp26_cancel_mi_activity_in_the_root_thread_ends_the_case_cancelled() -> None:
    """WCP26 edge: when the cancelled mi holds the only thread, the case ends cancelled."""
    case = Case(seq(mi(fx("work"), count=2, name="m"), fx("after")))
    case.run()
    case.m.cancel_region("m")
    r = case.run()
    assert (r.status, len(r.cancelled_effects)) == ("cancelled", 2)


# -- WCP27 complete MI activity --------------------------------------------------------------------


def test_wcp27_complete_mi_activity_fires_the_join_at_once_with_partial_outputs() -> None:
    """WCP27: complete_region cancels the remaining instances and fires the join now; collect has the
    outputs so far and None for the cancelled instances."""
    log: list[str] = []
    case = Case(seq(mi(fx("work"), count=3, name="m", collect="out"), step(log, "after")))
    case.run()
    ids = case.effect_ids("work")
    case.complete(ids[1], {"v": 1})
    assert log == []
    case.m.complete_region("m")
    r = case.run()
    assert (r.status, log, sorted(r.cancelled_effects)) == ("done", ["after"], [ids[0], ids[2]])
    assert case.data["out"] == [None, {"v": 1}, None]


def test_wcp27_complete_mi_activity_before_any_instance_finished() -> None:
    """WCP27 edge: completing an mi with no finished instance still joins, with all outputs None."""
    log: list[str] = []
    case = Case(seq(mi(fx("work"), count=2, name="m", collect="out"), step(log, "after")))
    case.run()
    case.m.complete_region("m")
    assert (case.run().status, log, case.data["out"]) == ("done", ["after"], [None, None])


def test_wcp27_complete_region_after_the_join_fired_is_rejected() -> None:
    """WCP27 edge: an mi whose join already fired (join=None) has nothing left to complete."""
    case = Case(seq(mi(fx("work"), count=1, join=None, name="m"), fx("after")))
    case.run()
    with pytest.raises(SignalRejected):
        case.m.complete_region("m")


# -- regions the thread has already left -----------------------------------------------------------


def _discriminator_in_scope(log: list[str], **kw: Any) -> Case:
    term = seq(scope("s", par(fx("a"), fx("b"), join="first"), **kw), step(log, "after"))
    case = Case(term)
    case.run()
    case.complete("a")
    assert log == ["after"]  # the thread left the scope; "b" still runs inside it
    return case


def test_wcp25_cancelling_a_left_region_withdraws_its_leftover_work_only() -> None:
    """WCP25 edge: cancelling a scope the thread already left (a discriminator's loser runs on inside)
    withdraws the leftover effect and does not run what follows the scope again."""
    log: list[str] = []
    case = _discriminator_in_scope(log)
    b = case.effect_id("b")
    case.m.cancel_region("s")
    r = case.run()
    assert (r.status, r.cancelled_effects, log) == ("done", [b], ["after"])


def test_wcp25_cancelling_a_left_region_with_on_cancel_does_not_rerun_what_follows() -> None:
    """WCP25 edge: with on_cancel, cancelling a scope whose thread already left must not run the steps
    after the scope a second time."""
    log: list[str] = []
    case = _discriminator_in_scope(log, on_cancel=step(log, "undo"))
    case.m.cancel_region("s")
    r = case.run()
    assert r.status == "done"
    assert log.count("after") == 1


def test_wcp25_completing_a_left_region_does_not_rerun_what_follows() -> None:
    """WCP25 edge: complete_region on a scope whose thread already left withdraws the leftover work and
    must not run the steps after the scope a second time."""
    log: list[str] = []
    case = _discriminator_in_scope(log)
    case.m.complete_region("s")
    r = case.run()
    assert (r.status, log) == ("done", ["after"])

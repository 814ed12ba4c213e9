"""Termination patterns at the vm level: explicit termination (WCP43). Implicit termination (WCP11) is the
ordinary end of a case and is covered by every other test that reaches `done`."""

from __future__ import annotations

import pytest

from wfsub import SignalRejected, mi, par, seq, sleep, terminate, wait

from ..harness import Case, Recorder


def test_wcp43_terminate_ends_the_case_done_and_cancels_all_remaining_work() -> None:
    """WCP43: terminate() ends the case done, cancels every other effect and timer, keeps the data written so far."""
    rec = Recorder()
    term = seq(
        par(seq(rec.effect("gate"), terminate(), rec.step("never1")), rec.effect("long"), sleep(10), wait("go")),
        rec.step("never2"),
    )
    case = Case(term)
    r = case.run()
    long_id = case.effect_id("long")
    (timer,) = r.timers
    r = case.complete("gate", {"g": 1})
    assert (r.status, r.cancelled_effects, r.cancelled_timers) == ("done", [long_id], [timer.timer_id])
    assert (rec.steps, case.data) == ([], {"g": 1})
    assert case.m.complete_effect(long_id, {"late": 1}) is False
    assert case.m.fire_timer(timer.timer_id) is False
    with pytest.raises(SignalRejected, match="already ended"):
        case.signal("go")


def test_wcp43_terminate_inside_an_mi_instance_cancels_the_other_instances() -> None:
    """WCP43: terminate() reached inside one MI instance ends the whole case, not only the instance."""
    rec = Recorder()
    body = seq(rec.effect("work"), terminate())
    case = Case(seq(mi(body, count=3), rec.step("after")))
    case.run()
    ids = case.effect_ids("work")
    r = case.complete(ids[1])
    assert (r.status, sorted(r.cancelled_effects), rec.steps) == ("done", [ids[0], ids[2]], [])


def test_wcp43_terminate_with_nothing_else_pending_is_plain_done() -> None:
    """WCP43 edge: terminate() as the last step of a case with no other work ends it done, cancelling nothing."""
    rec = Recorder()
    r = Case(seq(rec.step("a"), terminate())).run()
    assert (r.status, r.cancelled_effects, r.cancelled_timers, rec.steps) == ("done", [], [], ["a"])

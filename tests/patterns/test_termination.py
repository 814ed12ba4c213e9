"""Termination patterns at the vm level: explicit termination (WCP43). Implicit termination (WCP11) is the
ordinary end of a case and is covered by every other test that reaches `done`."""

from __future__ import annotations

import pytest

from wfsub import SignalRejected, mi, par, seq, sleep, terminate, wait

from ._drive import Case, fx, step


def test_wcp43_terminate_ends_the_case_done_and_cancels_all_remaining_work() -> None:
    """WCP43: terminate() ends the case as done; every in-flight effect and armed timer elsewhere is reported
    cancelled, steps after it never run, and the data written so far is kept."""
    log: list[str] = []
    term = seq(
        par(seq(fx("gate"), terminate(), step(log, "never1")), fx("long"), sleep(10), wait("go")),
        step(log, "never2"),
    )
    case = Case(term)
    r = case.run()
    long_id = case.effect_id("long")
    (timer,) = r.timers
    r = case.complete("gate", {"g": 1})
    assert (r.status, r.cancelled_effects, r.cancelled_timers) == ("done", [long_id], [timer.timer_id])
    assert (log, case.data) == ([], {"g": 1})
    assert case.m.complete_effect(long_id, {"late": 1}) is False
    assert case.m.fire_timer(timer.timer_id) is False
    with pytest.raises(SignalRejected):
        case.m.deliver_signal("go")


def test_wcp43_terminate_inside_an_mi_instance_cancels_the_other_instances() -> None:
    """WCP43: terminate() reached inside one MI instance ends the whole case, not only the instance."""
    log: list[str] = []
    body = seq(fx("work"), terminate())
    case = Case(seq(mi(body, count=3), step(log, "after")))
    case.run()
    ids = case.effect_ids("work")
    r = case.complete(ids[1])
    assert (r.status, sorted(r.cancelled_effects), log) == ("done", [ids[0], ids[2]], [])


def test_wcp43_terminate_with_nothing_else_pending_is_plain_done() -> None:
    """WCP43 edge: terminate() as the last step of a case with no other work ends it done, cancelling nothing."""
    log: list[str] = []
    r = Case(seq(step(log, "a"), terminate())).run()
    assert (r.status, r.cancelled_effects, r.cancelled_timers, log) == ("done", [], [], ["a"])

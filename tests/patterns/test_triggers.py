"""Trigger patterns at the vm level: transient trigger (WCP23) and persistent trigger (WCP24)."""

from __future__ import annotations

from typing import Any

import pytest

from wfsub import SignalRejected, loop, par, seq, wait

from ._drive import Case, call_task, fx, step

# -- WCP23 transient trigger -----------------------------------------------------------------------


def test_wcp23_a_transient_signal_nobody_waits_for_is_lost() -> None:
    """WCP23: a signal arriving while nobody waits on its transient wait is dropped: the wait still blocks
    and only a signal delivered while it waits releases it."""
    log: list[str] = []
    case = Case(seq(fx("first"), wait("go", transient=True), step(log, "after")))
    case.run()
    r = case.signal("go", "early")
    assert (r.status, r.signals) == ("blocked", ())
    r = case.complete("first")
    assert (r.status, r.signals, log, case.data) == ("blocked", ("go",), [], {})
    r = case.signal("go", "on time")
    assert (r.status, log, case.data) == ("done", ["after"], {"go": "on time"})


def test_wcp23_a_transient_signal_wakes_a_waiting_thread() -> None:
    """WCP23: a transient wait that is already waiting takes the signal and stores its payload at into=."""
    case = Case(wait("go", into="payload", transient=True))
    assert case.run().signals == ("go",)
    assert (case.signal("go", 42).status, case.data) == ("done", {"payload": 42})


def test_wcp23_transient_drop_is_traced() -> None:
    """WCP23: the vm records the dropped signal as signal_dropped at trace level min."""
    case = Case(seq(fx("first"), wait("go", transient=True)), trace_level="min")
    case.run()
    case.signal("go")
    assert [e.kind for e in case.m.take_events() if e.kind.startswith("signal_")] == ["signal_dropped"]


# -- WCP24 persistent trigger ----------------------------------------------------------------------


def test_wcp24_a_persistent_signal_is_buffered_until_a_wait_takes_it() -> None:
    """WCP24: a signal arriving before its (persistent) wait is reached is kept and consumed on arrival."""
    log: list[str] = []
    case = Case(seq(fx("first"), wait("go"), step(log, "after")))
    case.run()
    case.signal("go", "early")
    assert log == []
    r = case.complete("first")
    assert (r.status, log, case.data) == ("done", ["after"], {"go": "early"})


def test_wcp24_buffered_signals_are_consumed_one_per_wait_in_arrival_order() -> None:
    """WCP24: several buffered signals of one name each release one wait, oldest first."""
    seen: list[Any] = []
    body = seq(wait("item"), call_task([], "take", lambda ctx: seen.append(ctx["item"])))
    case = Case(seq(fx("first"), loop(body, times=3)))
    case.run()
    for payload in ("p1", "p2", "p3"):
        case.m.deliver_signal("item", payload)
    assert (case.complete("first").status, seen) == ("done", ["p1", "p2", "p3"])


def test_wcp24_one_persistent_wait_makes_the_name_buffered() -> None:
    """WCP24 edge: a name is buffered unless every wait on it is transient: a later persistent wait on the
    same name receives a signal sent before it was reached."""
    log: list[str] = []
    term = par(
        seq(fx("first"), wait("go", transient=True), step(log, "transient_got")),
        seq(fx("second"), wait("go", into="persistent"), step(log, "persistent_got")),
    )
    case = Case(term)
    case.run()
    case.signal("go", "early")
    case.complete("second")
    assert (log, case.data) == (["persistent_got"], {"persistent": "early"})


def test_wcp24_a_signal_no_wait_listens_for_is_rejected() -> None:
    """WCP24 edge: a signal name the workflow never waits for is rejected, not buffered forever."""
    case = Case(seq(fx("first"), wait("go")))
    case.run()
    with pytest.raises(SignalRejected):
        case.m.deliver_signal("og")


def test_wcp23_a_transient_wait_does_not_take_a_signal_buffered_before_it_waited() -> None:
    """WCP23 edge: a signal buffered because another wait on the name is persistent is kept for that wait;
    a transient wait reached later does not take it (it arrived while the transient wait was not waiting)."""
    log: list[str] = []
    term = par(
        seq(fx("first"), wait("go", transient=True), step(log, "transient_got")),
        seq(fx("second"), wait("go", into="persistent"), step(log, "persistent_got")),
    )
    case = Case(term)
    case.run()
    case.signal("go", "early")
    r = case.complete("first")
    assert (r.signals, log) == (("go",), [])
    r = case.complete("second")
    assert (log, case.data) == (["persistent_got"], {"persistent": "early"})

"""Trigger patterns at the vm level: transient trigger (WCP23) and persistent trigger (WCP24)."""

from __future__ import annotations

import pytest

from wfsub import SignalRejected, loop, par, seq, wait

from ..harness import Case, Recorder, trace_of

# -- WCP23 transient trigger -----------------------------------------------------------------------


def test_wcp23_a_transient_signal_nobody_waits_for_is_lost() -> None:
    """WCP23: a transient signal nobody waits for is dropped; only one delivered while the wait waits releases it."""
    rec = Recorder()
    case = Case(seq(rec.effect("first"), wait("go", transient=True), rec.step("after")))
    case.run()
    r = case.signal("go", "early")
    assert (r.status, r.signals) == ("blocked", ())
    r = case.complete("first")
    assert (r.status, r.signals, rec.steps, case.data) == ("blocked", ("go",), [], {})
    r = case.signal("go", "on time")
    assert (r.status, rec.steps, case.data) == ("done", ["after"], {"go": "on time"})


def test_wcp23_a_transient_signal_wakes_a_waiting_thread() -> None:
    """WCP23: a transient wait that is already waiting takes the signal and stores its payload at into=."""
    case = Case(wait("go", into="payload", transient=True))
    assert case.run().signals == ("go",)
    assert (case.signal("go", 42).status, case.data) == ("done", {"payload": 42})


def test_wcp23_transient_drop_is_traced() -> None:
    """WCP23: the vm records the dropped signal as signal_dropped at trace level min."""
    rec = Recorder()
    case = Case(seq(rec.effect("first"), wait("go", transient=True)), trace_level="min")
    case.run()
    case.signal("go")
    signal_kinds = ("signal_waiting", "signal_consumed", "signal_buffered", "signal_dropped")
    assert trace_of(case.events, *signal_kinds) == [
        ("signal_dropped", "", {"signal": "go", "reason": "transient and nobody waits"})
    ]


# -- WCP24 persistent trigger ----------------------------------------------------------------------


def test_wcp24_a_persistent_signal_is_buffered_until_a_wait_takes_it() -> None:
    """WCP24: a signal arriving before its (persistent) wait is reached is kept and consumed on arrival."""
    rec = Recorder()
    case = Case(seq(rec.effect("first"), wait("go"), rec.step("after")))
    case.run()
    case.signal("go", "early")
    assert rec.steps == []
    r = case.complete("first")
    assert (r.status, rec.steps, case.data) == ("done", ["after"], {"go": "early"})


def test_wcp24_buffered_signals_are_consumed_one_per_wait_in_arrival_order() -> None:
    """WCP24: several buffered signals of one name each release one wait, oldest first."""
    rec = Recorder()
    body = seq(wait("item"), rec.step("take", lambda ctx: {"got": [*ctx["got"], ctx["item"]]}))
    case = Case(seq(rec.effect("first"), loop(body, times=3)), {"got": []})
    case.run()
    for payload in ("p1", "p2", "p3"):
        case.signal("item", payload)
    assert rec.steps == []
    assert (case.complete("first").status, rec.steps) == ("done", ["take"] * 3)
    assert case.data["got"] == ["p1", "p2", "p3"]


def test_wcp24_one_persistent_wait_makes_the_name_buffered() -> None:
    """WCP24 edge: one persistent wait on a name makes it buffered: that wait gets a signal sent before it waited."""
    rec = Recorder()
    term = par(
        seq(rec.effect("first"), wait("go", transient=True), rec.step("transient_got")),
        seq(rec.effect("second"), wait("go", into="persistent"), rec.step("persistent_got")),
    )
    case = Case(term)
    case.run()
    case.signal("go", "early")
    r = case.complete("second")
    assert (r.status, rec.steps, case.data) == ("blocked", ["persistent_got"], {"persistent": "early"})
    assert case.pending_names() == ["first"]


def test_wcp24_a_signal_no_wait_listens_for_is_rejected() -> None:
    """WCP24 edge: a signal name the workflow never waits for is rejected, not buffered forever."""
    rec = Recorder()
    case = Case(seq(rec.effect("first"), wait("go")))
    case.run()
    with pytest.raises(SignalRejected, match="never waits for signal 'og'"):
        case.signal("og")


def test_wcp23_a_transient_wait_does_not_take_a_signal_buffered_before_it_waited() -> None:
    """WCP23 edge: a transient wait does not take a signal buffered for a persistent wait before it waited."""
    rec = Recorder()
    term = par(
        seq(rec.effect("first"), wait("go", transient=True), rec.step("transient_got")),
        seq(rec.effect("second"), wait("go", into="persistent"), rec.step("persistent_got")),
    )
    case = Case(term)
    case.run()
    case.signal("go", "early")
    r = case.complete("first")
    assert (r.signals, rec.steps) == (("go",), [])
    r = case.complete("second")
    assert (r.status, r.signals) == ("blocked", ("go",))
    assert (rec.steps, case.data) == (["persistent_got"], {"persistent": "early"})

"""State-based patterns at the vm level: deferred choice (WCP16), interleaved parallel routing (WCP17),
milestone (WCP18), critical section (WCP39), interleaved routing (WCP40).

WCP17 and WCP40 follow the catalogue (Russell et al. 2006): WCP17 interleaved *parallel* routing is the one
with a partial order (`interleave(..., order=...)`), WCP40 interleaved routing has none (`interleave(...)`).
"""

from __future__ import annotations

from typing import Any

import pytest

from wfsub import Term, critical, defer, interleave, milestone, par, scope, seq, wait, when_milestone
from wfsub.lowlevel import Seeded

from ..harness import Case, Recorder, trace_of

# -- WCP16 deferred choice -------------------------------------------------------------------------


def _approval(rec: Recorder, **kw: Any) -> Term:
    return seq(
        defer({"approve": rec.step("approved"), "reject": rec.step("rejected")}, **kw),
        rec.step("after"),
    )


def test_wcp16_deferred_choice_is_decided_by_the_first_signal() -> None:
    """WCP16: the first signal picks its branch and stores its payload; the other signal is no longer awaited."""
    rec = Recorder()
    case = Case(par(_approval(rec), wait("keep_open")))
    r = case.run()
    assert set(r.signals) == {"approve", "reject", "keep_open"}
    r = case.signal("reject", {"why": "late"})
    assert (r.status, rec.steps, case.data) == ("blocked", ["rejected", "after"], {"reject": {"why": "late"}})
    assert r.signals == ("keep_open",)
    r = case.signal("approve", "too late")
    assert (r.status, r.signals, rec.steps) == ("blocked", ("keep_open",), ["rejected", "after"])
    assert case.data == {"reject": {"why": "late"}}
    assert case.signal("keep_open").status == "done"


def test_wcp16_deferred_choice_timeout_takes_on_timeout_and_withdraws_the_signals() -> None:
    """WCP16: with timeout= the timer can decide: on_timeout runs and the signal branches are withdrawn."""
    rec = Recorder()
    case = Case(_approval(rec, timeout=5.0, on_timeout=rec.step("expired")))
    r = case.run()
    (timer,) = r.timers
    assert timer.seconds == 5.0
    r = case.fire(timer.timer_id)
    assert (r.status, r.signals, rec.steps, case.data) == ("done", (), ["expired", "after"], {})


def test_wcp16_deferred_choice_timeout_from_data_is_computed_when_the_choice_starts() -> None:
    """WCP16 with timeout=fn: the timer's length is read from the data the case has when the choice starts."""
    rec = Recorder()

    def offer_seconds(ctx: Any) -> Any:
        return ctx["offer_seconds"]

    case = Case(_approval(rec, timeout=offer_seconds, on_timeout=rec.step("expired")), {"offer_seconds": 900})
    (timer,) = case.run().timers
    assert timer.seconds == 900.0
    r = case.fire(timer.timer_id)
    assert (r.status, rec.steps) == ("done", ["expired", "after"])


def test_wcp16_a_signal_decision_cancels_the_timeout_timer() -> None:
    """WCP16 edge: when a signal decides, the deferred choice's timer is reported cancelled."""
    rec = Recorder()
    case = Case(_approval(rec, timeout=5.0, on_timeout=rec.step("expired")))
    (timer,) = case.run().timers
    r = case.signal("approve", 1)
    assert (r.status, r.cancelled_timers, rec.steps) == ("done", [timer.timer_id], ["approved", "after"])
    assert case.m.fire_timer(timer.timer_id) is False


def test_wcp16_signals_buffered_before_the_choice_decide_by_arrival_order() -> None:
    """WCP16 edge: signals that arrived before the choice was reached are buffered; the earliest decides."""
    rec = Recorder()
    case = Case(seq(rec.effect("before"), _approval(rec)))
    case.run()
    case.signal("reject", "r")
    case.signal("approve", "a")
    r = case.complete("before")
    assert (r.status, rec.steps, case.data) == ("done", ["rejected", "after"], {"reject": "r"})


# -- WCP17 interleaved parallel routing (partial order) --------------------------------------------


def _ordered(rec: Recorder) -> Term:
    # c before a, and b (index 1) before c: the only legal order is b, c, a
    return interleave(rec.step("a"), rec.step("b"), rec.step("c"), order=[("c", "a"), (1, "c")])


@pytest.mark.parametrize("seed", range(8))
def test_wcp17_interleaved_parallel_routing_respects_the_partial_order(seed: int) -> None:
    """WCP17: with order pairs every branch runs once, in an order that respects every (before, after) pair."""
    rec = Recorder()
    case = Case(_ordered(rec), scheduler=Seeded(seed))
    assert case.run().status == "done"
    assert rec.steps == ["b", "c", "a"]


@pytest.mark.parametrize("seed", range(8))
def test_wcp17_partial_order_leaves_unordered_branches_free(seed: int) -> None:
    """WCP17: only the ordered pair is constrained: 'late' always follows 'early'; 'free' may go anywhere."""
    rec = Recorder()
    term = interleave(rec.step("late"), rec.step("free"), rec.step("early"), order=[("early", "late")])
    assert Case(term, scheduler=Seeded(seed)).run().status == "done"
    assert sorted(rec.steps) == ["early", "free", "late"]
    assert rec.steps.index("early") < rec.steps.index("late")


def test_wcp17_across_schedules_an_unordered_branch_takes_every_legal_place() -> None:
    """WCP17: over several schedules the unordered branch runs before, between and after the ordered pair."""
    orders = set()
    for seed in range(8):
        rec = Recorder()
        term = interleave(rec.step("late"), rec.step("free"), rec.step("early"), order=[("early", "late")])
        Case(term, scheduler=Seeded(seed)).run()
        orders.add(tuple(rec.steps))
    assert orders == {("free", "early", "late"), ("early", "free", "late"), ("early", "late", "free")}


def test_wcp17_a_branch_waiting_on_an_effect_holds_off_the_others() -> None:
    """WCP17: no two branches at once: while one branch waits on its effect, no other branch starts."""
    rec = Recorder()
    term = seq(
        interleave(
            seq(rec.step("a1"), rec.effect("a"), rec.step("a2")),
            seq(rec.step("b1"), rec.effect("b"), rec.step("b2")),
        ),
        rec.step("after"),
    )
    case = Case(term)
    case.run()
    (first,) = case.pending_names()
    assert rec.steps == [f"{first}1"]
    case.complete(first)
    (second,) = case.pending_names()
    assert second == ("b" if first == "a" else "a")
    assert rec.steps == [f"{first}1", f"{first}2", f"{second}1"]
    assert case.complete(second).status == "done"
    assert rec.steps == [f"{first}1", f"{first}2", f"{second}1", f"{second}2", "after"]


def test_wcp17_a_withdrawn_branch_does_not_stop_the_other_branches() -> None:
    """WCP17 edge: a branch withdrawn by a region cancel is skipped; the others still run, then the thread goes on."""
    rec = Recorder()
    case = Case(seq(interleave(scope("s", rec.effect("a")), rec.step("b")), rec.step("after")))
    case.run()
    r = case.cancel_region("s")
    assert (r.status, rec.steps) == ("done", ["b", "after"])


# -- WCP40 interleaved routing (no order) ----------------------------------------------------------


def test_wcp40_interleaved_routing_runs_each_branch_once_never_two_at_a_time() -> None:
    """WCP40: across schedules each branch runs once, never interleaved with another, in more than one order."""
    orders = set()
    for seed in range(12):
        rec = Recorder()
        term = interleave(*(seq(rec.step(f"{x}1"), rec.step(f"{x}2")) for x in "abc"))
        assert Case(term, scheduler=Seeded(seed)).run().status == "done"
        assert sorted(rec.steps) == ["a1", "a2", "b1", "b2", "c1", "c2"]
        pairs = [rec.steps[i : i + 2] for i in range(0, 6, 2)]
        assert all(p[0][0] == p[1][0] and p[0][1] == "1" for p in pairs), rec.steps
        orders.add("".join(p[0][0] for p in pairs))
    assert len(orders) > 1


def test_wcp40_the_next_branch_waits_for_the_previous_branch_to_finish_all_its_work() -> None:
    """WCP40 edge: the next branch starts only once the previous branch's discriminator loser has ended too."""
    rec = Recorder()
    discriminator = par(rec.effect("a"), rec.effect("b"), join="first")
    case = Case(interleave(discriminator, seq(rec.step("c_in"), rec.effect("c"))))
    case.run()
    case.complete("a")
    assert (rec.steps, case.pending_names()) == ([], ["b"])
    case.complete("b")
    assert (rec.steps, case.pending_names()) == (["c_in"], ["c"])
    assert case.complete("c").status == "done"


# -- WCP18 milestone -------------------------------------------------------------------------------


def _milestone_case(rec: Recorder) -> Case:
    term = seq(
        par(seq(rec.effect("x"), milestone("m", rec.effect("hold"))), when_milestone("m", rec.step("gated"))),
        rec.step("after"),
    )
    return Case(term)


def test_wcp18_a_branch_arriving_before_the_milestone_waits_for_it() -> None:
    """WCP18: a when_milestone branch reached before the milestone was ever entered waits until it is entered."""
    rec = Recorder()
    case = _milestone_case(rec)
    assert (case.run().status, rec.steps) == ("blocked", [])
    r = case.complete("x")
    assert (r.status, rec.steps, case.pending_names()) == ("blocked", ["gated"], ["hold"])
    assert (case.complete("hold").status, rec.steps) == ("done", ["gated", "after"])


def test_wcp18_a_branch_arriving_while_the_milestone_is_reached_runs() -> None:
    """WCP18: a branch arriving while a token is inside the milestone runs at once."""
    rec = Recorder()
    term = par(milestone("m", rec.effect("hold")), seq(rec.effect("late"), when_milestone("m", rec.step("gated"))))
    case = Case(term)
    case.run()
    assert (case.complete("late").status, rec.steps) == ("blocked", ["gated"])
    assert (case.complete("hold").status, rec.steps) == ("done", ["gated"])


def test_wcp18_a_branch_arriving_after_the_milestone_passed_is_withdrawn() -> None:
    """WCP18 edge: a branch arriving after the milestone passed is withdrawn (traced) and does not block the join."""
    rec = Recorder()
    term = seq(
        par(milestone("m", rec.step("quick")), seq(rec.effect("late"), when_milestone("m", rec.step("gated")))),
        rec.step("after"),
    )
    case = Case(term, trace_level="min")
    case.run()
    assert rec.steps == ["quick"]
    assert (case.complete("late").status, rec.steps) == ("done", ["quick", "after"])
    assert trace_of(case.events, "withdrawn") == [
        ("withdrawn", "seq[0].par[1].seq[1].when_milestone", {"reason": "milestone 'm' has passed"})
    ]


# -- WCP39 critical section ------------------------------------------------------------------------


def _section(rec: Recorder, who: str) -> Term:
    return critical("db", seq(rec.step(f"{who}_in"), rec.effect(who), rec.step(f"{who}_out")))


def test_wcp39_critical_sections_never_run_at_the_same_time() -> None:
    """WCP39: while one critical section is held open by its effect, the other with the same name waits."""
    rec = Recorder()
    case = Case(seq(par(_section(rec, "a"), _section(rec, "b")), rec.step("after")))
    case.run()
    assert (rec.steps, case.pending_names()) == (["a_in"], ["a"])
    case.complete("a")
    assert (rec.steps, case.pending_names()) == (["a_in", "a_out", "b_in"], ["b"])
    assert case.complete("b").status == "done"
    assert rec.steps == ["a_in", "a_out", "b_in", "b_out", "after"]


def test_wcp39_sections_with_different_names_do_not_exclude_each_other() -> None:
    """WCP39: mutual exclusion is per name: sections named differently are open at the same time."""
    rec = Recorder()
    other = critical("files", seq(rec.step("b_in"), rec.effect("b"), rec.step("b_out")))
    case = Case(par(_section(rec, "a"), other))
    case.run()
    assert (sorted(rec.steps), case.pending_names()) == (["a_in", "b_in"], ["a", "b"])


@pytest.mark.parametrize("seed", range(6))
def test_wcp39_mutual_exclusion_holds_under_preemptive_schedules(seed: int) -> None:
    """WCP39: with a scheduler that switches threads at every step, no section's steps interleave."""
    rec = Recorder()

    def section(who: str) -> Term:
        return critical("db", seq(*(rec.step(f"{who}{i}") for i in range(3))))

    assert Case(par(section("a"), section("b"), section("c")), scheduler=Seeded(seed)).run().status == "done"
    blocks = [rec.steps[i : i + 3] for i in range(0, 9, 3)]
    assert sorted(rec.steps) == [f"{who}{i}" for who in "abc" for i in range(3)]
    assert all(b == [f"{b[0][0]}{i}" for i in range(3)] for b in blocks), rec.steps


def test_wcp39_cancelling_the_holder_hands_the_section_to_the_next() -> None:
    """WCP39 edge: withdrawing the thread inside a section releases it to the waiting one."""
    rec = Recorder()
    case = Case(par(scope("s", _section(rec, "a")), _section(rec, "b")))
    case.run()
    a = case.effect_id("a")
    r = case.cancel_region("s")
    assert (r.cancelled_effects, rec.steps, case.pending_names()) == ([a], ["a_in", "b_in"], ["b"])
    assert case.complete("b").status == "done"

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

from ._drive import Case, fx, step

# -- WCP16 deferred choice -------------------------------------------------------------------------


def _approval(log: list[str], **kw: Any) -> Term:
    return seq(
        defer({"approve": step(log, "approved"), "reject": step(log, "rejected")}, **kw),
        step(log, "after"),
    )


def test_wcp16_deferred_choice_is_decided_by_the_first_signal() -> None:
    """WCP16: the first signal picks its branch and stores its payload; the other branch never runs, and
    a later signal for it is no longer awaited."""
    log: list[str] = []
    case = Case(par(_approval(log), wait("keep_open")))
    r = case.run()
    assert set(r.signals) == {"approve", "reject", "keep_open"}
    r = case.signal("reject", {"why": "late"})
    assert (r.status, log, case.data) == ("blocked", ["rejected", "after"], {"reject": {"why": "late"}})
    assert r.signals == ("keep_open",)
    r = case.signal("approve", "too late")
    assert (log, "approve" in case.data) == (["rejected", "after"], False)
    assert case.signal("keep_open").status == "done"


def test_wcp16_deferred_choice_timeout_takes_on_timeout_and_withdraws_the_signals() -> None:
    """WCP16: with timeout= the timer can decide: on_timeout runs and the signal branches are withdrawn."""
    log: list[str] = []
    case = Case(_approval(log, timeout=5.0, on_timeout=step(log, "expired")))
    r = case.run()
    (timer,) = r.timers
    assert timer.seconds == 5.0
    r = case.fire(timer.timer_id)
    assert (r.status, log) == ("done", ["expired", "after"])


def test_wcp16_a_signal_decision_cancels_the_timeout_timer() -> None:
    """WCP16 edge: when a signal decides, the deferred choice's timer is reported cancelled."""
    log: list[str] = []
    case = Case(_approval(log, timeout=5.0, on_timeout=step(log, "expired")))
    (timer,) = case.run().timers
    r = case.signal("approve", 1)
    assert (r.status, r.cancelled_timers, log) == ("done", [timer.timer_id], ["approved", "after"])
    assert case.m.fire_timer(timer.timer_id) is False


def test_wcp16_signals_buffered_before_the_choice_decide_by_arrival_order() -> None:
    """WCP16 edge: signals that arrived before the choice was reached are buffered; the earliest decides."""
    log: list[str] = []
    case = Case(seq(fx("before"), _approval(log)))
    case.run()
    case.m.deliver_signal("reject", "r")
    case.m.deliver_signal("approve", "a")
    r = case.complete("before")
    assert (r.status, log, case.data) == ("done", ["rejected", "after"], {"reject": "r"})


# -- WCP17 interleaved parallel routing (partial order) --------------------------------------------


def _ordered(log: list[str]) -> Term:
    # c before a, and b (index 1) before c: the only legal order is b, c, a
    return interleave(step(log, "a"), step(log, "b"), step(log, "c"), order=[("c", "a"), (1, "c")])


@pytest.mark.parametrize("seed", range(8))
def test_wcp17_interleaved_parallel_routing_respects_the_partial_order(seed: int) -> None:
    """WCP17: with order pairs every branch runs once, in an order that respects every (before, after) pair."""
    log: list[str] = []
    case = Case(_ordered(log), scheduler=Seeded(seed))
    assert case.run().status == "done"
    assert log == ["b", "c", "a"]


@pytest.mark.parametrize("seed", range(8))
def test_wcp17_partial_order_leaves_unordered_branches_free(seed: int) -> None:
    """WCP17: only the ordered pair is constrained: 'late' always follows 'early'; 'free' may go anywhere."""
    log: list[str] = []
    term = interleave(step(log, "late"), step(log, "free"), step(log, "early"), order=[("early", "late")])
    Case(term, scheduler=Seeded(seed)).run()
    assert sorted(log) == ["early", "free", "late"]
    assert log.index("early") < log.index("late")


def test_wcp17_a_branch_waiting_on_an_effect_holds_off_the_others() -> None:
    """WCP17: no two branches at once: while one branch waits on its effect, no other branch starts."""
    log: list[str] = []
    term = seq(
        interleave(seq(step(log, "a1"), fx("a"), step(log, "a2")), seq(step(log, "b1"), fx("b"), step(log, "b2"))),
        step(log, "after"),
    )
    case = Case(term)
    case.run()
    first = case.pending_names()
    assert len(first) == 1
    assert log == [f"{first[0]}1"]
    case.complete(first[0])
    second = case.pending_names()
    assert second == ["b" if first == ["a"] else "a"]
    assert log == [f"{first[0]}1", f"{first[0]}2", f"{second[0]}1"]
    assert case.complete(second[0]).status == "done"
    assert log[-1] == "after"


def test_wcp17_a_withdrawn_branch_does_not_stop_the_other_branches() -> None:
    """WCP17 edge: a branch withdrawn by a region cancel is skipped; the others still run, then the thread goes on."""
    log: list[str] = []
    case = Case(seq(interleave(scope("s", fx("a")), step(log, "b")), step(log, "after")))
    case.run()
    case.m.cancel_region("s")
    r = case.run()
    assert (r.status, log) == ("done", ["b", "after"])


# -- WCP40 interleaved routing (no order) ----------------------------------------------------------


def test_wcp40_interleaved_routing_runs_each_branch_once_never_two_at_a_time() -> None:
    """WCP40: across schedules each branch runs exactly once and its steps are never interleaved with
    another branch's; the order is free (more than one order shows up)."""
    orders = set()
    for seed in range(12):
        log: list[str] = []
        term = interleave(*(seq(step(log, f"{x}1"), step(log, f"{x}2")) for x in "abc"))
        assert Case(term, scheduler=Seeded(seed)).run().status == "done"
        assert sorted(log) == ["a1", "a2", "b1", "b2", "c1", "c2"]
        pairs = [log[i : i + 2] for i in range(0, 6, 2)]
        assert all(p[0][0] == p[1][0] and p[0][1] == "1" for p in pairs), log
        orders.add("".join(p[0][0] for p in pairs))
    assert len(orders) > 1


def test_wcp40_the_next_branch_waits_for_the_previous_branch_to_finish_all_its_work() -> None:
    """WCP40 edge: a branch whose discriminator let its thread on while a loser still runs is not finished:
    the next branch starts only after that loser ends (as critical() holds its lock until then)."""
    log: list[str] = []
    case = Case(interleave(par(fx("a"), fx("b"), join="first"), seq(step(log, "c_in"), fx("c"))))
    case.run()
    case.complete("a")
    assert (log, case.pending_names()) == ([], ["b"])
    case.complete("b")
    assert (log, case.pending_names()) == (["c_in"], ["c"])


# -- WCP18 milestone -------------------------------------------------------------------------------


def _milestone_case(log: list[str]) -> Case:
    term = seq(
        par(seq(fx("x"), milestone("m", fx("hold"))), when_milestone("m", step(log, "gated"))),
        step(log, "after"),
    )
    return Case(term)


def test_wcp18_a_branch_arriving_before_the_milestone_waits_for_it() -> None:
    """WCP18: a when_milestone branch reached before the milestone was ever entered waits, then runs
    when the milestone is entered."""
    log: list[str] = []
    case = _milestone_case(log)
    assert (case.run().status, log) == ("blocked", [])
    r = case.complete("x")
    assert (r.status, log, case.pending_names()) == ("blocked", ["gated"], ["hold"])
    assert (case.complete("hold").status, log) == ("done", ["gated", "after"])


def test_wcp18_a_branch_arriving_while_the_milestone_is_reached_runs() -> None:
    """WCP18: a branch arriving while a token is inside the milestone runs at once."""
    log: list[str] = []
    term = par(milestone("m", fx("hold")), seq(fx("late"), when_milestone("m", step(log, "gated"))))
    case = Case(term)
    case.run()
    assert (case.complete("late").status, log) == ("blocked", ["gated"])
    assert case.complete("hold").status == "done"


def test_wcp18_a_branch_arriving_after_the_milestone_passed_is_withdrawn() -> None:
    """WCP18 edge: a branch arriving after the milestone was entered and left is withdrawn, and does not
    block the join that follows."""
    log: list[str] = []
    term = seq(
        par(milestone("m", step(log, "quick")), seq(fx("late"), when_milestone("m", step(log, "gated")))),
        step(log, "after"),
    )
    case = Case(term)
    case.run()
    assert log == ["quick"]
    assert (case.complete("late").status, log) == ("done", ["quick", "after"])


# -- WCP39 critical section ------------------------------------------------------------------------


def _section(log: list[str], who: str) -> Term:
    return critical("db", seq(step(log, f"{who}_in"), fx(who), step(log, f"{who}_out")))


def test_wcp39_critical_sections_never_run_at_the_same_time() -> None:
    """WCP39: while one critical section is held open by its effect, the other with the same name waits."""
    log: list[str] = []
    case = Case(seq(par(_section(log, "a"), _section(log, "b")), step(log, "after")))
    case.run()
    assert (log, case.pending_names()) == (["a_in"], ["a"])
    case.complete("a")
    assert (log, case.pending_names()) == (["a_in", "a_out", "b_in"], ["b"])
    assert case.complete("b").status == "done"
    assert log == ["a_in", "a_out", "b_in", "b_out", "after"]


def test_wcp39_sections_with_different_names_do_not_exclude_each_other() -> None:
    """WCP39: mutual exclusion is per name: sections named differently are open at the same time."""
    log: list[str] = []
    other = critical("files", seq(step(log, "b_in"), fx("b"), step(log, "b_out")))
    case = Case(par(_section(log, "a"), other))
    case.run()
    assert (sorted(log), case.pending_names()) == (["a_in", "b_in"], ["a", "b"])


@pytest.mark.parametrize("seed", range(6))
def test_wcp39_mutual_exclusion_holds_under_preemptive_schedules(seed: int) -> None:
    """WCP39: with a scheduler that switches threads at every step, no section's steps interleave."""
    log: list[str] = []

    def section(who: str) -> Term:
        return critical("db", seq(*(step(log, f"{who}{i}") for i in range(3))))

    assert Case(par(section("a"), section("b"), section("c")), scheduler=Seeded(seed)).run().status == "done"
    blocks = [log[i : i + 3] for i in range(0, 9, 3)]
    assert all(b == [f"{b[0][0]}{i}" for i in range(3)] for b in blocks), log


def test_wcp39_cancelling_the_holder_hands_the_section_to_the_next() -> None:
    """WCP39 edge: withdrawing the thread inside a section releases it to the waiting one."""
    log: list[str] = []
    case = Case(par(scope("s", _section(log, "a")), _section(log, "b")))
    case.run()
    a = case.effect_id("a")
    case.m.cancel_region("s")
    r = case.run()
    assert (r.cancelled_effects, log, case.pending_names()) == ([a], ["a_in", "b_in"], ["b"])
    assert case.complete("b").status == "done"

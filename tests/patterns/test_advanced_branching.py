"""Advanced branching and synchronization patterns at the vm level: multi-choice (WCP6), structured and local
synchronizing merge (WCP7, 37), multi-merge (WCP8), discriminators (WCP9, 29), partial joins (WCP30, 32),
thread merge and thread split (WCP41, 42)."""

from __future__ import annotations

from typing import Any

import pytest

from wfsub import Term, mi, multi_choice, par, scope, seq, sleep

from ._drive import Case, call_task, fx, step


def _three_way(log: list[str]) -> Term:
    return seq(
        multi_choice(
            (lambda ctx: ctx["x"], fx("a")),
            (lambda ctx: ctx["y"], fx("b")),
            (lambda ctx: ctx["z"], fx("c")),
            default=step(log, "fallback"),
        ),
        step(log, "merged"),
    )


# -- WCP6 multi-choice -----------------------------------------------------------------------------


def test_wcp6_multi_choice_starts_every_branch_whose_predicate_holds() -> None:
    """WCP6: every branch with a true predicate starts (a and c), the others (b) do not."""
    log: list[str] = []
    case = Case(_three_way(log), {"x": True, "y": False, "z": True})
    r = case.run()
    assert r.status == "blocked"
    assert sorted(req.name for req in r.effects) == ["a", "c"]
    assert log == []


def test_wcp6_multi_choice_takes_the_default_when_nothing_holds() -> None:
    """WCP6 edge: with no predicate true only the default runs, then the merge."""
    log: list[str] = []
    case = Case(_three_way(log), {"x": False, "y": False, "z": False})
    r = case.run()
    assert (r.status, r.effects, log) == ("done", [], ["fallback", "merged"])


def test_wcp6_multi_choice_without_match_or_default_fails() -> None:
    """WCP6 edge: no predicate true and no default: the case fails at the multi_choice's path."""
    case = Case(seq(multi_choice((lambda ctx: False, fx("a"))), fx("b")))
    r = case.run()
    assert (r.status, r.error_path) == ("failed", "seq[0].multi_choice")


# -- WCP7 structured synchronizing merge -----------------------------------------------------------


@pytest.mark.parametrize("order", [("a", "c"), ("c", "a")])
def test_wcp7_synchronizing_merge_waits_for_exactly_the_chosen_branches(order: tuple[str, str]) -> None:
    """WCP7: the merge fires once, after both chosen branches and without waiting for the unchosen one."""
    log: list[str] = []
    case = Case(_three_way(log), {"x": True, "y": False, "z": True})
    case.run()
    r = case.complete(order[0])
    assert (r.status, log) == ("blocked", [])
    r = case.complete(order[1])
    assert (r.status, log) == ("done", ["merged"])


def test_wcp7_a_chosen_branch_withdrawn_does_not_block_the_merge() -> None:
    """WCP7 edge: a chosen branch withdrawn by a region cancel is not waited for by the merge."""
    log: list[str] = []
    term = seq(
        multi_choice((lambda ctx: True, scope("s", fx("a"))), (lambda ctx: True, fx("b"))),
        step(log, "merged"),
    )
    case = Case(term)
    case.run()
    case.complete("b")
    assert log == []
    case.m.cancel_region("s")
    r = case.run()
    assert (r.status, log) == ("done", ["merged"])


# -- WCP37 local synchronizing merge ---------------------------------------------------------------


def test_wcp37_local_merge_decides_from_its_own_branches_only() -> None:
    """WCP37: the merge of a multi_choice fires when its chosen branches are done, while an unrelated
    parallel branch is still running (the decision uses only local information)."""
    log: list[str] = []
    term = par(
        seq(
            multi_choice((lambda ctx: ctx["x"], fx("a")), (lambda ctx: ctx["y"], fx("b"))),
            step(log, "merged"),
        ),
        fx("unrelated"),
    )
    case = Case(term, {"x": True, "y": False})
    case.run()
    assert case.pending_names() == ["a", "unrelated"]
    r = case.complete("a")
    assert (r.status, log, case.pending_names()) == ("blocked", ["merged"], ["unrelated"])
    assert case.complete("unrelated").status == "done"


# -- WCP8 multi-merge ------------------------------------------------------------------------------


def test_wcp8_multi_merge_runs_what_follows_once_per_arriving_branch() -> None:
    """WCP8: with join="each" the step after the par runs once per branch, as each arrives."""
    log: list[str] = []
    seen: list[Any] = []
    term = seq(
        par(fx("a"), fx("b"), fx("c"), join="each"),
        call_task(log, "after", lambda ctx: seen.append(ctx["last"])),
    )
    case = Case(term)
    case.run()
    r = case.complete("b", {"last": "b"})
    assert (r.status, log, seen) == ("blocked", ["after"], ["b"])
    r = case.complete("a", {"last": "a"})
    assert (r.status, log, seen) == ("blocked", ["after", "after"], ["b", "a"])
    r = case.complete("c", {"last": "c"})
    assert (r.status, log, seen) == ("done", ["after"] * 3, ["b", "a", "c"])


def test_wcp8_multi_merge_each_thread_runs_its_own_effects_downstream() -> None:
    """WCP8: downstream of a multi-merge each arriving thread requests its own copy of the next effect."""
    case = Case(seq(par(fx("a"), fx("b"), join="each"), fx("after")))
    case.run()
    case.complete("a")
    first = case.effect_id("after")
    case.complete("b")
    assert len(case.effect_ids("after")) == 2
    case.complete(first)
    r = case.complete(case.effect_id("after"))
    assert r.status == "done"


# -- WCP9 structured discriminator -----------------------------------------------------------------


def test_wcp9_discriminator_fires_once_on_the_first_arrival_and_cancels_nothing() -> None:
    """WCP9: join="first" continues after the first branch; the others run on, their completions have no
    further effect, and the case is not done until they end."""
    log: list[str] = []
    case = Case(seq(par(fx("a"), fx("b"), fx("c"), join="first"), step(log, "after")))
    case.run()
    r = case.complete("b", {"b": 1})
    assert (r.status, log, r.cancelled_effects) == ("blocked", ["after"], [])
    assert case.pending_names() == ["a", "c"]
    r = case.complete("c", {"c": 1})
    assert (r.status, log) == ("blocked", ["after"])
    r = case.complete("a", {"a": 1})
    assert (r.status, log, case.cancelled_effects) == ("done", ["after"], [])
    assert case.data == {"a": 1, "b": 1, "c": 1}


def test_wcp9_late_arrivals_are_traced_as_ignored() -> None:
    """WCP9: the branches arriving after the discriminator fired show up as join_late, with one join."""
    case = Case(seq(par(fx("a"), fx("b"), join="first"), fx("after")), trace_level="min")
    case.run()
    case.complete("a")
    case.complete("b")
    kinds = [e.kind for e in case.m.take_events() if e.kind in ("join", "join_late")]
    assert kinds == ["join", "join_late"]


# -- WCP29 cancelling discriminator ----------------------------------------------------------------


def test_wcp29_cancelling_discriminator_cancels_the_rest_when_it_fires() -> None:
    """WCP29: join="first" with cancel_remaining withdraws the others; their in-flight effects are reported
    cancelled and their late results are discarded."""
    log: list[str] = []
    term = seq(
        par(fx("a"), fx("b"), seq(fx("c"), step(log, "c_after")), join="first", cancel_remaining=True),
        step(log, "after"),
    )
    case = Case(term)
    case.run()
    a, c = case.effect_id("a"), case.effect_id("c")
    r = case.complete("b", {"b": 1})
    assert (r.status, log, sorted(r.cancelled_effects)) == ("done", ["after"], sorted([a, c]))
    assert case.m.complete_effect(a, {"a": 1}) is False
    assert case.data == {"b": 1}


def test_wcp29_cancelling_discriminator_cancels_timers_too() -> None:
    """WCP29: a losing branch parked on a timer has that timer reported cancelled."""
    case = Case(par(fx("a"), sleep(30), join="first", cancel_remaining=True))
    r = case.run()
    (timer,) = r.timers
    r = case.complete("a")
    assert (r.status, r.cancelled_timers) == ("done", [timer.timer_id])
    assert case.m.fire_timer(timer.timer_id) is False


# -- WCP30 structured partial join -----------------------------------------------------------------


def test_wcp30_partial_join_fires_on_the_nth_arrival_and_ignores_the_rest() -> None:
    """WCP30: join=2 of 3 continues after the second arrival; the third runs on and changes nothing."""
    log: list[str] = []
    case = Case(seq(par(fx("a"), fx("b"), fx("c"), join=2), step(log, "after")))
    case.run()
    assert (case.complete("c").status, log) == ("blocked", [])
    r = case.complete("a")
    assert (r.status, log, r.cancelled_effects, case.pending_names()) == ("blocked", ["after"], [], ["b"])
    assert (case.complete("b").status, log) == ("done", ["after"])


def test_wcp30_partial_join_fires_when_withdrawals_leave_fewer_than_n() -> None:
    """WCP30 edge: with join=2 and one of two branches withdrawn, the join fires on the one that arrived."""
    log: list[str] = []
    case = Case(seq(par(fx("a"), scope("s", fx("b")), join=2), step(log, "after")))
    case.run()
    case.complete("a")
    assert log == []
    case.m.cancel_region("s")
    assert (case.run().status, log) == ("done", ["after"])


# -- WCP32 cancelling partial join -----------------------------------------------------------------


def test_wcp32_cancelling_partial_join_cancels_the_rest_at_the_nth_arrival() -> None:
    """WCP32: join=2 with cancel_remaining withdraws the branches still running at the second arrival."""
    log: list[str] = []
    term = seq(par(fx("a"), fx("b"), fx("c"), fx("d"), join=2, cancel_remaining=True), step(log, "after"))
    case = Case(term)
    case.run()
    b, d = case.effect_id("b"), case.effect_id("d")
    r = case.complete("c")
    assert (r.status, log, r.cancelled_effects) == ("blocked", [], [])
    r = case.complete("a")
    assert (r.status, log, sorted(r.cancelled_effects)) == ("done", ["after"], sorted([b, d]))


# -- WCP41 thread merge ----------------------------------------------------------------------------


def test_wcp41_thread_merge_joins_the_threads_of_one_branch_into_one() -> None:
    """WCP41 (thread merge), mapped to mi(count=n, join="all"): the n threads running the same branch are
    merged into one thread, so what follows runs exactly once, after the last thread."""
    log: list[str] = []
    case = Case(seq(mi(fx("work"), count=3), step(log, "merged")))
    case.run()
    ids = case.effect_ids("work")
    assert len(ids) == 3
    for eid in ids[:2]:
        assert (case.complete(eid).status, log) == ("blocked", [])
    assert (case.complete(ids[2]).status, log) == ("done", ["merged"])


# -- WCP42 thread split ----------------------------------------------------------------------------


def test_wcp42_thread_split_starts_one_thread_per_item_in_the_same_branch() -> None:
    """WCP42 (thread split), mapped to mi(items=..., join=None): one thread per item runs the same branch,
    each seeing its item and index; the splitting thread goes on at once; the case ends with the threads."""
    log: list[str] = []
    term = seq(mi(fx("ship"), items=lambda ctx: ctx["orders"], join=None), step(log, "went_on"))
    case = Case(term, {"orders": ["o1", "o2", "o3"]})
    r = case.run()
    assert (r.status, log) == ("blocked", ["went_on"])
    assert [(req.ctx["item"], req.ctx["index"]) for req in r.effects] == [("o1", 0), ("o2", 1), ("o3", 2)]
    ids = [req.effect_id for req in r.effects]
    assert case.complete(ids[1]).status == "blocked"
    assert case.complete(ids[0]).status == "blocked"
    assert case.complete(ids[2]).status == "done"
    assert log == ["went_on"]


def test_wcp29_the_trace_says_the_remaining_branches_were_cancelled() -> None:
    """WCP29: at trace level min the cancelling join records one withdrawal of the rest, and each in-flight
    effect it cancelled."""
    case = Case(par(fx("a"), fx("b"), fx("c"), join="first", cancel_remaining=True), trace_level="min")
    case.run()
    b, c = case.effect_id("b"), case.effect_id("c")
    case.complete("a")
    events = case.m.take_events()
    withdrawn = [e.detail for e in events if e.kind == "withdrawn"]
    cancelled = sorted(e.detail["effect_id"] for e in events if e.kind == "effect_cancelled")
    assert withdrawn == [{"branches": 2, "reason": "join fired"}]
    assert cancelled == [b, c]

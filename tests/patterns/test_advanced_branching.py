"""Advanced branching and synchronization patterns at the vm level: multi-choice (WCP6), structured and local
synchronizing merge (WCP7, 37), multi-merge (WCP8), discriminators (WCP9, 29), partial joins (WCP30, 32),
thread merge and thread split (WCP41, 42)."""

from __future__ import annotations

from typing import Any

import pytest

from wfsub import Term, mi, multi_choice, par, scope, seq, sleep

from ..harness import Case, Recorder, trace_of


def _three_way(rec: Recorder) -> Term:
    return seq(
        multi_choice(
            (lambda ctx: ctx["x"], rec.effect("a")),
            (lambda ctx: ctx["y"], rec.effect("b")),
            (lambda ctx: ctx["z"], rec.effect("c")),
            default=rec.step("fallback"),
        ),
        rec.step("merged"),
    )


# -- WCP6 multi-choice -----------------------------------------------------------------------------


def test_wcp6_multi_choice_starts_every_branch_whose_predicate_holds() -> None:
    """WCP6: every branch with a true predicate starts (a and c), the others (b) do not."""
    rec = Recorder()
    case = Case(_three_way(rec), {"x": True, "y": False, "z": True})
    r = case.run()
    assert r.status == "blocked"
    assert sorted(req.name for req in r.effects) == ["a", "c"]
    assert rec.steps == []


def test_wcp6_multi_choice_takes_the_default_when_nothing_holds() -> None:
    """WCP6 edge: with no predicate true only the default runs, then the merge."""
    rec = Recorder()
    case = Case(_three_way(rec), {"x": False, "y": False, "z": False})
    r = case.run()
    assert (r.status, r.effects, rec.steps) == ("done", [], ["fallback", "merged"])


def test_wcp6_multi_choice_without_match_or_default_fails() -> None:
    """WCP6 edge: no predicate true and no default: the case fails at the multi_choice's path."""
    rec = Recorder()
    case = Case(seq(multi_choice((lambda ctx: False, rec.effect("a"))), rec.effect("b")))
    r = case.run()
    assert (r.status, r.error_path) == ("failed", "seq[0].multi_choice")


# -- WCP7 structured synchronizing merge -----------------------------------------------------------


@pytest.mark.parametrize("order", [("a", "c"), ("c", "a")])
def test_wcp7_synchronizing_merge_waits_for_exactly_the_chosen_branches(order: tuple[str, str]) -> None:
    """WCP7: the merge fires once, after both chosen branches and without waiting for the unchosen one."""
    rec = Recorder()
    case = Case(_three_way(rec), {"x": True, "y": False, "z": True})
    case.run()
    r = case.complete(order[0])
    assert (r.status, rec.steps) == ("blocked", [])
    r = case.complete(order[1])
    assert (r.status, rec.steps) == ("done", ["merged"])


def test_wcp7_a_chosen_branch_withdrawn_does_not_block_the_merge() -> None:
    """WCP7 edge: a chosen branch withdrawn by a region cancel is not waited for by the merge."""
    rec = Recorder()
    term = seq(
        multi_choice((lambda ctx: True, scope("s", rec.effect("a"))), (lambda ctx: True, rec.effect("b"))),
        rec.step("merged"),
    )
    case = Case(term)
    case.run()
    case.complete("b")
    assert rec.steps == []
    a = case.effect_id("a")
    r = case.cancel_region("s")
    assert (r.status, r.cancelled_effects, rec.steps) == ("done", [a], ["merged"])


# -- WCP37 local synchronizing merge ---------------------------------------------------------------


def test_wcp37_local_merge_decides_from_its_own_branches_only() -> None:
    """WCP37: a multi_choice's merge fires on its own chosen branches while an unrelated parallel branch still runs."""
    rec = Recorder()
    term = par(
        seq(
            multi_choice((lambda ctx: ctx["x"], rec.effect("a")), (lambda ctx: ctx["y"], rec.effect("b"))),
            rec.step("merged"),
        ),
        rec.effect("unrelated"),
    )
    case = Case(term, {"x": True, "y": False})
    case.run()
    assert case.pending_names() == ["a", "unrelated"]
    r = case.complete("a")
    assert (r.status, rec.steps, case.pending_names()) == ("blocked", ["merged"], ["unrelated"])
    assert case.complete("unrelated").status == "done"


# -- WCP8 multi-merge ------------------------------------------------------------------------------


def test_wcp8_multi_merge_runs_what_follows_once_per_arriving_branch() -> None:
    """WCP8: with join="each" the step after the par runs once per branch, as each arrives."""
    rec = Recorder()
    seen: list[Any] = []
    term = seq(
        par(rec.effect("a"), rec.effect("b"), rec.effect("c"), join="each"),
        rec.step("after", lambda ctx: seen.append(ctx["last"])),
    )
    case = Case(term)
    case.run()
    r = case.complete("b", {"last": "b"})
    assert (r.status, rec.steps, seen) == ("blocked", ["after"], ["b"])
    r = case.complete("a", {"last": "a"})
    assert (r.status, rec.steps, seen) == ("blocked", ["after", "after"], ["b", "a"])
    r = case.complete("c", {"last": "c"})
    assert (r.status, rec.steps, seen) == ("done", ["after"] * 3, ["b", "a", "c"])


def test_wcp8_multi_merge_each_thread_runs_its_own_effects_downstream() -> None:
    """WCP8: downstream of a multi-merge each arriving thread requests its own copy of the next effect."""
    rec = Recorder()
    case = Case(seq(par(rec.effect("a"), rec.effect("b"), join="each"), rec.effect("after")))
    case.run()
    case.complete("a")
    first = case.effect_id("after")
    case.complete("b")
    (second,) = [eid for eid in case.effect_ids("after") if eid != first]
    assert case.pending_names() == ["after", "after"]
    assert case.complete(first).status == "blocked"
    assert case.complete(second).status == "done"


# -- WCP9 structured discriminator -----------------------------------------------------------------


def test_wcp9_discriminator_fires_once_on_the_first_arrival_and_cancels_nothing() -> None:
    """WCP9: join="first" goes on after the first arrival; the rest run on uncancelled and the case ends after them."""
    rec = Recorder()
    case = Case(seq(par(rec.effect("a"), rec.effect("b"), rec.effect("c"), join="first"), rec.step("after")))
    case.run()
    r = case.complete("b", {"b": 1})
    assert (r.status, rec.steps, r.cancelled_effects) == ("blocked", ["after"], [])
    assert case.pending_names() == ["a", "c"]
    r = case.complete("c", {"c": 1})
    assert (r.status, rec.steps) == ("blocked", ["after"])
    r = case.complete("a", {"a": 1})
    assert (r.status, rec.steps, case.cancelled_effects) == ("done", ["after"], [])
    assert case.data == {"a": 1, "b": 1, "c": 1}


def test_wcp9_late_arrivals_are_traced_as_ignored() -> None:
    """WCP9: the branches arriving after the discriminator fired show up as join_late, with one join."""
    rec = Recorder()
    case = Case(seq(par(rec.effect("a"), rec.effect("b"), join="first"), rec.effect("after")), trace_level="min")
    case.run()
    case.complete("a")
    case.complete("b")
    assert [(kind, path) for kind, path, _ in trace_of(case.events, "join", "join_late")] == [
        ("join", "seq[0].par"),
        ("join_late", "seq[0].par"),
    ]


# -- WCP29 cancelling discriminator ----------------------------------------------------------------


def test_wcp29_cancelling_discriminator_cancels_the_rest_when_it_fires() -> None:
    """WCP29: the first arrival withdraws the others: their effects are reported cancelled, late results dropped."""
    rec = Recorder()
    term = seq(
        par(
            rec.effect("a"),
            rec.effect("b"),
            seq(rec.effect("c"), rec.step("c_after")),
            join="first",
            cancel_remaining=True,
        ),
        rec.step("after"),
    )
    case = Case(term)
    case.run()
    a, c = case.effect_id("a"), case.effect_id("c")
    r = case.complete("b", {"b": 1})
    assert (r.status, rec.steps, sorted(r.cancelled_effects)) == ("done", ["after"], sorted([a, c]))
    assert case.m.complete_effect(a, {"a": 1}) is False
    assert case.data == {"b": 1}


def test_wcp29_cancelling_discriminator_cancels_timers_too() -> None:
    """WCP29: a losing branch parked on a timer has that timer reported cancelled."""
    rec = Recorder()
    case = Case(par(rec.effect("a"), sleep(30), join="first", cancel_remaining=True))
    r = case.run()
    (timer,) = r.timers
    r = case.complete("a")
    assert (r.status, r.cancelled_timers) == ("done", [timer.timer_id])
    assert case.m.fire_timer(timer.timer_id) is False


# -- WCP30 structured partial join -----------------------------------------------------------------


def test_wcp30_partial_join_fires_on_the_nth_arrival_and_ignores_the_rest() -> None:
    """WCP30: join=2 of 3 continues after the second arrival; the third runs on and changes nothing."""
    rec = Recorder()
    case = Case(seq(par(rec.effect("a"), rec.effect("b"), rec.effect("c"), join=2), rec.step("after")))
    case.run()
    assert (case.complete("c").status, rec.steps) == ("blocked", [])
    r = case.complete("a")
    assert (r.status, rec.steps, r.cancelled_effects, case.pending_names()) == ("blocked", ["after"], [], ["b"])
    assert (case.complete("b").status, rec.steps) == ("done", ["after"])


def test_wcp30_partial_join_fires_when_withdrawals_leave_fewer_than_n() -> None:
    """WCP30 edge: with join=2 and one of two branches withdrawn, the join fires on the one that arrived."""
    rec = Recorder()
    case = Case(seq(par(rec.effect("a"), scope("s", rec.effect("b")), join=2), rec.step("after")))
    case.run()
    case.complete("a")
    assert rec.steps == []
    b = case.effect_id("b")
    r = case.cancel_region("s")
    assert (r.status, r.cancelled_effects, rec.steps) == ("done", [b], ["after"])


# -- WCP32 cancelling partial join -----------------------------------------------------------------


def test_wcp32_cancelling_partial_join_cancels_the_rest_at_the_nth_arrival() -> None:
    """WCP32: join=2 with cancel_remaining withdraws the branches still running at the second arrival."""
    rec = Recorder()
    branches = (rec.effect("a"), rec.effect("b"), rec.effect("c"), rec.effect("d"))
    term = seq(par(*branches, join=2, cancel_remaining=True), rec.step("after"))
    case = Case(term)
    case.run()
    b, d = case.effect_id("b"), case.effect_id("d")
    r = case.complete("c")
    assert (r.status, rec.steps, r.cancelled_effects) == ("blocked", [], [])
    r = case.complete("a")
    assert (r.status, rec.steps, sorted(r.cancelled_effects)) == ("done", ["after"], sorted([b, d]))


# -- WCP41 thread merge ----------------------------------------------------------------------------


def test_wcp41_thread_merge_joins_the_threads_of_one_branch_into_one() -> None:
    """WCP41 (thread merge, as mi(count=n)): n threads of one branch merge; what follows runs once, after the last."""
    rec = Recorder()
    case = Case(seq(mi(rec.effect("work"), count=3), rec.step("merged")))
    case.run()
    ids = case.effect_ids("work")
    assert case.pending_names() == ["work"] * 3
    for eid in ids[:2]:
        assert (case.complete(eid).status, rec.steps) == ("blocked", [])
    assert (case.complete(ids[2]).status, rec.steps) == ("done", ["merged"])


# -- WCP42 thread split ----------------------------------------------------------------------------


def test_wcp42_thread_split_starts_one_thread_per_item_in_the_same_branch() -> None:
    """WCP42 (thread split, as mi(items, join=None)): a thread per item sees item and index; the splitter goes on."""
    rec = Recorder()
    term = seq(mi(rec.effect("ship"), items=lambda ctx: ctx["orders"], join=None), rec.step("went_on"))
    case = Case(term, {"orders": ["o1", "o2", "o3"]})
    r = case.run()
    assert (r.status, rec.steps) == ("blocked", ["went_on"])
    assert [(req.ctx["item"], req.ctx["index"]) for req in r.effects] == [("o1", 0), ("o2", 1), ("o3", 2)]
    ids = [req.effect_id for req in r.effects]
    assert case.complete(ids[1]).status == "blocked"
    assert case.complete(ids[0]).status == "blocked"
    assert case.complete(ids[2]).status == "done"
    assert rec.steps == ["went_on"]


def test_wcp29_the_trace_says_the_remaining_branches_were_cancelled() -> None:
    """WCP29: the trace has one withdrawal of the rest at the par and an effect_cancelled at each loser's path."""
    rec = Recorder()
    term = par(rec.effect("a"), rec.effect("b"), rec.effect("c"), join="first", cancel_remaining=True)
    case = Case(term, trace_level="min")
    case.run()
    b, c = case.effect_id("b"), case.effect_id("c")
    case.complete("a")
    events = trace_of(case.events, "withdrawn", "effect_cancelled")
    withdrawn = [(path, detail) for kind, path, detail in events if kind == "withdrawn"]
    cancelled = sorted((path, detail["effect_id"]) for kind, path, detail in events if kind == "effect_cancelled")
    assert withdrawn == [("par", {"branches": 2, "reason": "join fired"})]
    assert cancelled == [("par[1].effect", b), ("par[2].effect", c)]

"""Basic control-flow patterns (WCP1-5) at the vm level: sequence, parallel split, synchronization,
exclusive choice, simple merge."""

from __future__ import annotations

import pytest

from wfsub import Term, par, scope, seq, xor

from ..harness import Case, Recorder

# -- WCP1 sequence ---------------------------------------------------------------------------------


def test_wcp1_sequence_runs_steps_in_order_each_seeing_the_previous_output() -> None:
    """WCP1: steps of a seq run one after another and each sees the data the previous one wrote."""
    rec = Recorder()
    term = seq(
        rec.step("a", {"x": 1}),
        rec.step("b", lambda ctx: {"y": ctx["x"] + 1}),
        rec.step("c", lambda ctx: {"z": ctx["y"] * 10}),
    )
    case = Case(term, {"keep": True})
    r = case.run()
    assert r.status == "done"
    assert rec.steps == ["a", "b", "c"]
    assert case.data == {"keep": True, "x": 1, "y": 2, "z": 20}


def test_wcp1_sequence_does_not_start_the_next_step_before_an_effect_completes() -> None:
    """WCP1: the step after an effect runs only once the effect has completed, and sees its output."""
    rec = Recorder()
    term = seq(rec.step("a"), rec.effect("e"), rec.step("b", lambda ctx: {"seen": ctx["e_out"]}))
    case = Case(term)
    r = case.run()
    assert (r.status, rec.steps, case.pending_names()) == ("blocked", ["a"], ["e"])
    r = case.complete("e", {"e_out": 7})
    assert (r.status, rec.steps, case.data) == ("done", ["a", "b"], {"e_out": 7, "seen": 7})


# -- WCP2 parallel split ---------------------------------------------------------------------------


def test_wcp2_parallel_split_starts_every_branch_before_any_completes() -> None:
    """WCP2: a par requests the effects of all its branches in the same run, before any of them completes."""
    rec = Recorder()
    case = Case(par(seq(rec.step("a"), rec.effect("ea")), seq(rec.step("b"), rec.effect("eb")), rec.effect("ec")))
    r = case.run()
    assert r.status == "blocked"
    assert sorted(rec.steps) == ["a", "b"]
    assert sorted(req.name for req in r.effects) == ["ea", "eb", "ec"]


# -- WCP3 synchronization --------------------------------------------------------------------------


@pytest.mark.parametrize("order", [("a", "b", "c"), ("c", "b", "a"), ("b", "c", "a")])
def test_wcp3_synchronization_continues_once_after_the_last_branch(order: tuple[str, ...]) -> None:
    """WCP3: the step after an all-join runs once, only after the last branch arrived, whatever the order."""
    rec = Recorder()
    case = Case(seq(par(rec.effect("a"), rec.effect("b"), rec.effect("c")), rec.step("after")))
    case.run()
    for name in order[:-1]:
        r = case.complete(name, {name: 1})
        assert (r.status, rec.steps) == ("blocked", [])
    r = case.complete(order[-1], {order[-1]: 1})
    assert (r.status, rec.steps, case.data) == ("done", ["after"], {"a": 1, "b": 1, "c": 1})


def test_wcp3_a_withdrawn_branch_does_not_block_the_join() -> None:
    """WCP3 edge: a branch withdrawn by cancelling its region is not waited for; the join fires on the rest."""
    rec = Recorder()
    case = Case(seq(par(scope("s", rec.effect("a")), rec.effect("b")), rec.step("after")))
    case.run()
    a = case.effect_id("a")
    r = case.cancel_region("s")
    assert (r.status, r.cancelled_effects, rec.steps) == ("blocked", [a], [])
    r = case.complete("b")
    assert (r.status, rec.steps) == ("done", ["after"])


def test_wcp3_a_join_withdrawn_after_others_arrived_fires_on_those() -> None:
    """WCP3 edge: if the last outstanding branch is withdrawn after the others arrived, the join fires then."""
    rec = Recorder()
    case = Case(seq(par(rec.effect("a"), scope("s", rec.effect("b"))), rec.step("after")))
    case.run()
    case.complete("a")
    assert rec.steps == []
    b = case.effect_id("b")
    r = case.cancel_region("s")
    assert (r.status, r.cancelled_effects, rec.steps) == ("done", [b], ["after"])


def test_wcp3_when_every_branch_is_withdrawn_the_par_is_withdrawn() -> None:
    """WCP3 edge: a par whose branches are all withdrawn is withdrawn itself; the root thread ends cancelled."""
    rec = Recorder()
    case = Case(seq(par(scope("s", rec.effect("a")), scope("s2", rec.effect("b"))), rec.step("after")))
    case.run()
    a, b = case.effect_id("a"), case.effect_id("b")
    case.m.cancel_region("s")  # both regions in one burst
    r = case.cancel_region("s2")
    assert (r.status, rec.steps, sorted(r.cancelled_effects)) == ("cancelled", [], [a, b])


# -- WCP4 exclusive choice / WCP5 simple merge -----------------------------------------------------


def _choice(rec: Recorder) -> Term:
    return seq(
        xor(
            (lambda ctx: ctx["x"] > 10, rec.step("big")),
            (lambda ctx: ctx["x"] > 0, rec.step("positive")),
            default=rec.step("other"),
        ),
        rec.step("merged"),
    )


@pytest.mark.parametrize(("x", "branch"), [(50, "big"), (5, "positive"), (0, "other"), (-3, "other")])
def test_wcp4_exclusive_choice_runs_only_the_first_matching_branch(x: int, branch: str) -> None:
    """WCP4: exactly one branch runs: the first whose predicate holds (50 matches both, only 'big' runs)."""
    rec = Recorder()
    case = Case(_choice(rec), {"x": x})
    assert case.run().status == "done"
    assert rec.steps == [branch, "merged"]


def test_wcp4_exclusive_choice_without_match_or_default_fails_naming_the_node() -> None:
    """WCP4 edge: no predicate true and no default: the case fails with an error at the xor's path."""
    rec = Recorder()
    case = Case(seq(rec.step("a"), xor((lambda ctx: False, rec.step("never"))), rec.step("after")))
    r = case.run()
    assert r.status == "failed"
    assert r.error_path == "seq[1].xor"
    assert r.error_message is not None and "no xor branch matched" in r.error_message
    assert rec.steps == ["a"]


@pytest.mark.parametrize(("x", "branch"), [(50, "big"), (5, "positive"), (-3, "other")])
def test_wcp5_simple_merge_continues_once_after_whichever_branch_ran(x: int, branch: str) -> None:
    """WCP5: the step after an xor runs exactly once, after the chosen branch."""
    rec = Recorder()
    case = Case(_choice(rec), {"x": x})
    assert case.run().status == "done"
    assert rec.steps == [branch, "merged"]


def test_wcp5_simple_merge_waits_for_the_chosen_branch_effect() -> None:
    """WCP5: the merge point is reached only when the chosen branch's effect completes."""
    rec = Recorder()
    term = seq(xor((lambda ctx: ctx["fast"], rec.step("fast")), default=rec.effect("slow")), rec.step("merged"))
    case = Case(term, {"fast": False})
    r = case.run()
    assert (r.status, rec.steps, case.pending_names()) == ("blocked", [], ["slow"])
    r = case.complete("slow")
    assert (r.status, rec.steps) == ("done", ["merged"])

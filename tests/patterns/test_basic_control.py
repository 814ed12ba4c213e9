"""Basic control-flow patterns (WCP1-5) at the vm level: sequence, parallel split, synchronization,
exclusive choice, simple merge."""

from __future__ import annotations

import pytest

from wfsub import Term, par, scope, seq, xor

from ._drive import Case, call_task, fx, step

# -- WCP1 sequence ---------------------------------------------------------------------------------


def test_wcp1_sequence_runs_steps_in_order_each_seeing_the_previous_output() -> None:
    """WCP1: steps of a seq run one after another and each sees the data the previous one wrote."""
    log: list[str] = []
    term = seq(
        step(log, "a", x=1),
        call_task(log, "b", lambda ctx: {"y": ctx["x"] + 1}),
        call_task(log, "c", lambda ctx: {"z": ctx["y"] * 10}),
    )
    case = Case(term, {"keep": True})
    r = case.run()
    assert r.status == "done"
    assert log == ["a", "b", "c"]
    assert case.data == {"keep": True, "x": 1, "y": 2, "z": 20}


def test_wcp1_sequence_does_not_start_the_next_step_before_an_effect_completes() -> None:
    """WCP1: the step after an effect runs only once the effect has completed, and sees its output."""
    log: list[str] = []
    term = seq(step(log, "a"), fx("e"), call_task(log, "b", lambda ctx: {"seen": ctx["e_out"]}))
    case = Case(term)
    r = case.run()
    assert (r.status, log, case.pending_names()) == ("blocked", ["a"], ["e"])
    r = case.complete("e", {"e_out": 7})
    assert (r.status, log, case.data) == ("done", ["a", "b"], {"e_out": 7, "seen": 7})


# -- WCP2 parallel split ---------------------------------------------------------------------------


def test_wcp2_parallel_split_starts_every_branch_before_any_completes() -> None:
    """WCP2: a par requests the effects of all its branches in the same run, before any of them completes."""
    log: list[str] = []
    case = Case(par(seq(step(log, "a"), fx("ea")), seq(step(log, "b"), fx("eb")), fx("ec")))
    r = case.run()
    assert r.status == "blocked"
    assert sorted(log) == ["a", "b"]
    assert sorted(req.name for req in r.effects) == ["ea", "eb", "ec"]


# -- WCP3 synchronization --------------------------------------------------------------------------


@pytest.mark.parametrize("order", [("a", "b", "c"), ("c", "b", "a"), ("b", "c", "a")])
def test_wcp3_synchronization_continues_once_after_the_last_branch(order: tuple[str, ...]) -> None:
    """WCP3: the step after an all-join runs once, only after the last branch arrived, whatever the order."""
    log: list[str] = []
    case = Case(seq(par(fx("a"), fx("b"), fx("c")), step(log, "after")))
    case.run()
    for name in order[:-1]:
        r = case.complete(name, {name: 1})
        assert (r.status, log) == ("blocked", [])
    r = case.complete(order[-1], {order[-1]: 1})
    assert (r.status, log, case.data) == ("done", ["after"], {"a": 1, "b": 1, "c": 1})


def test_wcp3_a_withdrawn_branch_does_not_block_the_join() -> None:
    """WCP3 edge: a branch withdrawn by cancelling its region is not waited for; the join fires on the rest."""
    log: list[str] = []
    case = Case(seq(par(scope("s", fx("a")), fx("b")), step(log, "after")))
    case.run()
    a = case.effect_id("a")
    case.m.cancel_region("s")
    r = case.run()
    assert (r.status, r.cancelled_effects, log) == ("blocked", [a], [])
    r = case.complete("b")
    assert (r.status, log) == ("done", ["after"])


def test_wcp3_a_join_withdrawn_after_others_arrived_fires_on_those() -> None:
    """WCP3 edge: if the last outstanding branch is withdrawn after the others arrived, the join fires then."""
    log: list[str] = []
    case = Case(seq(par(fx("a"), scope("s", fx("b"))), step(log, "after")))
    case.run()
    case.complete("a")
    assert log == []
    case.m.cancel_region("s")
    r = case.run()
    assert (r.status, log) == ("done", ["after"])


def test_wcp3_when_every_branch_is_withdrawn_the_par_is_withdrawn() -> None:
    """WCP3 edge: a par whose branches are all withdrawn is withdrawn itself; the root thread ends cancelled."""
    log: list[str] = []
    case = Case(seq(par(scope("s", fx("a")), scope("s2", fx("b"))), step(log, "after")))
    case.run()
    case.m.cancel_region("s")
    case.m.cancel_region("s2")
    r = case.run()
    assert (r.status, log, sorted(r.cancelled_effects)) == ("cancelled", [], [1, 2])


# -- WCP4 exclusive choice / WCP5 simple merge -----------------------------------------------------


def _choice(log: list[str]) -> Term:
    return seq(
        xor(
            (lambda ctx: ctx["x"] > 10, step(log, "big")),
            (lambda ctx: ctx["x"] > 0, step(log, "positive")),
            default=step(log, "other"),
        ),
        step(log, "merged"),
    )


@pytest.mark.parametrize(("x", "branch"), [(50, "big"), (5, "positive"), (0, "other"), (-3, "other")])
def test_wcp4_exclusive_choice_runs_only_the_first_matching_branch(x: int, branch: str) -> None:
    """WCP4: exactly one branch runs: the first whose predicate holds (50 matches both, only 'big' runs)."""
    log: list[str] = []
    case = Case(_choice(log), {"x": x})
    assert case.run().status == "done"
    assert log[:-1] == [branch]


def test_wcp4_exclusive_choice_without_match_or_default_fails_naming_the_node() -> None:
    """WCP4 edge: no predicate true and no default: the case fails with an error at the xor's path."""
    log: list[str] = []
    case = Case(seq(step(log, "a"), xor((lambda ctx: False, step(log, "never"))), step(log, "after")))
    r = case.run()
    assert r.status == "failed"
    assert r.error_path == "seq[1].xor"
    assert r.error_message is not None and "no xor branch matched" in r.error_message
    assert log == ["a"]


@pytest.mark.parametrize("x", [50, 5, -3])
def test_wcp5_simple_merge_continues_once_after_whichever_branch_ran(x: int) -> None:
    """WCP5: the step after an xor runs exactly once, after the chosen branch."""
    log: list[str] = []
    case = Case(_choice(log), {"x": x})
    assert case.run().status == "done"
    assert len(log) == 2
    assert log[1] == "merged"
    assert log.count("merged") == 1


def test_wcp5_simple_merge_waits_for_the_chosen_branch_effect() -> None:
    """WCP5: the merge point is reached only when the chosen branch's effect completes."""
    log: list[str] = []
    term = seq(xor((lambda ctx: ctx["fast"], step(log, "fast")), default=fx("slow")), step(log, "merged"))
    case = Case(term, {"fast": False})
    r = case.run()
    assert (r.status, log, case.pending_names()) == ("blocked", [], ["slow"])
    r = case.complete("slow")
    assert (r.status, log) == ("done", ["merged"])

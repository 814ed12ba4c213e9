"""Iteration patterns at the vm level: structured loop (WCP21) and recursion (WCP22)."""

from __future__ import annotations

from typing import Any

import pytest

from wfsub import Term, call, loop, seq, xor

from ..harness import Case, Recorder


def _inc(rec: Recorder) -> Term:
    return rec.step("inc", lambda ctx: {"n": ctx["n"] + 1})


# -- WCP21 structured loop -------------------------------------------------------------------------


@pytest.mark.parametrize(("start", "runs"), [(0, 3), (2, 1), (3, 0), (7, 0)])
def test_wcp21_while_loop_tests_before_each_iteration(start: int, runs: int) -> None:
    """WCP21: while_ is a pre-test: the body runs while it holds, and not at all when it is false at once."""
    rec = Recorder()
    case = Case(seq(loop(_inc(rec), while_=lambda ctx: ctx["n"] < 3), rec.step("after")), {"n": start})
    assert case.run().status == "done"
    assert rec.steps == ["inc"] * runs + ["after"]
    assert case.data["n"] == max(start, 3)


@pytest.mark.parametrize(("start", "runs"), [(0, 3), (3, 1), (7, 1)])
def test_wcp21_until_loop_tests_after_each_iteration(start: int, runs: int) -> None:
    """WCP21: until is a post-test: the body runs at least once, then until the condition holds."""
    rec = Recorder()
    case = Case(loop(_inc(rec), until=lambda ctx: ctx["n"] >= 3), {"n": start})
    assert case.run().status == "done"
    assert rec.steps == ["inc"] * runs


@pytest.mark.parametrize("times", [0, 1, 4])
def test_wcp21_times_loop_runs_the_body_exactly_that_often(times: int) -> None:
    """WCP21: times=k runs the body exactly k times (0 is legal and skips it)."""
    rec = Recorder()
    case = Case(seq(loop(_inc(rec), times=times), rec.step("after")), {"n": 0})
    assert case.run().status == "done"
    assert (rec.steps, case.data["n"]) == (["inc"] * times + ["after"], times)


def test_wcp21_each_iteration_requests_its_own_effect() -> None:
    """WCP21: a body effect is requested anew each iteration, after the previous one; `until` sees each result."""
    rec = Recorder()
    case = Case(loop(rec.effect("poll"), until=lambda ctx: ctx["ready"]), {"ready": False})
    r = case.run()
    seen: list[int] = []
    for ready in (False, False, True):
        assert (r.status, [req.name for req in r.effects]) == ("blocked", ["poll"])
        seen.append(r.effects[0].effect_id)
        r = case.complete(seen[-1], {"ready": ready})
    assert r.status == "done"
    assert seen == sorted(set(seen))  # three distinct requests, in order
    assert len(seen) == 3


def test_wcp21_max_iterations_fails_a_runaway_loop() -> None:
    """WCP21 edge: a loop passing max_iterations fails the case at the loop's path after exactly that many bodies."""
    rec = Recorder()
    case = Case(seq(loop(rec.step("spin"), while_=lambda ctx: True, max_iterations=5), rec.step("after")))
    r = case.run()
    assert (r.status, r.error_path, rec.steps) == ("failed", "seq[0].loop", ["spin"] * 5)
    assert r.error_message is not None and "max_iterations=5" in r.error_message


# -- WCP22 recursion -------------------------------------------------------------------------------


def _countdown_library(rec: Recorder) -> dict[str, Any]:
    body = seq(
        rec.step("dec", lambda ctx: {"n": ctx["n"] - 1}),
        xor((lambda ctx: ctx["n"] > 0, call("countdown")), default=rec.step("bottom")),
        rec.step("unwind", lambda ctx: {"depth": ctx.get("depth", 0) + 1}),
    )
    return {"countdown": body}


def test_wcp22_recursion_calls_itself_until_the_base_case_and_unwinds() -> None:
    """WCP22: a library workflow calling itself recurses to the base case; each level finishes on the way back."""
    rec = Recorder()
    term = seq(call("countdown"), rec.step("after"))
    case = Case(term, {"n": 3}, library=_countdown_library(rec))
    assert case.run().status == "done"
    assert rec.steps == ["dec", "dec", "dec", "bottom", "unwind", "unwind", "unwind", "after"]
    assert case.data == {"n": 0, "depth": 3}


def test_wcp22_recursion_through_an_effect_parks_each_level() -> None:
    """WCP22: a recursive level that waits on an effect parks there; completing it resumes the recursion."""
    rec = Recorder()
    lib = {"walk": seq(rec.effect("visit"), xor((lambda ctx: ctx["more"], call("walk")), default=rec.step("leaf")))}
    case = Case(call("walk"), library=lib)
    case.run()
    r = case.complete("visit", {"more": True})
    assert (r.status, case.pending_names(), rec.steps) == ("blocked", ["visit"], [])
    assert (case.complete("visit", {"more": False}).status, rec.steps) == ("done", ["leaf"])


def test_wcp22_recursion_is_depth_limited() -> None:
    """WCP22 edge: unbounded recursion fails the case once the call depth passes the limit."""
    rec = Recorder()
    lib = {"forever": seq(rec.step("level"), call("forever"))}
    case = Case(call("forever"), library=lib, max_call_depth=10)
    r = case.run()
    assert (r.status, rec.steps) == ("failed", ["level"] * 10)
    assert r.error_message is not None and "call depth limit 10" in r.error_message

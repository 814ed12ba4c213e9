"""Iteration patterns at the vm level: structured loop (WCP21) and recursion (WCP22)."""

from __future__ import annotations

from typing import Any

import pytest

from wfsub import Term, call, loop, seq, xor

from ._drive import Case, call_task, fx, step


def _inc(log: list[str]) -> Term:
    return call_task(log, "inc", lambda ctx: {"n": ctx["n"] + 1})


# -- WCP21 structured loop -------------------------------------------------------------------------


@pytest.mark.parametrize(("start", "runs"), [(0, 3), (2, 1), (3, 0), (7, 0)])
def test_wcp21_while_loop_tests_before_each_iteration(start: int, runs: int) -> None:
    """WCP21: while_ is a pre-test: the body runs while it holds, and not at all when it is false at once."""
    log: list[str] = []
    case = Case(seq(loop(_inc(log), while_=lambda ctx: ctx["n"] < 3), step(log, "after")), {"n": start})
    assert case.run().status == "done"
    assert log == ["inc"] * runs + ["after"]
    assert case.data["n"] == max(start, 3)


@pytest.mark.parametrize(("start", "runs"), [(0, 3), (3, 1), (7, 1)])
def test_wcp21_until_loop_tests_after_each_iteration(start: int, runs: int) -> None:
    """WCP21: until is a post-test: the body runs at least once, then until the condition holds."""
    log: list[str] = []
    case = Case(loop(_inc(log), until=lambda ctx: ctx["n"] >= 3), {"n": start})
    assert case.run().status == "done"
    assert log == ["inc"] * runs


@pytest.mark.parametrize("times", [0, 1, 4])
def test_wcp21_times_loop_runs_the_body_exactly_that_often(times: int) -> None:
    """WCP21: times=k runs the body exactly k times (0 is legal and skips it)."""
    log: list[str] = []
    case = Case(seq(loop(_inc(log), times=times), step(log, "after")), {"n": 0})
    assert case.run().status == "done"
    assert (log, case.data["n"]) == (["inc"] * times + ["after"], times)


def test_wcp21_each_iteration_requests_its_own_effect() -> None:
    """WCP21: an effect in the body is requested once per iteration, the next only after the previous
    completed, and the until test sees each result."""
    case = Case(loop(fx("poll"), until=lambda ctx: ctx["ready"]), {"ready": False})
    r = case.run()
    seen: list[int] = []
    for ready in (False, False, True):
        assert (r.status, [req.name for req in r.effects]) == ("blocked", ["poll"])
        seen.append(r.effects[0].effect_id)
        r = case.complete(seen[-1], {"ready": ready})
    assert r.status == "done"
    assert len(set(seen)) == 3


def test_wcp21_max_iterations_fails_a_runaway_loop() -> None:
    """WCP21 edge: a loop that passes max_iterations fails the case, at the loop's path, after exactly
    max_iterations bodies."""
    log: list[str] = []
    case = Case(seq(loop(step(log, "spin"), while_=lambda ctx: True, max_iterations=5), step(log, "after")))
    r = case.run()
    assert (r.status, r.error_path, log) == ("failed", "seq[0].loop", ["spin"] * 5)
    assert r.error_message is not None and "max_iterations=5" in r.error_message


# -- WCP22 recursion -------------------------------------------------------------------------------


def _countdown_library(log: list[str]) -> dict[str, Any]:
    body = seq(
        call_task(log, "dec", lambda ctx: {"n": ctx["n"] - 1}),
        xor((lambda ctx: ctx["n"] > 0, call("countdown")), default=step(log, "bottom")),
        call_task(log, "unwind", lambda ctx: {"depth": ctx.get("depth", 0) + 1}),
    )
    return {"countdown": body}


def test_wcp22_recursion_calls_itself_until_the_base_case_and_unwinds() -> None:
    """WCP22: a library workflow that calls itself recurses to the base case, then each level finishes
    its own remaining steps on the way back, and the caller continues."""
    log: list[str] = []
    term = seq(call("countdown"), step(log, "after"))
    case = Case(term, {"n": 3}, library=_countdown_library(log))
    assert case.run().status == "done"
    assert log == ["dec", "dec", "dec", "bottom", "unwind", "unwind", "unwind", "after"]
    assert case.data == {"n": 0, "depth": 3}


def test_wcp22_recursion_through_an_effect_parks_each_level() -> None:
    """WCP22: a recursive level that waits on an effect parks there; completing it resumes the recursion."""
    log: list[str] = []
    lib = {"walk": seq(fx("visit"), xor((lambda ctx: ctx["more"], call("walk")), default=step(log, "leaf")))}
    case = Case(call("walk"), library=lib)
    case.run()
    r = case.complete("visit", {"more": True})
    assert (r.status, case.pending_names(), log) == ("blocked", ["visit"], [])
    assert (case.complete("visit", {"more": False}).status, log) == ("done", ["leaf"])


def test_wcp22_recursion_is_depth_limited() -> None:
    """WCP22 edge: unbounded recursion fails the case once the call depth passes the limit."""
    log: list[str] = []
    lib = {"forever": seq(step(log, "level"), call("forever"))}
    case = Case(call("forever"), library=lib, max_call_depth=10)
    r = case.run()
    assert (r.status, len(log)) == ("failed", 10)
    assert r.error_message is not None and "call depth limit 10" in r.error_message

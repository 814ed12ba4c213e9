"""scope(finally_=) at the vm level: the branch runs after the body ends, fails or is withdrawn, before the failure
goes on or the cancel completes (Python's finally); not after terminate() or cancel(compensate=False). Each
interaction the docs name is pinned here: on_error, on_cancel, sagas, a failing finally_, region and case
cancels, nesting, mi and loops, joins, complete_region, and a snapshot taken mid-finally."""

from __future__ import annotations

from typing import Any

import pytest

import wfsub
from wfsub import (
    CompensationFailed,
    call,
    cancel_region,
    complete_region,
    loop,
    mi,
    par,
    saga,
    scope,
    seq,
    task,
    terminate,
    wait,
)
from wfsub.lowlevel import Machine

from ..harness import Case, Recorder


def boom(ctx: Any) -> None:
    raise ValueError("boom")


def test_finally_runs_after_the_body_ends_then_the_thread_goes_on() -> None:
    """A body that ends normally: finally_ runs, then what follows the scope."""
    rec = Recorder()
    case = Case(seq(scope("s", rec.step("body"), finally_=rec.step("fin")), rec.step("after")))
    assert case.run().status == "done"
    assert rec.steps == ["body", "fin", "after"]


def test_finally_runs_after_on_error_and_the_thread_goes_on() -> None:
    """try/except/finally: the body fails, on_error handles it, then finally_ runs, then the flow goes on."""
    rec = Recorder()
    case = Case(seq(scope("s", seq(rec.step("body"), task(boom)), on_error=rec.step("err"), finally_=rec.step("fin")),
                    rec.step("after")))
    assert case.run().status == "done"
    assert rec.steps == ["body", "err", "fin", "after"]
    assert case.data["error"]["type"] == "ValueError"


def test_finally_runs_before_an_uncaught_failure_fails_the_case() -> None:
    """Without on_error the failure goes outward, but only after finally_ ran; the case fails with the body's error."""
    rec = Recorder()
    case = Case(seq(scope("s", task(boom, name="boom"), finally_=rec.step("fin")), rec.step("after")))
    r = case.run()
    assert (r.status, r.error_path, type(r.error)) == ("failed", "seq[0].scope.task", ValueError)
    assert rec.steps == ["fin"]


def test_finally_runs_before_an_outer_on_error_catches_the_failure() -> None:
    """A failure caught further out: the inner finally_ runs first (innermost first), then the outer on_error."""
    rec = Recorder()
    inner = scope("inner", task(boom), finally_=rec.step("fin"))
    case = Case(seq(scope("outer", inner, on_error=rec.step("err")), rec.step("after")))
    assert case.run().status == "done"
    assert rec.steps == ["fin", "err", "after"]
    assert case.data["error"]["compensated"] == ["finally of scope 'inner'"]


def test_finally_runs_when_on_error_itself_fails() -> None:
    """An on_error that fails still gets the scope's finally_ before its failure goes on."""
    rec = Recorder()
    case = Case(scope("s", task(boom), on_error=seq(rec.step("err"), task(boom)), finally_=rec.step("fin")))
    assert case.run().status == "failed"
    assert rec.steps == ["err", "fin"]


def test_a_failing_finally_after_a_normal_end_is_a_failure_at_its_node() -> None:
    """finally_ failing after the body ended is an ordinary failure at its node: the enclosing on_error catches it."""
    rec = Recorder()
    case = Case(scope("outer", scope("s", rec.step("body"), finally_=task(boom, name="fin")),
                      on_error=rec.step("err")))
    assert case.run().status == "done"
    assert rec.steps == ["body", "err"]
    assert (case.data["error"]["type"], case.data["error"]["path"]) == ("ValueError", "scope.scope[finally].task")


def test_a_failing_finally_while_a_failure_unwinds_is_a_compensation_failure() -> None:
    """finally_ failing while the body's failure unwinds is reported like a failed compensation: CompensationFailed
    names it and carries the body's error as its cause, and the on_error that was catching does not run."""
    rec = Recorder()
    inner = scope("s", task(boom, name="body"), finally_=seq(rec.step("fin"), task(boom, name="fin_boom")))
    case = Case(scope("outer", inner, on_error=rec.step("err")))
    r = case.run()
    assert r.status == "failed" and isinstance(r.error, CompensationFailed)
    assert r.error.failures[0]["path"] == "scope.scope[finally].seq[1].task"
    assert rec.steps == ["fin"]
    assert case.m.failure_record is not None and case.m.failure_record["cause"]["path"] == "scope.scope.task"


def test_finally_inside_a_saga_runs_before_the_saga_compensates() -> None:
    """A scope inside a saga whose step fails: its finally_ (inner) runs before the saga's compensations (outer)."""
    rec = Recorder()
    case = Case(saga((rec.step("a"), rec.step("undo_a")), scope("s", task(boom), finally_=rec.step("fin"))))
    assert case.run().status == "failed"
    assert rec.steps == ["a", "fin", "undo_a"]


def test_a_saga_inside_the_body_compensates_before_finally() -> None:
    """A saga in the body compensates (inner), then the scope's finally_ runs (outer), then the failure goes on."""
    rec = Recorder()
    case = Case(scope("s", saga((rec.step("a"), rec.step("undo_a")), task(boom)), finally_=rec.step("fin")))
    assert case.run().status == "failed"
    assert rec.steps == ["a", "undo_a", "fin"]


def test_cancelling_the_scope_runs_finally_and_on_cancel_first() -> None:
    """cancel_region of the scope: on_cancel then finally_ run, and the thread goes on after the scope; without
    on_cancel, finally_ runs and the scope's thread ends there (the cancel completes after it)."""
    rec = Recorder()
    case = Case(seq(scope("s", wait("go"), on_cancel=rec.step("oc"), finally_=rec.step("fin")), rec.step("after")))
    case.run()
    assert case.cancel_region("s").status == "done"
    assert rec.steps == ["oc", "fin", "after"]
    rec = Recorder()
    case = Case(par(seq(scope("s", wait("go"), finally_=rec.step("fin")), rec.step("after")), wait("other")))
    case.run()
    case.cancel_region("s")
    assert rec.steps == ["fin"]
    assert case.signal("other").status == "done"
    assert rec.steps == ["fin"]


def test_a_region_step_inside_the_body_cancelling_its_own_scope_runs_finally() -> None:
    """A workflow that cancels its own scope from inside it: finally_ runs before the scope is gone."""
    rec = Recorder()
    case = Case(par(scope("s", seq(rec.step("body"), cancel_region("s"), rec.step("never")), finally_=rec.step("fin")),
                    rec.step("beside")))
    assert case.run().status == "done"
    assert "never" not in rec.steps and rec.steps.count("fin") == 1


def test_a_scope_whose_thread_is_withdrawn_from_inside_runs_finally_once() -> None:
    """A nested region cancelled takes the scope's thread with it: the scope's finally_ runs once, no on_cancel."""
    rec = Recorder()
    body = par(scope("inner", wait("x")), seq(wait("go"), cancel_region("inner")))
    case = Case(par(scope("s", seq(body, rec.step("after_body")), on_cancel=rec.step("oc"), finally_=rec.step("fin")),
                    wait("other")))
    case.run()
    case.signal("go")
    assert rec.steps == ["after_body", "fin"]  # the par still joined: its other branch arrived


def test_case_cancel_runs_finally_innermost_first_but_not_a_hard_cancel_or_terminate() -> None:
    """cancel() runs the finally_ branches innermost first, then ends the case cancelled; cancel(compensate=False)
    and terminate() end the case at once, with no finally_."""
    def nested(rec: Recorder) -> Any:
        inner = scope("in", wait("go"), finally_=rec.step("fin_in"))
        return scope("out", inner, finally_=rec.step("fin_out"))

    rec = Recorder()
    case = Case(nested(rec))
    case.run()
    assert case.cancel().status == "cancelled"
    assert rec.steps == ["fin_in", "fin_out"]
    rec = Recorder()
    case = Case(nested(rec))
    case.run()
    assert case.cancel(compensate=False).status == "cancelled"
    assert rec.steps == []
    rec = Recorder()
    case = Case(scope("s", seq(rec.step("b"), terminate()), finally_=rec.step("fin")))
    assert case.run().status == "done"
    assert rec.steps == ["b"]


def test_nested_scopes_run_their_finally_branches_inner_to_outer_on_every_path() -> None:
    """Normal end and failure alike: the inner scope's finally_ runs before the outer's (after a failure, the outer
    on_error runs between them, as in Python)."""
    for body, expected in ((task(lambda c: None), ["fin_in", "fin_out"]), (task(boom), ["fin_in", "err", "fin_out"])):
        rec = Recorder()
        inner = scope("in", body, finally_=rec.step("fin_in"))
        assert Case(scope("out", inner, finally_=rec.step("fin_out"), on_error=rec.step("err"))).run().status == "done"
        assert rec.steps == expected


def test_finally_in_each_mi_instance_and_each_loop_iteration() -> None:
    """Inside an mi every instance runs its own finally_ (its writes stay in the instance); in a loop every
    iteration runs it once."""
    rec = Recorder()
    body = scope("s", task(lambda c: {"b": c["index"]}), finally_=task(lambda c: {"f": c["index"] * 10}))
    case = Case(mi(body, count=3, collect="out"))
    assert case.run().status == "done"
    assert case.data["out"] == [{"b": 0, "f": 0}, {"b": 1, "f": 10}, {"b": 2, "f": 20}]
    case = Case(loop(scope("s", rec.step("b"), finally_=rec.step("fin")), times=3))
    assert case.run().status == "done"
    assert rec.steps == ["b", "fin"] * 3


def test_finally_runs_when_a_join_cancels_the_branch_or_a_region_is_completed() -> None:
    """A discriminator with cancel_remaining withdrawing the scope, and complete_region of the scope or of an mi
    around it: finally_ runs in each (a completed scope's thread goes on through its finally_)."""
    rec = Recorder()
    case = Case(par(seq(wait("a"), rec.step("x")), scope("s", wait("go"), finally_=rec.step("fin")), join="first",
                    cancel_remaining=True))
    case.run()
    assert case.signal("a").status == "done"
    assert sorted(rec.steps) == ["fin", "x"]
    rec = Recorder()
    case = Case(par(seq(scope("s", wait("go"), finally_=rec.step("fin")), rec.step("after")),
                    seq(wait("stop"), complete_region("s"))))
    case.run()
    assert case.signal("stop").status == "done"
    assert rec.steps == ["fin", "after"]
    case = Case(mi(scope("s", wait("go"), finally_=task(lambda c: None, name="fin")), count=2, name="m"),
                trace_level="min")
    case.run()
    assert case.complete_region("m").status == "done"
    done = [e for e in case.events if e.kind == "compensation" and e.detail.get("event") == "done"]
    assert [e.detail["name"] for e in done] == ["finally of scope 's'"] * 2


def test_finally_in_a_called_workflow_runs_on_cancel() -> None:
    """A scope inside a called workflow runs its finally_ when the case is cancelled."""
    rec = Recorder()
    case = Case(call("sub"), library={"sub": scope("s", wait("go"), finally_=rec.step("fin"))})
    case.run()
    assert case.cancel().status == "cancelled"
    assert rec.steps == ["fin"]


@pytest.mark.parametrize("path", ["ended", "failed", "cancelled"])
def test_a_snapshot_taken_mid_finally_restores_and_finishes_it_once(path: str) -> None:
    """A finally_ parked on a signal (after a normal end, during a failure's unwinding, during a cancel): the
    machine restored from a snapshot taken there finishes it once, with the outcome the original would have."""
    rec = Recorder()
    body = {"ended": task(lambda c: None), "failed": task(boom), "cancelled": wait("never")}[path]
    wf = seq(scope("s", body, finally_=seq(rec.step("fin1"), wait("go"), rec.step("fin2"))), rec.step("after"))
    program = wfsub.compile(wf)
    m = Machine(program, {})
    m.run(1000)
    if path == "cancelled":
        m.cancel()
        m.run(1000)
    assert rec.steps == ["fin1"]
    restored = Machine.restore(program, m.snapshot())
    restored.deliver_signal("go")
    r = restored.run(1000)
    expected = {"ended": ("done", ["fin1", "fin2", "after"]), "failed": ("failed", ["fin1", "fin2"]),
                "cancelled": ("cancelled", ["fin1", "fin2"])}[path]
    assert (r.status, rec.steps) == expected


def test_validate_reports_a_finally_that_is_not_a_term_or_that_terminates() -> None:
    """finally_ must be a workflow term, and may not reach terminate() (it cleans up and must run to its end)."""
    issues = wfsub.validate(scope("s", task(lambda c: None), finally_=print))
    assert [(i.path, "wrap it as task(print)" in i.message) for i in issues] == [("scope[finally].?", True)]
    issues = wfsub.validate(scope("s", task(lambda c: None), finally_=seq(task(lambda c: None), terminate())))
    assert [i.path for i in issues] == ["scope[finally].seq[1].terminate"]
    assert "finally_" in issues[0].message

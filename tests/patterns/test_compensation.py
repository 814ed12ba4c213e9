"""Failures, compensation and cancellation: scope(on_error), saga, wait(timeout), cancel(compensate=)."""

from __future__ import annotations

from typing import Any

import pytest

from wfsub import (
    CompensationFailed,
    LimitExceeded,
    WaitTimeout,
    complete_region,
    loop,
    mi,
    par,
    saga,
    scope,
    seq,
    task,
    terminate,
    validate,
    wait,
)

from ..harness import Case, Recorder


def boom(rec: Recorder, name: str) -> Any:
    """A step named `name` that records itself, then raises."""

    def fail(ctx: Any) -> None:
        raise ValueError(f"{name} went wrong")

    return seq(rec.step(name), task(fail, name=f"{name}_raise"))


# -- sagas -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("failing", [0, 1, 2, 3])
def test_a_saga_compensates_the_steps_completed_before_the_failing_one_newest_first(failing: int) -> None:
    """Failure at step k: the compensations of steps 0..k-1 run in reverse order, then the case fails."""
    rec = Recorder()
    steps = [
        boom(rec, f"s{i}") if i == failing else (rec.step(f"s{i}"), rec.step(f"c{i}"))
        for i in range(4)
    ]
    case = Case(saga(*steps))
    r = case.run()
    assert r.status == "failed" and isinstance(r.error, ValueError)
    assert rec.steps == [f"s{i}" for i in range(failing + 1)] + [f"c{i}" for i in reversed(range(failing))]
    assert case.m.failure_record is not None
    assert case.m.failure_record["compensated"] == [f"c{i}" for i in reversed(range(failing))]


def test_a_step_without_a_compensation_is_skipped_when_compensating() -> None:
    """Plain actions in a saga have nothing to undo; the others still compensate in reverse order."""
    rec = Recorder()
    case = Case(saga((rec.step("a"), rec.step("undo_a")), rec.step("b"), boom(rec, "c")))
    assert case.run().status == "failed"
    assert rec.steps == ["a", "b", "c", "undo_a"]


def test_on_error_catches_after_compensation_and_stores_the_error_record() -> None:
    """A failure in scope(on_error=) compensates, stores the error record in error_into, runs on_error and goes on."""
    rec = Recorder()
    body = saga((rec.step("charge"), rec.step("refund")), boom(rec, "reserve"))
    case = Case(seq(scope("order", body, on_error=rec.step("apologise"), error_into="why"), rec.step("after")))
    assert case.run().status == "done"
    assert rec.steps == ["charge", "reserve", "refund", "apologise", "after"]
    assert case.data["why"] == {
        "type": "ValueError",
        "message": "task reserve_raise raised ValueError: reserve went wrong",
        "path": "seq[0].scope.saga[1].seq[1].task",
        "compensated": ["refund"],
        "cause": None,
    }


def test_a_failure_inside_on_error_goes_outward_naming_the_handled_error_as_its_cause() -> None:
    """on_error that fails re-raises: the enclosing handler's record has the inner record as `cause`."""
    rec = Recorder()
    inner = scope("inner", boom(rec, "first"), on_error=boom(rec, "handler"))
    case = Case(scope("outer", inner, on_error=rec.step("outer_handler"), error_into="e"))
    assert case.run().status == "done"
    assert case.data["e"]["message"] == "task handler_raise raised ValueError: handler went wrong"
    assert case.data["e"]["cause"]["message"] == "task first_raise raised ValueError: first went wrong"
    assert rec.steps == ["first", "handler", "outer_handler"]


def test_a_failing_compensation_does_not_stop_the_others_and_fails_with_compensation_failed() -> None:
    """Each compensation runs even if one fails; afterwards the failure goes outward as CompensationFailed."""
    rec = Recorder()
    case = Case(saga((rec.step("a"), rec.step("undo_a")), (rec.step("b"), boom(rec, "undo_b")), boom(rec, "c")))
    r = case.run()
    assert r.status == "failed" and isinstance(r.error, CompensationFailed)
    assert rec.steps == ["a", "b", "c", "undo_b", "undo_a"]
    assert [f["path"] for f in r.error.failures] == ["saga[1.compensation].seq[1].task"]
    assert isinstance(r.error.__cause__, ValueError)


def test_compensation_failed_goes_past_the_scope_it_happened_in() -> None:
    """When compensating for a caught failure fails, that scope's on_error does not run; the enclosing one does."""
    rec = Recorder()
    inner = scope("inner", saga((rec.step("a"), boom(rec, "undo_a")), boom(rec, "b")), on_error=rec.step("inner_h"))
    case = Case(scope("outer", inner, on_error=rec.step("outer_h"), error_into="e"))
    assert case.run().status == "done"
    assert rec.steps == ["a", "b", "undo_a", "outer_h"]
    assert case.data["e"]["type"] == "CompensationFailed"
    assert case.data["e"]["cause"]["path"].endswith("saga[1].seq[1].task")


def test_nested_sagas_compensate_innermost_first() -> None:
    """A failure inside an inner saga: the inner compensations run first, then the outer saga's."""
    rec = Recorder()
    inner = saga((rec.step("i1"), rec.step("undo_i1")), boom(rec, "i2"))
    case = Case(saga((rec.step("o1"), rec.step("undo_o1")), inner))
    assert case.run().status == "failed"
    assert rec.steps == ["o1", "i1", "i2", "undo_i1", "undo_o1"]


def test_an_ended_saga_is_never_compensated_later() -> None:
    """A failure after a saga has finished leaves the saga's completed work alone."""
    rec = Recorder()
    case = Case(seq(saga((rec.step("a"), rec.step("undo_a"))), boom(rec, "later")))
    assert case.run().status == "failed" and rec.steps == ["a", "later"]


def test_each_mi_instance_compensates_its_own_steps() -> None:
    """A failing instance withdraws its siblings (caught outside the mi): each compensates only its steps."""
    rec = Recorder()
    body = saga((rec.step("book", lambda c: {"i": c["index"]}), rec.step("unbook", lambda c: {"u": c["index"]})),
                seq(wait("go"), task(lambda c: 1 / 0 if c["index"] == 1 else None)))
    case = Case(scope("all", mi(body, count=3), on_error=rec.step("handled")))
    case.run()
    assert case.signal("go").status == "blocked"  # instance 0 passes
    assert case.signal("go").status == "done"  # instance 1 fails: 1 and 2 are withdrawn and compensate
    assert rec.steps == ["book", "book", "book", "unbook", "unbook", "handled"]
    assert case.data["error"]["compensated"] == ["unbook", "unbook"]


def test_a_join_that_cancels_its_remaining_branches_compensates_them() -> None:
    """The losers of a first join with cancel_remaining are withdrawn: their sagas compensate (detached)."""
    rec = Recorder()
    loser = saga((rec.step("hold"), rec.step("release")), wait("never"))
    case = Case(seq(par(seq(wait("win"), rec.step("winner")), loser, join="first", cancel_remaining=True),
                    rec.step("after")))
    case.run()
    assert case.signal("win").status == "done"
    assert rec.steps == ["hold", "winner", "after", "release"]  # the winner goes on; the loser undoes, detached


def test_complete_region_and_terminate_never_compensate() -> None:
    """complete_region and terminate() withdraw work without running any compensation."""
    rec = Recorder()
    held = saga((rec.step("hold"), rec.step("release")), wait("x"))
    case = Case(par(scope("r", held), seq(wait("done"), complete_region("r"))))
    case.run()
    assert case.signal("done").status == "done" and rec.steps == ["hold"]
    rec2 = Recorder()
    case = Case(par(saga((rec2.step("hold"), rec2.step("release")), wait("x")), seq(wait("stop"), terminate())))
    case.run()
    assert case.signal("stop").status == "done" and rec2.steps == ["hold"]


# -- cancelling a case --------------------------------------------------------------------------------------


def test_cancel_compensates_active_sagas_and_runs_on_cancel_innermost_first() -> None:
    """cancel(): compensations and on_cancel branches run, innermost first, then the case ends cancelled."""
    rec = Recorder()
    inner = scope("inner", saga((rec.step("a"), rec.step("undo_a")), wait("x")), on_cancel=rec.step("inner_oc"))
    case = Case(scope("outer", inner, on_cancel=rec.step("outer_oc")))
    case.run()
    assert case.cancel().status == "cancelled"
    assert rec.steps == ["a", "undo_a", "inner_oc", "outer_oc"]


def test_cancel_without_compensation_ends_at_once() -> None:
    """cancel(compensate=False) runs neither compensations nor on_cancel branches."""
    rec = Recorder()
    case = Case(scope("s", saga((rec.step("a"), rec.step("undo_a")), wait("x")), on_cancel=rec.step("oc")))
    case.run()
    assert case.cancel(compensate=False).status == "cancelled" and rec.steps == ["a"]


def test_a_second_cancel_ends_a_compensating_case_at_once() -> None:
    """While compensations run (here an effect), a second cancel ends the case without waiting for them."""
    rec = Recorder()
    case = Case(saga((rec.step("charge"), rec.effect("refund")), wait("x")))
    case.run()
    r = case.cancel()
    assert r.status == "blocked" and case.pending_names() == ["refund"]
    r = case.cancel()
    assert r.status == "cancelled" and r.cancelled_effects == [case.cancelled_effects[-1]]


def test_cancelling_a_region_never_stops_a_compensation_already_running() -> None:
    """A region cancelled while a compensation inside it runs: the compensation finishes first."""
    rec = Recorder()
    body = scope("inner", saga((rec.step("a"), rec.effect("undo_a")), wait("x")), on_error=rec.step("h"))
    case = Case(seq(scope("outer", par(body, seq(wait("fail"), task(lambda c: 1 / 0))), on_cancel=rec.step("oc")),
                    rec.step("after")))
    case.run()
    case.m.cancel_region("inner")  # undo_a starts
    r = case.run()
    assert case.pending_names() == ["undo_a"]
    case.m.cancel_region("outer")  # does not stop undo_a: on_cancel waits for it
    r = case.run()
    assert r.status == "blocked" and rec.steps == ["a"]
    assert case.complete("undo_a").status == "done"
    assert rec.steps == ["a", "oc", "after"]


# -- waits with a timeout, limits as failures ------------------------------------------------------------


def test_a_wait_that_times_out_is_a_failure_that_on_error_catches() -> None:
    """wait(timeout=) with no signal in time raises WaitTimeout at the wait; on_error handles it."""
    rec = Recorder()
    case = Case(seq(scope("reply", wait("answer", timeout=60), on_error=rec.step("chase")), rec.step("after")))
    r = case.run()
    assert [t.seconds for t in r.timers] == [60.0]
    assert case.fire(r.timers[0].timer_id).status == "done"
    assert case.data["error"]["type"] == "WaitTimeout" and rec.steps == ["chase", "after"]


def test_a_signal_in_time_disarms_the_wait_timeout() -> None:
    """The signal arriving first cancels the wait's timer."""
    case = Case(wait("answer", timeout=60))
    timer = case.run().timers[0].timer_id
    assert case.signal("answer", 1).status == "done" and case.cancelled_timers == [timer]


def test_an_uncaught_wait_timeout_fails_the_case() -> None:
    """Without on_error, WaitTimeout fails the case at the wait."""
    case = Case(seq(task(lambda c: None), wait("answer", timeout=5)))
    r = case.run()
    r = case.fire(r.timers[0].timer_id)
    assert r.status == "failed" and isinstance(r.error, WaitTimeout) and r.error_path == "seq[1].wait"


def test_a_broken_limit_is_a_failure_at_the_node_that_on_error_catches() -> None:
    """loop max_iterations exceeded raises LimitExceeded, caught like any failure."""
    case = Case(scope("l", loop(task(lambda c: None), while_=lambda c: True, max_iterations=3), on_error=task(
        lambda c: {"caught": c["error"]["type"]})))
    assert case.run().status == "done" and case.data["caught"] == "LimitExceeded"
    r = Case(loop(task(lambda c: None), while_=lambda c: True, max_iterations=3)).run()
    assert isinstance(r.error, LimitExceeded)


# -- blocking joins --------------------------------------------------------------------------------------


def test_a_blocking_discriminator_holds_the_next_iteration_until_every_branch_ended() -> None:
    """WCP28: the first branch fires the join; the loop comes back and waits until the other branch arrives."""
    rec = Recorder()
    body = seq(par(seq(wait("a"), rec.step("a")), seq(wait("b"), rec.step("b")), join="first", blocking=True),
               rec.step("after"))
    case = Case(loop(body, times=2))
    case.run()
    case.signal("a")
    assert rec.steps == ["a", "after"]  # iteration 2 is blocked at the par until b arrives
    case.signal("a")  # buffered for iteration 2
    assert rec.steps == ["a", "after"]
    assert case.signal("b").status == "blocked"
    assert rec.steps == ["a", "after", "b", "a", "after"]
    assert case.signal("b").status == "done"


def test_a_blocking_join_whose_leftovers_are_withdrawn_resets() -> None:
    """WCP31 edge: the branches left after the join fired are withdrawn (a region): the par resets at once."""
    rec = Recorder()
    body = seq(
        par(seq(wait("a"), rec.step("a")), scope("slow", wait("b")), join=1, blocking=True),
        rec.step("after"),
    )
    case = Case(par(loop(body, times=2), seq(wait("drop"), task(lambda c: None))))
    case.run()
    case.signal("a")
    case.signal("a")
    case.m.cancel_region("slow")
    assert case.run().status == "blocked"
    assert rec.steps == ["a", "after", "a", "after"]


# -- validation ------------------------------------------------------------------------------------------


def test_the_new_constructs_are_validated_with_paths() -> None:
    """Empty saga, terminate in a handler branch, blocking without first/n, bad timeouts, shared error_into."""
    wf = seq(
        saga(),
        scope("s", task(lambda c: None), on_cancel=terminate()),
        par(task(lambda c: None), join="all", blocking=True),
        wait("x", timeout=0),
        par(scope("a", task(lambda c: None), on_error=task(lambda c: None)),
            scope("b", task(lambda c: None), on_error=task(lambda c: None))),
        scope("c", task(lambda c: None), on_error=42),  # type: ignore[arg-type]
    )
    found = [(i.path, i.message) for i in validate(wf)]
    assert [path for path, _ in found] == [
        "seq[0].saga",
        "seq[1].scope[on_cancel].terminate",
        "seq[2].par",
        "seq[3].wait",
        "seq[4].par[1].scope",
        "seq[5].scope[on_error].?",
    ]
    assert "at least one step" in found[0][1] and "terminate() inside an on_cancel" in found[1][1]
    assert "blocking=True needs join='first'" in found[2][1] and "error_into='error'" in found[4][1]

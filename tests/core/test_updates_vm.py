"""Updates, check= and reply at vm level: answers come out of `take_answers`, a check refuses before anything is
stored, buffered inputs are checked when a wait takes them, and a timeout=fn is computed only when a timer is armed."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
from pydantic import BaseModel

import wfsub
from wfsub import SignalRejected, StepFailed, defer, effect, reply, scope, seq, sleep, task, validate, wait
from wfsub._terms import Term
from wfsub.lowlevel import Machine, RunResult


def machine(term: Term, data: dict[str, Any] | None = None) -> Machine:
    return Machine(wfsub.compile(term), data)


def settle(m: Machine) -> RunResult:
    while True:
        r = m.run(1000)
        if r.status != "yielded":
            return r


def total(ctx: Mapping[str, Any]) -> Any:
    return ctx["n"] + ctx["add"]


def add(ctx: Mapping[str, Any]) -> dict[str, Any]:
    return {"n": ctx["n"] + ctx["add"]}


def positive(ctx: Mapping[str, Any], payload: Any) -> str | None:
    return None if isinstance(payload, int) and payload > 0 else f"add must be a positive int, got {payload!r}"


def n_is(ctx: Mapping[str, Any]) -> Any:
    return {"n": ctx["n"]}


def test_wait_reply_answers_after_the_payload_is_merged() -> None:
    """wait(reply=fn): fn runs on the data with the payload merged; the answer carries the update's id."""
    m = machine(seq(wait("add", reply=total), task(add)), {"n": 1})
    settle(m)
    m.deliver_update("add", 2, "u1")
    assert m.take_answers() == [("u1", "answer", "add", 3)]
    assert settle(m).status == "done" and m.data["n"] == 3


def test_reply_step_answers_what_the_thread_took() -> None:
    """A later reply(name, fn) step of the thread that took the update answers it, after the steps between."""
    m = machine(seq(wait("add"), task(add), reply("add", n_is)), {"n": 1})
    settle(m)
    m.deliver_update("add", 5, "u1")
    assert m.take_answers() == []
    assert settle(m).status == "done"
    assert m.take_answers() == [("u1", "answer", "add", {"n": 6})]


def test_reply_after_the_threads_own_effect() -> None:
    """A thread waiting for its own effect still owes the update; the reply after the effect answers it."""
    async def charge(ctx: Mapping[str, Any]) -> dict[str, Any]:
        return {"x": 1}

    m = machine(seq(wait("go"), effect(charge), reply("go", lambda ctx: ctx["x"])))
    settle(m)
    m.deliver_update("go", None, "u")
    r = settle(m)
    assert m.take_answers() == []
    m.complete_effect(r.effects[0].effect_id, {"x": 7})
    settle(m)
    assert m.take_answers() == [("u", "answer", "go", 7)]


def test_thread_that_parks_without_replying_answers_none() -> None:
    """A thread that took an update and parks on a timer with no reply step of its name ahead answers None (a
    later wait's reply= answers only the update that wait takes)."""
    m = machine(seq(wait("go"), sleep(5), wait("go", reply=lambda ctx: 2)))
    settle(m)
    m.deliver_update("go", None, "u")
    settle(m)
    assert m.take_answers() == [("u", "answer", "go", None)]


def test_reply_ahead_keeps_the_caller_through_effects_and_timers() -> None:
    """A thread with a reply step of its name ahead keeps owing the update through its effect and its timer; the
    reply step answers it once it runs."""
    async def pay(ctx: Mapping[str, Any]) -> dict[str, Any]:
        return {"paid": 1}

    m = machine(seq(wait("approve"), effect(pay), sleep(60), reply("approve", lambda ctx: {"paid": ctx["paid"]}),
                    sleep(3600)))
    settle(m)
    m.deliver_update("approve", None, "u")
    r = settle(m)
    assert m.take_answers() == []
    m.complete_effect(r.effects[0].effect_id, {"paid": 7})
    r = settle(m)
    assert m.take_answers() == [] and m.owed_updates() == ["u"]
    m.fire_timer(r.timers[0].timer_id)
    settle(m)
    assert m.take_answers() == [("u", "answer", "approve", {"paid": 7})]


def test_update_to_a_name_nobody_answers_is_refused() -> None:
    """An update to a plain signal (no reply=, no reply step) is refused naming the fix; nothing changes."""
    m = machine(wait("go"))
    settle(m)
    with pytest.raises(SignalRejected, match="answers no update of that name.*reply"):
        m.deliver_update("go", None, "u")
    with pytest.raises(SignalRejected, match="never waits for 'nope'"):
        m.deliver_update("nope", None, "u")


def test_check_refuses_before_anything_is_stored() -> None:
    """check= refuses with its text (SignalRejected.reason) and the wait goes on waiting; a good one is taken."""
    m = machine(seq(wait("add", check=positive, reply=total), task(add)), {"n": 1})
    settle(m)
    with pytest.raises(SignalRejected) as info:
        m.deliver_update("add", -1, "u1")
    assert info.value.reason == "add must be a positive int, got -1"
    assert "wait" in str(info.value)
    with pytest.raises(SignalRejected, match="positive int"):
        m.deliver_signal("add", "x")
    assert "add" not in m.data and m.take_answers() == []
    m.deliver_update("add", 4, "u2")
    assert m.take_answers() == [("u2", "answer", "add", 5)]


def test_check_reads_the_data_at_that_moment() -> None:
    """A check sees the case data as it is when the input comes."""
    def under_limit(ctx: Mapping[str, Any], payload: Any) -> str | None:
        return None if payload <= ctx["limit"] else f"over the limit {ctx['limit']}"

    m = machine(seq(task(lambda ctx: {"limit": 3}), wait("amount", check=under_limit)), {"limit": 100})
    settle(m)
    with pytest.raises(SignalRejected, match="over the limit 3"):
        m.deliver_signal("amount", 10)
    m.deliver_signal("amount", 2)
    assert settle(m).status == "done"


def test_buffered_input_is_checked_when_a_wait_takes_it() -> None:
    """A signal or update no wait takes now is buffered with only its name checked; check= runs when a wait takes
    it, and a refusal drops it (an update's caller gets the refusal); the next buffered one is taken."""
    m = machine(seq(sleep(1), wait("add", check=positive, reply=total), task(add)), {"n": 1})
    r = settle(m)
    m.deliver_update("add", -3, "bad")
    m.deliver_signal("add", 2)
    assert m.take_answers() == []
    m.fire_timer(r.timers[0].timer_id)
    assert settle(m).status == "done" and m.data["n"] == 3
    answers = m.take_answers()
    assert answers[0][:3] == ("bad", "refused", "add") and "positive int" in answers[0][3][0]
    assert answers[0][3][1] == "seq[1].wait"
    assert len(answers) == 1  # the plain signal taken has no answer


def test_buffered_update_answered_by_the_wait_that_takes_it() -> None:
    """A buffered update keeps its id: the wait that takes it later answers it."""
    m = machine(seq(sleep(1), wait("add", reply=total)), {"n": 1})
    r = settle(m)
    m.deliver_update("add", 9, "later")
    m.fire_timer(r.timers[0].timer_id)
    settle(m)
    assert m.take_answers() == [("later", "answer", "add", 10)]


def test_buffered_update_id_survives_a_snapshot() -> None:
    """Buffered update ids and owed updates are part of the snapshot: a restored machine answers them."""
    term = seq(sleep(1), wait("add"), task(add), reply("add", n_is))
    m = machine(term, {"n": 1})
    r = settle(m)
    m.deliver_update("add", 2, "u")
    back = Machine.restore(wfsub.compile(term), m.snapshot())
    back.fire_timer(r.timers[0].timer_id)
    settle(back)
    assert back.take_answers() == [("u", "answer", "add", {"n": 3})]


def test_defer_model_and_check_per_signal() -> None:
    """defer(model={signal: Model}, check={signal: fn}): the payload is validated and checked as on wait."""
    class Order(BaseModel):
        qty: int

    def small(ctx: Mapping[str, Any], payload: Any) -> str | None:
        return "too many" if payload["qty"] > 10 else None

    term = defer({"order": task(lambda ctx: {"got": ctx["order"]["qty"]}), "stop": task(lambda ctx: {"got": 0})},
                 model={"order": Order}, check={"order": small})
    m = machine(term)
    settle(m)
    with pytest.raises(SignalRejected, match="does not fit Order"):
        m.deliver_signal("order", {"qty": "many"})
    with pytest.raises(SignalRejected, match="too many"):
        m.deliver_signal("order", {"qty": 11})
    m.deliver_signal("order", {"qty": "3"})
    assert settle(m).status == "done" and m.data["got"] == 3


def test_defer_takes_an_update_and_replies_in_the_branch() -> None:
    """An update taken by a defer is answered by a reply step in the chosen branch."""
    term = defer({"approve": reply("approve", lambda ctx: "approved"), "reject": task(lambda ctx: None)})
    m = machine(term)
    settle(m)
    m.deliver_update("approve", None, "u")
    settle(m)
    assert m.take_answers() == [("u", "answer", "approve", "approved")]


def test_check_that_raises_refuses_naming_the_function() -> None:
    """A check= that raises refuses the input with what went wrong (the case is unharmed)."""
    def broken(ctx: Mapping[str, Any], payload: Any) -> str | None:
        raise KeyError("limit")

    m = machine(wait("go", check=broken))
    settle(m)
    with pytest.raises(SignalRejected, match="check function .*broken raised KeyError"):
        m.deliver_signal("go")
    assert settle(m).status == "blocked"


def test_reply_that_is_not_json_fails_the_step() -> None:
    """A reply function returning no JSON value fails the wait's step (catchable) and answers with the failure."""
    m = machine(scope("s", wait("go", reply=lambda ctx: {1, 2}), on_error=task(lambda ctx: {"caught": True})))
    settle(m)
    m.deliver_update("go", None, "u")
    answers = m.take_answers()
    assert answers[0][:3] == ("u", "error", "go") and "no JSON value" in answers[0][3][0]
    assert settle(m).status == "done" and m.data["caught"] is True


def test_case_ending_answers_ended() -> None:
    """An owed update of a case that ends before replying is answered "ended" (the runtime gives the outcome)."""
    m = machine(seq(wait("go"), task(lambda ctx: {"x": 1}), reply("go", lambda ctx: 1), wait("more")))
    settle(m)
    m.deliver_update("go", None, "u")
    assert m.take_answers() == []
    settle(m)
    assert m.take_answers() == [("u", "answer", "go", 1)]


def test_timeout_fn_not_called_when_a_buffered_signal_is_taken() -> None:
    """wait/defer timeout=fn is computed only when the step parks and arms its timer: a buffered signal taken at
    once needs no timer, so a raising fn does not fail the step."""
    def boom(ctx: Mapping[str, Any]) -> float:
        raise RuntimeError("no timer needed")

    for term in (seq(sleep(1), wait("go", timeout=boom)),
                 seq(sleep(1), defer({"go": task(lambda ctx: None)}, timeout=boom, on_timeout=task(lambda c: None)))):
        m = machine(term)
        r = settle(m)
        m.deliver_signal("go", 1)
        m.fire_timer(r.timers[0].timer_id)
        assert settle(m).status == "done"
    m = machine(wait("go", timeout=boom))
    r = settle(m)
    assert r.status == "failed" and "no timer needed" in str(m.error)


def test_validate_reply_and_checks() -> None:
    """validate names a reply with no earlier wait, a reply fn that is not callable, a bad check and a defer model
    for a signal it does not take, each at its node path with the fix."""
    issues = validate(seq(reply("nope", lambda ctx: 1), wait("go", check="x"), reply("go", 3)))  # type: ignore[arg-type]
    got = [(i.path, i.message) for i in issues]
    assert any(p == "seq[0].reply" and "no earlier wait of its thread takes" in msg and "wait('nope')" in msg
               for p, msg in got)
    assert any(p == "seq[1].wait" and "check=" in msg and "must be a function" in msg for p, msg in got)
    assert any(p == "seq[2].reply" and "reply fn must be a function" in msg for p, msg in got)
    issues = validate(defer({"a": task(lambda ctx: None)}, model={"b": int}, check={"a": 5}))  # type: ignore[dict-item]
    text = " | ".join(i.message for i in issues)
    assert "model= names signal 'b', which is not one of this defer's branches ('a')" in text
    assert "check['a']=5 must be a function" in text
    with pytest.raises(wfsub.InvalidWorkflow):
        wfsub.compile(reply("x", lambda ctx: 1))


def test_fingerprints_without_the_new_fields_are_unchanged() -> None:
    """wait/defer without reply/check/model keep the fingerprint they had before those fields existed."""
    term = wfsub.seq(wait("go", timeout=4), defer({"a": wait("b")}))
    assert wfsub.compile(term).fingerprint == "15fb5ce85aff5923106295d5f16970fe6d9b8173f58925eeea8b6866c787a2cd"
    assert wfsub.compile(wait("go", check=positive)).fingerprint != wfsub.compile(wait("go")).fingerprint


def test_step_failed_type_for_bad_reply() -> None:
    """A reply function that raises is a StepFailed at the node, failing an unprotected case."""
    m = machine(seq(wait("go"), reply("go", lambda ctx: 1 / 0)))
    settle(m)
    m.deliver_update("go", None, "u")
    assert settle(m).status == "failed"
    assert isinstance(m.error, StepFailed) and "ZeroDivisionError" in str(m.error)


def test_validate_reply_looks_at_its_own_thread() -> None:
    """A reply after a wait in another par branch, or after the par that held the wait, is refused; a reply after
    an xor or scope whose body took it (same thread) is accepted."""
    from wfsub import par, xor

    bad = validate(seq(par(wait("u"), reply("u", n_is)), reply("u", n_is)))
    assert [i.path for i in bad] == ["seq[0].par[1].reply", "seq[1].reply"]
    assert "no earlier wait of its thread takes" in bad[0].message
    good = seq(xor((lambda c: True, wait("u")), default=task(add)), scope("s", task(add)), reply("u", n_is))
    assert validate(good) == []
    assert validate(par(seq(wait("u"), reply("u", n_is)), wait("v"))) == []


# -- what can still be reached: a repeated update to a wait the case has passed, a reply ahead -------------------


def approved(ctx: Mapping[str, Any]) -> Any:
    return "ok"


def passed_answer(m: Machine, uid: str) -> str:
    """The text of the refusal of update `uid` as "passed" (no wait for it can be reached any more)."""
    found = [a for a in m.take_answers() if a[0] == uid]
    assert [a[1] for a in found] == ["passed"], found
    return str(found[0][3][0])


def test_an_update_no_wait_can_take_any_more_is_refused_naming_where_the_case_is() -> None:
    """A second update after the case passed its only wait is refused as "passed", naming the wait and where the
    case is (not buffered); a plain signal in that position is buffered."""
    m = machine(seq(wait("approve", reply=approved), sleep(3600)))
    settle(m)
    m.deliver_update("approve", None, "u1")
    assert m.take_answers() == [("u1", "answer", "approve", "ok")]
    settle(m)
    m.deliver_update("approve", None, "u2")
    answers = m.take_answers()
    assert answers[0][:3] == ("u2", "passed", "approve") and answers[0][3][1] == "seq[1].sleep"
    assert "passed every wait for it (seq[0].wait)" in answers[0][3][0] and "(seq[1].sleep)" in answers[0][3][0]
    assert m.owed_updates() == []
    m.deliver_signal("approve", "late")  # a signal is buffered, as before
    assert m.take_answers() == []


def test_earlier_waits_are_reachable_again_through_loops_nets_calls_and_handlers() -> None:
    """An update whose wait the case can reach again (a loop's next round, a net's edge back, the caller's wait
    after a called workflow returns, an on_error handler, an open mi's next instance) is buffered, not refused;
    where nothing can reach one, it is refused."""
    from wfsub import call, loop, mi, net

    lib = {"lib": seq(wait("a", reply=approved), sleep(5))}
    again = net({"w": wait("a", reply=approved), "s": sleep(5)}, [("start", "w"), ("w", "s"), ("s", "w"),
                                                                   ("s", "end", lambda c: False)], split={"s": "xor"})
    once = net({"w": wait("a", reply=approved), "s": sleep(5)}, [("start", "w"), ("w", "s"), ("s", "end")])
    cases = {
        "loop": (seq(loop(seq(wait("a", reply=approved), sleep(5)), times=3)), True),
        "net back": (again, True),
        "net on": (once, False),
        "call then wait": (seq(call("lib"), wait("a", reply=approved)), True),
        "call": (seq(call("lib"), sleep(9)), False),
        "on_error": (scope("s", seq(wait("a", reply=approved), sleep(5)), on_error=wait("a", reply=approved)), True),
        "open mi": (mi(seq(wait("a", reply=approved), sleep(5)), count=1, dynamic="open", name="m"), True),
        "mi": (mi(seq(wait("a", reply=approved), sleep(5)), count=1), False),
    }
    for label, (term, reachable) in cases.items():
        m = Machine(wfsub.compile(term, library=lib if "call" in label else None))
        settle(m)
        m.deliver_update("a", None, "u1")
        assert m.take_answers() == [("u1", "answer", "a", "ok")], label
        settle(m)
        m.deliver_update("a", None, "u2")
        if reachable:
            assert m.take_answers() == [] and m.owes("u2"), label
        else:
            assert "passed every wait" in passed_answer(m, "u2"), label


def test_a_buffered_update_is_refused_once_the_case_has_passed_its_wait() -> None:
    """Two updates buffered before the wait: the wait takes the first; the second is refused as soon as the case
    has gone past (after that burst), not left buffered for good."""
    m = machine(seq(sleep(1), wait("approve", reply=approved), sleep(3600)))
    r = settle(m)
    m.deliver_update("approve", None, "u1")
    m.deliver_update("approve", None, "u2")
    assert m.take_answers() == [] and sorted(m.owed_updates()) == ["u1", "u2"]
    m.fire_timer(r.timers[0].timer_id)
    settle(m)
    answers = m.take_answers()
    assert answers[0] == ("u1", "answer", "approve", "ok") and answers[1][:2] == ("u2", "passed")
    assert m.owed_updates() == []


def test_reply_ahead_is_judged_on_the_threads_own_way() -> None:
    """A reply after a called workflow returns, or after a scope's finally_, is ahead of the thread parked inside
    them (kept owed); a reply in the branch not taken, or after a par the thread split into, is not (None); a
    failure caught around the thread withdraws it (answered "withdrawn", naming the failure)."""
    from wfsub import call, par, task, xor

    def fails(ctx: Mapping[str, Any]) -> None:
        raise RuntimeError("no")

    lib = {"lib": seq(task(lambda c: None), sleep(5))}
    ahead = {
        "call": seq(wait("a"), call("lib"), reply("a", approved)),
        "finally": seq(wait("a"), scope("s", sleep(5), finally_=sleep(3)), reply("a", approved)),
    }
    for label, term in ahead.items():
        m = Machine(wfsub.compile(term, library=lib))
        settle(m)
        m.deliver_update("a", None, "u")
        r = settle(m)
        while r.status == "blocked" and r.timers:  # parked in the called workflow, in the scope, in its finally_
            assert m.take_answers() == [] and m.owes("u"), label
            m.fire_timer(r.timers[0].timer_id)
            r = settle(m)
        assert m.take_answers() == [("u", "answer", "a", "ok")], label
    # a failure caught around the thread withdraws it: the handler's thread does not answer for it
    m = machine(seq(wait("a"), scope("s", seq(sleep(5), task(fails)), on_error=sleep(3)), reply("a", approved)))
    settle(m)
    m.deliver_update("a", None, "u")
    r = settle(m)
    m.fire_timer(r.timers[0].timer_id)
    settle(m)
    answers = m.take_answers()
    assert answers[0][:3] == ("u", "withdrawn", "a") and "scope 's' caught a failure" in answers[0][3][0]
    not_ahead = {
        "xor": seq(wait("a"), xor((lambda c: False, reply("a", approved)), default=sleep(5))),
        "par": seq(wait("a"), par(sleep(5), task(lambda c: None)), reply("a", approved)),
    }
    for label, term in not_ahead.items():
        m = machine(term)
        settle(m)
        m.deliver_update("a", None, "u")
        settle(m)
        assert m.take_answers() == [("u", "answer", "a", None)], label


def test_a_thread_withdrawn_before_its_reply_answers_withdrawn_saying_why() -> None:
    """The region of a thread that owes an update is cancelled before its reply step runs (the case goes on after
    it): the update is answered "withdrawn" naming the region (the caller gets SignalRejected), not None."""
    from wfsub import task

    m = machine(seq(scope("pay", seq(wait("approve"), sleep(60), reply("approve", approved)),
                          on_cancel=task(lambda c: {"refunded": True})), wait("end")))
    settle(m)
    m.deliver_update("approve", None, "u")
    settle(m)
    assert m.take_answers() == []
    m.cancel_region("pay")
    settle(m)
    answers = m.take_answers()
    assert answers == [("u", "withdrawn", "approve", ["region 'pay' was cancelled", "seq[0].scope.seq[1].sleep"])]

"""Timers from data at vm level: sleep(fn), sleep(until=fn), timeout=fn on wait and defer are computed from the case
data when the step starts; bad values fail the step naming the node; constant forms keep bytecode and fingerprint."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import pytest

import wfsub
from wfsub import StepFailed, WaitTimeout, defer, scope, seq, sleep, task, validate, wait
from wfsub._terms import Sleep, Term
from wfsub.lowlevel import Machine, RunResult


def machine(term: Term, data: dict[str, Any] | None = None) -> Machine:
    return Machine(wfsub.compile(term), data)


def settle(m: Machine) -> RunResult:
    """Run until the machine needs an input or has ended; gather the timers every run asked for."""
    timers = []
    while True:
        r = m.run(1000)
        timers += r.timers
        if r.status != "yielded":
            r.timers = timers
            return r


def put(key: str, value: Any) -> Term:
    def step(ctx: Mapping[str, Any]) -> dict[str, Any]:
        return {key: value}

    return task(step, name=f"put_{key}")


def delay(ctx: Mapping[str, Any]) -> Any:
    return ctx["delay"]


def deadline(ctx: Mapping[str, Any]) -> Any:
    return ctx["deadline"]


def test_sleep_seconds_from_data_is_computed_when_the_step_starts() -> None:
    """sleep(fn) arms a timer of fn(ctx) seconds, reading the data as it is when the sleep starts."""
    m = machine(seq(put("delay", 90), sleep(delay), put("woke", True)), {"delay": 5})
    r = settle(m)
    assert [(t.timer_id, t.seconds, t.path, t.at) for t in r.timers] == [(1, 90.0, "seq[1].sleep", None)]
    m.fire_timer(1)
    assert settle(m).status == "done" and m.data == {"delay": 90, "woke": True}


@pytest.mark.parametrize(
    ("value", "epoch"),
    [
        (1_800_000_000, 1_800_000_000.0),
        ("2027-01-15T10:00:00+01:00", datetime(2027, 1, 15, 9, tzinfo=UTC).timestamp()),
        ("2027-01-15T09:00:00Z", datetime(2027, 1, 15, 9, tzinfo=UTC).timestamp()),
    ],
)
def test_sleep_until_asks_for_a_timer_at_an_absolute_time(value: Any, epoch: float) -> None:
    """sleep(until=fn) takes epoch seconds or an ISO 8601 time with a timezone; the request carries the epoch due."""
    m = machine(seq(sleep(until=deadline), put("woke", True)), {"deadline": value})
    (timer,) = settle(m).timers
    assert (timer.at, timer.due(base=123.0)) == (epoch, epoch)
    m.fire_timer(timer.timer_id)
    assert settle(m).status == "done"


def test_wait_and_defer_timeouts_from_data() -> None:
    """timeout=fn on wait and defer arms a timer of fn(ctx) seconds; the wait's timeout message shows it."""
    m = machine(wait("ok", timeout=delay), {"delay": 7})
    (timer,) = settle(m).timers
    assert timer.seconds == 7.0
    m.fire_timer(timer.timer_id)
    r = settle(m)
    assert r.status == "failed" and isinstance(m.error, WaitTimeout)
    assert "within its timeout of 7s" in str(m.error)
    m = machine(defer({"ok": put("ok", True)}, timeout=delay, on_timeout=put("late", True)), {"delay": 0})
    (timer,) = settle(m).timers
    assert timer.seconds == 0.0
    m.fire_timer(timer.timer_id)
    assert settle(m).status == "done" and m.data == {"delay": 0, "late": True}


@pytest.mark.parametrize(
    ("term", "data", "message"),
    [
        (sleep(delay), {"delay": "soon"},
         "at seq[0].sleep: sleep seconds function delay returned 'soon' (str), not a finite number of seconds; "
         "return an int or float >= 0"),
        (sleep(delay), {"delay": float("nan")}, "returned nan (float), not a finite number of seconds"),
        (sleep(delay), {"delay": True}, "returned True (bool), not a finite number of seconds"),
        (sleep(delay), {"delay": -1}, "returned -1: the seconds must be >= 0"),
        (sleep(delay), {"delay": 1e12}, "more than the longest timer wfsub arms"),
        (wait("x", timeout=delay), {"delay": 0}, "wait timeout function delay returned 0: the seconds must be > 0"),
        (sleep(until=deadline), {"deadline": "2027-01-15T09:00:00"},
         "at seq[0].sleep: sleep until function deadline returned '2027-01-15T09:00:00', a time without a timezone "
         "(add 'Z' or an offset such as '+00:00'); return epoch seconds or an ISO 8601 time with a timezone"),
        (sleep(until=deadline), {"deadline": "next tuesday"}, "returned 'next tuesday', which is not an ISO 8601 time"),
        (sleep(until=deadline), {"deadline": float("inf")}, "returned inf, not a finite number of epoch seconds"),
        (sleep(until=deadline), {"deadline": None}, "returned None (NoneType), not a time"),
        (sleep(until=deadline), {}, "sleep until function deadline raised KeyError: 'deadline'"),
    ],
)
def test_a_bad_timer_value_fails_the_step_naming_its_path_and_the_fix(term: Term, data: Any, message: str) -> None:
    """A value that is not a finite number or a valid time fails the step at its node path, saying what to return."""
    m = machine(seq(term, put("after", True)), data)
    r = settle(m)
    assert r.status == "failed" and "after" not in m.data
    assert message in f"{m.error} | {m.error_message}"
    assert m.error_path == "seq[0]." + ("wait" if "wait" in message else "sleep")


def test_a_bad_timer_value_is_caught_by_on_error() -> None:
    """The failure of a timer computed from data is a failure at the node: scope(on_error=) catches it."""
    m = machine(scope("s", sleep(delay), on_error=put("handled", True)), {"delay": "x"})
    assert settle(m).status == "done"
    assert m.data["handled"] is True and m.data["error"]["path"] == "scope.sleep"
    assert isinstance(m.error, type(None))
    assert m.data["error"]["type"] == StepFailed.__name__


def test_constant_timers_keep_their_bytecode_and_fingerprint() -> None:
    """Constant sleep, wait and defer timeouts compile to the same specs and fingerprint text as before."""
    from wfsub._compiler import canonical
    from wfsub._program import SleepSpec, WaitSpec

    program = wfsub.compile(seq(sleep(5), wait("x", timeout=3)))
    assert program.consts[0] == SleepSpec(5.0) and program.consts[1] == WaitSpec("x", "x", False, 3.0)
    assert canonical(sleep(5)) == "sleep('sleep',('seconds',),None,5,)"  # the text before until= existed
    assert wfsub.compile(sleep(5)).fingerprint != wfsub.compile(sleep(delay)).fingerprint
    assert wfsub.compile(sleep(until=delay)).fingerprint != wfsub.compile(sleep(delay)).fingerprint
    assert repr(sleep(until=deadline)) == "sleep(until=deadline)" and repr(sleep(5)) == "sleep(5)"


def test_a_snapshot_keeps_computed_timer_values() -> None:
    """A machine restored from a snapshot asks for the computed timers again, with the values computed at the start."""
    program = wfsub.compile(seq(sleep(delay), sleep(until=deadline)))
    m = Machine(program, {"delay": 42, "deadline": 1_900_000_000})
    settle(m)
    restored = Machine.restore(program, m.snapshot())
    _, timers = restored.pending_requests()
    assert [(t.seconds, t.at) for t in timers] == [(42.0, None)]
    restored.fire_timer(timers[0].timer_id)
    settle(restored)
    again = Machine.restore(program, restored.snapshot())
    assert [(t.seconds, t.at) for t in again.pending_requests()[1]] == [(0.0, 1_900_000_000.0)]


def test_validate_checks_timer_arguments_with_paths_and_fixes() -> None:
    """validate accepts timer functions and reports misuse (both forms, async functions, non-callable until)."""

    async def slow(ctx: Any) -> float:
        return 1.0

    def issues(term: Term) -> list[str]:
        return [f"{i.path}: {i.message}" for i in validate(seq(put("a", 1), term))]

    assert issues(sleep(delay)) == issues(sleep(until=deadline)) == issues(wait("x", timeout=delay)) == []
    assert issues(defer({"x": put("b", 1)}, timeout=delay, on_timeout=put("c", 1))) == []
    assert issues(sleep(5, until=deadline)) == [
        f"seq[1].sleep: sleep takes seconds or until=, not both (got 5 and until={deadline!r}): keep the one "
        "that says when the timer falls due"
    ]
    assert "sleep needs seconds" in issues(Sleep())[0]  # the bare term: sleep() itself is typed to need one
    assert "until='2027-01-01' must be a function of ctx" in issues(sleep(until="2027-01-01"))[0]  # type: ignore[arg-type]
    (message,) = issues(sleep(slow))
    assert message.startswith("seq[1].sleep: seconds=") and "slow is an async function" in message
    assert "use a plain function" in message
    assert "slow is an async function" in issues(wait("x", timeout=slow))[0]



def test_a_snapshot_from_before_timer_values_existed_restores() -> None:
    """A snapshot written before computed timer values were kept restores with none (its timers were constant)."""
    program = wfsub.compile(seq(sleep(5), put("woke", True)))
    m = Machine(program)
    settle(m)
    snap = m.snapshot()
    del snap["state"]["timer_values"]
    restored = Machine.restore(program, snap)
    assert [(t.seconds, t.at) for t in restored.pending_requests()[1]] == [(5.0, None)]
    restored.fire_timer(1)
    assert settle(restored).status == "done"


T0 = datetime(2027, 1, 15, 8, tzinfo=UTC).timestamp()


def settle_at(m: Machine, time: float) -> RunResult:
    """`settle`, the driver telling the vm the time its inputs have reached (as the runtime and a replay do)."""
    timers = []
    while True:
        r = m.run(1000, time=time)
        timers += r.timers
        if r.status != "yielded":
            r.timers = timers
            return r


def test_wait_and_defer_deadlines_from_data_arm_a_timer_at_that_time() -> None:
    """deadline=fn on wait and defer arms a timer at the time fn(ctx) names (epoch seconds or ISO 8601 with a
    timezone); a wait that saw nothing by then fails with WaitTimeout naming its deadline, a defer takes on_timeout."""
    m = machine(wait("ok", deadline=deadline), {"deadline": "2027-01-15T10:00:00+01:00"})
    (timer,) = settle_at(m, T0).timers
    assert (timer.at, timer.due(base=T0)) == (T0 + 3600, T0 + 3600)
    m.fire_timer(timer.timer_id)
    r = settle_at(m, T0 + 3600)
    assert r.status == "failed" and isinstance(m.error, WaitTimeout)
    assert "wait('ok') saw no signal by its deadline 2027-01-15T09:00:00Z" in str(m.error)
    m = machine(defer({"ok": put("ok", True)}, deadline=deadline, on_timeout=put("late", True)), {"deadline": T0 - 5})
    (timer,) = settle_at(m, T0).timers
    assert timer.at == T0 - 5  # already passed: due at once
    m.fire_timer(timer.timer_id)
    assert settle_at(m, T0).status == "done" and m.data["late"] is True
    m = machine(seq(wait("ok", deadline=deadline), put("after", True)), {"deadline": "tomorrow"})
    r = settle_at(m, T0)
    assert r.status == "failed" and m.error_path == "seq[0].wait"
    assert ("wait deadline function deadline returned 'tomorrow', which is not an ISO 8601 time; return epoch "
            "seconds or an ISO 8601 time with a timezone") in str(m.error)


@pytest.mark.parametrize(
    "term",
    [
        sleep(until=deadline),
        wait("x", deadline=deadline),
        defer({"x": put("x", 1)}, deadline=deadline, on_timeout=put("late", 1)),
    ],
)
def test_a_due_time_from_data_is_bounded_as_a_timer_length_is(term: Term) -> None:
    """A due time further than MAX_SECONDS (1e9 s, about 31 years) after the time the run was given fails the step
    naming that bound, as sleep(seconds) and timeout= above it do; one exactly that far is armed."""
    from wfsub._terms import MAX_SECONDS

    m = machine(seq(term, put("after", True)), {"deadline": "3000-01-01T00:00:00Z"})
    r = settle_at(m, T0)
    assert r.status == "failed" and m.error_path == "seq[0]." + term.kind
    assert f"after the step started: more than the longest timer wfsub arms ({MAX_SECONDS:g} s, about 31 years)" \
        in str(m.error)
    m = machine(seq(term, put("after", True)), {"deadline": T0 + MAX_SECONDS})
    (timer,) = settle_at(m, T0).timers
    assert timer.at == T0 + MAX_SECONDS


def test_validate_checks_deadlines() -> None:
    """validate takes deadline=fn on wait and defer, and refuses it beside timeout=, not a function, async, or on a
    defer without on_timeout."""

    async def slow(ctx: Any) -> float:
        return 1.0

    def issues(term: Term) -> list[str]:
        return [i.message for i in validate(seq(put("a", 1), term))]

    assert issues(wait("x", deadline=deadline)) == []
    assert issues(defer({"x": put("b", 1)}, deadline=deadline, on_timeout=put("c", 1))) == []
    assert issues(wait("x", timeout=5, deadline=deadline)) == [
        f"give timeout= or deadline=, not both (got 5 and deadline={deadline!r}): timeout= is a length from when "
        "the step starts, deadline= the time it gives up at"
    ]
    assert "deadline='2027-01-01' must be a function of ctx returning epoch seconds or an ISO 8601 time" in issues(
        wait("x", deadline="2027-01-01"))[0]  # type: ignore[arg-type]
    assert "slow is an async function" in issues(wait("x", deadline=slow))[0]
    assert issues(defer({"x": put("b", 1)}, deadline=deadline)) == [
        "timeout (or deadline) and on_timeout go together: add on_timeout="
    ]
    assert wfsub.compile(wait("x")).fingerprint != wfsub.compile(wait("x", deadline=deadline)).fingerprint
    from wfsub._compiler import canonical

    assert "deadline" not in canonical(wait("x", timeout=3)) + canonical(defer({"x": put("b", 1)}))

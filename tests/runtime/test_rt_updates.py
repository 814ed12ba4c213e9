"""Updates through the runtime (cases in memory), on asyncio and trio: answers, refusals by check=, buffered updates,
the case's failure or cancel before answering, repeated request ids (also two callers at once), timeouts."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from wfsub import (
    CaseCancelled,
    CaseFailed,
    SignalRejected,
    defer,
    effect,
    loop,
    reply,
    scope,
    seq,
    sleep,
    task,
    wait,
)

from ..harness import running


def positive(ctx: Mapping[str, Any], payload: Any) -> str | None:
    return None if isinstance(payload, int) and payload > 0 else f"add must be a positive int, got {payload!r}"


def add(ctx: Mapping[str, Any]) -> dict[str, Any]:
    return {"n": ctx["n"] + ctx["add"]}


def n_of(ctx: Mapping[str, Any]) -> Any:
    return ctx["n"]


COUNTER = seq(
    wait("add", check=positive), task(add), reply("add", n_of),
    wait("add", check=positive), task(add), reply("add", n_of),
)


@pytest.fixture(params=["asyncio", "trio"])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def run(backend: str, fn: Any) -> None:
    anyio.run(fn, backend=backend)


def test_update_returns_the_reply(backend: str) -> None:
    """sub.update and handle.update return the reply computed after the payload is merged; the case goes on."""
    async def main() -> None:
        async with running() as (sub, _, _):
            h = await sub.new_case(COUNTER, {"n": 1})
            assert await sub.update(h.case_id, "add", 2) == 3
            assert await h.update("add", 10) == 13
            assert await h.result() == {"n": 13, "add": 10}

    run(backend, main)


def test_check_refuses_with_signal_rejected(backend: str) -> None:
    """A check= refusal raises SignalRejected carrying its text; nothing changes and a good update is taken."""
    async def main() -> None:
        async with running() as (sub, _, _):
            h = await sub.new_case(COUNTER, {"n": 1})
            with pytest.raises(SignalRejected) as info:
                await h.update("add", -5)
            assert info.value.reason == "add must be a positive int, got -5"
            with pytest.raises(SignalRejected, match="positive int"):
                await h.signal("add", 0)
            assert h.data() == {"n": 1}
            assert await h.update("add", 1) == 2

    run(backend, main)


def test_unknown_update_name_refused(backend: str) -> None:
    """An update to a name the workflow never answers is refused at once, naming the fix."""
    async def main() -> None:
        async with running() as (sub, _, _):
            h = await sub.new_case(seq(wait("go"), wait("add", reply=n_of)), {"n": 0})
            with pytest.raises(SignalRejected, match="never answers it"):
                await h.update("go")
            with pytest.raises(SignalRejected, match="never waits for 'nope'"):
                await h.update("nope")

    run(backend, main)


def test_buffered_update_answered_when_a_wait_takes_it(backend: str) -> None:
    """An update no wait takes now is buffered; the caller gets the answer when a wait takes it, or the
    refusal if that wait's check refuses it."""
    async def main() -> None:
        async with running() as (sub, clock, _):
            h = await sub.new_case(seq(sleep(10), wait("add", check=positive, reply=lambda c: c["add"] * 2)), {})
            answers: dict[str, Any] = {}

            async def call(key: str, value: Any) -> None:
                try:
                    answers[key] = await h.update("add", value)
                except SignalRejected as exc:
                    answers[key] = exc

            async with anyio.create_task_group() as tg:
                tg.start_soon(call, "bad", -1)
                await clock.settle()
                tg.start_soon(call, "good", 4)
                await clock.settle()
                assert answers == {}
                await clock.advance(10)
            assert isinstance(answers["bad"], SignalRejected) and "positive int" in answers["bad"].reason
            assert answers["good"] == 8

    run(backend, main)


def test_thread_without_reply_answers_none(backend: str) -> None:
    """A thread that takes an update and parks with no reply step of its name ahead answers None; so does a case
    that ends done."""
    async def main() -> None:
        async with running() as (sub, _, _):
            h = await sub.new_case(seq(wait("go"), task(lambda c: {"x": 1}), wait("more"),
                                       wait("go", reply=n_of)))
            assert await h.update("go", 1) is None
            h2 = await sub.new_case(seq(wait("go"), task(lambda c: {"x": 1}), reply("go", n_of), wait("go")), {"n": 5})
            assert await h2.update("go") == 5
            assert await h2.update("go") is None  # the second wait has no reply: the case ends done
            await h2.result()

    run(backend, main)


def test_case_failing_or_cancelled_before_answering(backend: str) -> None:
    """An update owed when the case fails raises CaseFailed; when it is cancelled, CaseCancelled."""
    async def main() -> None:
        async with running() as (sub, _, _):
            async def boom(ctx: Any) -> None:
                raise RuntimeError("card declined")

            from wfsub import effect
            h = await sub.new_case(seq(wait("pay"), effect(boom), reply("pay", lambda c: "paid")))
            with pytest.raises(CaseFailed, match="card declined"):
                await h.update("pay")

            gate = anyio.Event()

            async def slow(ctx: Any) -> None:
                await gate.wait()

            h2 = await sub.new_case(seq(wait("pay"), effect(slow), reply("pay", lambda c: "paid")))
            async with anyio.create_task_group() as tg:
                got: list[Any] = []

                async def call() -> None:
                    try:
                        got.append(await h2.update("pay"))
                    except CaseCancelled as exc:
                        got.append(exc)

                tg.start_soon(call)
                while h2.status().state != "waiting_effect":
                    await anyio.lowlevel.checkpoint()
                await h2.cancel(reason="customer left")
            assert isinstance(got[0], CaseCancelled) and "customer left" in str(got[0])

    run(backend, main)


def test_repeated_request_id_answers_as_the_first(backend: str) -> None:
    """Calls with one request_id apply once and get the first call's answer: two at once, and one after."""
    async def main() -> None:
        async with running() as (sub, clock, _):
            h = await sub.new_case(seq(sleep(1), COUNTER), {"n": 1})
            got: list[Any] = []

            async def call() -> None:
                got.append(await h.update("add", 5, request_id="r1"))

            async with anyio.create_task_group() as tg:
                tg.start_soon(call)
                tg.start_soon(call)
                await clock.settle()
                await clock.advance(1)
            assert got == [6, 6]
            assert await sub.update(h.case_id, "add", 5, request_id="r1") == 6
            assert h.data()["n"] == 6
            assert await h.update("add", 1, request_id="r2") == 7

    run(backend, main)


def test_update_timeout_leaves_the_update_with_the_case(backend: str) -> None:
    """timeout= raises TimeoutError when no answer came in time; the case keeps it, and the same request_id
    gets the answer later."""
    async def main() -> None:
        async with running() as (sub, clock, _):
            h = await sub.new_case(seq(sleep(100), wait("q", reply=lambda c: "late")))
            got: list[BaseException] = []

            async def call() -> None:
                try:
                    await h.update("q", request_id="q1", timeout=5)
                except TimeoutError as exc:
                    got.append(exc)

            async with anyio.create_task_group() as tg:
                tg.start_soon(call)
                await clock.settle()
                await clock.advance(5)
            assert "same request_id" in str(got[0])
            await clock.advance(95)
            assert await h.update("q", request_id="q1") == "late"

    run(backend, main)


def test_defer_update_replied_in_branch(backend: str) -> None:
    """An update taken by a defer is answered by the reply step of the branch it chose."""
    async def main() -> None:
        async with running() as (sub, _, _):
            h = await sub.new_case(defer(
                {"approve": seq(task(lambda c: {"ok": True}), reply("approve", lambda c: {"ok": c["ok"]})),
                 "reject": task(lambda c: {"ok": False})},
                check={"approve": lambda c, p: None if p == "ann" else "only ann approves"},
            ))
            with pytest.raises(SignalRejected, match="only ann approves"):
                await h.update("approve", "bob")
            assert await h.update("approve", "ann") == {"ok": True}

    run(backend, main)


def test_buffered_signal_refused_when_taken_is_logged() -> None:
    """A buffered signal that the taking wait's check refuses is dropped with a WARNING naming case, name, reason,
    and listed in status().refused."""
    import structlog

    async def main() -> None:
        with structlog.testing.capture_logs() as logs:
            async with running() as (sub, clock, _):
                h = await sub.new_case(seq(sleep(1), wait("add", check=positive), wait("end")), {})
                await h.signal("add", -2)
                await clock.advance(1)
                assert h.status().state == "waiting_signal" and "add" not in h.data()
        refused = [e for e in logs if e["event"] == "input refused by its wait's check"]
        assert refused and refused[0]["log_level"] == "warning" and refused[0]["name"] == "add"
        assert refused[0]["case_id"] == h.case_id and "positive int" in refused[0]["reason"]
        listed = h.status().refused
        assert [(r.kind, r.name) for r in listed] == [("signal", "add")]
        assert "positive int" in listed[0].reason and "seq[1].wait" in listed[0].reason

    run("asyncio", main)


async def pay(ctx: Mapping[str, Any]) -> dict[str, Any]:
    return {"paid": True}


APPROVAL = seq(
    wait("approve", reply=lambda c: {"approved_by": c["approve"]}),
    effect(pay),
    sleep(3600),
    task(lambda c: {"closed": True}),
)


def test_repeated_update_to_a_passed_wait_is_refused_at_once(backend: str) -> None:
    """A second approve (a new request) after the case passed its only wait is refused at once with SignalRejected
    naming where the case is, and listed in status().refused; the first call's request_id still gets its answer; a
    plain signal in that position is buffered as before."""
    async def main() -> None:
        async with running() as (sub, clock, _):
            h = await sub.new_case(APPROVAL)
            assert await h.update("approve", "ann", request_id="click-1") == {"approved_by": "ann"}
            await clock.settle()
            assert h.status().state == "waiting_timer"
            with anyio.fail_after(10), pytest.raises(SignalRejected) as info:  # at once (bounded: not a timing)
                await h.update("approve", "ann", request_id="click-2")
            text = str(info.value)
            assert "passed every wait for it (seq[0].wait)" in text and "seq[2].sleep" in text, text
            assert info.value.path == "seq[2].sleep"
            assert await h.update("approve", "ann", request_id="click-1") == {"approved_by": "ann"}
            listed = h.status().refused
            assert [(r.kind, r.name, r.request_id) for r in listed] == [("update", "approve", "click-2")]
            assert "seq[2].sleep" in listed[0].reason
            with pytest.raises(SignalRejected, match="passed every wait"):  # the same refusal to its retry
                await h.update("approve", "ann", request_id="click-2")
            await h.signal("approve", "bob")  # a signal is buffered, not refused
            await clock.advance(3600)
            assert (await h.result())["approve"] == "ann"

    run(backend, main)


def test_double_click_buffered_before_the_wait_is_refused_once_passed(backend: str) -> None:
    """Two approves that come while the case is still before its wait are both buffered; the wait takes the first
    and answers it, and the second is refused as soon as the case has passed the wait (not held until its
    caller's timeout)."""
    async def main() -> None:
        async with running() as (sub, clock, _):
            h = await sub.new_case(seq(sleep(10), APPROVAL))
            got: dict[str, Any] = {}

            async def click(rid: str) -> None:
                try:
                    got[rid] = await h.update("approve", rid, request_id=rid)
                except SignalRejected as exc:
                    got[rid] = exc

            with anyio.fail_after(10):  # (a bound against a hang, not a timing)
                async with anyio.create_task_group() as tg:
                    tg.start_soon(click, "c1")
                    await clock.settle()
                    tg.start_soon(click, "c2")
                    await clock.settle()
                    assert got == {}
                    await clock.advance(10)
            assert got["c1"] == {"approved_by": "c1"}
            assert isinstance(got["c2"], SignalRejected) and "passed every wait" in str(got["c2"])
            assert [r.request_id for r in h.status().refused] == ["c2"]

    run(backend, main)


def test_a_loop_makes_its_wait_reachable_again(backend: str) -> None:
    """An update that comes while a loop's thread is past its wait is buffered, not refused: the next round takes
    it; once the loop is over, the next one is refused."""
    async def main() -> None:
        async with running() as (sub, clock, _):
            body = seq(wait("add", reply=lambda c: c["add"]), sleep(5))
            h = await sub.new_case(seq(loop(body, times=2), sleep(100)))
            assert await h.update("add", 1) == 1
            async with anyio.create_task_group() as tg:
                got: list[Any] = []

                async def second() -> None:
                    got.append(await h.update("add", 2))

                tg.start_soon(second)
                await clock.settle()
                assert got == []
                await clock.advance(5)
            assert got == [2]
            await clock.advance(5)
            with anyio.fail_after(10), pytest.raises(SignalRejected, match="passed every wait"):
                await h.update("add", 3)

    run(backend, main)


def test_reply_ahead_keeps_the_caller_through_effects_and_timers(backend: str) -> None:
    """An update taken by a wait whose thread has a reply step of its name ahead keeps its caller waiting through
    the thread's effect and timer, and returns the reply's answer once that step runs."""
    async def main() -> None:
        async with running() as (sub, clock, _):
            paid = anyio.Event()

            async def charge(ctx: Mapping[str, Any]) -> dict[str, Any]:
                await paid.wait()
                return {"payment": "P-1"}

            h = await sub.new_case(seq(wait("approve"), effect(charge), sleep(60),
                                       reply("approve", lambda c: {"payment": c["payment"]}), sleep(3600)))
            got: list[Any] = []
            async with anyio.create_task_group() as tg:
                async def approve() -> None:
                    got.append(await h.update("approve", "ann"))

                tg.start_soon(approve)
                while h.status().state != "waiting_effect":
                    await anyio.lowlevel.checkpoint()
                assert got == []
                paid.set()
                while h.status().state != "waiting_timer":
                    await anyio.lowlevel.checkpoint()
                assert got == []
                await clock.advance(60)
            assert got == [{"payment": "P-1"}]

    run(backend, main)


def test_a_caller_whose_thread_is_withdrawn_gets_signal_rejected_saying_why(backend: str) -> None:
    """A region cancelled while its thread owes an update (its reply step still ahead) answers the caller with
    SignalRejected naming the region, and the case goes on after the region."""
    async def main() -> None:
        async with running() as (sub, clock, _):
            h = await sub.new_case(seq(
                scope("pay", seq(wait("approve"), sleep(60), reply("approve", lambda c: "paid")),
                      on_cancel=task(lambda c: {"refunded": True})),
                wait("end"),
            ))
            got: list[Any] = []
            async with anyio.create_task_group() as tg:
                async def approve() -> None:
                    try:
                        got.append(await h.update("approve"))
                    except SignalRejected as exc:
                        got.append(exc)

                tg.start_soon(approve)
                await clock.settle()
                assert got == [] and h.status().state == "waiting_timer"
                await sub.cancel_region(h.case_id, "pay")
            assert isinstance(got[0], SignalRejected), got
            assert "withdrawn before its reply step ran: region 'pay' was cancelled" in str(got[0])
            await clock.settle()
            assert h.data().get("refunded") is True and h.status().signals == ("end",)

    run(backend, main)

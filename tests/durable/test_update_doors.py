"""Updates at every door (the owner's API and handle, a standby and a `wfsub.Client` through the inbox, another
Postgres node), without a store and on MemoryStore, SQLite and Postgres: a repeated update to a wait the case has
passed (a double-clicked approve) is refused at once naming where the case is and listed in `status().refused`,
while the first call's request id still gets its answer; a thread with a reply step ahead keeps its caller
waiting through its effect until that step runs; both across a restart."""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import anyio
import pytest

from wfsub import CaseState, Client, SignalRejected, Substrate, effect, reply, seq, sleep, task, wait
from wfsub.testing import VirtualClock

from ._util import eventually, same_store

BOUND = 30.0  # seconds: a bound against a hang, not a latency requirement

DOORS = [  # (store kind, door): who sends the updates
    ("none", "owner"), ("memory", "owner"), ("sqlite", "owner"), ("postgres", "owner"),
    ("sqlite", "handle"), ("sqlite", "standby"), ("sqlite", "client"),
    ("postgres", "client"), ("postgres", "node"),
]


def _approved(ctx: Mapping[str, Any]) -> dict[str, Any]:
    return {"approved_by": ctx["approve"]}


def _paid(ctx: Mapping[str, Any]) -> dict[str, Any]:
    return {"payment": ctx["payment"]}


GATE: dict[str, anyio.Event] = {}  # set by each test: the payment below ends when the test opens it


async def _pay(ctx: Mapping[str, Any]) -> dict[str, Any]:
    await GATE["paid"].wait()
    return {"payment": "P-1"}


FLOWS = {
    # approved once, then paid, then a long wait for the delivery: a second approve can never be taken
    "approval": seq(wait("approve", reply=_approved), sleep(3600), task(lambda c: {"closed": True})),
    # the answer is given after the payment and its confirmation: the approve's caller waits through both
    "paid": seq(wait("approve"), effect(_pay, name="pay"), wait("confirm"), reply("approve", _paid),
                wait("shipped")),
}


class Caller:
    """The door under test: `update`, `status` and `new_case` as it offers them."""

    def __init__(self, door: str, sub: Substrate, other: Any) -> None:
        self.door, self.sub, self.other = door, sub, other

    async def new_case(self, workflow: str, case_id: str) -> None:
        await self.sub.new_case(workflow, {}, case_id=case_id)

    async def update(self, case_id: str, name: str, payload: Any, request_id: str) -> Any:
        if self.door == "owner":
            return await self.sub.update(case_id, name, payload, request_id=request_id)
        if self.door == "handle":
            return await self.sub.handle(case_id).update(name, payload, request_id=request_id)
        return await self.other.update(case_id, name, payload, request_id=request_id)

    async def refused(self, case_id: str) -> list[tuple[str, str | None, str | None]]:
        status = self.sub.status(case_id) if self.door in ("owner", "handle") else self.other.status(case_id)
        if self.door == "client":
            status = await status
        return [(r.kind, r.name, r.request_id) for r in status.refused]


async def _open(stack: AsyncExitStack, kind: str, door: str, tmp_path: Path, **options: Any) -> Caller:
    store = same_store(kind, tmp_path)
    node = {"node_id": "n1"} if kind == "postgres" else {}
    sub = await stack.enter_async_context(Substrate(store=store(), workflows=FLOWS, **node, **options))
    other: Any = None
    if door == "standby":
        other = await stack.enter_async_context(Substrate(store=store(), workflows=FLOWS))
        assert other.standby
    elif door == "client":
        other = await stack.enter_async_context(Client(store()))
    elif door == "node":
        other = await stack.enter_async_context(Substrate(store=store(), workflows=FLOWS, node_id="n2"))
    return Caller(door, sub, other)


@pytest.mark.parametrize(("kind", "door"), DOORS)
async def test_a_double_clicked_approve_is_refused_at_once_naming_where_the_case_is(
    kind: str, door: str, tmp_path: Path
) -> None:
    """The second approve (a new request id) after the case passed its only wait raises SignalRejected at once,
    naming the wait passed and where the case is, and is listed in status().refused; its retry gets the same
    refusal; the first approve's request id still gets the first answer."""
    async with AsyncExitStack() as stack:
        caller = await _open(stack, kind, door, tmp_path)
        sub = caller.sub
        await caller.new_case("approval", "a1")
        assert await caller.update("a1", "approve", "ann", "click-1") == {"approved_by": "ann"}
        await eventually(lambda: sub.status("a1").state == CaseState.WAITING_TIMER, BOUND)
        with anyio.fail_after(BOUND):  # at once: not after a timeout, however long the case waits
            with pytest.raises(SignalRejected) as info:
                await caller.update("a1", "approve", "ann", "click-2")
        text = str(info.value)
        assert "cannot take update 'approve'" in text and "passed every wait for it (seq[0].wait)" in text, text
        assert "seq[1].sleep" in text, text
        with pytest.raises(SignalRejected, match="passed every wait"):
            await caller.update("a1", "approve", "ann", "click-2")
        assert await caller.update("a1", "approve", "ann", "click-1") == {"approved_by": "ann"}
        assert await caller.refused("a1") == [("update", "approve", "click-2")]
        assert sub.data("a1") == {"approve": "ann"}


@pytest.mark.parametrize(("kind", "door"), DOORS)
async def test_a_reply_ahead_keeps_the_caller_waiting_through_the_threads_parks(
    kind: str, door: str, tmp_path: Path
) -> None:
    """An approve whose thread pays (an effect) and waits for a confirmation (a signal) before its reply step gets
    the reply's answer once that step runs; until then the call has not returned."""
    GATE["paid"] = anyio.Event()
    async with AsyncExitStack() as stack:
        caller = await _open(stack, kind, door, tmp_path)
        sub = caller.sub
        await caller.new_case("paid", "p1")
        got: list[Any] = []
        async with anyio.create_task_group() as tg:
            async def approve() -> None:
                got.append(await caller.update("p1", "approve", "ann", "a-1"))

            tg.start_soon(approve)
            await eventually(lambda: sub.status("p1").state == CaseState.WAITING_EFFECT, BOUND)
            assert got == []
            GATE["paid"].set()
            await eventually(lambda: sub.status("p1").signals == ("confirm",), BOUND)
            assert got == []
            await sub.signal("p1", "confirm")
            with anyio.fail_after(BOUND):
                while not got:  # noqa: ASYNC110 - the call returns when the owner answers
                    await anyio.sleep(0.005)
        assert got == [{"payment": "P-1"}]
        assert await caller.update("p1", "approve", "ann", "a-1") == {"payment": "P-1"}


@pytest.mark.parametrize("kind", ["memory", "sqlite", "postgres"])
async def test_the_refusal_and_an_owed_answer_survive_a_restart(kind: str, tmp_path: Path) -> None:
    """After a restart the double click's retry gets the same refusal, listed once; an approve owed across the
    restart (its thread waits for a timer before replying) is answered to its retry once the reply step runs."""
    store = same_store(kind, tmp_path)
    flows = {
        **FLOWS,
        "later": seq(wait("approve"), sleep(60), reply("approve", _approved), sleep(3600)),
    }
    clock = VirtualClock()
    async with Substrate(store=store(), workflows=flows, clock=clock) as sub:
        await sub.new_case("approval", {}, case_id="a1")
        await sub.new_case("later", {}, case_id="l1")
        assert await sub.update("a1", "approve", "ann", request_id="click-1") == {"approved_by": "ann"}
        with anyio.fail_after(BOUND), pytest.raises(SignalRejected, match="passed every wait"):
            await sub.update("a1", "approve", "ann", request_id="click-2")
        gave_up: list[BaseException] = []
        async with anyio.create_task_group() as tg:
            async def first() -> None:
                try:
                    await sub.update("l1", "approve", "bob", request_id="late-1", timeout=5)
                except TimeoutError as exc:
                    gave_up.append(exc)

            tg.start_soon(first)
            await clock.settle()
            await clock.advance(5)
        assert len(gave_up) == 1 and sub.status("l1").state == CaseState.WAITING_TIMER
    async with Substrate(store=store(), workflows=flows, clock=clock) as sub:
        assert [(r.kind, r.request_id) for r in sub.status("a1").refused] == [("update", "click-2")]
        with pytest.raises(SignalRejected, match="passed every wait"):
            await sub.update("a1", "approve", "ann", request_id="click-2")
        assert await sub.update("a1", "approve", "ann", request_id="click-1") == {"approved_by": "ann"}
        assert [(r.kind, r.request_id) for r in sub.status("a1").refused] == [("update", "click-2")]
        got: list[Any] = []
        async with anyio.create_task_group() as tg:
            async def retry() -> None:
                got.append(await sub.update("l1", "approve", "bob", request_id="late-1"))

            tg.start_soon(retry)
            await clock.settle()
            assert got == []
            await clock.advance(55)
        assert got == [{"approved_by": "bob"}]

"""Idempotent calls hold on every store, a Substrate without one included: a start repeated with the same workflow
and data is that case, and an input repeated with its request id applies once (DESIGN: Idempotent calls)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio
import pytest

from wfsub import CaseExists, CaseState, SignalRejected, Substrate, effect, loop, saga, seq, task, wait

from ..durable._util import eventually, same_store

KINDS = ["none", "memory", "sqlite", "postgres"]
BOUND = 30.0  # seconds: a bound against a hang, not a latency requirement


def _node(kind: str) -> dict[str, Any]:
    return {"node_id": "n1"} if kind == "postgres" else {}


def _count(ctx: Mapping[str, Any]) -> dict[str, Any]:
    return {"n": ctx.get("n", 0) + 1}


def _yes(ctx: Mapping[str, Any]) -> str:
    return "yes"


COUNTER = loop(seq(wait("add", into="item"), task(_count)), while_=lambda d: True)
OTHER = seq(wait("go"))


@pytest.mark.parametrize("kind", KINDS)
async def test_a_start_repeated_with_the_same_workflow_and_data_is_that_case(kind: str, tmp_path: Path) -> None:
    """new_case with an existing id, the same workflow and equal data returns that case (not started again, also
    once it ended); other data or another workflow raises CaseExists naming what differs."""
    store = same_store(kind, tmp_path)
    async with Substrate(store=store(), workflows={"count": COUNTER, "other": OTHER}, **_node(kind)) as sub:
        first = await sub.new_case("count", {"shop": "a"}, case_id="c")
        await sub.signal("c", "add", 1)
        await eventually(lambda: sub.data("c").get("n") == 1, BOUND)
        again = await sub.new_case("count", {"shop": "a"}, case_id="c")
        assert again.case_id == first.case_id == "c"
        assert sub.data("c")["n"] == 1  # the same case: not started again
        with pytest.raises(CaseExists, match=r"'c' already exists with other start data \(keys that differ: 'shop'\)"):
            await sub.new_case("count", {"shop": "b"}, case_id="c")
        with pytest.raises(CaseExists, match="'c' already exists with workflow 'count' .this call: 'other'."):
            await sub.new_case("other", {"shop": "a"}, case_id="c")
        await sub.cancel("c")
        with pytest.raises(Exception, match="cancelled"):
            await first.result(timeout=BOUND)
        ended = await sub.new_case("count", {"shop": "a"}, case_id="c")
        assert ended.status().state == CaseState.CANCELLED
        assert [s.case_id for s in sub.cases()] == ["c"]


@pytest.mark.parametrize("kind", KINDS)
async def test_a_signal_repeated_with_its_request_id_applies_once(kind: str, tmp_path: Path) -> None:
    """A signal sent twice with one request id (one after the other, and twice at once) is applied once; a retry
    after it ended the case returns; a cancel or an update with its id is refused naming the signal."""
    store = same_store(kind, tmp_path)
    flows = {"count": COUNTER, "once": seq(wait("go"), wait("ask", reply=_yes))}
    async with Substrate(store=store(), workflows=flows, **_node(kind)) as sub:
        await sub.new_case("count", {}, case_id="c")
        await sub.signal("c", "add", 1, request_id="r1")
        await sub.signal("c", "add", 1, request_id="r1")
        async with anyio.create_task_group() as tg:
            for _ in range(2):
                tg.start_soon(lambda: sub.signal("c", "add", 2, request_id="r2"))
        await sub.signal("c", "add", 3, request_id="r3")
        await eventually(lambda: sub.data("c").get("item") == 3, BOUND)
        assert sub.data("c")["n"] == 3
        with pytest.raises(SignalRejected, match="request_id 'r1' was used by a signal of this case"):
            await sub.cancel("c", request_id="r1")
        with pytest.raises(SignalRejected, match="request_id 'r2' was used by a signal of this case"):
            await sub.update("c", "add", 4, request_id="r2")
        handle = await sub.new_case("once", {}, case_id="o")
        await sub.signal("o", "go", request_id="g")
        assert await sub.update("o", "ask", request_id="u") == "yes"
        await handle.result(timeout=BOUND)
        await sub.signal("o", "go", request_id="g")  # a retry of what it took: returns as it did first
        await handle.signal("go", request_id="g")
        assert await sub.update("o", "ask", request_id="u") == "yes"
        with pytest.raises(SignalRejected, match="request_id 'u' was used by an update of this case"):
            await sub.signal("o", "go", request_id="u")
        with pytest.raises(SignalRejected, match="it has already ended"):
            await sub.signal("o", "go", request_id="fresh")


@pytest.mark.parametrize("kind", KINDS)
async def test_a_cancel_repeated_with_its_request_id_while_compensating_is_not_a_second_cancel(
    kind: str, tmp_path: Path
) -> None:
    """A cancel retried with its request id while the case compensates changes nothing (a second cancel would end
    it at once): the compensation finishes, the case ends cancelled with it, and a retry after the end returns."""
    release = anyio.Event()
    undone: list[str] = []

    async def refund(ctx: Any) -> None:
        await release.wait()
        undone.append("refund")

    flows = {"pay": seq(saga((task(lambda c: {"paid": True}, name="charge"), effect(refund, name="refund")),
                            wait("never")))}
    store = same_store(kind, tmp_path)
    async with Substrate(store=store(), workflows=flows, **_node(kind)) as sub:
        handle = await sub.new_case("pay", {}, case_id="p")
        await eventually(lambda: sub.status("p").signals == ("never",), BOUND)
        await sub.cancel("p", request_id="k")
        await eventually(lambda: sub.status("p").effects_pending == 1, BOUND)  # compensating
        await sub.cancel("p", request_id="k")
        assert sub.status("p").state != CaseState.CANCELLED
        release.set()
        with pytest.raises(Exception, match="cancelled"):
            await handle.result(timeout=BOUND)
        assert undone == ["refund"] and sub.status("p").state == CaseState.CANCELLED
        await sub.cancel("p", request_id="k")  # after the end: returns as the first call did
        with pytest.raises(SignalRejected, match="it has already ended"):
            await sub.cancel("p", request_id="another")

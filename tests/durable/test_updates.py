"""Updates of durable cases on MemoryStore, SQLite and Postgres: answered and journaled as signals marked as
updates, answers kept on the case row (not journaled) so a call retried with its request id across a restart gets
its answer, buffered updates keeping their id across a restart, check= refusals after a restart, and an update
sent through a Client (the inbox) answered by the owner."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio
import pytest

import wfsub
from wfsub import Client, SignalRejected, Substrate, effect, loop, reply, seq, task, wait
from wfsub.stores import Store
from wfsub.testing import VirtualClock

from ..stores._helpers import STORE_PARAMS, make_store, twin
from ..stores._pg import ENABLED as PG_ENABLED
from ..stores._pg import SKIP_REASON as PG_SKIP
from ._util import kinds


def positive(ctx: Mapping[str, Any], payload: Any) -> str | None:
    return None if isinstance(payload, int) and payload > 0 else f"add must be a positive int, got {payload!r}"


def add(ctx: Mapping[str, Any]) -> dict[str, Any]:
    return {"n": ctx["n"] + ctx["add"]}


def n_of(ctx: Mapping[str, Any]) -> Any:
    return ctx["n"]


WORKFLOWS = {
    "counter": seq(
        wait("add", check=positive), task(add), reply("add", n_of),
        wait("add", check=positive, reply=n_of), task(add),
    ),
    "gated": seq(wait("start"), wait("add", check=positive), task(add), reply("add", n_of)),
}


@pytest.fixture(params=STORE_PARAMS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    return make_store(str(request.param), tmp_path)


async def test_update_answer_survives_a_restart(store: Store) -> None:
    """An applied update's answer is kept on the case row: after a restart, the same request_id gets it again
    (nothing applied twice); the journal holds the update as a signal with `update`."""
    async with Substrate(store=store, workflows=WORKFLOWS, clock=VirtualClock()) as sub:
        h = await sub.new_case("counter", {"n": 1}, case_id="c1")
        assert await h.update("add", 2, request_id="r1") == 3
        journal = await sub.journal("c1")
        update = [r for r in journal if r.kind == "signal"][0]
        assert update.model_dump().get("update") is True and update.model_dump().get("request_id") == "r1"
    async with Substrate(store=twin(store), workflows=WORKFLOWS, clock=VirtualClock()) as sub:
        assert await sub.update("c1", "add", 2, request_id="r1") == 3
        assert sub.data("c1")["n"] == 3
        with pytest.raises(SignalRejected, match="positive int"):
            await sub.update("c1", "add", -1)
        assert await sub.update("c1", "add", 4, request_id="r2") == 3  # reply= runs before the task adds
        assert (await sub.await_case("c1"))["n"] == 7
        assert kinds(await sub.journal("c1")).count("signal") == 2
        # the case has ended: a retried call still gets its answer, from the row
        assert await sub.update("c1", "add", 2, request_id="r1") == 3
        assert await sub.update("c1", "add", 4, request_id="r2") == 3


async def test_buffered_update_keeps_its_id_across_a_restart(store: Store) -> None:
    """An update buffered when its caller gave up is answered after a restart to a retry with its request_id,
    once a wait takes it; a buffered update the check refuses then is refused to its retry and listed in
    status().refused, also after another restart (once, though the replay refuses it again)."""
    clock = VirtualClock()
    async with Substrate(store=store, workflows=WORKFLOWS, clock=clock) as sub:
        await sub.new_case("gated", {"n": 1}, case_id="g1")
        await sub.new_case("gated", {"n": 1}, case_id="g2")
        gave_up: list[BaseException] = []

        async def call(case_id: str, value: int, rid: str) -> None:
            try:
                await sub.update(case_id, "add", value, request_id=rid, timeout=5)
            except TimeoutError as exc:
                gave_up.append(exc)

        async with anyio.create_task_group() as tg:
            tg.start_soon(call, "g1", 5, "b1")
            tg.start_soon(call, "g2", 0, "b2")
            await clock.settle()
            await clock.advance(5)
        assert len(gave_up) == 2
    async with Substrate(store=twin(store), workflows=WORKFLOWS, clock=VirtualClock()) as sub:
        await sub.signal("g1", "start")
        await sub.signal("g2", "start")
        assert await sub.update("g1", "add", 5, request_id="b1") == 6
        with pytest.raises(SignalRejected, match="add must be a positive int, got 0"):
            await sub.update("g2", "add", 0, request_id="b2")
        assert sub.data("g2") == {"n": 1, "start": None}
        listed = sub.status("g2").refused
        assert [(r.kind, r.name, r.request_id) for r in listed] == [("update", "add", "b2")]
    async with Substrate(store=twin(store), workflows=WORKFLOWS, clock=VirtualClock()) as sub:
        listed = sub.status("g2").refused  # from the row, and once more in memory after a replay: listed once
        assert [(r.kind, r.name, r.request_id) for r in listed] == [("update", "add", "b2")]
        assert await sub.update("g2", "add", 2) == 3  # brought into memory: its journal replayed
        assert [(r.kind, r.request_id) for r in sub.status("g2").refused] == [("update", "b2")]


async def test_client_update_through_the_inbox(tmp_path: Path) -> None:
    """A Client's update goes through the inbox and returns the owner's answer (read from the case row); an
    unknown update name is refused from the program summary, a check= refusal comes back from the owner and is
    listed in status().refused."""
    path = str(tmp_path / "cases.db")
    async with Substrate(store=path, workflows=WORKFLOWS) as sub:
        await sub.new_case("counter", {"n": 1}, case_id="c1")
        async with Client(path) as client:
            with pytest.raises(SignalRejected, match="answers no update of that name"):
                await client.update("c1", "nope")
            assert await client.update("c1", "add", 2, request_id="k1") == 3
            assert await client.update("c1", "add", 2, request_id="k1") == 3
            with pytest.raises(SignalRejected, match="positive int"):
                await (await client.handle("c1")).update("add", -4)
            refused = sub.status("c1").refused
            assert (refused[0].kind, refused[0].name) == ("update", "add") and "positive int" in refused[0].reason
            assert await client.update("c1", "add", 1) == 3
        assert (await sub.await_case("c1"))["n"] == 4


async def test_standby_update_answered_by_the_owner(tmp_path: Path) -> None:
    """A standby's update (and a handle's) goes to the owner through the inbox and returns the owner's answer;
    repeated request ids answer as the first call, also two at once; refusals come back as SignalRejected."""
    path = str(tmp_path / "cases.db")
    async with Substrate(store=path, workflows=WORKFLOWS) as owner, Substrate(store=path, workflows=WORKFLOWS) as sub:
        assert sub.standby and not owner.standby
        handle = await sub.new_case("counter", {"n": 1}, case_id="s1")
        with pytest.raises(SignalRejected, match="answers no update of that name"):
            await sub.update("s1", "start")
        got: list[Any] = []

        async def call() -> None:
            got.append(await sub.update("s1", "add", 2, request_id="t1"))

        async with anyio.create_task_group() as tg:
            tg.start_soon(call)
            tg.start_soon(call)
        assert got == [3, 3]
        with pytest.raises(SignalRejected, match="positive int"):
            await handle.update("add", -1)
        assert await handle.update("add", 3) == 3
        assert await sub.await_case("s1") == {"n": 6, "add": 3}
        assert kinds(await owner.journal("s1")).count("signal") == 2


async def test_program_summary_lists_updates_with_their_schema(tmp_path: Path) -> None:
    """The program summary lists each update name with its payload model's JSON Schema (None without a model)."""
    from pydantic import BaseModel

    class Item(BaseModel):
        sku: int

    flows = {"cart": seq(wait("add_item", model=Item, reply=lambda c: 1), wait("note"), reply("note", n_of))}
    path = str(tmp_path / "cases.db")
    async with Substrate(store=path, workflows=flows) as sub:
        handle = await sub.new_case("cart", {"n": 0}, case_id="k")
        fingerprint = wfsub.compile(flows["cart"]).fingerprint
        summary = (await sub._store.program(fingerprint)).summary  # type: ignore[union-attr]
        assert sorted(summary["updates"]) == ["add_item", "note"]
        assert summary["updates"]["add_item"]["properties"]["sku"]["type"] == "integer"
        assert summary["updates"]["note"] is None
        with pytest.raises(SignalRejected, match="take update 'add_item'.*does not fit Item"):
            await handle.update("add_item", {"sku": "x"})


async def test_client_refuses_an_unknown_update_with_no_owner_running(tmp_path: Path) -> None:
    """With no Substrate running, a Client refuses an update name the case's version never answers (from the
    program summary), and a name it answers times out waiting, queued for the owner, which answers it later."""
    path = str(tmp_path / "cases.db")
    async with Substrate(store=path, workflows=WORKFLOWS) as sub:
        await sub.new_case("counter", {"n": 1}, case_id="c1")
    async with Client(path) as client:
        with pytest.raises(SignalRejected, match="answers no update of that name.*updates: 'add'"):
            await client.update("c1", "ad", 1)
        with pytest.raises(TimeoutError, match="got no answer within"):
            await client.update("c1", "add", 1, request_id="q1", timeout=0.2)
    async with Substrate(store=path, workflows=WORKFLOWS) as sub:
        assert await sub.update("c1", "add", 1, request_id="q1") == 2


GATE: dict[str, anyio.Event] = {}  # the test sets GATE["stop"] to end the loop below


async def tick(ctx: Mapping[str, Any]) -> dict[str, Any]:
    await anyio.sleep(0.005)
    return {"stop": GATE["stop"].is_set()}


# answers the update, then runs effects one after another (each ends at once: the case never waits long on one)
BUSY = seq(wait("add", reply=n_of), loop(effect(tick), until=lambda ctx: bool(ctx.get("stop"))), wait("end"))


@pytest.mark.parametrize("kind", ["sqlite", pytest.param("postgres", marks=pytest.mark.skipif(
    not PG_ENABLED, reason=PG_SKIP))])
async def test_a_client_gets_an_answer_while_the_case_runs_on_through_effects(kind: str, tmp_path: Path) -> None:
    """A case that answers an update and runs on through a chain of quick effects (never parking) writes the answer
    to its row with its next commit: the Client's caller gets it while the chain still runs."""
    GATE["stop"] = anyio.Event()
    store = make_store(kind, tmp_path)
    async with Substrate(store=store, workflows={"busy": BUSY}) as sub:
        await sub.new_case("busy", {"n": 1}, case_id="b1")
        async with Client(twin(store)) as client:
            with anyio.fail_after(20):
                assert await client.update("b1", "add", 2, request_id="k1") == 1
                assert not GATE["stop"].is_set()  # (the chain runs on)
                assert await client.update("b1", "add", 2, request_id="k1") == 1
            GATE["stop"].set()
        with anyio.fail_after(20):
            while sub.status("b1").signals != ("end",):  # noqa: ASYNC110 (the case's own pace)
                await anyio.sleep(0.01)
        await sub.signal("b1", "end")
        assert (await sub.await_case("b1"))["stop"] is True

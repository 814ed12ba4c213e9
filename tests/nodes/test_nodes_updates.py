"""An `update` caller whose case moves to another node while it waits (this node's actor fenced: the other node
took the case over), on Postgres: the caller gets the answer the new owner gives, whether its update was refused
unrecorded by the fenced actor (it goes through the inbox) or journaled before the move (the new owner's replay
answers it). Skipped unless WFSUB_TEST_POSTGRES names a server."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import anyio
import pytest

from wfsub import Substrate, effect, reply, seq, wait
from wfsub.stores import PostgresStore

from ..stores import _pg

pytestmark = [pytest.mark.skipif(not _pg.ENABLED, reason=_pg.SKIP_REASON), pytest.mark.anyio]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def total(ctx: Mapping[str, Any]) -> dict[str, Any]:
    return {"total": ctx["add"]["n"] * 10}


GATE: dict[str, anyio.Event] = {}  # the test opens it: the effect below ends then, on whichever node runs it


async def gated(ctx: Mapping[str, Any]) -> None:
    await GATE["open"].wait()


AT_ONCE = seq(wait("add", reply=total), wait("end"))  # answers when it takes the update
LATER = seq(wait("add"), effect(gated, name="gated"), reply("add", total), wait("end"))  # answers after an effect
FLOWS: dict[str, Any] = {"at_once": AT_ONCE, "later": LATER}


def node_store(schema: str) -> PostgresStore:
    return PostgresStore(_pg.database_dsn(), schema=schema, lease_seconds=10.0)


def moved_to(schema: str, case_id: str, node: str) -> None:
    """The case is `node`'s now, at a new epoch, as a takeover leaves it (this node could not tell: it was paused,
    say)."""
    _pg.fetchval(f'UPDATE "{schema}".cases SET owner = $2, epoch = epoch + 1 WHERE case_id = $1', case_id, node)


async def parked(sub: Substrate, case_id: str, signal: str) -> None:
    with anyio.fail_after(20):
        while signal not in sub.status(case_id).signals:  # noqa: ASYNC110 - the case's own pace
            await anyio.sleep(0.02)


async def test_an_update_refused_by_a_fenced_actor_is_answered_by_the_new_owner() -> None:
    """The case moved before this node's actor journaled the update: the update goes to the new owner's inbox and
    the caller gets that owner's answer (not a wait until its timeout)."""
    schema = _pg.new_schema()
    async with Substrate(store=node_store(schema), workflows=FLOWS, node_id="a") as a, \
            Substrate(store=node_store(schema), workflows=FLOWS, node_id="b") as b:
        await a.new_case("at_once", case_id="c1")
        await parked(a, "c1", "add")
        moved_to(schema, "c1", "b")
        with anyio.fail_after(20):
            assert await a.update("c1", "add", {"n": 4}, request_id="add-1") == {"total": 40}
        await b.signal("c1", "end")
        with anyio.fail_after(20):
            assert (await b.await_case("c1"))["add"] == {"n": 4}
        kinds = [r.kind for r in await b.journal("c1")]
        assert kinds == ["start", "signal", "signal", "end"]  # the update once (the fenced actor wrote nothing)


async def test_an_update_journaled_before_the_case_moved_is_answered_by_the_new_owner() -> None:
    """The update was journaled here and the case moved before it was answered: the caller waiting here gets the
    answer the new owner's replay gives once it can (here: once the effect before the reply ends there)."""
    schema = _pg.new_schema()
    GATE["open"] = anyio.Event()
    async with Substrate(store=node_store(schema), workflows=FLOWS, node_id="a") as a, \
            Substrate(store=node_store(schema), workflows=FLOWS, node_id="b") as b:
        await a.new_case("later", case_id="c1")
        await parked(a, "c1", "add")
        answers: list[Any] = []

        async def call() -> None:
            answers.append(await a.update("c1", "add", {"n": 2}, request_id="add-1"))

        with anyio.fail_after(20):
            async with anyio.create_task_group() as tg:
                tg.start_soon(call)
                while not a.status("c1").effects:  # noqa: ASYNC110 - the update is journaled and taken
                    await anyio.sleep(0.02)
                moved_to(schema, "c1", "b")
                loader = a._table.loader
                assert loader is not None
                assert await loader.recheck()  # what a node does after a lapsed lease: a's actor of c1 leaves
                assert "c1" not in loader.cases
                await b.signal("c1", "end")  # (b brings the case into memory, its effect in flight again)
                GATE["open"].set()
        assert answers == [{"total": 20}]
        with anyio.fail_after(20):
            assert (await b.await_case("c1"))["add"] == {"n": 2}
            # a retried call gets the same answer, from wherever it is asked
            assert await a.update("c1", "add", {"n": 2}, request_id="add-1") == {"total": 20}
            assert await b.update("c1", "add", {"n": 2}, request_id="add-1") == {"total": 20}

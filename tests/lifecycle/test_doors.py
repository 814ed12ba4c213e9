"""Tags, listing and delete through the other doors: a `wfsub.Client` and a standby Substrate beside the owner
(SQLite; two Substrates of one process hold the file's lock as two processes do)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest

from wfsub import Client, SignalRejected, Substrate, seq, task, wait

WORKFLOWS = {"flow": seq(wait("go"), task(lambda c: {"done": True}))}


@asynccontextmanager
async def owner_until(path: str, stop: anyio.Event) -> AsyncIterator[Substrate]:
    """The owning Substrate in a task of its own, open until `stop` is set."""
    opened: list[Substrate] = []
    ready = anyio.Event()

    async def run() -> None:
        async with Substrate(store=path, workflows=WORKFLOWS) as sub:
            opened.append(sub)
            ready.set()
            await stop.wait()

    async with anyio.create_task_group() as tg:
        tg.start_soon(run)
        await ready.wait()
        yield opened[0]
        stop.set()


async def test_a_client_and_a_standby_tag_list_and_delete(tmp_path: Path) -> None:
    """Cases started by a client and by a standby carry their tags; both list by tags and delete ended cases."""
    path = str(tmp_path / "cases.db")
    async with (
        owner_until(path, anyio.Event()) as owner,
        Substrate(store=path, workflows=WORKFLOWS) as standby,
        Client(path) as client,
    ):
        assert standby.standby
        await client.new_case("flow", case_id="from-client", tags={"source": "client", "t": "1"})
        await standby.new_case("flow", case_id="from-standby", tags={"source": "standby", "t": "1"})
        with pytest.raises(TypeError, match="tags must be a dict of str to str"):
            await client.new_case("flow", case_id="bad", tags=["x"])  # type: ignore[arg-type]
        assert (await client.status("from-standby")).tags == {"source": "standby", "t": "1"}
        assert standby.status("from-client").tags == {"source": "client", "t": "1"}
        assert [s.case_id for s in await client.cases(tags={"t": "1"})] == ["from-standby", "from-client"]
        assert [s.case_id for s in standby.cases(tags={"source": "client"})] == ["from-client"]
        assert [s.case_id for s in await client.cases(id_prefix="from-s")] == ["from-standby"]
        with pytest.raises(SignalRejected, match="has not ended"):
            await client.delete("from-client")
        for case_id in ("from-client", "from-standby"):
            await client.signal(case_id, "go")
            await client.await_case(case_id)
        await client.delete("from-client")
        await standby.delete("from-standby")
        assert await client.cases() == [] == owner.cases()

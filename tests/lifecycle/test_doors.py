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


class Flaky:
    fail = True


def maybe_fail(c: dict[str, object]) -> dict[str, object]:
    if Flaky.fail:
        raise RuntimeError("not yet")
    return {"ok": True}


FLAKY = {"flow": WORKFLOWS["flow"], "flaky": seq(task(maybe_fail, name="maybe"), wait("go"))}


@asynccontextmanager
async def flaky_owner(path: str, stop: anyio.Event) -> AsyncIterator[Substrate]:
    opened: list[Substrate] = []
    ready = anyio.Event()

    async def run() -> None:
        async with Substrate(store=path, workflows=FLAKY) as sub:
            opened.append(sub)
            ready.set()
            await stop.wait()

    async with anyio.create_task_group() as tg:
        tg.start_soon(run)
        await ready.wait()
        yield opened[0]
        stop.set()


async def test_a_client_and_a_standby_retry_and_fork_through_the_owner(tmp_path: Path) -> None:
    """A client's and a standby's retry and fork are done by the owner (returning once done); refusals carry the
    owner's reason, checked before anything is sent."""
    Flaky.fail = True
    path = str(tmp_path / "cases.db")
    async with (
        flaky_owner(path, anyio.Event()) as owner,
        Substrate(store=path, workflows=FLAKY) as standby,
        Client(path) as client,
    ):
        await owner.new_case("flaky", case_id="f1")
        await owner.new_case("flaky", case_id="f2")
        for case_id in ("f1", "f2"):
            with pytest.raises(Exception, match="not yet"):
                await owner.await_case(case_id)
        Flaky.fail = False  # the fix
        await client.retry("f1")
        assert owner.status("f1").state in ("initializing", "running", "waiting_signal")
        await standby.retry("f2")
        await client.signal("f1", "go")
        await standby.signal("f2", "go")
        assert (await client.await_case("f1"))["ok"] is True
        assert (await standby.await_case("f2"))["ok"] is True
        with pytest.raises(SignalRejected, match="case 'f1' cannot be retried: it is done"):
            await client.retry("f1")
        fork = await client.fork("f1", at=0, new_case_id="f1-again")
        assert fork.case_id == "f1-again" and (await client.status("f1-again")).forked_from == "f1"
        fork = await standby.fork("f2", at=0)
        assert standby.status(fork.case_id).forked_from == "f2"
        with pytest.raises(ValueError, match="has no record 9"):
            await client.fork("f1", at=9)

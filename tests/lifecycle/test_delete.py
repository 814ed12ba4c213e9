"""Deleting ended cases: refused while inputs for the case wait in the store's inbox (a queued retry or fork is
never dropped), and seen on every node of a shared store."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import pytest
from click.testing import CliRunner

from wfsub import CaseNotFound, Client, SignalRejected, Substrate, seq, task, wait
from wfsub.cli import main as cli_main
from wfsub.stores import PostgresStore

from ..durable._util import eventually
from ..stores import _pg

PG = pytest.mark.skipif(not _pg.ENABLED, reason=_pg.SKIP_REASON)
FLOW = seq(wait("go"), task(lambda ctx: {"went": True}, name="went"))


def place(kind: str, tmp_path: Path) -> Any:
    """Where the store is: an SQLite file, or a new Postgres schema (a fresh PostgresStore each call)."""
    if kind == "sqlite":
        path = str(tmp_path / "cases.db")
        return lambda: path
    dsn, schema = _pg.database_dsn(), _pg.new_schema()
    return lambda: PostgresStore(dsn, schema=schema)


@pytest.mark.parametrize("kind", ["sqlite"])  # (a Client on Postgres waits for a node to take its fork)
async def test_delete_is_refused_naming_a_fork_queued_for_the_case_until_an_owner_made_it(
    kind: str, tmp_path: Path
) -> None:
    """A Client queues a fork of an ended case while no owner runs: delete is refused naming it (kind and inbox
    id) and saying how to proceed; once an owner has made the fork, the delete goes through and the fork stays."""
    store = place(kind, tmp_path)
    options: dict[str, Any] = {"node_id": "n1"} if kind == "postgres" else {}
    async with Substrate(store=store(), workflows={"w": FLOW}, **options) as sub:
        await sub.new_case("w", {}, case_id="c")
        await sub.signal("c", "go", 1)
        await sub.await_case("c")
    async with Client(store()) as client:
        await client.fork("c", at=1, new_case_id="f")  # queued: no owner runs
        with pytest.raises(SignalRejected, match=r"fork \(inbox id \d+\).*open a Substrate on the store"):
            await client.delete("c")
        assert (await client.status("c")).state == "done"  # nothing removed
    async with Substrate(store=store(), workflows={"w": FLOW}, **options) as sub:
        await eventually(lambda: "f" in {c.case_id for c in sub.cases()})  # the owner takes the queued fork
        with anyio.fail_after(30):
            assert await sub.await_case("f") == {"go": 1, "went": True}
        await sub.delete("c")
        with pytest.raises(CaseNotFound):
            await sub.await_case("c")
        assert (await sub.journal("f"))[0].forked_from == {"case_id": "c", "seq": 1}  # type: ignore[attr-defined]


@pytest.mark.skipif(not _pg.ENABLED, reason=_pg.SKIP_REASON)
async def test_a_case_deleted_on_another_node_leaves_memory_here_and_status_says_not_found() -> None:
    """Node b deletes an ended case node a ran and keeps in memory: a's status() then raises CaseNotFound (the
    delete's notification takes the copy out of a's memory), as b's does."""
    dsn, schema = _pg.database_dsn(), _pg.new_schema()
    workflows = {"w": seq(task(lambda ctx: {"ok": True}, name="run"))}
    async with (
        Substrate(store=PostgresStore(dsn, schema=schema), workflows=workflows, node_id="a") as a,
        Substrate(store=PostgresStore(dsn, schema=schema), workflows=workflows, node_id="b") as b,
    ):
        assert await (await a.new_case("w", {}, case_id="c")).result() == {"ok": True}
        assert a.status("c").state == "done"
        await b.delete("c")

        def gone() -> bool:
            try:
                a.status("c")
            except CaseNotFound:
                return True
            return False

        await eventually(gone)
        with pytest.raises(CaseNotFound):
            b.status("c")


NUMBERED = {"w": seq(wait("go"), task(lambda ctx: {"went": ctx["n"]}, name="went"))}


@asynccontextmanager
async def doors(kind: str, tmp_path: Path) -> AsyncIterator[dict[str, Any]]:
    """Every door to one store: the Substrate that owns it ("owner"), a standby beside it (Postgres: another node,
    "other"), a Client, and the store's place for the command ("url")."""
    if kind == "sqlite":
        url = str(tmp_path / "cases.db")
        made: Any = lambda node: url  # noqa: E731
    else:
        dsn, schema = _pg.database_dsn(), _pg.new_schema()
        url = f"{dsn}?schema={schema}" if "?" not in dsn else f"{dsn}&schema={schema}"
        made = lambda node: PostgresStore(dsn, schema=schema)  # noqa: E731
    options: Any = (lambda node: {}) if kind == "sqlite" else (lambda node: {"node_id": node})
    async with (
        Substrate(store=made("a"), workflows=NUMBERED, **options("a")) as owner,
        Substrate(store=made("b"), workflows=NUMBERED, **options("b")) as other,
        Client(made("c")) as client,
    ):
        assert other.standby == (kind == "sqlite")
        yield {"owner": owner, "other": other, "client": client, "url": url}


async def delete_by(door: str, found: dict[str, Any], case_id: str) -> None:
    if door == "command":  # `wfsub delete STORE CASE`, in a thread of its own (the command runs its own loop)
        ran = await anyio.to_thread.run_sync(lambda: CliRunner().invoke(cli_main, ["delete", found["url"], case_id]))
        assert ran.exit_code == 0, ran.output
    else:
        await found[door].delete(case_id)


@pytest.mark.parametrize("kind", ["sqlite", pytest.param("postgres", marks=PG)])
@pytest.mark.parametrize(("deleter", "starter"), [
    ("client", "client"), ("other", "other"), ("command", "owner"), ("owner", "client"), ("client", "other"),
])
async def test_a_deleted_id_starts_a_new_case_through_any_door_and_it_runs(
    kind: str, deleter: str, starter: str, tmp_path: Path
) -> None:
    """A case the owner ran and keeps in memory, deleted through one door (the owner, a standby or another node,
    a Client, the command) and its id started again through another: the new case runs (it takes its signal from
    a Client and ends with its own data), and the owner's status, data and await_case give the new case."""
    async with doors(kind, tmp_path) as found:
        owner, client = found["owner"], found["client"]
        with anyio.fail_after(60):
            await owner.new_case("w", {"n": 1}, case_id="c")
            await owner.signal("c", "go")
            assert await owner.await_case("c") == {"n": 1, "go": None, "went": 1}
            await delete_by(deleter, found, "c")
            await found[starter].new_case("w", {"n": 2}, case_id="c")
            await client.signal("c", "go")
            assert await client.await_case("c") == {"n": 2, "go": None, "went": 2}
            assert await owner.await_case("c") == {"n": 2, "go": None, "went": 2}
            await eventually(lambda: owner.data("c") == {"n": 2, "go": None, "went": 2})
            assert owner.status("c").state == "done"
            assert [r.kind for r in await client.journal("c")] == ["start", "signal", "end"]

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

from wfsub import (
    CaseCancelled,
    CaseNotFound,
    Client,
    SignalRejected,
    Substrate,
    effect,
    scope,
    seq,
    start_case,
    task,
    wait,
)
from wfsub.cli import main as cli_main
from wfsub.stores import PostgresStore

from ..durable._util import eventually
from ..stores import _pg
from ._util import KINDS, node, store_maker

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
async def doors(kind: str, tmp_path: Path, workflows: Any = NUMBERED) -> AsyncIterator[dict[str, Any]]:
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
        Substrate(store=made("a"), workflows=workflows, **options("a")) as owner,
        Substrate(store=made("b"), workflows=workflows, **options("b")) as other,
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


class Gate:
    event: anyio.Event | None = None


async def undo_slowly(ctx: Any) -> dict[str, Any]:
    assert Gate.event is not None
    await Gate.event.wait()
    return {"undone": True}


FAMILY = {
    "tree": seq(
        start_case("kid", data=lambda c: {"id": c["id"]}, case_id=lambda c: f"{c['id']}-kid", into="kid"),
        start_case("leaf", case_id=lambda c: f"{c['id']}-free", wait=False, into="free"),
    ),
    "kid": seq(start_case("leaf", case_id=lambda c: f"{c['id']}-grand", into="grand"), task(lambda c: {"kid": True})),
    "leaf": task(lambda c: {"leaf": True}),
    "holds": start_case("slow", case_id=lambda c: "slow"),
    "slow": scope("s", wait("go"), on_cancel=effect(undo_slowly, name="undo")),
    "leaves": start_case("waiter", case_id=lambda c: "waiter", on_parent_cancel="abandon"),
    "waiter": seq(wait("go"), task(lambda c: {"went": True})),
}
ALL_KINDS = ["none", *KINDS]


def family_store(kind: str, tmp_path: Path) -> Any:
    return (lambda: None) if kind == "none" else store_maker(kind, tmp_path)


async def gone(sub: Substrate, case_id: str) -> bool:
    try:
        await sub.await_case(case_id, timeout=0)
    except CaseNotFound:
        return True
    return False


@pytest.mark.parametrize("kind", ALL_KINDS)
async def test_delete_removes_the_children_it_waited_for_and_theirs(kind: str, tmp_path: Path) -> None:
    """delete of an ended case removes, at once, the children it waited for and the children they waited for; a
    child it started without waiting (wait=False) stays, with its data."""
    make = family_store(kind, tmp_path)
    async with Substrate(store=make(), workflows=FAMILY, **node(kind)) as sub:
        with anyio.fail_after(30):
            await sub.new_case("tree", {"id": "t"}, case_id="t")
            assert (await sub.await_case("t"))["kid"]["grand"] == {"leaf": True}
            await sub.await_case("t-free")
            assert set(sub.status("t").children) == {"t-kid", "t-free"}
            await sub.delete("t")
            for case_id in ("t", "t-kid", "t-grand"):
                assert await gone(sub, case_id), case_id
            assert await sub.await_case("t-free") == {"leaf": True}
            assert [s.case_id for s in sub.cases()] == ["t-free"]
    if kind != "none":  # (and in the store, as another process reads it)
        async with Substrate(store=make(), workflows=FAMILY, **node(kind)) as sub:
            assert [s.case_id for s in sub.cases()] == ["t-free"]


@pytest.mark.parametrize("kind", ALL_KINDS)
async def test_delete_is_refused_while_a_child_cancelled_with_it_has_not_ended(kind: str, tmp_path: Path) -> None:
    """A cancelled parent whose child (on_parent_cancel="cancel") still runs its cancel handler: delete is refused
    naming the child and what to do; once the child has ended, delete removes both."""
    Gate.event = anyio.Event()
    async with Substrate(store=family_store(kind, tmp_path)(), workflows=FAMILY, **node(kind)) as sub:
        with anyio.fail_after(30):
            await sub.new_case("holds", {}, case_id="h")
            await eventually(lambda: "slow" in {s.case_id for s in sub.cases()}
                             and sub.status("slow").state == "waiting_signal")
            await sub.cancel("h")
            await eventually(lambda: sub.status("h").state == "cancelled")
            await eventually(lambda: sub.status("slow").state in ("waiting_effect", "running"))
            with pytest.raises(SignalRejected, match=r"children it waited for, cancelled with it .* 'slow' \("):
                await sub.delete("h")
            assert sub.status("h").state == "cancelled"  # nothing removed
            Gate.event.set()
            with pytest.raises(CaseCancelled):
                await sub.await_case("slow")
            await sub.delete("h")
            assert await gone(sub, "h") and await gone(sub, "slow")


@pytest.mark.parametrize("kind", ALL_KINDS)
async def test_delete_leaves_a_child_it_abandoned_running(kind: str, tmp_path: Path) -> None:
    """A cancelled parent whose child (on_parent_cancel="abandon") runs on: delete removes the parent and leaves
    the child running, a case of its own (it takes its signal and ends; then it is deleted on its own)."""
    async with Substrate(store=family_store(kind, tmp_path)(), workflows=FAMILY, **node(kind)) as sub:
        with anyio.fail_after(30):
            await sub.new_case("leaves", {}, case_id="l")
            await eventually(lambda: "waiter" in {s.case_id for s in sub.cases()}
                             and sub.status("waiter").state == "waiting_signal")
            await sub.cancel("l")
            with pytest.raises(CaseCancelled):
                await sub.await_case("l")
            await sub.delete("l")
            assert await gone(sub, "l")
            assert sub.status("waiter").state == "waiting_signal"
            await sub.signal("waiter", "go")
            assert await sub.await_case("waiter") == {"go": None, "went": True}
            await sub.delete("waiter")
            assert await gone(sub, "waiter")


@pytest.mark.parametrize("kind", ["sqlite", pytest.param("postgres", marks=PG)])
async def test_a_client_and_the_command_delete_the_children_a_case_waited_for(kind: str, tmp_path: Path) -> None:
    """Through a Client and through `wfsub delete`, as through the Substrate: the children the case waited for
    (and theirs) go with it, the one it did not wait for stays."""
    async with doors(kind, tmp_path, FAMILY) as found:
        owner, client = found["owner"], found["client"]
        with anyio.fail_after(30):
            for case_id in ("t1", "t2"):  # (their children: t1-kid and its t1-grand, and t1-free not waited for)
                await owner.new_case("tree", {"id": case_id}, case_id=case_id)
                await owner.await_case(case_id)
                await owner.await_case(f"{case_id}-free")
            await client.delete("t1")
            for case_id in ("t1", "t1-kid", "t1-grand"):
                with pytest.raises(CaseNotFound):
                    await client.await_case(case_id)
            await delete_by("command", found, "t2")
            assert {s.case_id for s in await client.cases()} == {"t1-free", "t2-free"}

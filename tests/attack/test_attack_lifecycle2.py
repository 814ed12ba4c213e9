"""Attacks on retry, fork and delete where they race each other, other nodes, clients and a failing database:
a delete landing between a retry's read and its write, two nodes retrying one case, a client's retry of a case
whose node is gone, answers lost while a retry takes a case over."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from wfsub import CaseFailed, CaseNotFound, Client, SignalRejected, Substrate, seq, task
from wfsub.stores import MemoryStore, PostgresStore, SqliteStore

from ..durable._util import eventually
from ..lifecycle._util import KINDS
from ..stores import _pg
from ..stores._proxy import PROXY_CONNECT, Proxy


def failing_until_fixed() -> tuple[dict[str, Any], Any]:
    """A workflow whose one task fails until `fixed["ok"]`; `fixed["runs"]` counts its runs."""
    fixed: dict[str, Any] = {"ok": False, "runs": 0}

    def step(ctx: Any) -> dict[str, Any]:
        fixed["runs"] += 1
        if not fixed["ok"]:
            raise RuntimeError("not fixed yet")
        return {"done": True}

    return fixed, seq(task(step, name="step"))


def deleting_during_retry(kind: str, tmp_path: Path) -> Any:
    """A store of `kind` that, once armed with a case id, deletes that case (the store's own delete, as another
    door would) right after the next read of its journal: the moment between a retry's reads and its write."""
    base: Any = {"memory": MemoryStore, "sqlite": SqliteStore, "postgres": PostgresStore}[kind]

    class Racing(base):  # type: ignore[misc, valid-type]
        armed: str | None = None
        deleted = False

        async def journal(self, case_id: str) -> Any:
            records = await super().journal(case_id)
            if case_id == self.armed:
                self.armed = None
                self.deleted = await self.delete(case_id)
            return records

    if kind == "memory":
        return Racing()
    if kind == "sqlite":
        return Racing(str(tmp_path / "cases.db"))
    return Racing(_pg.database_dsn(), schema=_pg.emptied_schema())


@pytest.mark.parametrize("kind", KINDS)
async def test_a_delete_between_a_retrys_read_and_its_write_leaves_no_broken_case(kind: str, tmp_path: Path) -> None:
    """A failed case is deleted after retry() read it and before its `retry` record is written: the retry is
    refused with CaseNotFound and the case stays gone, rather than the retry writing a row and a journal holding
    only its `retry` record (a case that cannot be loaded: suspended with KeyError 'data', listed for good)."""
    store = deleting_during_retry(kind, tmp_path)
    fixed, flow = failing_until_fixed()
    options = {"node_id": "n1"} if kind == "postgres" else {}
    async with Substrate(store=store, workflows={"w": flow}, **options) as sub:
        with pytest.raises(CaseFailed):
            await (await sub.new_case("w", {}, case_id="c")).result()
        fixed["ok"] = True
        store.armed = "c"
        with pytest.raises(CaseNotFound):
            await sub.retry("c")
        assert store.deleted
        assert await store.row("c") is None and await store.journal("c") == []
        with pytest.raises(CaseNotFound):
            await sub.await_case("c", timeout=0)
        assert [s.case_id for s in sub.cases()] == []


async def failed_on_a_gone_node(dsn: str, schema: str, flow: Any) -> None:
    """Case "c" failed on node "x", which then stopped; returns once x's lease ran out on the database's clock."""
    async with Substrate(store=PostgresStore(dsn, schema=schema, lease_seconds=0.5), workflows={"w": flow},
                         node_id="x") as x:
        with pytest.raises(CaseFailed):
            await (await x.new_case("w", {}, case_id="c")).result()
    live = f"SELECT count(*) FROM {schema}.nodes WHERE node_id = 'x' AND lease_until > {schema}.db_now()"
    with anyio.fail_after(10):
        while _pg.fetchval(live):  # noqa: ASYNC110 - x's lease runs out on the database's clock
            await anyio.sleep(0.02)


@pytest.mark.skipif(not _pg.ENABLED, reason=_pg.SKIP_REASON)
async def test_two_nodes_retrying_a_case_of_a_gone_node_at_once_reopen_it_once() -> None:
    """Nodes a and b retry at once a case that failed on node x, gone for good: one re-opens it, the other is
    refused saying where the case is now (never that the gone node x owns it, which would send the caller to a
    node that no longer exists), and the case runs its failed step once more and ends done."""
    dsn, schema = _pg.database_dsn(), _pg.new_schema()
    fixed, flow = failing_until_fixed()
    await failed_on_a_gone_node(dsn, schema, flow)
    fixed["ok"] = True
    async with (
        Substrate(store=PostgresStore(dsn, schema=schema), workflows={"w": flow}, node_id="a") as a,
        Substrate(store=PostgresStore(dsn, schema=schema), workflows={"w": flow}, node_id="b") as b,
    ):
        outcomes: dict[str, Any] = {}

        async def retry(sub: Substrate, name: str) -> None:
            try:
                outcomes[name] = await sub.retry("c")
            except SignalRejected as exc:
                outcomes[name] = exc

        with anyio.fail_after(20):
            async with anyio.create_task_group() as tg:
                tg.start_soon(retry, a, "a")
                tg.start_soon(retry, b, "b")
            refused = [o for o in outcomes.values() if isinstance(o, SignalRejected)]
            assert len(refused) == 1, outcomes
            assert "'x'" not in str(refused[0]), str(refused[0])
            assert await a.await_case("c") == {"done": True} and await b.await_case("c") == {"done": True}
        assert [r.kind for r in await a.journal("c")] == ["start", "end", "retry", "end"]
        assert fixed["runs"] == 2


@pytest.mark.skipif(not _pg.ENABLED, reason=_pg.SKIP_REASON)
async def test_a_clients_retry_of_a_case_whose_node_is_gone_is_done_by_a_live_node() -> None:
    """A Client (as `wfsub retry`) retries a case that failed on node x, gone for good, while node y runs: y
    takes the queued retry, takes the case over and re-opens it, so the Client's retry returns and the case ends
    done; before, only x took inputs for its cases, and the Client waited for good."""
    dsn, schema = _pg.database_dsn(), _pg.new_schema()
    fixed, flow = failing_until_fixed()
    await failed_on_a_gone_node(dsn, schema, flow)
    fixed["ok"] = True
    async with (
        Substrate(store=PostgresStore(dsn, schema=schema), workflows={"w": flow}, node_id="y") as y,
        Client(PostgresStore(dsn, schema=schema)) as client,
    ):
        with anyio.fail_after(20):
            await client.retry("c")
            assert await client.await_case("c") == {"done": True}
            # (the row is read by others as soon as it commits; y hears that its commit went through just after)
            assert await y.await_case("c") == {"done": True}
        assert y.status("c").state == "done"
        assert [r.kind for r in await client.journal("c")] == ["start", "end", "retry", "end"]


@pytest.mark.skipif(not _pg.ENABLED, reason=_pg.SKIP_REASON)
async def test_a_delete_whose_notice_a_node_missed_still_leaves_that_nodes_memory() -> None:
    """Node a's connection to the database is down while node b deletes a case a ran and keeps in memory (a's
    listener misses the delete's NOTIFY, then reconnects): a's status() still comes to raise CaseNotFound,
    rather than answering 'done' for a deleted case for as long as a runs."""
    dsn, schema = _pg.database_dsn(), _pg.new_schema()
    proxy = Proxy(dsn)
    workflows = {"w": seq(task(lambda ctx: {"ok": True}, name="run"))}
    try:
        async with (
            Substrate(store=PostgresStore(proxy.dsn, schema=schema, retry_for=10, connect_timeout=PROXY_CONNECT),
                      workflows=workflows, node_id="a") as a,
            Substrate(store=PostgresStore(dsn, schema=schema), workflows=workflows, node_id="b") as b,
        ):
            assert await (await a.new_case("w", {}, case_id="c")).result() == {"ok": True}
            proxy.down()
            await b.delete("c")
            proxy.up()

            def gone() -> bool:
                try:
                    a.status("c")
                except CaseNotFound:
                    return True
                return False

            await eventually(gone)
    finally:
        proxy.down()


@pytest.mark.skipif(not _pg.ENABLED, reason=_pg.SKIP_REASON)
async def test_a_fork_queued_while_a_delete_waits_for_the_case_row_makes_the_delete_refuse() -> None:
    """A Client's delete waits for the case row (another transaction holds it, as an owner's write does) while
    another Client queues a fork of the case: the delete is refused naming the waiting fork, as it is when the
    fork was queued first; the case is not deleted under an input that waits for it."""
    import asyncpg

    dsn, schema = _pg.database_dsn(), _pg.new_schema()
    flow = seq(task(lambda ctx: {"ok": True}, name="run"))
    async with Substrate(store=PostgresStore(dsn, schema=schema), workflows={"w": flow}, node_id="n1") as sub:
        assert await (await sub.new_case("w", {}, case_id="c")).result() == {"ok": True}
    holder = await asyncpg.connect(dsn)
    outcome: dict[str, Any] = {}
    try:
        held = holder.transaction()
        await held.start()
        await holder.execute(f"SELECT 1 FROM {schema}.cases WHERE case_id = 'c' FOR UPDATE")
        async with (
            Client(PostgresStore(dsn, schema=schema)) as deleter,
            Client(PostgresStore(dsn, schema=schema)) as forker,
            anyio.create_task_group() as tg,
        ):
            async def delete() -> None:
                try:
                    await deleter.delete("c")
                    outcome["delete"] = "deleted"
                except SignalRejected as exc:
                    outcome["delete"] = exc

            tg.start_soon(delete)
            waiting = (
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()"
            )
            await eventually(lambda: holder.fetchval(waiting), limit=10)

            async def fork() -> None:
                await forker.fork("c", at=1, new_case_id="f")  # waits for an owner to make it: cancelled below

            tg.start_soon(fork)
            await eventually(lambda: holder.fetchval(f"SELECT count(*) FROM {schema}.inbox"), limit=10)
            await held.commit()
            await eventually(lambda: "delete" in outcome, limit=10)
            tg.cancel_scope.cancel()
    finally:
        await holder.close()
    assert isinstance(outcome["delete"], SignalRejected) and "fork (inbox id" in str(outcome["delete"])


@pytest.mark.skipif(not _pg.ENABLED, reason=_pg.SKIP_REASON)
async def test_a_delete_waits_for_an_inbox_put_in_flight_without_holding_the_case_row() -> None:
    """An input put for a case whose transaction has not committed yet (a group commit still under way) makes a
    Client's delete wait, holding no lock on the case row meanwhile (that transaction may go on to write the row
    and commit), then refuse naming the input."""
    import asyncpg

    dsn, schema = _pg.database_dsn(), _pg.new_schema()
    flow = seq(task(lambda ctx: {"ok": True}, name="run"))
    async with Substrate(store=PostgresStore(dsn, schema=schema), workflows={"w": flow}, node_id="n1") as sub:
        assert await (await sub.new_case("w", {}, case_id="c")).result() == {"ok": True}
    group = await asyncpg.connect(dsn, server_settings={"search_path": schema})
    outcome: dict[str, Any] = {}
    try:
        held = group.transaction()
        await held.start()
        await group.fetchval("SELECT inbox_put('x', 'c', 'retry', '{}', NULL, 0, NULL)")
        async with Client(PostgresStore(dsn, schema=schema)) as deleter, anyio.create_task_group() as tg:
            async def delete() -> None:
                try:
                    await deleter.delete("c")
                    outcome["delete"] = "deleted"
                except SignalRejected as exc:
                    outcome["delete"] = exc

            tg.start_soon(delete)
            waiting = (  # the delete waits for the case's inbox key (a bigint key: classid, objid)
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND objsubid = 1 "
                "AND ((classid::bigint << 32) | objid::bigint) = inbox_lock_key('c')"
            )
            await eventually(lambda: group.fetchval(waiting), limit=10)
            with anyio.fail_after(10):  # the delete let the row go while it waits: this does not deadlock
                await group.fetchval("SELECT 1 FROM cases WHERE case_id = 'c' FOR UPDATE")
            await held.commit()
            await eventually(lambda: "delete" in outcome, limit=10)
    finally:
        await group.close()
    assert isinstance(outcome["delete"], SignalRejected) and "retry (inbox id" in str(outcome["delete"])


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
async def test_a_compacted_case_failing_again_after_a_retry_is_retried_again_and_ends_once(
    kind: str, tmp_path: Path
) -> None:
    """An endless case compacted every 3 records fails, is retried, is compacted past its retry, fails at another
    step and is retried again (its earlier retry counted from the snapshot): it runs on to one `end` of run 2,
    and a restarted Substrate reads the same data back."""
    from wfsub import loop, wait

    fixes = {"a": False, "b": False}

    def add(ctx: Any) -> dict[str, Any]:
        n = ctx.get("n", 0) + 1
        if (n == 5 and not fixes["a"]) or (n == 10 and not fixes["b"]):
            raise RuntimeError(f"bad at {n}")
        return {"n": n, "total": ctx.get("total", 0) + ctx["item"]}

    workflows = {"cart": loop(seq(wait("add", into="item"), task(add, name="add")), while_=lambda d: d["n"] < 12)}
    store: Any = MemoryStore() if kind == "memory" else str(tmp_path / "cases.db")
    async with Substrate(store=store, workflows=workflows, compact_after=3) as sub:
        await sub.new_case("cart", {"n": 0}, case_id="c")
        for fix, items in (("a", range(5)), ("b", range(5, 10))):
            for i in items:
                await sub.signal("c", "add", i, request_id=f"r{i}")
            with anyio.fail_after(10), pytest.raises(CaseFailed):
                await sub.await_case("c")
            assert (await sub.journal("c"))[0].kind == "snapshot"
            fixes[fix] = True
            await sub.retry("c")
        retry = (await sub.journal("c"))[-1]
        assert (retry.kind, retry.model_dump().get("run")) == ("retry", 2)
        for i in range(10, 12):
            await sub.signal("c", "add", i, request_id=f"r{i}")
        with anyio.fail_after(10):
            assert await sub.await_case("c") == {"item": 11, "n": 12, "total": sum(range(12))}
        assert [r.kind for r in await sub.journal("c")].count("end") == 1
    async with Substrate(store=store, workflows=workflows, compact_after=3) as sub:
        assert await sub.await_case("c", timeout=0) == {"item": 11, "n": 12, "total": sum(range(12))}

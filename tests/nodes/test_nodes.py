"""Several Substrates (nodes) sharing cases on one Postgres database: inputs and awaiters across nodes, queued
cases, and a node killed with SIGKILL while the others carry on. Skipped unless WFSUB_TEST_POSTGRES names a server.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import anyio
import pytest

from wfsub import Substrate
from wfsub.stores import Listing, PostgresStore

from .. import _warm
from ..stores import _pg
from ._flows import FLOWS

pytestmark = [pytest.mark.skipif(not _pg.ENABLED, reason=_pg.SKIP_REASON), pytest.mark.anyio]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def node_store(schema: str) -> PostgresStore:
    return PostgresStore(_pg.database_dsn(), schema=schema, lease_seconds=2.0)


async def owner_of(schema: str, case_id: str) -> str | None:
    """The node that owns a case, as its row says (read as the wfsub command reads it)."""
    operator = PostgresStore(_pg.database_dsn(), schema=schema, create=False)
    await operator.open(owner=False, owner_id="operator")
    try:
        row = await operator.row(case_id)
        return None if row is None else row.owner
    finally:
        await operator.close()


async def test_a_case_of_one_node_is_signalled_and_awaited_through_another() -> None:
    """Node B signals a case node A owns (through the inbox) and awaits it (woken by its end on A)."""
    schema = _pg.new_schema()
    async with Substrate(store=node_store(schema), workflows=FLOWS, node_id="a") as a, \
            Substrate(store=node_store(schema), workflows=FLOWS, node_id="b") as b:
        await a.new_case("order", {"n": 1}, case_id="c1")
        with anyio.fail_after(10):
            while b.status("c1").state != "waiting_signal":  # noqa: ASYNC110 - A's row, read from B
                await anyio.sleep(0.05)
            await b.signal("c1", "go", {"from": "b"}, request_id="go-1")
            result = await b.await_case("c1")
        assert result["done"] and result["go"] == {"from": "b"}
        assert await owner_of(schema, "c1") == "a"  # it ran on A


async def test_a_queued_case_runs_on_a_node_that_claims_it() -> None:
    """new_case(placement="any") queues the case; a node claims it and runs it; the starter's handle follows."""
    schema = _pg.new_schema()
    async with Substrate(store=node_store(schema), workflows=FLOWS, node_id="a") as a, \
            Substrate(store=node_store(schema), workflows=FLOWS, node_id="b"):
        handle = await a.new_case("order", {"n": 2}, case_id="q1", placement="any")
        with anyio.fail_after(10):
            while handle.status().state != "waiting_signal":  # noqa: ASYNC110 - wherever it runs
                await anyio.sleep(0.05)
            await handle.signal("go")
            assert (await handle.result())["done"]
        assert await owner_of(schema, "q1") in ("a", "b")  # a node claimed it


def test_placement_any_needs_a_shared_store() -> None:
    """placement='any' on a Substrate without a shared store is refused with the fix."""
    async def start() -> None:
        async with Substrate(workflows=FLOWS) as sub:
            await sub.new_case("order", placement="any")

    with pytest.raises(ValueError, match="shared store"):
        anyio.run(start)


@pytest.mark.long
async def test_a_killed_node_loses_nothing_acknowledged_and_no_case_runs_twice(tmp_path: Path) -> None:
    """A SIGKILLed node of three loses no acknowledged signal, and no case runs twice or interleaves two owners."""
    # Three node processes share 1,002 cases: every case ends once, each acknowledged signal is in its journal,
    # and epochs never go back.
    schema = _pg.new_schema()
    dsn = _pg.database_dsn()
    per_node, nodes = 334, 3
    env = {**os.environ, "WFSUB_TEST_CALLS": str(tmp_path / "calls.txt")}
    procs = [
        _warm.Popen(  # started once, before the test's own event loop work
            [sys.executable, "-m", "tests.nodes._node", dsn, schema, f"node{i}", str(i * per_node), str(per_node)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=Path(__file__).parents[2],
        )
        for i in range(nodes)
    ]
    try:
        for proc in procs:
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == "started"
        operator = PostgresStore(dsn, schema=schema, create=False)
        await operator.open(owner=False, owner_id="operator")
        try:
            acked: list[str] = []
            order = [k * per_node + i for i in range(per_node) for k in range(nodes)]  # the nodes' cases in turn
            for sent, n in enumerate(order):
                await operator.inbox_put(f"c{n}", "signal", {"name": "go"}, request_id=f"go-{n}",
                                         created_at=time.time())
                acked.append(f"c{n}")  # committed: acknowledged
                if sent == len(order) // 3:
                    procs[0].send_signal(signal.SIGKILL)  # node0 dies with cases parked, running, signalled
            with anyio.fail_after(180):
                while len(await operator.cases(Listing(state="done", limit=2000))) < per_node * nodes:  # noqa: ASYNC110
                    await anyio.sleep(0.2)
            for case_id in acked:
                records = await operator.journal(case_id)
                kinds = [r["kind"] for r in records]
                assert kinds.count("end") == 1 and records[-1]["kind"] == "end", (case_id, kinds)
                assert [r.get("request_id") for r in records].count(f"go-{case_id[1:]}") == 1, (case_id, kinds)
                epochs = [epoch for _, epoch in await operator.journal_epochs(case_id)]
                assert epochs == sorted(epochs), (case_id, epochs)
            taken = [f"c{n}" for n in range(per_node) if max(e for _, e in await operator.journal_epochs(f"c{n}")) > 1]
            assert taken  # node0's cases were taken over and finished elsewhere
        finally:
            await operator.close()
    finally:
        for proc in procs:
            assert proc.stdin is not None and proc.stdout is not None
            if not proc.stdin.closed:
                with contextlib.suppress(BrokenPipeError):  # the killed one
                    proc.stdin.close()  # the live nodes leave their Substrates cleanly
        for proc in procs:
            proc.wait(timeout=30)
            assert proc.stdout is not None
            proc.stdout.close()


async def test_a_paused_process_of_a_node_id_is_fenced_when_another_opens_as_that_node() -> None:
    """A paused node process is fenced when another opens as its node id; the case completes once, on the new one."""
    # The new opener bumps the epochs of the node's live cases, so the paused one can append nothing once it wakes.
    schema = _pg.new_schema()
    dsn = _pg.database_dsn()
    old = _warm.Popen(  # started once, before the test's own event loop work
        [sys.executable, "-m", "tests.nodes._node", dsn, schema, "n", "0", "1"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=Path(__file__).parents[2],
    )
    try:
        assert old.stdout is not None and old.stdout.readline().strip() == "started"
        operator = PostgresStore(dsn, schema=schema, create=False)
        await operator.open(owner=False, owner_id="operator")
        try:
            with anyio.fail_after(20):
                while (row := await operator.row("c0")) is None or row.state != "waiting_signal":  # noqa: ASYNC110 - another process
                    await anyio.sleep(0.05)
            before = row.epoch
            old.send_signal(signal.SIGSTOP)
            await anyio.sleep(2.5)  # past its 2 s lease
            async with Substrate(store=node_store(schema), workflows=FLOWS, node_id="n") as new:
                row = await operator.row("c0")
                assert row is not None and row.epoch > before  # the old process's epoch is stale now
                old.send_signal(signal.SIGCONT)  # it wakes and sees the signal below too (same node id)
                await new.signal("c0", "go", {"from": "new"}, request_id="go-0")
                with anyio.fail_after(20):
                    assert (await new.await_case("c0"))["done"]
            records = await operator.journal("c0")
            kinds = [r["kind"] for r in records]
            assert kinds.count("end") == 1 and kinds.count("signal") == 1, kinds
            epochs = [epoch for _, epoch in await operator.journal_epochs("c0")]
            assert epochs == sorted(epochs) and epochs[-1] > before, epochs
        finally:
            await operator.close()
    finally:
        old.send_signal(signal.SIGCONT)
        assert old.stdin is not None and old.stdout is not None
        with contextlib.suppress(BrokenPipeError):
            old.stdin.close()
        old.wait(timeout=30)
        old.stdout.close()


async def test_dropped_connections_lose_nothing_acknowledged() -> None:
    """Killing every store connection while signals flow loses no acknowledged signal, and every case completes."""
    # Connections die by pg_terminate_backend; each acknowledged signal is in its case's journal once.
    schema = _pg.new_schema()
    async with Substrate(store=node_store(schema), workflows=FLOWS, node_id="a") as sub:
        ids = [(await sub.new_case("order", {"n": i}, case_id=f"d{i}")).case_id for i in range(40)]
        with anyio.fail_after(20):
            while any(sub.status(c).state != "waiting_signal" for c in ids):  # noqa: ASYNC110
                await anyio.sleep(0.05)
            acked = []
            for i, case_id in enumerate(ids):
                if i in (10, 25):
                    _pg.fetchval(
                        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                        "WHERE datname = current_database() AND pid <> pg_backend_pid()"
                    )
                await sub.signal(case_id, "go", request_id=f"go-{i}")
                acked.append(case_id)
            for case_id in acked:
                assert (await sub.await_case(case_id))["done"]
        for i, case_id in enumerate(acked):
            kinds = [(r.kind, getattr(r, "request_id", None)) for r in await sub.journal(case_id)]
            assert kinds.count(("signal", f"go-{i}")) == 1 and kinds[-1][0] == "end", kinds

"""What only the Postgres store has: several nodes on one schema (leases, fencing, takeover, queued cases),
NOTIFY, connection loss, and the schema's version. Two store objects on one schema play two nodes.

Leases are expired by hand (an UPDATE of the node's row) rather than by sleeping, so no test waits for a clock.
Skipped unless WFSUB_TEST_POSTGRES names a server (see _pg.py)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import pytest

from wfsub._errors import StoreConflict, StoreError
from wfsub._store import SCHEMA_VERSION, CaseWrite
from wfsub._store._postgres import _process_name
from wfsub._store._postgres_driver import fault
from wfsub.stores import PostgresStore

from . import _pg
from ._helpers import end, first_write, make_store, opened, row, signal, start, twin
from ._proxy import PROXY_CONNECT, Proxy

pytestmark = pytest.mark.skipif(not _pg.ENABLED, reason=_pg.SKIP_REASON)


def new_store(tmp_path: Path, *, fresh: bool = False, **options: Any) -> PostgresStore:
    """A store on the emptied shared schema, or (fresh=True: tests of the layout) on a schema of its own."""
    if fresh:
        return PostgresStore(_pg.database_dsn(), schema=_pg.new_schema(), **options)
    store = make_store("postgres", tmp_path, **options)
    assert isinstance(store, PostgresStore)
    return store


def sql(store: PostgresStore, text: str, *args: Any) -> Any:
    """Run one statement on the store's schema from outside the store (names in `text` are qualified here)."""
    return _pg.fetchval(text.replace("S.", f'"{store.schema}".'), *args)


def expire(store: PostgresStore, node: str) -> None:
    """The node's lease runs out now (as if it had stopped renewing)."""
    sql(store, "UPDATE S.nodes SET lease_until = S.db_now() - 1 WHERE node_id = $1", node)


@contextmanager
def connected_as(name: str) -> Iterator[None]:
    """A connection named `name` (application_name) held open meanwhile, from a thread of its own: a live node
    process's connection, as the database sees it."""
    ready, done = threading.Event(), threading.Event()

    async def hold() -> None:
        import asyncpg

        conn = await asyncpg.connect(_pg.database_dsn(), server_settings={"application_name": name})
        ready.set()
        await asyncio.get_running_loop().run_in_executor(None, done.wait)
        await conn.close()

    thread = threading.Thread(target=asyncio.run, args=(hold(),))
    thread.start()
    try:
        assert ready.wait(30)
        yield
    finally:
        done.set()
        thread.join()


def terminate(pids: list[int]) -> int:
    count: int = _pg.fetchval("SELECT count(pg_terminate_backend(pid)) FROM unnest($1::int[]) AS pid", pids)
    return count


@asynccontextmanager
async def nodes(store: PostgresStore, *names: str, **options: Any) -> AsyncIterator[list[PostgresStore]]:
    """One open store object per node name, all on the store's schema (the first is `store` itself)."""
    stores = [store, *(twin(store, **options) for _ in names[1:])]
    opened_ = []
    try:
        for each, name in zip(stores, names):
            await each.open(owner=True, owner_id=name)
            opened_.append(each)
        yield [s for s in stores if isinstance(s, PostgresStore)]
    finally:
        for each in opened_:
            await each.close()


def queued(case_id: str, fingerprint: str = "fp-1") -> CaseWrite:
    r = row(case_id, "initializing")
    r.fingerprint = fingerprint
    return CaseWrite(case_id, records=[start(case_id)], row=r)


# -- fencing and takeover ----------------------------------------------------------------------------------------


async def test_a_node_whose_case_was_taken_over_writes_nothing_more_for_it(tmp_path: Path) -> None:
    """After B takes A's case over (epoch 2), A's writes fail with StoreConflict naming B and change nothing."""
    async with nodes(new_store(tmp_path), "A", "B") as (a, b):
        await a.write(first_write("c"))
        assert await a.write(CaseWrite("c", records=[signal(1)], epoch=1)) == [True]
        assert await b.take_over() == []  # A's lease holds: nothing to take
        expire(a, "A")
        taken = await b.take_over()
        assert [(r.case_id, r.owner, r.epoch) for r in taken] == [("c", "B", 2)]
        with pytest.raises(StoreConflict, match=r"owned by node 'B' at epoch 2, not by node 'A' at epoch 1"):
            await a.write(CaseWrite("c", records=[signal(2)], row=row("c", "done", last_seq=2), epoch=1))
        with pytest.raises(StoreConflict, match="node 'B' at epoch 2"):  # epoch None still checks the owner
            await a.write(CaseWrite("c", records=[signal(2)]))
        stale = await b.row("c")
        assert stale is not None and (stale.state, stale.last_seq) == ("running", 0)
        with pytest.raises(StoreConflict, match="epoch 2"):  # B with A's old epoch is fenced too
            await b.write(CaseWrite("c", records=[signal(2)], epoch=1))
        assert await b.write(CaseWrite("c", records=[signal(2), end(3)], epoch=2)) == [True, True]
        assert [r["seq"] for r in await b.journal("c")] == [0, 1, 2, 3]
        assert await b.journal_epochs("c") == [(0, 1), (1, 1), (2, 2), (3, 2)]
        assert await b.take_over() == []  # ended or owned: nothing more


async def test_concurrent_takers_never_take_one_case_twice(tmp_path: Path) -> None:
    """Three nodes take over a dead node's 120 cases at once, 7 at a time: each case goes to exactly one."""
    async with nodes(new_store(tmp_path), "dead", "n1", "n2", "n3") as (dead, *takers):
        async with anyio.create_task_group() as tg:
            for i in range(120):
                tg.start_soon(dead.write, first_write(f"c{i}"))
        expire(dead, "dead")
        got: dict[str, list[str]] = {t.node_id or "": [] for t in takers}

        async def take(node: PostgresStore) -> None:
            while rows := await node.take_over(limit=7):
                got[node.node_id or ""].extend(r.case_id for r in rows)
                assert all(r.epoch == 2 and r.owner == node.node_id for r in rows)

        async with anyio.create_task_group() as tg:
            for node in takers:
                tg.start_soon(take, node)
        every = [case for cases in got.values() for case in cases]
        assert sorted(every) == sorted(f"c{i}" for i in range(120))
        for node in takers:
            assert {r.case_id for r in await node.live()} == set(got[node.node_id or ""])


async def test_take_over_needs_a_live_lease_and_close_gives_the_lease_up(tmp_path: Path) -> None:
    """Taking over needs a live lease of one's own; a node that closes lets its cases be taken at once."""
    async with nodes(new_store(tmp_path), "A", "B") as (a, b):
        await a.write(first_write("c"))
        expire(b, "B")
        with pytest.raises(StoreError, match="lease of node B has expired"):
            await b.take_over()
        before = await b.database_time()
        renewed = await b.renew_lease()
        assert before <= renewed <= await b.database_time()
        await a.close()
        assert [r.case_id for r in await b.take_over()] == ["c"]


async def test_renew_lease_extends_it_and_fails_once_the_node_id_is_someone_elses(tmp_path: Path) -> None:
    """renew_lease() extends the lease by lease_seconds; once another process holds the node id it fails."""
    store = new_store(tmp_path, lease_seconds=5.0)
    async with nodes(store, "A") as (a,):
        now = await a.renew_lease()
        until = sql(a, "SELECT lease_until FROM S.nodes WHERE node_id = 'A'")
        assert until == pytest.approx(now + 5.0, abs=0.05)
        sql(a, "UPDATE S.nodes SET pid = pid + 1 WHERE node_id = 'A'")  # another process holds "A" now
        with pytest.raises(StoreError, match="cannot renew the lease of node 'A'"):
            await a.renew_lease()
        alive = connected_as(_process_name("A", a._pid + 1, a._host))  # that process is alive (connected)
        with alive, pytest.raises(StoreError, match=r"another live process holds that node id \(pid"):
            await twin(a).open(owner=True, owner_id="A")


async def test_each_node_sees_only_its_own_live_due_and_inbox_work(tmp_path: Path) -> None:
    """live, due, next_due and inbox_take answer for this node's cases; a store without a lease sees all."""
    async with nodes(new_store(tmp_path), "A", "B") as (a, b):
        await a.write(first_write("a-run"))
        await a.write(first_write("a-park", "waiting_timer", next_due=10.0))
        await b.write(first_write("b-run"))
        await b.write(first_write("b-park", "waiting_signal", next_due=5.0))
        for case_id in ("a-run", "b-run", "nobody"):
            await b.inbox_put(case_id, "signal", {"name": "go"}, request_id=None, created_at=1.0)
        assert [r.case_id for r in await a.live()] == ["a-run"]
        assert [r.case_id for r in await a.due(100.0)] == ["a-park"] and await a.next_due() == 10.0
        assert [r.case_id for r in await b.due(100.0)] == ["b-park"] and await b.next_due() == 5.0
        assert [r.case_id for r in await a.inbox_take()] == ["a-run", "nobody"]
        assert [r.case_id for r in await b.inbox_take()] == ["b-run", "nobody"]
        viewer = twin(a)
        async with opened(viewer, owner=False, owner_id="cli"):
            assert {r.case_id for r in await viewer.live()} == {"a-run", "b-run"}
            assert len(await viewer.inbox_take()) == 3 and await viewer.next_due() == 5.0
            with pytest.raises(StoreError, match="without a lease"):
                await viewer.renew_lease()
            with pytest.raises(StoreConflict, match="not by a store opened without a lease"):
                await viewer.write(CaseWrite("a-run", records=[signal(1)]))


# -- queued cases (placement="any") ------------------------------------------------------------------------------


async def test_queued_cases_are_claimed_once_each_by_nodes_that_know_their_fingerprint(tmp_path: Path) -> None:
    """Two nodes claiming queued cases at once get each once, and only the fingerprints they name."""
    async with nodes(new_store(tmp_path), "A", "B", "C") as (a, b, c):
        for i in range(40):
            await a.queue_case(queued(f"q{i}"))
        for i in range(5):
            await a.queue_case(queued(f"other{i}", "fp-2"))
        waiting = await a.row("q0")
        assert waiting is not None and (waiting.owner, waiting.epoch) == (None, 0)
        with pytest.raises(StoreConflict, match="seq 0"):  # the id is taken
            await b.queue_case(queued("q0"))
        got: dict[str, list[str]] = {"B": [], "C": []}

        async def claim(node: PostgresStore) -> None:
            while ids := await node.claim_queued(["fp-1", "fp-9"], 3):
                got[node.node_id or ""].extend(ids)

        async with anyio.create_task_group() as tg:
            tg.start_soon(claim, b)
            tg.start_soon(claim, c)
        assert sorted(got["B"] + got["C"]) == sorted(f"q{i}" for i in range(40))
        claimed = await b.row(got["B"][0])
        assert claimed is not None and (claimed.owner, claimed.epoch) == ("B", 1)
        assert await b.write(CaseWrite(claimed.case_id, records=[signal(1)], epoch=1)) == [True]
        assert sorted(await a.claim_queued(["fp-2"], 10)) == [f"other{i}" for i in range(5)]
        assert await a.journal_epochs("q0") == [(0, 0)] + ([(1, 1)] if "q0" in got["B"][:1] else [])


# -- notifications ---------------------------------------------------------------------------------------------


async def test_wait_changed_is_woken_by_another_nodes_inbox_put_and_end(tmp_path: Path) -> None:
    """wait_changed wakes for an input to one's own case and for any end, not for others' inputs."""
    async with nodes(new_store(tmp_path), "A", "B") as (a, b):
        await b.write(first_write("b-case"))
        await a.write(first_write("a-case"))
        await b.wait_changed(0)  # what opening reported

        with anyio.fail_after(5):
            async with anyio.create_task_group() as tg:
                tg.start_soon(b.wait_changed, 30.0)
                await anyio.sleep(0.05)
                await a.inbox_put("b-case", "signal", {"name": "go"}, request_id=None, created_at=1.0)

        await a.inbox_put("a-case", "signal", {"name": "go"}, request_id=None, created_at=1.0)
        began = time.monotonic()
        await b.wait_changed(0.3)
        assert time.monotonic() - began >= 0.25  # not woken by an input for another node's case

        with anyio.fail_after(5):
            async with anyio.create_task_group() as tg:
                tg.start_soon(b.wait_changed, 30.0)
                await anyio.sleep(0.05)
                await a.write(CaseWrite("a-case", records=[end(1)]))
        assert b.drain_ended() == {"a-case"} and b.drain_ended() == set()


async def test_wait_changed_returns_after_the_listener_reconnects_and_is_woken_again(tmp_path: Path) -> None:
    """A killed listener is replaced; wait_changed returns then (re-read) and wakes on NOTIFY again."""
    async with nodes(new_store(tmp_path), "A", "B") as (a, b):
        await b.write(first_write("b-case"))
        await b.wait_changed(0)
        listener = b._c.listener
        assert listener is not None
        with anyio.fail_after(10):
            assert terminate([listener.get_server_pid()]) == 1
            await b.wait_changed(30.0)  # returns once it has subscribed again
        assert b._c.listener is not None and b._c.listener is not listener
        assert b.drain_ended() is None and b.drain_ended() == set()
        with anyio.fail_after(5):
            async with anyio.create_task_group() as tg:
                tg.start_soon(b.wait_changed, 30.0)
                await anyio.sleep(0.05)
                await a.inbox_put("b-case", "signal", {"name": "go"}, request_id=None, created_at=1.0)


# -- connection loss -------------------------------------------------------------------------------------------


async def test_killed_connections_are_replaced_and_calls_go_on(tmp_path: Path) -> None:
    """After pg_terminate_backend on all its connections, every kind of call works and nothing is lost."""
    async with nodes(new_store(tmp_path), "A") as (a,):
        await a.write(first_write("c"))
        for round_ in range(2):
            assert terminate(await a.backend_pids()) >= 2
            assert await a.write(CaseWrite("c", records=[signal(round_ + 1)], epoch=1)) == [True]
            found = a.read_row("c")
            assert found is not None and found.owner == "A"
            await a.inbox_put("c", "signal", {"name": "go"}, request_id=None, created_at=1.0)
        assert [r["seq"] for r in await a.journal("c")] == [0, 1, 2]
        assert len(await a.inbox_take()) == 2


async def test_an_unreachable_server_fails_after_retry_for(tmp_path: Path) -> None:
    """An unreachable server fails open() after retry_for with a StoreError that hides the password."""
    store = PostgresStore("postgresql://u:hunter2@127.0.0.1:1/none", retry_for=0.3, connect_timeout=0.2)
    began = time.monotonic()
    with pytest.raises(StoreError, match=r"could not be reached for 0.3 s.*pg_isready") as caught:
        await store.open(owner=True, owner_id="A")
    assert time.monotonic() - began < 3
    assert "hunter2" not in str(caught.value) and "u@127.0.0.1:1" in str(caught.value)


class LosesAnswer:
    """A writer connection that loses the connection on its next group, before or after committing it."""

    def __init__(self, store: PostgresStore, *, commit: bool) -> None:
        self.store, self.real, self.commit = store, store._c.writer, commit

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    async def fetchmany(self, query: str, args: Any) -> Any:
        import asyncpg

        if self.commit:
            await self.real.fetchmany(query, args)
        self.store._c.writer = self.real
        raise asyncpg.exceptions.ConnectionDoesNotExistError("connection was closed in the middle of operation")


async def test_a_commit_whose_answer_was_lost_is_answered_as_committed(tmp_path: Path) -> None:
    """A group that committed but lost its answer is answered as it committed (read back); a retry applies once."""
    async with nodes(new_store(tmp_path), "A") as (a,):
        a._c.writer = LosesAnswer(a, commit=True)
        assert await a.write(first_write("c")) == [True]  # a new case's start write
        a._c.writer = LosesAnswer(a, commit=True)
        change = CaseWrite("c", records=[signal(1, request_id="r1")], epoch=1)
        assert await a.write(change) == [True]
        assert await a.write(change) == [False]  # it had committed: the retry is skipped
        a._c.writer = LosesAnswer(a, commit=True)
        assert await a.write(CaseWrite("c", records=[signal(2), signal(3, request_id="r1")], epoch=1)) == [True, False]
        a._c.writer = LosesAnswer(a, commit=True)
        assert await a.write(CaseWrite("c", row=row("c", "waiting_signal", last_seq=2), epoch=1)) == []
        assert [r["seq"] for r in await a.journal("c")] == [0, 1, 2]
        found = await a.row("c")
        assert found is not None and found.state == "waiting_signal"


async def test_a_refused_write_in_a_group_whose_answer_was_lost_gets_its_own_refusal(tmp_path: Path) -> None:
    """In a committed group whose answer was lost, a write that was refused (a seq taken) is answered StoreConflict."""
    async with nodes(new_store(tmp_path), "A") as (a,):
        await a.write(first_write("c"))
        await a.write(CaseWrite("c", records=[signal(1)], epoch=1))
        a._c.writer = LosesAnswer(a, commit=True)
        with pytest.raises(StoreConflict, match="already has a record at seq 1"):
            await a.write(CaseWrite("c", records=[signal(1, name="other")], epoch=1))
        assert [r.get("name") for r in await a.journal("c")] == [None, "go"]


async def test_a_group_lost_before_it_committed_is_sent_again(tmp_path: Path) -> None:
    """A group lost before it committed (its token is absent) is sent again: one success, one record."""
    async with nodes(new_store(tmp_path), "A") as (a,):
        await a.write(first_write("c"))
        a._c.writer = LosesAnswer(a, commit=False)
        assert await a.write(CaseWrite("c", records=[signal(1)], epoch=1)) == [True]
        assert [r["seq"] for r in await a.journal("c")] == [0, 1]


async def test_a_write_postgres_refuses_fails_alone_in_its_group(tmp_path: Path) -> None:
    """A write Postgres refuses (a NUL in a case id) fails alone; the rest of its group commits."""
    results: dict[str, object] = {}

    async with nodes(new_store(tmp_path), "A") as (a,):

        async def attempt(case_id: str) -> None:
            try:
                results[case_id] = await a.write(first_write(case_id))
            except StoreError as exc:
                results[case_id] = exc

        async with anyio.create_task_group() as tg:
            for i in range(10):
                tg.start_soon(attempt, f"ok{i}")
            tg.start_soon(attempt, "bad\x00id")
        bad = results.pop("bad\x00id")
        assert isinstance(bad, StoreError) and "0x00" in str(bad)
        assert results == {f"ok{i}": [True] for i in range(10)}


# -- the schema ------------------------------------------------------------------------------------------------


async def test_a_newer_schema_version_is_refused_and_left_untouched(tmp_path: Path) -> None:
    """A schema of a newer layout version is refused with a StoreError saying to update (the tests run wfsub from
    its checkout: the checkout, not pip), and left as it is."""
    store = new_store(tmp_path, fresh=True)
    async with opened(store):
        pass
    sql(store, "UPDATE S.meta SET value = '99' WHERE key = 'version'")
    newer = rf"layout version 99, newer than this wfsub reads \(up to {SCHEMA_VERSION}\).*update the checkout"
    with pytest.raises(StoreError, match=newer):
        await twin(store).open(owner=True, owner_id="A")
    assert sql(store, "SELECT value FROM S.meta WHERE key = 'version'") == "99"


async def test_a_schema_that_is_not_a_wfsub_store_is_refused(tmp_path: Path) -> None:
    """A schema holding tables of another application is refused, and create=False refuses a missing schema."""
    store = new_store(tmp_path, fresh=True)
    _pg.fetchval(f'CREATE SCHEMA "{store.schema}"')
    sql(store, "CREATE TABLE S.orders (id int)")
    with pytest.raises(StoreError, match="not a wfsub store"):
        await store.open(owner=True, owner_id="A")
    missing = PostgresStore(store.dsn, schema="nothing_here", create=False)
    with pytest.raises(StoreError, match="no schema 'nothing_here'"):
        await missing.open(owner=False, owner_id="cli")


async def test_a_new_schema_records_what_it_is_and_two_openers_build_it_once(tmp_path: Path) -> None:
    """Two nodes opening a new schema at once build it once; meta names wfsub and the layout version."""
    store = new_store(tmp_path, fresh=True)
    both = [store, twin(store)]
    try:
        async with anyio.create_task_group() as tg:
            for each, name in zip(both, "AB"):
                tg.start_soon(partial(each.open, owner=True, owner_id=name))
        assert sql(store, "SELECT value FROM S.meta WHERE key = 'application'") == "wfsub"
        assert sql(store, "SELECT value FROM S.meta WHERE key = 'version'") == str(SCHEMA_VERSION)
        assert sql(store, "SELECT count(*) FROM S.nodes") == 2
    finally:
        for each in both:
            await each.close()


async def test_calls_made_during_an_outage_wait_for_the_server_or_fail_after_retry_for(tmp_path: Path) -> None:
    """Calls wait through an outage shorter than retry_for and fail with a StoreError after a longer one."""
    proxy = Proxy(_pg.database_dsn())
    store = PostgresStore(proxy.dsn, schema=_pg.emptied_schema(), retry_for=1.5, connect_timeout=PROXY_CONNECT)
    try:
        async with nodes(store, "A") as (a,):
            await a.write(first_write("c"))
            results: list[object] = []

            async def call() -> None:
                results.append(await a.write(CaseWrite("c", records=[signal(1)], epoch=1)))
                results.append(await a.row("c"))

            proxy.down()
            with anyio.fail_after(10):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(call)
                    await anyio.sleep(0.4)
                    assert results == []  # waiting for the server
                    proxy.up()
            assert results[0] == [True] and getattr(results[1], "last_seq", None) == 0

            proxy.down()
            await anyio.sleep(0.2)  # the store sees its connections close (a write sent into one is CommitUnknown)
            began = time.monotonic()
            with pytest.raises(StoreError, match=r"could not be reached for 1.5 s.*pg_isready"):
                await a.write(CaseWrite("c", records=[signal(2)], epoch=1))
            assert 1.0 < time.monotonic() - began < 6
            proxy.up()
            assert [r["seq"] for r in await a.journal("c")] == [0, 1]
    finally:
        proxy.down()


async def wait_running(marker: str) -> None:
    """Wait until a statement whose text holds `marker` runs in the server (seen in pg_stat_activity)."""
    query = "SELECT count(*) FROM pg_stat_activity WHERE query LIKE $1 AND pid <> pg_backend_pid()"
    with anyio.fail_after(10):
        while not await anyio.to_thread.run_sync(_pg.fetchval, query, f"%{marker}%"):  # noqa: ASYNC110 - the server
            await anyio.sleep(0.01)


async def test_a_read_whose_connection_is_cut_mid_statement_is_retried(tmp_path: Path) -> None:
    """A read in flight when its connection is cut (the driver has released it already) is retried, not raised."""
    proxy = Proxy(_pg.database_dsn())
    store = PostgresStore(proxy.dsn, schema=_pg.emptied_schema(), retry_for=10, connect_timeout=PROXY_CONNECT)
    try:
        async with nodes(store, "A") as (a,):
            async def slow(c: Any) -> int:  # (on the store's connection seam: `c.conn` is asyncpg's)
                found: int = await c.conn.fetchval("SELECT 7 /* cut-mid-read */ FROM pg_sleep(0.2)")
                return found

            async def cut() -> None:
                await wait_running("cut-mid-read")
                proxy.down()
                proxy.up()

            async with anyio.create_task_group() as tg:
                tg.start_soon(cut)
                assert await a._read("a slow read", slow) == 7
    finally:
        proxy.down()


class OutageWhileOpening(PostgresStore):
    """Its connection is lost `times` times while it checks its schema (after its first connection was made)."""

    def __init__(self, *args: Any, times: int, **options: Any) -> None:
        super().__init__(*args, **options)
        self.times = times
        self.attempts = 0

    async def _prepare(self, conn: Any, owner: bool) -> None:
        self.attempts += 1
        if self.times > 0:
            self.times -= 1
            lost = ConnectionResetError("the server closed the connection (a test's outage)")
            raise fault(self._name, f"checking the store's schema {self.schema!r}", lost) from lost
        await super()._prepare(conn, owner)


async def test_an_open_that_meets_an_outage_waits_it_out_then_fails_after_retry_for(tmp_path: Path) -> None:
    """An outage met while opening is waited out (the open starts again); one longer than retry_for: StoreError."""
    schema = _pg.emptied_schema()
    store = OutageWhileOpening(_pg.database_dsn(), schema=schema, times=2, retry_for=10)
    async with nodes(store, "A") as (a,):
        assert store.attempts == 3
        await a.write(first_write("c"))
        assert (await a.nodes())[0].owner_id == "A"
    failing = OutageWhileOpening(_pg.database_dsn(), schema=schema, times=10**6, retry_for=0.5)
    with pytest.raises(StoreError, match="a test's outage"):
        await failing.open(owner=True, owner_id="B")
    assert failing.attempts > 1 and not failing._is_open()

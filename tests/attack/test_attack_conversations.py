"""An independent attack on conversations with a case (updates, child cases, heartbeats, `scope(finally_=)`, timers
from data, unlimited retries) through the public API, on MemoryStore, SQLite and Postgres, asyncio and trio, with
restarts and the database failing at the wrong moment.

Tests marked xfail(strict=True) are faults found on the current code (each reason says what is wrong and where);
the others pin behaviour that held up (or a fault fixed here).
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import anyio.to_thread
import pytest
from structlog.testing import capture_logs

import wfsub
from wfsub import (
    CaseFailed,
    Client,
    Retry,
    SignalRejected,
    StoreError,
    Substrate,
    effect,
    loop,
    mi,
    seq,
    start_case,
    task,
    wait,
)
from wfsub.stores import MemoryStore, PostgresStore, Store

from .. import _warm
from ..stores import _pg
from ..stores._helpers import STORE_PARAMS, make_store, twin
from ..stores._proxy import PROXY_CONNECT, Proxy

BOUND = 30.0  # seconds: a bound against a hang, never a latency requirement


@pytest.fixture(params=STORE_PARAMS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    return make_store(str(request.param), tmp_path)


def n_of(ctx: Mapping[str, Any]) -> Any:
    return ctx["n"]


def add(ctx: Mapping[str, Any]) -> dict[str, Any]:
    return {"n": ctx["n"] + ctx["add"]}


# -- heartbeats from a worker thread ---------------------------------------------------------------------------


async def _blocking_job(ctx: Mapping[str, Any]) -> dict[str, Any]:
    """A long blocking job run in a worker thread, heartbeating its progress from there; the first attempt dies
    after its heartbeats, the retry reads where it got to."""
    info = wfsub.effect_info()
    if info.attempt == 1:
        def work() -> None:
            assert threading.current_thread() is not threading.main_thread()
            for page in range(1, 4):
                wfsub.heartbeat({"page": page})

        await anyio.to_thread.run_sync(work)
        raise ConnectionError("the export service went away")
    return {"resumed_from": info.heartbeat}


THREADED = {"export": effect(_blocking_job, heartbeat_timeout=3600, retry=Retry(2, initial=0))}


async def _threaded_heartbeats(store: Store | None) -> None:
    async with Substrate(store=store, workflows=THREADED) as sub:
        handle = await sub.new_case("export", {}, case_id="x1")
        with anyio.fail_after(BOUND):
            assert await handle.result() == {"resumed_from": {"page": 3}}


async def test_a_heartbeat_sent_from_a_worker_thread_is_kept_for_the_retry(store: Store) -> None:
    """wfsub.heartbeat() called from the worker thread of a blocking job (anyio.to_thread) records its details on
    every store, as from the effect's own task; it used to fail the effect with NoEventLoopError on a store."""
    await _threaded_heartbeats(store)


async def _asyncio_thread_job(ctx: Mapping[str, Any]) -> dict[str, Any]:
    def work() -> Any:
        wfsub.heartbeat({"page": 9})
        return wfsub.effect_info().heartbeat

    return {"seen": await asyncio.to_thread(work), "attempt": wfsub.effect_info().attempt}


async def test_a_heartbeat_from_asyncio_to_thread_is_recorded(tmp_path: Path) -> None:
    """asyncio.to_thread (which copies the effect's context into a thread anyio did not start) may heartbeat in a
    durable case: the call is recorded and the effect goes on (it used to fail with NoEventLoopError)."""
    async with Substrate(store=tmp_path / "cases.db", workflows={"job": seq(effect(_asyncio_thread_job,
                                                                                    heartbeat_timeout=3600))}) as sub:
        handle = await sub.new_case("job", {}, case_id="j1")
        with anyio.fail_after(BOUND):
            assert await handle.result() == {"seen": None, "attempt": 1}


def test_a_heartbeat_from_a_worker_thread_on_trio(tmp_path: Path) -> None:
    """On trio too, a heartbeat from a worker thread of a durable case is recorded (not a NoEventLoopError)."""
    anyio.run(_threaded_heartbeats, make_store("sqlite", tmp_path), backend="trio")


# -- updates through a Client and the command --------------------------------------------------------------------

ANSWERING = {"counter": seq(wait("add", reply=n_of), task(add), wait("done"))}


async def _ended_counter(sub: Substrate) -> None:
    await sub.new_case("counter", {"n": 1}, case_id="c1")
    assert await sub.update("c1", "add", 2, request_id="r1") == 1
    await sub.signal("c1", "done")
    await sub.await_case("c1")


@pytest.mark.parametrize("kind", ["sqlite", *(["postgres"] if _pg.ENABLED else [])])
async def test_a_client_update_to_an_ended_case_is_refused_as_the_owner_refuses_it(kind: str, tmp_path: Path) -> None:
    """A Client's update of a case that ended raises SignalRejected naming the case (the owner's words), with the
    owner running and without; it used to return None as if answered once the case had answered any update. A
    retried call of the update it did answer still gets its answer."""
    store = make_store(kind, tmp_path)
    async with Substrate(store=store, workflows=ANSWERING) as sub:
        await _ended_counter(sub)
        with pytest.raises(SignalRejected, match="case 'c1' cannot take update 'add': it has already ended"):
            await sub.update("c1", "add", 5)
        async with Client(twin(store)) as client:
            with pytest.raises(SignalRejected, match="case 'c1' cannot take update 'add': it has already ended"):
                await client.update("c1", "add", 5)
            with pytest.raises(SignalRejected, match="case 'c1' cannot take update 'typo': it has already ended"):
                await client.update("c1", "typo", 5)
            assert await client.update("c1", "add", 2, request_id="r1") == 1
    async with Client(twin(store)) as client:
        with pytest.raises(SignalRejected, match="it has already ended"):
            await client.update("c1", "add", 5, request_id="r2")
        assert await client.update("c1", "add", 2, request_id="r1") == 1
    async with Substrate(store=twin(store), workflows=ANSWERING) as sub:
        assert sub.data("c1") == {"n": 3, "add": 2, "done": None}


async def test_a_standby_update_to_an_ended_case_is_refused(tmp_path: Path) -> None:
    """A standby's update of an ended case raises SignalRejected as its owner's does; a retried answered call
    still gets its answer."""
    path = tmp_path / "cases.db"
    async with Substrate(store=path, workflows=ANSWERING) as owner, Substrate(store=path, workflows=ANSWERING) as sb:
        assert sb.standby and not owner.standby
        await _ended_counter(sb)
        with pytest.raises(SignalRejected, match="case 'c1' cannot take update 'add': it has already ended"):
            await sb.update("c1", "add", 5)
        with pytest.raises(SignalRejected, match="it has already ended"):
            await sb.handle("c1").update("add", 5)
        assert await sb.update("c1", "add", 2, request_id="r1") == 1


async def test_wfsub_update_of_an_ended_case_exits_1(tmp_path: Path) -> None:
    """`wfsub update` of an ended case prints the refusal and exits 1, rather than printing null and exiting 0."""
    path = tmp_path / "cases.db"
    async with Substrate(store=path, workflows=ANSWERING) as sub:
        await _ended_counter(sub)
        ran = await _warm.acommand("update", str(path), "c1", "add", "4")
    assert ran.returncode == 1 and ran.stdout == ""
    assert "case 'c1' cannot take update 'add': it has already ended (done)" in ran.stderr


# -- the database going away under a live owner ------------------------------------------------------------------


@pytest.mark.skipif(not _pg.ENABLED, reason=_pg.SKIP_REASON)
async def test_status_of_a_case_in_memory_answers_while_the_database_is_away() -> None:
    """An owner's status() of a live case it runs answers during a Postgres outage (the case runs in memory)."""
    proxy = Proxy(_pg.database_dsn())
    flows = {"waits": seq(wait("go", reply=n_of))}
    try:
        store = PostgresStore(proxy.dsn, schema=_pg.emptied_schema(), retry_for=0.5, connect_timeout=PROXY_CONNECT,
                              sync_timeout=0.5)
        async with Substrate(store=store, workflows=flows) as sub:
            await sub.new_case("waits", {"n": 1}, case_id="s1")
            with anyio.fail_after(BOUND):
                while sub.status("s1").state != "waiting_signal":  # noqa: ASYNC110 - a state, not a time
                    await anyio.sleep(0.005)
            proxy.down()
            try:
                status = sub.status("s1")
            except StoreError:
                status = None
            proxy.up()
            assert status is not None and status.state == "waiting_signal"
            with anyio.fail_after(BOUND):
                assert await sub.update("s1", "go", None) == 1
    finally:
        proxy.down()



# -- child cases -------------------------------------------------------------------------------------------------


def _kid(ctx: Mapping[str, Any]) -> dict[str, Any]:
    return {"kid": True}


def _huge_child_id(ctx: Mapping[str, Any]) -> str:
    """A child id of 9,600 characters that do not compress (a Postgres index entry holds at most 8,191 bytes)."""
    return "".join(hashlib.sha256(str(i).encode()).hexdigest() for i in range(150))


@pytest.mark.skipif(not _pg.ENABLED, reason=_pg.SKIP_REASON)
async def test_a_child_id_the_store_cannot_hold_fails_the_step() -> None:
    """start_case with a child id Postgres cannot index fails the parent's step, rather than retrying for ever."""
    flows = {"kid": task(_kid), "parent": start_case("kid", case_id=_huge_child_id)}
    store = make_store("postgres", Path("."))
    with capture_logs() as logs:
        async with Substrate(store=store, workflows=flows) as sub:
            handle = await sub.new_case("parent", {}, case_id="p1")
            with anyio.fail_after(BOUND):
                while not handle.done() and not any(e.get("event") == "store trouble; trying again" for e in logs):  # noqa: ASYNC110 - a log line
                    await anyio.sleep(0.01)
            assert handle.done(), sub.status("p1").state
            with pytest.raises(CaseFailed, match="start_case"):
                await handle.result()


_kid_runs: list[str] = []


async def _kid_effect(ctx: Mapping[str, Any]) -> dict[str, Any]:
    _kid_runs.append(wfsub.effect_info().case_id)
    return {"kid_ran": True}


FAMILY = {
    "kid": effect(_kid_effect),
    "parent": seq(
        wait("go", reply=lambda c: "going"),
        start_case("kid", data=lambda c: {"from": "parent"}, into="child"),
        mi(start_case("kid", wait=False, into="cid"), count=3),
        wait("end", reply=lambda c: c["child"]),
    ),
}


async def _update_through(sub: Substrate, name: str, request_id: str) -> Any:
    """An update retried with its request id while the store says its outcome is unknown (what a caller does)."""
    for _ in range(5):
        try:
            return await sub.update("p1", name, None, request_id=request_id)
        except StoreError:
            continue
    raise AssertionError(f"update {name!r} kept failing")


@pytest.mark.skipif(not _pg.ENABLED, reason=_pg.SKIP_REASON)
@pytest.mark.parametrize("lost", [1, 3, 6])
async def test_lost_commit_answers_during_updates_and_child_starts_apply_once(lost: int) -> None:
    """With the server's answers to writes lost (the proxy resets the connection after the server committed), an
    update retried with its request id is applied once and answered, and each child (waited for, and of an mi)
    starts once and runs once."""
    _kid_runs.clear()
    proxy = Proxy(_pg.database_dsn())
    try:
        store = PostgresStore(proxy.dsn, schema=_pg.emptied_schema(), retry_for=10, connect_timeout=PROXY_CONNECT)
        async with Substrate(store=store, workflows=FAMILY) as sub:
            await sub.new_case("parent", {}, case_id="p1")
            proxy.drop_answers(lost, after=400)
            with anyio.fail_after(BOUND):
                assert await _update_through(sub, "go", "g1") == "going"
                assert await _update_through(sub, "end", "e1") == {"from": "parent", "kid_ran": True}
                assert await _update_through(sub, "go", "g1") == "going"
                data = await sub.await_case("p1")
            children = sub.status("p1").children
            assert len(children) == 4 and sorted(_kid_runs) == sorted(children)
            for child in children:
                assert [r.kind for r in await sub.journal(child)].count("start") == 1
                assert sub.status(child).parent == "p1"
            journal = await sub.journal("p1")
            assert [r.kind for r in journal].count("signal") == 2
            assert data["end"] is None and data["go"] is None and proxy.dropped >= 1
    finally:
        proxy.down()


# -- an update whose caller gave up while its record was being committed ---------------------------------------


class HeldWrites(MemoryStore):
    """A MemoryStore whose writes carrying a `signal` record wait, while `hold` is set, until `release` is set (a
    slow disk or database commit); `held` is set once such a write waits."""

    def __init__(self) -> None:
        super().__init__()
        self.hold = False
        self.held = anyio.Event()
        self.release = anyio.Event()

    async def write(self, change: Any, *, wait: bool = True) -> list[bool]:
        if self.hold and any(record.get("kind") == "signal" for record in change.records):
            self.held.set()
            await self.release.wait()
        return await super().write(change, wait=wait)


@contextmanager
def _released(store: HeldWrites) -> Iterator[None]:
    """The held write is let go however the block ends (a Substrate closing waits for a commit under way)."""
    try:
        yield
    finally:
        store.release.set()


async def test_an_update_retried_while_its_first_call_is_being_committed_gets_its_answer() -> None:
    """timeout= leaves the update with the case: a retry with the same request_id, made while the first call's
    record is still being committed, waits for the answer and the update applies once."""
    store = HeldWrites()
    flows = {"loop": loop(seq(wait("add", reply=n_of), task(add)), times=10)}
    async with Substrate(store=store, workflows=flows) as sub:
        await sub.new_case("loop", {"n": 0}, case_id="c1")
        store.hold = True
        with anyio.fail_after(BOUND), _released(store):
            async with anyio.create_task_group() as tg:
                first = anyio.CancelScope()

                async def impatient() -> None:
                    with first:
                        await sub.update("c1", "add", 1, request_id="z")
                    store.hold = False

                tg.start_soon(impatient)
                await store.held.wait()
                first.cancel()  # the caller gives up (as timeout= does) while the commit is under way
            answers: list[Any] = []

            async def retry() -> None:
                answers.append(await sub.update("c1", "add", 1, request_id="z"))

            async with anyio.create_task_group() as tg:
                tg.start_soon(retry)
                for _ in range(20):  # the retry runs until it waits for its answer (or fails)
                    await anyio.lowlevel.checkpoint()
                store.release.set()
            assert answers == [0]
            assert sub.data("c1")["n"] == 1

"""Attacks on many nodes sharing cases on Postgres (leases, fencing, takeover, the inbox, queued cases), through
the public API. Skipped unless WFSUB_TEST_POSTGRES names a server (see tests/stores/_pg.py).

Each test pins a fault found here (fixed beside it) or a promise that was checked and held; an
`xfail(strict=True)` test is a fault left open, its reason says what is wrong.
"""

from __future__ import annotations

import contextlib
import re
import socket
import threading
import time
from collections.abc import Mapping
from typing import Any

import anyio
import pytest

from wfsub import CaseCancelled, Substrate, effect, effect_info, seq, task, wait
from wfsub.stores import PostgresStore, StoreError

from ..stores import _pg
from ..stores._proxy import Proxy

pytestmark = [pytest.mark.skipif(not _pg.ENABLED, reason=_pg.SKIP_REASON), pytest.mark.anyio]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def node_store(schema: str, lease_seconds: float = 1.0) -> PostgresStore:
    return PostgresStore(_pg.database_dsn(), schema=schema, lease_seconds=lease_seconds)


def _finish(ctx: Mapping[str, Any]) -> dict[str, Any]:
    return {"done": True}


async def test_a_paused_node_does_not_report_a_taken_over_case_as_failed() -> None:
    """A node that stalls past its lease hands its case over; on waking its awaiter gets the new owner's outcome."""
    # Not an internal CaseFailed: the outcome is the one the new owner recorded.
    calls: list[str] = []

    async def pay(ctx: Mapping[str, Any]) -> dict[str, Any]:
        calls.append(effect_info().idempotency_key)
        if len(calls) == 1:
            time.sleep(3.0)  # noqa: ASYNC251 - the whole node stalls (a long GC pause, a starved VM)
        return {"paid": len(calls)}

    flows = {"f": seq(effect(pay, name="pay"), task(_finish, name="finish"))}
    schema = _pg.new_schema()
    seen: dict[str, Any] = {}
    started = threading.Event()

    def paused_node() -> None:
        async def run() -> None:
            async with Substrate(store=node_store(schema), workflows=flows, node_id="a") as a:
                await a.new_case("f", case_id="c1")
                started.set()
                try:
                    with anyio.fail_after(30):
                        seen["await"] = await a.await_case("c1")
                except Exception as exc:  # what the node's own awaiter was told
                    seen["await"] = exc
                seen["status"] = a.status("c1").state.value

        anyio.run(run)

    async with Substrate(store=node_store(schema), workflows=flows, node_id="b") as b:
        thread = threading.Thread(target=paused_node)
        thread.start()
        try:
            await anyio.to_thread.run_sync(started.wait)
            with anyio.fail_after(30):
                assert (await b.await_case("c1"))["done"]
        finally:
            await anyio.to_thread.run_sync(thread.join)
        kinds = [r.kind for r in await b.journal("c1")]
    assert calls == [calls[0], calls[0]]  # run again after takeover, with the same idempotency key
    assert kinds == ["start", "effect", "end"]
    assert seen == {"await": {"paid": 2, "done": True}, "status": "done"}


async def test_a_node_leaves_alone_a_suspended_case_another_node_owns() -> None:
    """A node does not run another node's suspended case: signals go to the owner's inbox, a cancel ends it."""
    # The cancel ends the case with its reason (no zombie).
    v1 = seq(wait("go"), task(_finish, name="finish"))
    schema = _pg.new_schema()
    async with Substrate(store=node_store(schema, 10.0), workflows={"f": v1}, node_id="a") as a:
        await a.new_case("f", case_id="c1")
    # Node a comes back without the case's workflow: the case is suspended there, still a's.
    async with Substrate(store=node_store(schema, 10.0), workflows={"g": seq(wait("other"))}, node_id="a") as a:
        with anyio.fail_after(30):
            while a.status("c1").state != "suspended":  # noqa: ASYNC110 - a's version check runs in the background
                await anyio.sleep(0.05)
            async with Substrate(store=node_store(schema, 10.0), workflows={"f": v1}, node_id="b") as b:
                await anyio.sleep(0.5)  # b's own version check has run
                assert b.status("c1").state == "suspended"
                await b.signal("c1", "go", request_id="go-1")  # a's input now: a refuses it (suspended)
                await b.cancel("c1", reason="from b")
                with pytest.raises(CaseCancelled, match="from b"):
                    await b.await_case("c1")
    operator = PostgresStore(_pg.database_dsn(), schema=schema, create=False)
    await operator.open(owner=False, owner_id="operator")
    try:
        row = await operator.row("c1")
        assert row is not None and row.owner == "a" and row.state == "cancelled"
    finally:
        await operator.close()


async def test_two_substrates_of_one_process_cannot_share_a_node_id() -> None:
    """A second Substrate opened as an open node's id is refused with a StoreError naming the id and the fix."""
    # Both would run the same cases.
    schema = _pg.new_schema()
    flows = {"f": seq(wait("go"), task(_finish, name="finish"))}
    async with Substrate(store=node_store(schema, 10.0), workflows=flows, node_id="n") as a:
        await a.new_case("f", case_id="c1")
        with pytest.raises(StoreError, match="node 'n'.*(own id|another one)"):
            async with Substrate(store=node_store(schema, 10.0), workflows=flows, node_id="n"):
                pass
        await a.signal("c1", "go")
        assert (await a.await_case("c1"))["done"]
    async with Substrate(store=node_store(schema, 10.0), workflows=flows, node_id="n") as again:
        assert again.status("c1").state == "done"  # closed: the id is free again in this process


@pytest.mark.parametrize(
    "option", ["lease_seconds=0.001", "lease_seconds=inf", "retry_for=inf", "connect_timeout=inf", "retry_for=1e300"]
)
def test_store_times_that_cannot_work_are_refused(option: str) -> None:
    """A lease too short to renew, or a wait without end, is refused when the store is made, naming the option."""
    name = option.split("=")[0]
    with pytest.raises(StoreError, match=name):
        PostgresStore(f"{_pg.URL}?{option}")


class _SilentProxy(Proxy):
    """The loopback proxy, able to stop forwarding on the connection that LISTENs without closing it: a
    connection lost with no RST, as a dead router or a NAT that forgot it leaves it."""

    def __init__(self, dsn: str) -> None:
        self.listening: set[Any] = set()
        self.silent = False
        super().__init__(dsn)

    def _pump(self, source: Any, sink: Any) -> None:
        try:
            while data := source.recv(65536):
                if re.search(rb'(?<!UN)LISTEN "', data):  # the listener's own (pooled ones send UNLISTEN *)
                    self.listening.add(source)
                if self.silent and (source in self.listening or sink in self.listening):
                    continue  # swallowed: neither side hears of it
                sink.sendall(data)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                sink.shutdown(socket.SHUT_WR)


@pytest.mark.long
async def test_an_awaiter_on_another_node_wakes_when_its_notifications_are_silently_lost() -> None:
    """With its LISTEN connection silently dead, a node still wakes awaiters of other nodes' cases (it polls)."""
    schema = _pg.new_schema()
    flows = {"f": seq(wait("go"), task(_finish, name="finish"))}
    proxy = _SilentProxy(_pg.database_dsn())
    try:
        async with Substrate(store=node_store(schema, 10.0), workflows=flows, node_id="a") as a, Substrate(
            store=PostgresStore(proxy.dsn, schema=schema, lease_seconds=10.0), workflows=flows, node_id="b"
        ) as b:
            await a.new_case("f", case_id="c1")
            result: dict[str, Any] = {}

            async def awaiter() -> None:
                result.update(await b.await_case("c1"))

            with anyio.fail_after(30):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(awaiter)
                    await anyio.sleep(0.5)  # b's awaiter waits for c1's end
                    proxy.silent = True
                    await a.signal("c1", "go")
            assert result["done"]
    finally:
        proxy.down()

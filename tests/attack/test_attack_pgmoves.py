"""Attacks on Postgres where a case or a queue claim moves under a node: an `update` caller whose case another
node took over (its actor fenced), and a node whose queue claim's commit answer was lost. Two Substrates on one
schema; a TCP proxy (tests/stores/_proxy.py) makes the network lose an answer. Skipped unless
WFSUB_TEST_POSTGRES names a server."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Mapping
from typing import Any

import anyio
import pytest

from wfsub import Client, Queue, SignalRejected, Substrate, effect, reply, seq, wait
from wfsub.stores import PostgresStore

from ..stores import _pg
from ..stores._proxy import Proxy, _reset

pytestmark = [pytest.mark.skipif(not _pg.ENABLED, reason=_pg.SKIP_REASON), pytest.mark.anyio]

BOUND = 20  # seconds any wait on a state may take before the test fails


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def total(ctx: Mapping[str, Any]) -> dict[str, Any]:
    return {"total": ctx["add"]["n"] * 10}


GATE: dict[str, anyio.Event] = {}
RAN: list[str] = []  # case ids whose effect ran, in order


async def gated(ctx: Mapping[str, Any]) -> None:
    await GATE["open"].wait()


async def counted(ctx: Mapping[str, Any]) -> dict[str, Any]:
    RAN.append(ctx["id"])
    return {"ran": True}


AT_ONCE = seq(wait("add", reply=total), wait("end"))
LATER = seq(wait("add"), effect(gated, name="gated"), reply("add", total), wait("end"))
ONCE = seq(effect(counted, name="counted"))
FLOWS: dict[str, Any] = {"at_once": AT_ONCE, "later": LATER, "once": ONCE}


def node_store(schema: str, dsn: str | None = None, **options: Any) -> PostgresStore:
    return PostgresStore(dsn or _pg.database_dsn(), schema=schema, lease_seconds=10.0, **options)


def moved_to(schema: str, case_id: str, node: str) -> None:
    """The case is `node`'s now, at a new epoch, as a takeover leaves it."""
    _pg.fetchval(f'UPDATE "{schema}".cases SET owner = $2, epoch = epoch + 1 WHERE case_id = $1', case_id, node)


async def until(condition: Any) -> None:
    with anyio.fail_after(BOUND):
        while not condition():  # noqa: ASYNC110 - a state, not a time
            await anyio.sleep(0.01)


async def parked(sub: Substrate, case_id: str, signal: str) -> None:
    await until(lambda: signal in sub.status(case_id).signals)


# -- (a) an update caller whose case moved to another node -------------------------------------------------------


async def test_an_update_to_a_moved_case_the_new_owner_cancelled_is_refused_as_ended() -> None:
    """The case moved and its new owner cancelled it before the update came: the caller on the old node gets the
    refusal the owner gives (an ended case's), not a wait for an answer that never comes."""
    schema = _pg.new_schema()
    async with Substrate(store=node_store(schema), workflows=FLOWS, node_id="a") as a, \
            Substrate(store=node_store(schema), workflows=FLOWS, node_id="b") as b:
        await a.new_case("at_once", case_id="c1")
        await parked(a, "c1", "add")
        moved_to(schema, "c1", "b")
        await b.cancel("c1", reason="closed")
        with anyio.fail_after(BOUND), pytest.raises(SignalRejected, match="ended .cancelled."):
            await a.update("c1", "add", {"n": 4}, request_id="add-1")
        with pytest.raises(SignalRejected, match="ended .cancelled."):  # as the owner answers it
            await b.update("c1", "add", {"n": 4}, request_id="add-1")
        kinds = [r.kind for r in await b.journal("c1")]
        assert "signal" not in kinds  # the update never went in


async def test_an_update_timeout_holds_while_the_moved_case_has_not_answered() -> None:
    """An update journaled before the case moved, whose answer the new owner has not given yet: a `timeout=` on
    the call raises TimeoutError at its time, and a retry with the same id gets the answer once it is given."""
    schema = _pg.new_schema()
    GATE["open"] = anyio.Event()
    async with Substrate(store=node_store(schema), workflows=FLOWS, node_id="a") as a, \
            Substrate(store=node_store(schema), workflows=FLOWS, node_id="b") as b:
        await a.new_case("later", case_id="c1")
        await parked(a, "c1", "add")
        outcome: list[Any] = []

        async def call() -> None:
            try:
                outcome.append(await a.update("c1", "add", {"n": 3}, request_id="add-1", timeout=0.5))
            except TimeoutError as exc:
                outcome.append(exc)

        async with anyio.create_task_group() as tg:
            tg.start_soon(call)
            await until(lambda: a.status("c1").effects)  # journaled and taken
            moved_to(schema, "c1", "b")
            loader = a._table.loader
            assert loader is not None
            assert await loader.recheck()
            await b.signal("c1", "end")  # b brings the case in, its effect in flight (the gate stays shut)
        assert len(outcome) == 1 and isinstance(outcome[0], TimeoutError), outcome
        GATE["open"].set()
        with anyio.fail_after(BOUND):
            assert await a.update("c1", "add", {"n": 3}, request_id="add-1") == {"total": 30}
            assert (await b.await_case("c1"))["add"] == {"n": 3}


async def test_an_update_to_an_evicted_case_that_moved_is_answered_by_the_new_owner() -> None:
    """The case left this node's memory (idle), then moved: an update sent here goes to the new owner and is
    answered with its answer."""
    schema = _pg.new_schema()
    async with Substrate(store=node_store(schema), workflows=FLOWS, node_id="a", evict_after=0.05) as a, \
            Substrate(store=node_store(schema), workflows=FLOWS, node_id="b") as b:
        await a.new_case("at_once", case_id="c1")
        await until(lambda: a.statistics().cases_idle_evicted >= 1)
        moved_to(schema, "c1", "b")
        with anyio.fail_after(BOUND):
            assert await a.update("c1", "add", {"n": 5}, request_id="add-1") == {"total": 50}
            await b.signal("c1", "end")
            assert (await b.await_case("c1"))["add"] == {"n": 5}
        kinds = [r.kind for r in await b.journal("c1")]
        assert kinds.count("signal") == 2


async def test_an_update_retried_from_the_new_owner_while_the_first_waits_is_applied_once() -> None:
    """The case moved before the fenced actor journaled the update; the same request id sent at once from the
    new owner: both callers get the one answer and the case takes the update once."""
    schema = _pg.new_schema()
    async with Substrate(store=node_store(schema), workflows=FLOWS, node_id="a") as a, \
            Substrate(store=node_store(schema), workflows=FLOWS, node_id="b") as b:
        await a.new_case("at_once", case_id="c1")
        await parked(a, "c1", "add")
        moved_to(schema, "c1", "b")
        answers: dict[str, Any] = {}

        async def call(sub: Substrate, name: str) -> None:
            answers[name] = await sub.update("c1", "add", {"n": 6}, request_id="add-1")

        with anyio.fail_after(BOUND):
            async with anyio.create_task_group() as tg:
                tg.start_soon(call, a, "a")
                tg.start_soon(call, b, "b")
        assert answers == {"a": {"total": 60}, "b": {"total": 60}}
        with anyio.fail_after(BOUND):
            await b.signal("c1", "end")
            await b.await_case("c1")
        kinds = [r.kind for r in await b.journal("c1")]
        assert kinds == ["start", "signal", "signal", "end"]


# -- (b) a queue claim whose commit answer was lost --------------------------------------------------------------


class CommitLoser(Proxy):
    """The proxy, losing the answer to the first COMMIT sent on the connection that sent a request carrying
    `marker`: armed with a queued case's id, the COMMIT of the claim whose UPDATE named the case (the server
    commits it; the node never hears so, and its connection is reset)."""

    def __init__(self, dsn: str) -> None:
        self.marker = b""
        self._marked: socket.socket | None = None  # the server side of the connection that sent the marker
        self._armed: socket.socket | None = None  # its next request was sent: its answer is lost
        self._guard = threading.Lock()
        super().__init__(dsn)

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        answers = source in self._servers
        try:
            while data := source.recv(65536):
                with self._guard:
                    if answers and self._armed is source:  # the answer to the COMMIT: lost
                        self._armed = None
                        self.marker = b""
                        self.dropped += 1
                        lost = True
                    else:
                        lost = False
                        if not answers and self._marked is sink and b"COMMIT" in data:
                            self._marked, self._armed = None, sink
                        elif not answers and self.marker and self.marker in data and self._armed is None:
                            self._marked = sink
                if lost:
                    _reset(source, sink)
                    return
                sink.sendall(data)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                sink.shutdown(socket.SHUT_WR)


async def test_a_queued_case_whose_claim_answer_was_lost_is_started_once_by_its_claimer(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The commit answer of the claim that took a queued case is lost (the claim committed): the claiming node,
    still up with its lease held, finds its own claim never started at its next round and starts the case once;
    another node does not take it meanwhile."""
    schema = _pg.new_schema()
    RAN.clear()
    proxy = CommitLoser(_pg.database_dsn())
    try:
        queues = {"q": Queue(concurrency=4)}
        async with Substrate(store=node_store(schema, proxy.dsn), workflows=FLOWS, node_id="a", queues=queues) as a, \
                Substrate(store=node_store(schema), workflows=FLOWS, node_id="b") as b:
            proxy.marker = b"queued-lost-1"
            async with Client(node_store(schema)) as client:
                await client.new_case("once", {"id": "queued-lost-1"}, case_id="queued-lost-1", queue="q")
                await client.new_case("once", {"id": "queued-ok-2"}, case_id="queued-ok-2", queue="q")
            # cases queued here wake the node's claim at once (rather than at its next poll): the first claim, then
            # the round after the lost answer
            await a.new_case("once", {"id": "nudge-1"}, case_id="nudge-1", queue="q")
            await until(lambda: proxy.dropped == 1)
            await a.new_case("once", {"id": "nudge-2"}, case_id="nudge-2", queue="q")
            with anyio.fail_after(BOUND):
                assert (await a.await_case("queued-lost-1"))["ran"] is True
                assert (await a.await_case("queued-ok-2"))["ran"] is True
            assert proxy.dropped == 1  # the claim's commit answer was lost (else the attack did not happen)
            assert "could not claim queued cases" in caplog.text
            with anyio.fail_after(BOUND):
                for case_id in ("nudge-1", "nudge-2"):
                    await a.await_case(case_id)
            assert sorted(RAN) == ["nudge-1", "nudge-2", "queued-lost-1", "queued-ok-2"]  # each ran its effect once
            for case_id in ("queued-lost-1", "queued-ok-2", "nudge-1", "nudge-2"):
                kinds = [r.kind for r in await b.journal(case_id)]
                assert kinds.count("start") == 1, (case_id, kinds)
                assert a.status(case_id).state == "done"
    finally:
        proxy.down()


async def test_a_cancel_in_the_queue_whose_commit_answer_was_lost_returns_as_done() -> None:
    """The answer to the COMMIT that cancelled a queued case (and wrote its end) is lost: the cancel, sent again by
    the store, reads back that it was done and returns, rather than refusing it as a case that has already ended."""
    schema = _pg.new_schema()
    proxy = CommitLoser(_pg.database_dsn())
    flows = {"waits": seq(wait("go"))}
    try:
        queues = {"q": Queue(concurrency=1)}
        async with Substrate(store=node_store(schema, proxy.dsn), workflows=flows, node_id="a", queues=queues) as a:
            await a.new_case("waits", case_id="first", queue="q")
            await a.new_case("waits", case_id="held-in-queue", queue="q")
            await until(lambda: a.status("first").state == "waiting_signal")
            assert a.status("held-in-queue").state == "queued"
            proxy.marker = b"held-in-queue"
            with anyio.fail_after(BOUND):
                await a.cancel("held-in-queue", reason="not wanted")
            assert proxy.dropped == 1  # the cancel's commit answer was lost (else the attack did not happen)
            status = a.status("held-in-queue")
            assert (status.state, status.cancel_reason) == ("cancelled", "not wanted")
            assert [r.kind for r in await a.journal("held-in-queue")].count("cancel") == 1
    finally:
        proxy.down()

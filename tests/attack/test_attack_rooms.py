"""Attacks on the rooms of the Substrate (starts, deliveries, reads, ownership) through the public API, where two
features meet: a queued start whose checks refuse at dequeue, inputs of every kind through every door against
cases in odd places (queued, cancelled in their queue, retried back into their queue, evicted, another node's,
deleted, a child), and starts repeated through every door."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
from click.testing import CliRunner
from pydantic import BaseModel

from wfsub import CaseState, Client, Queue, SignalRejected, Substrate, Workflow, seq, task, wait
from wfsub.cli import main as command
from wfsub.stores import MemoryStore, PostgresStore

from .. import _warm
from ..stores import _pg

BOUND = 20.0  # seconds: a bound against a hang, not a latency requirement
needs_pg = pytest.mark.skipif(not _pg.ENABLED, reason=_pg.SKIP_REASON)


async def _state(sub: Substrate, case_id: str, *states: str) -> None:
    with anyio.fail_after(BOUND):
        while sub.status(case_id).state not in states:  # noqa: ASYNC110 - the public status is what is waited on
            await anyio.sleep(0.01)


class _Old(BaseModel):
    n: int


class _New(BaseModel):
    s: str


@pytest.mark.xfail(strict=True, reason=(
    "a queued case whose start is refused when its queue claims it (its workflow no longer registered, or its data "
    "no longer fits the workflow's input model) is only logged: it stays claimed and `queued` for good, holds its "
    "queue's room (no case queued after it starts) and its awaiters wait forever; it should end (failed, naming "
    "the refusal) and free the room"))
@pytest.mark.parametrize("change", ["workflow removed", "model changed"])
async def test_a_queued_start_refused_at_dequeue_ends_and_frees_its_queue(tmp_path: Path, change: str) -> None:
    """A queued case its queue cannot start any more (refused at dequeue) ends with the refusal; the next starts."""
    path = tmp_path / "c.db"
    queues = {"q": Queue(concurrency=1)}
    before = {"w": seq(wait("go")), "m": Workflow(seq(wait("gm")), input=_Old), "gone": seq(wait("gg"))}
    after = {"w": seq(wait("go")), "m": Workflow(seq(wait("gm")), input=_New)}
    doomed = "gone" if change == "workflow removed" else "m"
    async with Substrate(store=path, workflows=before, queues=queues) as sub:
        await sub.new_case("w", {}, case_id="blocker", queue="q")
        await _state(sub, "blocker", "waiting_signal")
        await sub.new_case(doomed, {"n": 1} if doomed == "m" else {}, case_id="doomed", queue="q")
        await sub.new_case("w", {}, case_id="next", queue="q")
    async with Substrate(store=path, workflows=after, queues=queues) as sub:
        await sub.cancel("blocker", reason="make room")
        with anyio.fail_after(5):  # (its queue looks for room every second)
            with pytest.raises(Exception) as refused:  # noqa: PT011 - what it is is asserted below
                await sub.await_case("doomed")
        assert sub.status("doomed").state == CaseState.FAILED, refused.value
        await _state(sub, "next", "waiting_signal")




_FAIL = {"on": True}


def _flaky(_: Any) -> dict[str, Any]:
    if _FAIL["on"]:
        raise RuntimeError("boom")
    return {}


_RETRIED = {"f": seq(task(_flaky, name="t"), wait("go")), "w": seq(wait("go"))}


@pytest.mark.parametrize("store", ["memory", "sqlite"])
@pytest.mark.parametrize("queue", [None, "q"])
async def test_a_start_repeated_for_a_retried_case_in_its_queue_leaves_it_there(
    tmp_path: Path, store: str, queue: str | None
) -> None:
    """A start repeated (same workflow and data) with the id of a retried case waiting in its queue is that case,
    still waiting: it does not start it past its queue's limit."""
    _FAIL["on"] = True
    opened = MemoryStore() if store == "memory" else tmp_path / "c.db"
    async with Substrate(store=opened, workflows=_RETRIED, queues={"q": Queue(concurrency=1)}) as sub:
        await sub.new_case("f", {}, case_id="rq", queue="q")
        await _state(sub, "rq", "failed")
        await sub.new_case("w", {}, case_id="blocker", queue="q")
        await _state(sub, "blocker", "waiting_signal")
        await sub.retry("rq")
        assert sub.status("rq").state == CaseState.QUEUED
        _FAIL["on"] = False
        again = await sub.new_case("f", {}, case_id="rq", queue=queue)
        assert again.case_id == "rq"
        assert sub.status("rq").state == CaseState.QUEUED  # the queue still holds it: its room is the blocker's
        assert sub.statistics().cases_live == 1
        await sub.cancel("blocker", reason="make room")
        await _state(sub, "rq", "waiting_signal")


async def _refusal(call: Any) -> tuple[str, str] | None:
    try:
        await call
    except Exception as exc:  # noqa: BLE001 - the refusal is what is compared
        return type(exc).__name__, str(exc)
    return None


def _command(*argv: str) -> tuple[int, str]:
    ran = CliRunner().invoke(command, list(argv), env={"COLUMNS": "2000"})
    return ran.exit_code, ran.output.strip()


async def test_every_door_refuses_an_input_for_a_retried_case_in_its_queue_alike(tmp_path: Path) -> None:
    """A signal or region operation for a retried case waiting in its queue is refused by the Substrate, its handle,
    a Client, a standby and the command with one message (none puts it in the inbox for the owner to drop)."""
    _FAIL["on"] = True
    path = tmp_path / "c.db"
    queues = {"q": Queue(concurrency=1)}
    async with Substrate(store=path, workflows=_RETRIED, queues=queues) as sub:
        await sub.new_case("f", {}, case_id="rq", queue="q")
        await _state(sub, "rq", "failed")
        await sub.new_case("w", {}, case_id="blocker", queue="q")
        await _state(sub, "blocker", "waiting_signal")
        await sub.retry("rq")
        async with Client(path) as client, Substrate(store=path, workflows=_RETRIED, queues=queues) as standby:
            assert standby.standby
            said = {
                "substrate": await _refusal(sub.signal("rq", "go")),
                "handle": await _refusal(sub.handle("rq").signal("go")),
                "client": await _refusal(client.signal("rq", "go")),
                "standby": await _refusal(standby.signal("rq", "go")),
                "client region": await _refusal(client.cancel_region("rq", "nosuch")),
                "standby region": await _refusal(standby.cancel_region("rq", "nosuch")),
            }
            ran = await anyio.to_thread.run_sync(lambda: _command("signal", str(path), "rq", "go", "--timeout", "5"))
        expected = await _refusal(sub.signal("rq", "go"))
        assert expected is not None and "it is queued: retried" in expected[1]
        region = await _refusal(sub.cancel_region("rq", "nosuch"))
        assert said == {"substrate": expected, "handle": expected, "client": expected, "standby": expected,
                        "client region": region, "standby region": region}
        assert ran[0] != 0 and expected[1] in ran[1], ran
        _FAIL["on"] = False
        await sub.cancel("blocker", reason="make room")
        await _state(sub, "rq", "waiting_signal")  # it starts, and no signal was left for it in the inbox
        assert sub.status("rq").signals == ("go",)


@pytest.mark.parametrize("store", ["none", "memory", "sqlite"])
async def test_a_handle_is_given_for_a_case_waiting_in_its_queue(tmp_path: Path, store: str) -> None:
    """`handle(case_id)` of a case waiting in its queue, or cancelled there, is its handle (as `new_case` and a
    Client's `handle` give one, and `status` reads it), not CaseNotFound."""
    opened = {"none": None, "memory": MemoryStore(), "sqlite": tmp_path / "c.db"}[store]
    async with Substrate(store=opened, workflows=_RETRIED, queues={"q": Queue(concurrency=1)}) as sub:
        await sub.new_case("w", {}, case_id="blocker", queue="q")
        await _state(sub, "blocker", "waiting_signal")
        await sub.new_case("w", {}, case_id="waiting", queue="q")
        await sub.new_case("w", {}, case_id="dropped", queue="q")
        await sub.cancel("dropped", reason="not needed")
        handle = sub.handle("waiting")
        assert handle.case_id == "waiting" and handle.status().state == CaseState.QUEUED
        assert sub.handle("dropped").status().state == CaseState.CANCELLED
        if store == "sqlite":
            async with Client(opened) as client:
                assert (await client.handle("waiting")).case_id == "waiting"
        await sub.cancel("blocker", reason="make room")
        await _state(sub, "waiting", "waiting_signal")
        await handle.signal("go")
        assert await handle.result(timeout=BOUND) == {"go": None}


@pytest.mark.parametrize("store", ["none", "sqlite"])
async def test_an_input_for_a_case_waiting_in_its_queue_says_it_is_queued(tmp_path: Path, store: str) -> None:
    """A signal for a case waiting in its queue is refused saying it is queued (not that there is no such case)."""
    opened = None if store == "none" else tmp_path / "c.db"
    async with Substrate(store=opened, workflows=_RETRIED, queues={"q": Queue(concurrency=1)}) as sub:
        await sub.new_case("w", {}, case_id="blocker", queue="q")
        await sub.new_case("w", {}, case_id="waiting", queue="q")
        assert sub.status("waiting").state == CaseState.QUEUED
        refused = await _refusal(sub.signal("waiting", "go"))
        assert refused is not None and refused[0] == "SignalRejected" and "queued" in refused[1], refused
        assert await _refusal(sub.handle("waiting").signal("go")) == refused
        if opened is not None:  # the other doors: a Client, and the command
            async with Client(opened) as client:
                assert await _refusal(client.signal("waiting", "go")) == refused
            ran = await _warm.acommand("signal", str(opened), "waiting", "go")
            assert ran.returncode != 0 and "it is queued: it waits in its queue 'q'" in ran.stderr, ran.stderr


@needs_pg
async def test_a_node_refuses_an_input_for_a_retried_case_in_its_queue_as_its_owner_does() -> None:
    """On Postgres, another node refuses a signal for a retried case waiting in its queue as the node that ran it
    does (it is queued), rather than leaving it in the inbox for that node to drop."""
    _FAIL["on"] = True
    dsn, schema = _pg.database_dsn(), _pg.new_schema()
    queues = {"q": Queue(concurrency=1)}

    def node(name: str) -> Substrate:
        return Substrate(store=PostgresStore(dsn, schema=schema), workflows=_RETRIED, queues=queues, node_id=name)

    async with node("a") as a, node("b") as b:
        await a.new_case("f", {}, case_id="rq", queue="q")
        await _state(a, "rq", "failed")
        await a.new_case("w", {}, case_id="blocker", queue="q")
        await _state(a, "blocker", "waiting_signal")
        try:  # (either node may have claimed and run it: its owner retries it)
            await a.retry("rq")
            owner, other = a, b
        except SignalRejected:
            await b.retry("rq")
            owner, other = b, a
        await _state(other, "rq", "queued")
        here, there = await _refusal(owner.signal("rq", "go")), await _refusal(other.signal("rq", "go"))
        assert here is not None and "it is queued: retried" in here[1], here
        assert there == here

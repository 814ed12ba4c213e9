"""A case cancelled while it waits in its queue ends there as any case ends, and every door answers it so; a
deleted case leaves no queue item behind, so its id starts afresh (and its start still counts in its queue's
rate window). On no store, Memory, SQLite and Postgres; across two Postgres nodes; the owner, a Client and the
`wfsub` command."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

import wfsub
from wfsub import CaseCancelled, CaseExists, CaseNotFound, Queue, SignalRejected, Substrate
from wfsub.testing import VirtualClock

from .. import _warm
from ._util import ROOT
from .test_queues import KINDS, T0, WORKFLOWS, substrate


async def _blocked_and_cancelled(sub: Any, clock: VirtualClock) -> None:
    """'w' waits in queue 'q' behind 'blocker' (concurrency 1) and is cancelled there with request id c1."""
    await sub.new_case("waits", queue="q", case_id="blocker")
    await clock.advance(0)
    await sub.new_case("job", {"n": 1}, queue="q", case_id="w", tags={"t": "1"})
    await sub.cancel("w", reason="not needed", request_id="c1")


@pytest.mark.parametrize("kind", KINDS)
async def test_a_case_cancelled_in_its_queue_is_an_ended_case_at_every_owner_door(kind: str, tmp_path: Path) -> None:
    """A case cancelled while queued: status cancelled with its reason (never started), awaiters get CaseCancelled,
    a retried cancel with its request id returns (with a store), other inputs are refused as for an ended case, a
    start with its id and data is that case and with other data CaseExists, and it never runs."""
    clock = VirtualClock(start=T0)
    async with substrate(kind, tmp_path, clock, {"q": Queue(concurrency=1)}) as sub:
        await _blocked_and_cancelled(sub, clock)
        status = sub.status("w")
        assert (status.state, status.cancel_reason, status.started_at, status.dequeued_at, status.queue) == (
            "cancelled", "not needed" if kind != "none" else "cancelled while queued", None, None, "q")
        with pytest.raises(CaseCancelled):
            await sub.await_case("w")
        if kind == "none":  # no request id is kept without a store: a retry is refused as any ended case's
            with pytest.raises(SignalRejected, match="has already ended"):
                await sub.cancel("w", request_id="c1")
        else:
            await sub.cancel("w", request_id="c1")
        with pytest.raises(SignalRejected, match="has already ended"):
            await sub.cancel("w")
        with pytest.raises(SignalRejected, match="has already ended"):
            await sub.signal("w", "go")
        again = await sub.new_case("job", {"n": 1}, case_id="w")
        assert again.status().state == "cancelled"
        again = await sub.new_case("job", {"n": 1}, case_id="w", queue="q")
        assert again.status().state == "cancelled"
        with pytest.raises(CaseExists, match="'w'"):
            await sub.new_case("job", {"n": 2}, case_id="w")
        await sub.signal("blocker", "go")
        await sub.await_case("blocker")
        await clock.advance(5)
        assert sub.status("w").state == "cancelled" and sub.status("w").dequeued_at is None
        if kind != "none":
            journal = await sub.journal("w")
            assert [r.kind for r in journal] == ["start", "cancel", "end"]
            assert journal[1].model_dump()["request_id"] == "c1"
            assert journal[2].model_dump()["queue"] == "q"
            assert [(s.case_id, s.state) for s in sub.cases(tags={"t": "1"})] == [("w", "cancelled")]


@pytest.mark.parametrize("kind", KINDS)
async def test_a_case_cancelled_in_its_queue_can_be_deleted_and_its_id_queued_again(kind: str, tmp_path: Path) -> None:
    """delete of a case cancelled while queued removes it (status: CaseNotFound), and a new case queued with its id
    is a new case that runs."""
    clock = VirtualClock(start=T0)
    async with substrate(kind, tmp_path, clock, {"q": Queue(concurrency=1)}) as sub:
        await _blocked_and_cancelled(sub, clock)
        await sub.delete("w")
        with pytest.raises(CaseNotFound):
            sub.status("w")
        await sub.new_case("job", {"n": 2}, queue="q", case_id="w")
        assert sub.status("w").state == "queued"
        await sub.signal("blocker", "go")
        await clock.advance(1)
        assert await sub.await_case("w") == {"n": 2, "ran": True}


@pytest.mark.parametrize("kind", KINDS)
async def test_a_deleted_cases_start_still_counts_in_its_queues_rate_window(kind: str, tmp_path: Path) -> None:
    """With rate=(1, 60 s), deleting the case that started at T0 does not let another start before T0 + 60."""
    clock = VirtualClock(start=T0)
    async with substrate(kind, tmp_path, clock, {"r": Queue(rate=(1, 60.0))}) as sub:
        await sub.new_case("job", queue="r", case_id="a")
        await clock.advance(0)
        assert await sub.await_case("a") == {"ran": True}
        await sub.delete("a")
        await sub.new_case("job", queue="r", case_id="b")
        await clock.advance(59)
        assert sub.status("b").state == "queued"
        await clock.advance(1)
        assert await sub.await_case("b") == {"ran": True} and sub.status("b").dequeued_at == T0 + 60


async def test_a_client_and_the_owner_agree_on_a_case_the_client_cancelled_in_its_queue(tmp_path: Path) -> None:
    """A Client cancels a queued case with a request id: its retry returns, its signal and another cancel are
    refused as for an ended case, its start with that id is that case, its status and the owner's say cancelled,
    and its delete lets the id be queued again."""
    db = str(tmp_path / "cases.db")
    async with Substrate(store=db, workflows=WORKFLOWS, queues={"q": Queue(concurrency=1)}) as sub, wfsub.Client(
        db
    ) as client:
        await client.new_case("waits", queue="q", case_id="blocker")
        handle = await client.new_case("job", {"n": 1}, queue="q", case_id="w")
        await client.cancel("w", request_id="c1")
        await client.cancel("w", request_id="c1")
        with pytest.raises(SignalRejected, match="has already ended"):
            await client.cancel("w")
        with pytest.raises(SignalRejected, match="has already ended"):
            await client.signal("w", "go")
        with pytest.raises(CaseCancelled, match="cancelled while queued"):
            await handle.result()
        assert (await client.new_case("job", {"n": 1}, case_id="w")).status().state == "cancelled"
        assert (await client.status("w")).state == sub.status("w").state == "cancelled"
        assert (await client.status("w")).started_at is None and handle.status().started_at is None
        assert [r.kind for r in await client.journal("w")] == ["start", "cancel", "end"]
        await client.delete("w")
        await client.new_case("job", {"n": 2}, queue="q", case_id="w")
        await sub.cancel("blocker")
        assert await client.await_case("w") == {"n": 2, "ran": True}


async def test_two_nodes_agree_on_a_case_cancelled_in_its_queue_on_one_of_them() -> None:
    """Node b cancels a case node a queued: a sees it cancelled, a's retry of b's cancel returns, a start with
    its id on a is that case, and after b deletes it a queues a new case with its id that runs."""
    from wfsub.stores import PostgresStore

    from ..stores import _pg

    if not _pg.ENABLED:
        pytest.skip(_pg.SKIP_REASON)
    dsn, schema = _pg.database_dsn(), _pg.new_schema()
    clock = VirtualClock(start=T0)
    queues = {"q": Queue(concurrency=1)}
    async with (
        Substrate(store=PostgresStore(dsn, schema=schema), clock=clock, workflows=WORKFLOWS, queues=queues,
                  node_id="a") as a,
        Substrate(store=PostgresStore(dsn, schema=schema), clock=clock, workflows=WORKFLOWS, queues=queues,
                  node_id="b") as b,
    ):
        await a.new_case("waits", queue="q", case_id="blocker")
        await clock.advance(0)
        await a.new_case("job", queue="q", case_id="w")
        await b.cancel("w", request_id="c1")
        assert a.status("w").state == "cancelled"
        await a.cancel("w", request_id="c1")
        with pytest.raises(CaseCancelled):
            await a.await_case("w")
        assert (await a.new_case("job", case_id="w")).status().state == "cancelled"
        await b.delete("w")
        with pytest.raises(CaseNotFound):
            a.status("w")
        await a.new_case("job", {"n": 3}, queue="q", case_id="w")
        await b.cancel("blocker")
        for _ in range(10):
            if a.status("w").state == "done":
                break
            await clock.advance(1)
        assert await a.await_case("w") == {"n": 3, "ran": True}


async def test_the_cancel_command_ends_a_queued_case_as_the_other_doors_do(tmp_path: Path) -> None:
    """`wfsub cancel STORE W --request-id c1` of a queued case ends it cancelled in its queue (its journal and
    status as any door's), and the same command again answers that it was done before."""
    db = str(tmp_path / "cases.db")
    async with Substrate(store=db, workflows=WORKFLOWS, queues={"q": Queue(concurrency=1)}) as sub:
        await sub.new_case("waits", queue="q", case_id="blocker")
        await sub.new_case("job", queue="q", case_id="w")
        env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
        ran = [
            await _warm.acommand("cancel", db, "w", "--request-id", "c1", cwd=tmp_path, env=env) for _ in range(2)
        ]
        said = [(r.returncode, r.stdout, r.stderr) for r in ran]
        assert said[0][0] == 0 and "was queued: cancelled" in said[0][1], said
        assert said[1][0] == 0 and "request id 'c1' was applied before" in said[1][2], said
        assert sub.status("w").state == "cancelled" and sub.status("w").started_at is None
        assert [r.kind for r in await sub.journal("w")] == ["start", "cancel", "end"]


async def test_a_start_without_a_queue_with_the_id_of_a_waiting_case_starts_nothing_new_without_a_store(
    tmp_path: Path,
) -> None:
    """Without a store, new_case(case_id=W) (no queue) while W waits in its queue is W (the same start) or
    CaseExists, and W runs once, from its queue."""
    clock = VirtualClock(start=T0)
    async with substrate("none", tmp_path, clock, {"q": Queue(concurrency=1)}) as sub:
        await sub.new_case("waits", queue="q", case_id="blocker")
        await clock.advance(0)
        await sub.new_case("job", {"n": 1}, queue="q", case_id="w")
        assert (await sub.new_case("job", {"n": 1}, case_id="w")).status().state == "queued"
        with pytest.raises(CaseExists, match="'w'"):
            await sub.new_case("job", {"n": 2}, case_id="w")
        await sub.signal("blocker", "go")
        await clock.advance(1)
        assert await sub.await_case("w") == {"n": 1, "ran": True}


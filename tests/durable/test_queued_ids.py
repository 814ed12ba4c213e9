"""A start by id of a case that waits in its queue (queued, or claimed and not started yet), through any door, is
that queued case when it is the same start (its handle) and CaseExists naming what differs otherwise: it never
writes a second case, and the queued case later starts from its queue with its own data. On no store, Memory,
SQLite and Postgres; the owner, a Client, placement="any", a fork; and two starts of one id at once."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

import wfsub
from wfsub import CaseExists, CaseNotFound, Queue, Substrate
from wfsub._store._queueing import QueueLimits
from wfsub.stores import SqliteStore
from wfsub.testing import VirtualClock

from ._util import same_store
from .test_queues import KINDS, T0, WORKFLOWS, substrate

QUEUES = {"q": Queue(concurrency=1)}


async def blocked(sub: Any, clock: VirtualClock | None = None) -> None:
    """'blocker' holds queue 'q' (concurrency 1): what is queued behind it waits."""
    await sub.new_case("waits", queue="q", case_id="blocker")
    if clock is not None:
        await clock.advance(0)


async def released(sub: Substrate, clock: VirtualClock, *case_ids: str) -> list[Any]:
    """Let 'blocker' end, then the results of the cases queued behind it (one after another)."""
    await sub.signal("blocker", "go")
    results = []
    for case_id in case_ids:
        for _ in range(20):
            if sub.status(case_id).state == "done":
                break
            await clock.advance(1)
        results.append(await sub.await_case(case_id))
    return results


@pytest.mark.parametrize("kind", KINDS)
async def test_a_start_by_id_of_a_queued_case_at_the_owner_door_is_that_case_or_case_exists(
    kind: str, tmp_path: Path
) -> None:
    """new_case(case_id=W) without a queue while W is queued: the same workflow and data give W's handle (queued),
    other data or another workflow raise CaseExists naming it; nothing is written, and W runs once with its data."""
    clock = VirtualClock(start=T0)
    async with substrate(kind, tmp_path, clock, QUEUES) as sub:
        await blocked(sub, clock)
        await sub.new_case("job", {"n": 1}, queue="q", case_id="w")
        again = await sub.new_case("job", {"n": 1}, case_id="w")
        assert again.case_id == "w" and again.status().state == "queued"
        with pytest.raises(CaseExists, match=r"'w'.*other start data \(keys that differ: 'n'\)"):
            await sub.new_case("job", {"n": 2}, case_id="w")
        with pytest.raises(CaseExists, match="workflow 'job' \\(this call: 'slow'\\)"):
            await sub.new_case("slow", {"n": 1}, case_id="w")
        assert sub.status("w").state == "queued"
        if kind != "none":
            with pytest.raises(CaseNotFound):
                await sub.journal("w")
        assert await released(sub, clock, "w") == [{"n": 1, "ran": True}]
        if kind != "none":
            assert [r.kind for r in await sub.journal("w")].count("start") == 1


@pytest.mark.parametrize("kind", ["memory", "sqlite", "postgres"])
async def test_a_fork_to_the_id_of_a_queued_case_is_refused(kind: str, tmp_path: Path) -> None:
    """fork(..., new_case_id=W) while W is queued raises CaseExists and writes nothing; W then runs from its
    queue."""
    clock = VirtualClock(start=T0)
    async with substrate(kind, tmp_path, clock, QUEUES) as sub:
        await blocked(sub, clock)
        await sub.new_case("job", {"n": 1}, queue="q", case_id="w")
        with pytest.raises(CaseExists, match="'w'"):
            await sub.fork("blocker", at=0, new_case_id="w")
        assert sub.status("w").state == "queued"
        assert await released(sub, clock, "w") == [{"n": 1, "ran": True}]


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
async def test_a_start_by_id_of_a_queued_case_at_a_clients_door_is_that_case_or_case_exists(
    kind: str, tmp_path: Path
) -> None:
    """A Client's new_case(case_id=W) without a queue while W is queued (by the owner or by the Client): the same
    start is W, other data CaseExists; on Postgres placement="any" from the owner alike; W runs once, with its
    data."""
    store = same_store(kind, tmp_path)
    clock = VirtualClock(start=T0)
    async with Substrate(store=store(), clock=clock, workflows=WORKFLOWS, queues=QUEUES) as sub, wfsub.Client(
        store()
    ) as client:
        await blocked(sub, clock)
        await sub.new_case("job", {"n": 1}, queue="q", case_id="w")
        await client.new_case("job", {"n": 2}, queue="q", case_id="v")
        for case_id, n in (("w", 1), ("v", 2)):
            assert (await client.new_case("job", {"n": n}, case_id=case_id)).case_id == case_id
            with pytest.raises(CaseExists, match=f"'{case_id}'.*other start data"):
                await client.new_case("job", {"n": n + 10}, case_id=case_id)
            assert (await client.status(case_id)).state == "queued"
            with pytest.raises(CaseNotFound):
                await client.journal(case_id)
        if kind == "postgres":
            with pytest.raises(CaseExists, match="'w'.*other start data"):
                await sub.new_case("job", {"n": 3}, case_id="w", placement="any")
            assert (await sub.new_case("job", {"n": 1}, case_id="w", placement="any")).case_id == "w"
        assert await released(sub, clock, "w", "v") == [{"n": 1, "ran": True}, {"n": 2, "ran": True}]


async def test_a_start_by_id_of_a_case_claimed_from_its_queue_and_not_started_is_refused(tmp_path: Path) -> None:
    """W claimed from its queue by a node that stopped before starting it: a Client's and an owner's start of W
    with other data raise CaseExists, the same start is W; the next owner that runs the queue starts W with its
    own data, once."""
    db = str(tmp_path / "cases.db")
    async with Substrate(store=db, workflows=WORKFLOWS, queues=QUEUES):
        pass  # (queue 'q' registered in the store)
    async with wfsub.Client(db) as client:
        await client.new_case("job", {"n": 1}, queue="q", case_id="w")
    claimer = SqliteStore(db)
    await claimer.open(owner=False, owner_id="claimer")
    try:
        claimed, _ = await claimer.queue_claim("q", QueueLimits(concurrency=1), "gone", time.time(), 1)
    finally:
        await claimer.close()
    assert [i.case_id for i in claimed] == ["w"]
    async with Substrate(store=db, workflows=WORKFLOWS) as sub, wfsub.Client(db) as client:  # (no queues: no claims)
        for caller in (client, sub):
            with pytest.raises(CaseExists, match="'w'.*other start data"):
                await caller.new_case("job", {"n": 2}, case_id="w")
            assert (await caller.new_case("job", {"n": 1}, case_id="w")).case_id == "w"
        with pytest.raises(CaseNotFound):
            await sub.journal("w")
    async with Substrate(store=db, workflows=WORKFLOWS, queues=QUEUES) as sub:  # takes the claim over as it opens
        assert await sub.await_case("w") == {"n": 1, "ran": True}
        assert [r.kind for r in await sub.journal("w")].count("start") == 1


async def both(done: dict[str, Any], what: str, start: Any) -> None:
    try:
        await start
    except CaseExists as exc:
        done[what] = exc
    else:
        done[what] = None


@pytest.mark.parametrize("kind", KINDS)
async def test_two_starts_of_one_id_at_once_one_queued_one_not_make_one_case(kind: str, tmp_path: Path) -> None:
    """new_case(case_id=K, queue='q') and new_case(case_id=K) with other data at once (a Client's and the owner's
    where there is a store), for 8 ids: exactly one of each pair is refused with CaseExists, and each id runs once,
    with the data of the start that was taken."""
    store = same_store(kind, tmp_path)
    clock = VirtualClock(start=T0)
    async with Substrate(store=store(), clock=clock, workflows=WORKFLOWS, queues=QUEUES) as sub, \
            contextlib.AsyncExitStack() as stack:
        queuer: Any = sub
        if kind in ("sqlite", "postgres"):
            queuer = await stack.enter_async_context(wfsub.Client(store()))
        await blocked(sub, clock)
        taken: dict[str, int] = {}
        for i in range(8):
            case_id = f"k{i}"
            done: dict[str, Any] = {}
            async with anyio.create_task_group() as tg:
                tg.start_soon(both, done, "queued", queuer.new_case("job", {"n": 1}, case_id=case_id, queue="q"))
                tg.start_soon(both, done, "started", sub.new_case("job", {"n": 2}, case_id=case_id))
            assert sum(e is None for e in done.values()) == 1, (case_id, done)
            taken[case_id] = 1 if done["queued"] is None else 2
        await sub.signal("blocker", "go")
        for case_id, n in taken.items():
            for _ in range(40):
                if sub.status(case_id).state == "done":
                    break
                await clock.advance(1)
            assert await sub.await_case(case_id) == {"n": n, "ran": True}, case_id
            if kind != "none":
                assert [r.kind for r in await sub.journal(case_id)].count("start") == 1

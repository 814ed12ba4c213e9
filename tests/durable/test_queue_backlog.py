"""A claim considers every waiting item of its queue, however long the backlog: a tenant's backlog in a full
partition, or a backlog of delayed cases, never hides a case that may start now. On no store, Memory, SQLite and
Postgres."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from wfsub import Queue, Substrate
from wfsub.testing import VirtualClock

from ._util import same_store
from .test_queues import KINDS, T0, WORKFLOWS

BACKLOG = 1001  # more than one read of a thousand waiting items (what a claim once looked at)


def substrate(kind: str, tmp_path: Path, clock: VirtualClock, queues: dict[str, Queue]) -> Substrate:
    """A Substrate on the kind of store; on Postgres with 16 pooled connections, so that the backlog's queue writes
    run side by side."""
    if kind == "postgres":
        from wfsub.stores import PostgresStore

        from ..stores import _pg

        if not _pg.ENABLED:
            pytest.skip(_pg.SKIP_REASON)
        store = PostgresStore(_pg.database_dsn(), schema=_pg.new_schema(), readers=16)
    else:
        store = same_store(kind, tmp_path)()
    return Substrate(store=store, clock=clock, workflows=WORKFLOWS, queues=queues)


async def queue_many(sub: object, count: int, **options: object) -> None:
    """Queue `count` cases of `waits` side by side (their queue writes commit in groups)."""
    async def one(i: int) -> None:
        await sub.new_case("waits", {"i": i}, case_id=f"backlog-{i}", **options)  # type: ignore[attr-defined]

    limiter = anyio.CapacityLimiter(16)

    async def bounded(i: int) -> None:
        async with limiter:
            await one(i)

    async with anyio.create_task_group() as tg:
        for i in range(count):
            tg.start_soon(bounded, i)


@pytest.mark.parametrize("kind", KINDS)
async def test_a_tenants_backlog_in_a_full_partition_never_starves_another_tenant(kind: str, tmp_path: Path) -> None:
    """Partitioned, concurrency 1: tenant a runs one case with 1,001 more waiting; a case of tenant b queued after
    them starts at once."""
    clock = VirtualClock(start=T0)
    async with substrate(kind, tmp_path, clock, {"t": Queue(concurrency=1, partitioned=True)}) as sub:
        await sub.new_case("waits", queue="t", partition="a", case_id="a-running")
        await clock.advance(0)
        assert sub.status("a-running").state == "waiting_signal"
        await queue_many(sub, BACKLOG, queue="t", partition="a")
        await sub.new_case("job", {"tenant": "b"}, queue="t", partition="b", case_id="b-1")
        await clock.advance(1)
        assert sub.status("b-1").state == "done"
        assert len(sub.cases(state="queued", limit=BACKLOG + 10)) == BACKLOG  # tenant a's, still waiting


@pytest.mark.parametrize("kind", KINDS)
async def test_a_backlog_of_delayed_cases_never_holds_back_one_due_now(kind: str, tmp_path: Path) -> None:
    """Concurrency 2: 1,001 cases queued with delay=3600, then one with none: that one starts (and ends) at once;
    once their hour has passed, the delayed ones fill the queue."""
    clock = VirtualClock(start=T0)
    async with substrate(kind, tmp_path, clock, {"d": Queue(concurrency=2)}) as sub:
        await queue_many(sub, BACKLOG, queue="d", delay=3600)
        await sub.new_case("job", {"now": True}, queue="d", case_id="due-now")
        await clock.advance(1)
        assert sub.status("due-now").state == "done"
        assert sub.status("backlog-0").state == "queued"
        await clock.advance(3600)
        assert len(sub.cases(state="waiting_signal")) == 2
        assert len(sub.cases(state="queued", limit=BACKLOG)) == BACKLOG - 2

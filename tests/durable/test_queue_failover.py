"""A queue item follows its case to the node that takes it over, so `per_node` counts the cases a node runs after
a failover or a new owner's start (not only those it claimed itself). On Memory and SQLite (a new owner of the
store), and Postgres (a node SIGKILLed, its cases taken over by another)."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from wfsub import Queue, Substrate
from wfsub.testing import VirtualClock

from .. import _warm
from ._util import ROOT, eventually
from ._util import same_store as store_maker
from .test_queues import T0, WORKFLOWS


async def owner_of(dsn: str, schema: str, case_id: str, node: str) -> bool:
    """Whether `node` owns the case now, as its row says (read as the wfsub command reads it)."""
    from wfsub.stores import PostgresStore

    operator = PostgresStore(dsn, schema=schema, create=False)
    await operator.open(owner=False, owner_id="operator")
    try:
        row = await operator.row(case_id)
        return row is not None and row.owner == node
    finally:
        await operator.close()


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
async def test_per_node_counts_the_cases_a_new_owner_took_over(kind: str, tmp_path: Path) -> None:
    """per_node=1: a case an owner that stopped started on the queue counts for the owner after it (another node
    id): the next queued case waits until that case ends, then starts."""
    clock = VirtualClock(start=T0)
    make = store_maker(kind, tmp_path)
    queues = {"q": Queue(per_node=1)}
    async with Substrate(store=make(), clock=clock, workflows=WORKFLOWS, queues=queues, node_id="old") as sub:
        await sub.new_case("waits", queue="q", case_id="first")
        await sub.new_case("job", queue="q", case_id="second")
        await clock.advance(1)
        assert (sub.status("first").state, sub.status("second").state) == ("waiting_signal", "queued")
    async with Substrate(store=make(), clock=clock, workflows=WORKFLOWS, queues=queues, node_id="new") as sub:
        await clock.advance(1)
        assert sub.status("second").state == "queued"  # "first" runs here now: this node's one
        await sub.signal("first", "go")
        await sub.await_case("first")
        await clock.advance(1)
        assert await sub.await_case("second") == {"ran": True}


async def test_per_node_counts_the_cases_a_node_took_over_from_a_killed_node(tmp_path: Path) -> None:
    """Postgres, per_node=1: node b runs b1; a node process running a1 is SIGKILLed and b takes a1 over. When b1
    ends, b still runs a1 (its one), so the queued case c waits: it starts only once a1 has ended."""
    from wfsub.stores import PostgresStore

    from ..stores import _pg

    if not _pg.ENABLED:
        pytest.skip(_pg.SKIP_REASON)
    dsn, schema = _pg.database_dsn(), _pg.new_schema()
    url = f"{dsn}{'&' if '?' in dsn else '?'}schema={schema}&lease_seconds=1"
    queues = {"q": Queue(per_node=1), "probe": Queue()}
    doomed = _warm.Popen(  # started once, before the test's own event loop work
        [sys.executable, "-m", "tests.durable._queue_node", url, "doomed", "a1"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT,
    )
    try:
        async with Substrate(store=PostgresStore(dsn, schema=schema, lease_seconds=1.0), workflows=WORKFLOWS,
                             queues=queues, node_id="b") as b:
            await b.new_case("waits", queue="q", case_id="b1")
            await eventually(lambda: b.status("b1").state == "waiting_signal")
            assert doomed.stdout is not None
            line = await anyio.to_thread.run_sync(doomed.stdout.readline)
            assert line.strip() == "running a1", line
            await b.new_case("job", {"n": 1}, queue="q", case_id="c")
            doomed.kill()  # SIGKILL: a1 is left to b once the lease of "doomed" has run out
            await anyio.to_thread.run_sync(doomed.wait)
            await eventually(lambda: owner_of(dsn, schema, "a1", "b"), limit=60)
            await b.signal("b1", "go")
            await b.await_case("b1")
            # A round of b's queues after b1's end: the probe's queue comes after q, and its case starts in it.
            await b.new_case("job", queue="probe", case_id="probe")
            await b.await_case("probe")
            assert b.status("c").state == "queued"  # b runs a1: its share of q
            await b.signal("a1", "go")
            await b.await_case("a1")
            assert await b.await_case("c") == {"n": 1, "ran": True}
            a1_end = (await b.journal("a1"))[-1].time
            assert b.status("c").dequeued_at is not None and b.status("c").dequeued_at >= a1_end
    finally:
        if doomed.poll() is None:
            doomed.kill()
        doomed.wait()
        assert doomed.stdout is not None and doomed.stdin is not None
        doomed.stdout.close()
        with contextlib.suppress(BrokenPipeError):
            doomed.stdin.close()

"""A retried case goes back through its queue: it waits there (state `queued`) until its queue has room, its slot
counts while it runs, and its dedup key is held again (a retry while another live case holds it is refused).
While it waits it can be cancelled (it ends there) and takes no other input. On Memory, SQLite and Postgres, and
through a Client."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import wfsub
from wfsub import CaseCancelled, CaseExists, CaseFailed, Queue, SignalRejected, Substrate, seq, task, wait
from wfsub.testing import VirtualClock

from ._util import eventually
from ._util import same_store as store_maker
from .test_queues import T0, WORKFLOWS

KINDS = ["memory", "sqlite", "postgres"]


class Flaky:
    fail = True


def maybe_fail(c: dict[str, Any]) -> dict[str, Any]:
    if Flaky.fail:
        raise RuntimeError("not yet")
    return {"ok": True}


FLOWS = {**WORKFLOWS, "flaky": seq(task(maybe_fail, name="maybe"), wait("go"))}


async def failed_on_queue(sub: Substrate, case_id: str = "f", **options: Any) -> None:
    """Case `case_id` of `flaky` started on queue q, failed."""
    Flaky.fail = True
    await sub.new_case("flaky", queue="q", case_id=case_id, **options)
    with pytest.raises(CaseFailed, match="not yet"):
        await sub.await_case(case_id)
    Flaky.fail = False  # the fix


@pytest.mark.parametrize("kind", KINDS)
async def test_a_retried_case_waits_for_room_in_its_queue(kind: str, tmp_path: Path) -> None:
    """Concurrency 1: f fails, w starts in its place; retry(f) puts f back in the queue (queued, not dequeued)
    while w runs; once w ends, f starts from its retry record and ends done. f never ran beside w."""
    clock = VirtualClock(start=T0)
    async with Substrate(store=store_maker(kind, tmp_path)(), clock=clock, workflows=FLOWS,
                         queues={"q": Queue(concurrency=1)}) as sub:
        await failed_on_queue(sub)
        await sub.new_case("waits", queue="q", case_id="w")
        await clock.advance(1)
        assert sub.status("w").state == "waiting_signal"
        handle = await sub.retry("f")
        await clock.advance(1)
        status = handle.status()
        assert (status.state, status.queue, status.dequeued_at) == ("queued", "q", None)
        assert [s.case_id for s in sub.cases(state="queued")] == ["f"]
        assert [s.case_id for s in sub.cases()].count("f") == 1
        await sub.signal("w", "go")
        await sub.await_case("w")
        await clock.advance(1)
        await eventually(lambda: sub.status("f").state == "waiting_signal")
        dequeued = sub.status("f").dequeued_at
        await sub.signal("f", "go")
        assert await handle.result() == {"ok": True, "go": None}
        kinds = [r.kind for r in await sub.journal("f")]
        assert kinds[:3] == ["start", "end", "retry"] and kinds[-1] == "end", kinds
        w_end = (await sub.journal("w"))[-1].time
        retried_at = next(r for r in await sub.journal("f") if r.kind == "retry").time
        assert dequeued is not None and retried_at < T0 + 2 <= w_end <= dequeued  # queued while w ran


@pytest.mark.parametrize("kind", KINDS)
async def test_a_retry_holds_the_dedup_key_again_or_is_refused(kind: str, tmp_path: Path) -> None:
    """f (dedup key k) fails, freeing k; g takes k. retry(f) is refused with CaseExists naming g (nothing is
    written: f stays failed); once g has ended, retry(f) holds k again: a third case with k is refused."""
    clock = VirtualClock(start=T0)
    async with Substrate(store=store_maker(kind, tmp_path)(), clock=clock, workflows=FLOWS,
                         queues={"q": Queue()}) as sub:
        await failed_on_queue(sub, dedup="k")
        await sub.new_case("waits", queue="q", dedup="k", case_id="g")
        await clock.advance(1)
        with pytest.raises(CaseExists, match="case 'g' of queue 'q' is live .* dedup key 'k'"):
            await sub.retry("f")
        assert sub.status("f").state == "failed" and [r.kind for r in await sub.journal("f")] == ["start", "end"]
        await sub.signal("g", "go")
        await sub.await_case("g")
        await sub.retry("f")
        with pytest.raises(CaseExists, match="case 'f' of queue 'q' is live .* dedup key 'k'"):
            await sub.new_case("waits", queue="q", dedup="k", case_id="h")
        await clock.advance(1)
        await eventually(lambda: sub.status("f").state == "waiting_signal")
        with pytest.raises(CaseExists, match="dedup key 'k'"):
            await sub.new_case("waits", queue="q", dedup="k", case_id="h")


@pytest.mark.parametrize("kind", KINDS)
async def test_a_retried_case_waiting_in_its_queue_is_cancelled_there(kind: str, tmp_path: Path) -> None:
    """A retried case waiting for room refuses a signal (it takes inputs once started), and a cancel ends it there:
    cancelled, its journal ends with the cancel and an end of its run, and it never starts."""
    clock = VirtualClock(start=T0)
    async with Substrate(store=store_maker(kind, tmp_path)(), clock=clock, workflows=FLOWS,
                         queues={"q": Queue(concurrency=1)}) as sub:
        await failed_on_queue(sub)
        await sub.new_case("waits", queue="q", case_id="w")
        await clock.advance(1)
        await sub.retry("f")
        with pytest.raises(SignalRejected, match="'f' cannot take signal 'go': it is queued: retried, it waits"):
            await sub.signal("f", "go")
        await sub.cancel("f", reason="not needed", request_id="c1")
        with pytest.raises(CaseCancelled, match="not needed"):
            await sub.await_case("f")
        await sub.cancel("f", request_id="c1")  # the same cancel again: what it returned
        await sub.signal("w", "go")
        await sub.await_case("w")
        await clock.advance(5)
        assert sub.status("f").state == "cancelled" and sub.cases(state="queued") == []
        journal = await sub.journal("f")
        assert [r.kind for r in journal] == ["start", "end", "retry", "cancel", "end"]
        assert (journal[-1].model_extra or {}).get("run") == 1


async def test_a_client_retry_puts_the_case_back_in_its_queue(tmp_path: Path) -> None:
    """Through a Client (the owner does it): the retried case waits in its queue (queued in the Client's status
    and listing), and the Client's cancel ends it there."""
    db = str(tmp_path / "cases.db")
    async with Substrate(store=db, workflows=FLOWS, queues={"q": Queue(concurrency=1)}) as sub:
        await failed_on_queue(sub)
        await sub.new_case("waits", queue="q", case_id="w")
        await eventually(lambda: sub.status("w").state == "waiting_signal")
        async with wfsub.Client(db) as client:
            await client.retry("f")
            assert (await client.status("f")).state == "queued"
            assert [s.case_id for s in await client.cases(state="queued")] == ["f"]
            assert [s.case_id for s in await client.cases()].count("f") == 1
            await client.cancel("f")
            with pytest.raises(CaseCancelled):
                await client.await_case("f")
        assert sub.status("f").state == "cancelled"


async def test_a_case_retried_on_one_node_runs_on_the_node_that_claims_it() -> None:
    """Postgres, per_node=1: f failed on node b (a was busy with its one case); b, busy again, retries it (b owns
    its row); once a has room, a claims f, takes its row (its epoch bumped) and runs it from its retry record; a
    signal sent through b reaches it on a."""
    from wfsub.stores import PostgresStore

    from ..stores import _pg

    if not _pg.ENABLED:
        pytest.skip(_pg.SKIP_REASON)
    dsn, schema = _pg.database_dsn(), _pg.new_schema()
    queues = {"q": Queue(per_node=1)}
    async with Substrate(store=PostgresStore(dsn, schema=schema), workflows=FLOWS, queues=queues, node_id="a") as a:
        await a.new_case("waits", queue="q", case_id="busy")  # (before b is there: a runs it)
        await eventually(lambda: a.status("busy").state == "waiting_signal")
        async with Substrate(store=PostgresStore(dsn, schema=schema), workflows=FLOWS, queues=queues,
                             node_id="b") as b:
            await failed_on_queue(b)  # a is full: b claims f, and f fails there
            await b.new_case("waits", queue="q", case_id="w")
            await eventually(lambda: b.status("w").state == "waiting_signal")
            await b.retry("f")  # back in its queue; both nodes have their one case
            assert b.status("f").state == "queued"
            await a.signal("busy", "go")  # a has room: it claims f
            await eventually(lambda: b.status("f").state == "waiting_signal")
            await b.signal("f", "go")
            assert await b.await_case("f") == {"ok": True, "go": None}
        operator = PostgresStore(dsn, schema=schema, create=False)
        await operator.open(owner=False, owner_id="operator")
        try:
            row = await operator.row("f")
            assert row is not None and row.owner == "a"
            epochs = [epoch for _, epoch in await operator.journal_epochs("f")]
            assert epochs == sorted(epochs) and epochs[-1] > epochs[0], epochs
        finally:
            await operator.close()

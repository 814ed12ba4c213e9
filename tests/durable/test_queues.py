"""Queues: queued cases start when their queue has room (concurrency, per node, a sliding rate window, partitions),
lower priority first then first come first served, deduplicated by key, cancellable while queued; on Memory,
SQLite and Postgres, and across two nodes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import wfsub
from wfsub import CaseCancelled, CaseExists, Queue, Substrate, seq, sleep, task, wait
from wfsub.stores import MemoryStore
from wfsub.testing import VirtualClock

from .. import _warm
from ._util import same_store as store_maker

KINDS = ["none", "memory", "sqlite", "postgres"]
T0 = 1_800_000_000.0

ONE_STEP = seq(task(lambda c: {"ran": True}, name="run"))
SLOW = seq(sleep(1), task(lambda c: {"ran": True}, name="run"))
WAITS = seq(wait("go"), task(lambda c: {"ran": True}, name="run"))
WORKFLOWS = {"job": ONE_STEP, "slow": SLOW, "waits": WAITS}




def substrate(kind: str, tmp_path: Path, clock: VirtualClock, queues: dict[str, Queue], **options: Any) -> Substrate:
    return Substrate(store=store_maker(kind, tmp_path)(), clock=clock, workflows=WORKFLOWS, queues=queues, **options)


def check_at_most(intervals: list[tuple[float, float]], most: int) -> int:
    """The most intervals [start, end) open at once (ends before starts at one instant); asserts <= most."""
    events = sorted([(end, -1) for _, end in intervals] + [(start, 1) for start, _ in intervals])
    now = peak = 0
    for _, delta in events:
        now += delta
        peak = max(peak, now)
    assert peak <= most, f"{peak} cases were started and not ended at once (limit {most})"
    return peak


@pytest.mark.parametrize("kind", KINDS)
async def test_a_queued_case_waits_shows_its_queue_and_starts_when_there_is_room(kind: str, tmp_path: Path) -> None:
    """A case queued behind a full queue is `queued` (listed, started_at None, its queue options shown); it starts
    once the running case ends, with dequeued_at = its start, and its result is awaited as any case's."""
    clock = VirtualClock(start=T0)
    async with substrate(kind, tmp_path, clock, {"mail": Queue(concurrency=1)}) as sub:
        first = await sub.new_case("waits", queue="mail", case_id="first")
        second = await sub.new_case("job", {"n": 2}, queue="mail", priority=4, dedup="d2", partition="p",
                                    case_id="second")
        await clock.advance(5)
        assert sub.status("first").state == "waiting_signal" and sub.status("first").dequeued_at == T0
        queued = second.status()
        assert (queued.state, queued.started_at, queued.dequeued_at) == ("queued", None, None)
        assert (queued.queue, queued.priority, queued.dedup, queued.partition) == ("mail", 4, "d2", "p")
        assert [s.case_id for s in sub.cases(state="queued")] == ["second"]
        with pytest.raises(TimeoutError, match="queued on 'mail'"):
            await second.result(timeout=0)
        await sub.signal("first", "go")
        assert await first.result() == {"go": None, "ran": True}
        assert await second.result() == {"n": 2, "ran": True}
        started = sub.status("second")
        assert (started.state, started.queue, started.dequeued_at, started.started_at) == ("done", "mail", T0 + 5,
                                                                                            T0 + 5)
        assert sub.cases(state="queued") == []


@pytest.mark.parametrize("kind", KINDS)
async def test_priority_lower_first_then_first_come_first_served(kind: str, tmp_path: Path) -> None:
    """Behind a busy queue of concurrency 1, waiting cases start by priority (lower first), ties in arrival order."""
    clock = VirtualClock(start=T0)
    async with substrate(kind, tmp_path, clock, {"q": Queue(concurrency=1)}) as sub:
        await sub.new_case("waits", queue="q", case_id="blocker")
        await clock.advance(0)
        for name, priority in [("p5", 5), ("p1a", 1), ("p3", 3), ("p1b", 1), ("p0", 0)]:
            await sub.new_case("slow", queue="q", priority=priority, case_id=name)
        await sub.signal("blocker", "go")
        await clock.advance(10)
        order = sorted(["p5", "p1a", "p3", "p1b", "p0"], key=lambda c: sub.status(c).dequeued_at or 0)
        assert order == ["p0", "p1a", "p1b", "p3", "p5"]
        assert [sub.status(c).dequeued_at for c in order] == [T0 + i for i in range(5)]


@pytest.mark.parametrize("kind", KINDS)
async def test_a_queued_case_can_be_cancelled_and_never_starts(kind: str, tmp_path: Path) -> None:
    """Cancelling a queued case ends it `cancelled` before it starts: its awaiters get CaseCancelled, it is no
    longer listed as queued, and it never starts when room comes."""
    clock = VirtualClock(start=T0)
    async with substrate(kind, tmp_path, clock, {"q": Queue(concurrency=1)}) as sub:
        await sub.new_case("waits", queue="q", case_id="blocker")
        handle = await sub.new_case("job", queue="q", case_id="later")
        await clock.advance(0)
        await sub.cancel("later")
        with pytest.raises(CaseCancelled, match="cancelled while queued"):
            await handle.result()
        assert sub.status("later").state == "cancelled"
        assert sub.cases(state="queued") == []
        with pytest.raises(wfsub.SignalRejected, match="already ended"):
            await sub.cancel("later")
        await sub.signal("blocker", "go")
        await sub.await_case("blocker")
        await clock.advance(5)
        assert sub.status("later").state == "cancelled" and sub.status("later").dequeued_at is None


@pytest.mark.parametrize("kind", KINDS)
async def test_dedup_refuses_a_second_live_case_with_the_key(kind: str, tmp_path: Path) -> None:
    """A dedup key held by a live (queued or running) case of the queue refuses another start with CaseExists naming
    it; once that case has ended the key is free again."""
    clock = VirtualClock(start=T0)
    async with substrate(kind, tmp_path, clock, {"q": Queue(concurrency=1)}) as sub:
        await sub.new_case("waits", queue="q", dedup="order-7", case_id="a")
        with pytest.raises(CaseExists, match="case 'a' of queue 'q' is live .* dedup key 'order-7'"):
            await sub.new_case("job", queue="q", dedup="order-7", case_id="b")
        await clock.advance(0)
        with pytest.raises(CaseExists, match="dedup key 'order-7'"):  # running now, still live
            await sub.new_case("job", queue="q", dedup="order-7", case_id="b")
        await sub.new_case("job", queue="q", dedup="order-8", case_id="c")  # another key queues
        again = await sub.new_case("job", queue="q", dedup="order-8", case_id="c")  # the same start: that case
        assert again.case_id == "c" and sub.status("c").state == "queued"
        with pytest.raises(CaseExists, match="other start data"):
            await sub.new_case("job", {"x": 1}, queue="q", case_id="c")
        await sub.signal("a", "go")
        await sub.await_case("a")
        await sub.new_case("job", queue="q", dedup="order-7", case_id="b")
        await clock.advance(1)
        assert await sub.await_case("b") == {"ran": True}


@pytest.mark.parametrize("kind", KINDS)
async def test_a_rate_limit_holds_over_every_sliding_window(kind: str, tmp_path: Path) -> None:
    """With rate=(5, 10 s), twenty queued cases start at most five in any ten seconds (sliding), all within 40 s."""
    clock = VirtualClock(start=T0)
    async with substrate(kind, tmp_path, clock, {"r": Queue(rate=(5, 10.0))}) as sub:
        for i in range(20):
            await sub.new_case("job", {"i": i}, queue="r", case_id=f"c{i}")
            if i % 3 == 0:
                await clock.advance(1)
        await clock.advance(40)
        starts = sorted(sub.status(f"c{i}").dequeued_at or 0 for i in range(20))
        assert all(s >= T0 for s in starts)
        for s in starts:
            assert sum(1 for t in starts if s <= t < s + 10) <= 5, starts
        assert all(sub.status(f"c{i}").state == "done" for i in range(20))


@pytest.mark.parametrize("kind", ["none", "sqlite"])
async def test_delay_partitions_and_the_refusals(kind: str, tmp_path: Path) -> None:
    """delay= holds a case back that long; a partitioned queue limits each partition on its own; an unknown queue is
    refused with the names there are, and queue options without a queue are refused."""
    clock = VirtualClock(start=T0)
    queues = {"later": Queue(), "tenants": Queue(concurrency=1, partitioned=True)}
    async with substrate(kind, tmp_path, clock, queues) as sub:
        with pytest.raises(ValueError, match="no queue 'mial' \\(configured: 'later', 'tenants'\\)"):
            await sub.new_case("job", queue="mial")
        with pytest.raises(ValueError, match="priority, delay apply to a queued case only"):
            await sub.new_case("job", priority=3, delay=5)
        await sub.new_case("job", queue="later", delay=30, case_id="d")
        for tenant in ("a", "a", "b"):
            await sub.new_case("waits", queue="tenants", partition=tenant)
        await clock.advance(29)
        assert sub.status("d").state == "queued"
        running = [s for s in sub.cases(limit=100) if s.queue == "tenants" and s.state == "waiting_signal"]
        assert sorted(s.partition or "" for s in running) == ["a", "b"]
        await clock.advance(1)
        assert await sub.await_case("d") == {"ran": True} and sub.status("d").dequeued_at == T0 + 30


@pytest.mark.long
async def test_concurrency_3_over_two_nodes_never_runs_more_than_3(tmp_path: Path) -> None:
    """200 cases queued through two nodes on one Postgres store on a queue of concurrency 3: checked from their
    journals afterwards, never more than 3 were started and not ended at once, and all ran, once each."""
    from wfsub.stores import PostgresStore

    from ..stores import _pg

    if not _pg.ENABLED:
        pytest.skip(_pg.SKIP_REASON)
    dsn, schema = _pg.database_dsn(), _pg.new_schema()
    clock = VirtualClock(start=T0)
    queues = {"mail": Queue(concurrency=3)}
    async with (
        Substrate(store=PostgresStore(dsn, schema=schema), clock=clock, workflows=WORKFLOWS, queues=queues,
                  node_id="a") as a,
        Substrate(store=PostgresStore(dsn, schema=schema), clock=clock, workflows=WORKFLOWS, queues=queues,
                  node_id="b") as b,
    ):
        for i in range(200):
            await (a if i % 2 else b).new_case("slow", {"i": i}, queue="mail", case_id=f"m{i}")
        for _ in range(200):
            if not a.cases(state="queued", limit=1):
                break
            await clock.advance(1)
        await clock.advance(2)
        intervals = []
        nodes = set()
        for i in range(200):
            journal = await a.journal(f"m{i}")
            kinds = [r.kind for r in journal]
            assert kinds == ["start", "timer", "end"], (i, kinds)
            intervals.append((journal[0].model_dump()["time"], journal[-1].model_dump()["time"]))
            nodes.add(a.status(f"m{i}").dequeued_at is not None)
        assert check_at_most(intervals, 3) == 3
        assert nodes == {True}


async def test_a_client_queues_dedups_cancels_and_awaits_through_the_store(tmp_path: Path) -> None:
    """A wfsub.Client starts cases on a queue the owner registered (an unknown one is refused with the names there
    are), is refused a live dedup key, reads and cancels a queued case, and awaits one the owner ran."""
    db = str(tmp_path / "cases.db")
    async with Substrate(store=db, workflows=WORKFLOWS, queues={"mail": Queue(concurrency=1)}) as sub:
        await sub.new_case("waits", queue="mail", case_id="blocker")
        async with wfsub.Client(db) as client:
            with pytest.raises(ValueError, match="no queue 'mial' \\(configured: 'mail'\\)"):
                await client.new_case("job", queue="mial")
            handle = await client.new_case("job", {"n": 1}, queue="mail", dedup="k", case_id="c1")
            with pytest.raises(CaseExists, match="case 'c1' of queue 'mail' is live"):
                await client.new_case("job", queue="mail", dedup="k", case_id="c2")
            await client.new_case("job", queue="mail", case_id="c3")
            status = await client.status("c1")
            assert (status.state, status.queue, status.dedup, status.started_at) == ("queued", "mail", "k", None)
            await client.cancel("c3")
            assert (await client.status("c3")).state == "cancelled"
            with pytest.raises(CaseCancelled):
                await client.await_case("c3")
            await sub.signal("blocker", "go")
            assert await handle.result() == {"n": 1, "ran": True}
            assert (await client.status("c1")).dequeued_at is not None


async def test_the_newest_registration_of_a_queue_wins_and_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    """A Substrate that configures a queue differently from the one registered before it logs a WARNING naming
    both; its configuration is the one the store keeps."""
    store = MemoryStore()
    async with Substrate(store=store, workflows=WORKFLOWS, queues={"q": Queue(concurrency=1)}, node_id="old"):
        pass
    with caplog.at_level("WARNING", logger="wfsub"):
        async with Substrate(store=store, workflows=WORKFLOWS, queues={"q": Queue(concurrency=2)}, node_id="new"):
            assert (await store.queue_specs())["q"]["concurrency"] == 2
    assert "newest registration wins" in caplog.text and "registered_by" in caplog.text


async def test_per_node_caps_each_nodes_share_across_two_nodes() -> None:
    """With per_node=1 and two nodes on one Postgres store, each node runs at most one of the queue's cases at a
    time (checked from the queue's rows and the journals), and both nodes take part."""
    from wfsub.stores import PostgresStore

    from ..stores import _pg

    if not _pg.ENABLED:
        pytest.skip(_pg.SKIP_REASON)
    dsn, schema = _pg.database_dsn(), _pg.new_schema()
    clock = VirtualClock(start=T0)
    queues = {"q": Queue(per_node=1)}
    store_a = PostgresStore(dsn, schema=schema)
    async with (
        Substrate(store=store_a, clock=clock, workflows=WORKFLOWS, queues=queues, node_id="a") as a,
        Substrate(store=PostgresStore(dsn, schema=schema), clock=clock, workflows=WORKFLOWS, queues=queues,
                  node_id="b") as b,
    ):
        for i in range(8):
            await (a if i % 2 else b).new_case("slow", queue="q", case_id=f"n{i}")
        for _ in range(20):
            await clock.advance(1)
        by_node: dict[str, list[tuple[float, float]]] = {}
        for i in range(8):
            item = store_a.read_queue_item(f"n{i}")
            assert item is not None and item.node is not None
            journal = await a.journal(f"n{i}")
            assert journal[-1].kind == "end"
            span = (journal[0].model_dump()["time"], journal[-1].model_dump()["time"])
            by_node.setdefault(item.node, []).append(span)
        assert sorted(by_node) == ["a", "b"]
        for intervals in by_node.values():
            check_at_most(intervals, 1)


async def test_a_standby_queues_cases_the_owner_runs_and_is_refused_a_live_dedup_key(tmp_path: Path) -> None:
    """A standby Substrate (a second one on the owner's SQLite file) queues cases through the store: a live dedup
    key is refused there too, and the owner claims and runs them."""
    db = str(tmp_path / "cases.db")
    queues = {"mail": Queue(concurrency=1)}
    async with (
        Substrate(store=db, workflows=WORKFLOWS, queues=queues) as owner,
        Substrate(store=db, workflows=WORKFLOWS, queues=queues) as standby,
    ):
        assert standby.standby and not owner.standby
        handle = await standby.new_case("job", {"n": 1}, queue="mail", dedup="k", case_id="s1")
        with pytest.raises(CaseExists, match="dedup key 'k'"):
            await standby.new_case("job", queue="mail", dedup="k", case_id="s2")
        assert await handle.result() == {"n": 1, "ran": True}
        assert owner.status("s1").queue == "mail" and owner.status("s1").dequeued_at is not None


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
async def test_a_case_claimed_but_not_started_before_a_stop_starts_when_its_node_comes_back(
    kind: str, tmp_path: Path
) -> None:
    """A queue item a node claimed without writing its case (the node stopped in between) is started when a
    Substrate with that node id enters the store again."""
    from wfsub._store._queueing import QueueItem, QueueLimits

    store = store_maker(kind, tmp_path)
    opened = store()
    raw = opened if isinstance(opened, MemoryStore) else wfsub.stores.SqliteStore(opened)
    await raw.open(owner=True, owner_id="n1")
    try:
        await raw.queue_put(QueueItem("orphan", "q", None, 0, None,
                                      {"workflow": "job", "data": {"k": 1}, "timeout": None, "seed": None}, T0, T0))
        claimed, _ = await raw.queue_claim("q", QueueLimits(concurrency=1), "n1", T0, 10)
        assert [i.case_id for i in claimed] == ["orphan"]
        assert [i.case_id for i in await raw.queue_orphans("n1")] == ["orphan"]
    finally:
        await raw.close()
    clock = VirtualClock(start=T0)
    async with Substrate(store=store(), clock=clock, workflows=WORKFLOWS, queues={"q": Queue(concurrency=1)},
                         node_id="n1") as sub:
        await clock.advance(0)
        assert await sub.await_case("orphan") == {"k": 1, "ran": True}


@pytest.mark.parametrize("kind", ["none", "sqlite"])
async def test_a_queued_cases_timeout_counts_from_its_start(kind: str, tmp_path: Path) -> None:
    """timeout= of a queued case counts from when it leaves the queue, not from when it was queued."""
    clock = VirtualClock(start=T0)
    async with substrate(kind, tmp_path, clock, {"q": Queue(concurrency=1)}) as sub:
        await sub.new_case("waits", queue="q", case_id="blocker")
        await sub.new_case("waits", queue="q", case_id="bounded", timeout=5)
        await clock.advance(100)
        assert sub.status("bounded").state == "queued"
        await sub.cancel("blocker")
        await clock.advance(4)
        assert sub.status("bounded").state == "waiting_signal" and sub.status("bounded").dequeued_at == T0 + 100
        await clock.advance(1)
        with pytest.raises(CaseCancelled, match="timeout"):
            await sub.await_case("bounded")


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
async def test_a_case_claimed_by_a_process_killed_before_starting_it_is_started_once_by_another_node(
    kind: str, tmp_path: Path
) -> None:
    """A process with a random node id SIGKILLed between claiming a queued case and writing its start: a node with
    another id takes the claim over and starts the case exactly once (SQLite: the next owner; Postgres: two live
    nodes, once the dead node's lease has run out)."""
    import sys
    import uuid

    import anyio

    from ._util import ROOT

    if kind == "sqlite":
        spec = str(tmp_path / "cases.db")
        stores: list[Any] = [spec]
    else:
        from wfsub.stores import PostgresStore

        from ..stores import _pg

        if not _pg.ENABLED:
            pytest.skip(_pg.SKIP_REASON)
        dsn, schema = _pg.database_dsn(), _pg.new_schema()
        spec = f"{dsn}{'&' if '?' in dsn else '?'}schema={schema}&lease_seconds=0.5"
        stores = [PostgresStore(dsn, schema=schema), PostgresStore(dsn, schema=schema)]
    done = await _warm.run_process([sys.executable, "-m", "tests.durable._queue_child", spec, "orphan"], cwd=ROOT)
    assert done.returncode == -9, done.stderr.decode()[-3000:]
    assert done.stdout.decode().startswith("claimed orphan doomed-"), done.stdout
    queues = {"q": Queue(concurrency=1)}
    nodes = [Substrate(store=s, workflows=WORKFLOWS, queues=queues, node_id=f"live-{uuid.uuid4().hex[:8]}")
             for s in stores]
    async with nodes[0] as first:
        if len(nodes) > 1:
            await nodes[1].__aenter__()
        try:
            with anyio.fail_after(60):  # a bound against a hang (never recovered), not an expected time
                assert await first.await_case("orphan") == {"k": 1, "ran": True}
            journal = await first.journal("orphan")
            assert [r.kind for r in journal].count("start") == 1 and journal[-1].kind == "end"
            item = first._table.queues.item("orphan")
            assert item is not None and item.node in {n._table.owner for n in nodes}
        finally:
            if len(nodes) > 1:
                await nodes[1].__aexit__(None, None, None)


@pytest.mark.parametrize("kind", KINDS)
async def test_cases_lists_queued_cases_first_and_pages_across_queued_and_started(kind: str, tmp_path: Path) -> None:
    """cases() without a state lists queued cases (newest queued first) before the started ones, and paging with
    before= at every page size goes through both without losing or repeating a case; filters apply to both."""
    clock = VirtualClock(start=T0)
    async with substrate(kind, tmp_path, clock, {"mail": Queue(concurrency=1)}) as sub:
        await sub.new_case("waits", case_id="x", tags={"t": "1"})
        await sub.new_case("waits", queue="mail", case_id="a")
        await clock.advance(5)
        assert sub.status("a").state == "waiting_signal"
        await sub.new_case("waits", case_id="y")
        await sub.new_case("job", queue="mail", case_id="b", tags={"t": "1"})
        await sub.new_case("job", queue="mail", case_id="c")
        assert [s.case_id for s in sub.cases()] == ["c", "b", "y", "a", "x"]
        for size in (1, 2, 3, 4):
            listed: list[str] = []
            before = None
            while page := sub.cases(limit=size, before=before):
                listed += [s.case_id for s in page]
                before = page[-1].order
            assert listed == ["c", "b", "y", "a", "x"], size
        assert [s.case_id for s in sub.cases(tags={"t": "1"})] == ["b", "x"]
        assert [s.case_id for s in sub.cases(state="queued")] == ["c", "b"]
        assert [s.case_id for s in sub.cases(workflow="job")] == ["c", "b"]
        assert [s.case_id for s in sub.cases(state="queued", before=sub.status("c").order)] == ["b"]
        assert [s.case_id for s in sub.cases(state="queued", before=sub.status("b").order)] == []
        assert [s.case_id for s in sub.cases(started_after=0)] == ["y", "a", "x"]


@pytest.mark.parametrize("kind", KINDS)
async def test_a_queued_case_keeps_its_tags_through_its_queue(kind: str, tmp_path: Path) -> None:
    """new_case(tags=, queue=) is accepted: the queued case shows and is listed by its tags, and keeps them in its
    status and start record once it has left the queue (also when a restarted Substrate starts it)."""
    clock = VirtualClock(start=T0)
    make = store_maker(kind, tmp_path)
    async with Substrate(store=make(), clock=clock, workflows=WORKFLOWS, queues={"mail": Queue(concurrency=1)}) as sub:
        await sub.new_case("waits", queue="mail", case_id="blocker")
        await sub.new_case("job", {"n": 1}, queue="mail", case_id="tagged", tags={"customer": "c-17"})
        await clock.advance(5)
        assert sub.status("tagged").state == "queued" and sub.status("tagged").tags == {"customer": "c-17"}
        assert [s.case_id for s in sub.cases(tags={"customer": "c-17"})] == ["tagged"]
        if kind == "none":
            await sub.signal("blocker", "go")
            assert await sub.await_case("tagged") == {"n": 1, "ran": True}
            assert sub.status("tagged").tags == {"customer": "c-17"}
            return
    async with Substrate(store=make(), clock=clock, workflows=WORKFLOWS, queues={"mail": Queue(concurrency=1)}) as sub:
        await clock.advance(5)
        assert sub.status("tagged").state == "queued"
        await sub.signal("blocker", "go")
        assert await sub.await_case("tagged") == {"n": 1, "ran": True}
        assert sub.status("tagged").tags == {"customer": "c-17"}
        assert [s.case_id for s in sub.cases(tags={"customer": "c-17"})] == ["tagged"]
        assert (await sub.journal("tagged"))[0].model_dump()["tags"] == {"customer": "c-17"}


async def test_a_clients_cases_lists_queued_cases_first_and_pages_across_both(tmp_path: Path) -> None:
    """A wfsub.Client's cases() without a state lists the queued cases (with their tags) before the started ones,
    and paging with before= goes through both without losing or repeating a case."""
    db = str(tmp_path / "cases.db")
    async with Substrate(store=db, workflows=WORKFLOWS, queues={"mail": Queue(concurrency=1)}) as sub:
        await sub.new_case("waits", case_id="x")
        await sub.new_case("waits", queue="mail", case_id="a")
        await eventually_state(sub, "a", "waiting_signal")
        await sub.new_case("job", queue="mail", case_id="b", tags={"t": "1"})
        await sub.new_case("job", queue="mail", case_id="c")
        async with wfsub.Client(db) as client:
            assert [s.case_id for s in await client.cases()] == ["c", "b", "a", "x"]
            listed: list[str] = []
            before = None
            while page := await client.cases(limit=1, before=before):
                listed += [s.case_id for s in page]
                before = page[-1].order
            assert listed == ["c", "b", "a", "x"]
            assert [s.case_id for s in await client.cases(tags={"t": "1"})] == ["b"]
            c_order = (await client.status("c")).order
            assert [s.case_id for s in await client.cases(state="queued", before=c_order)] == ["b"]


async def eventually_state(sub: Substrate, case_id: str, state: str) -> None:
    from ._util import eventually

    await eventually(lambda: sub.status(case_id).state == state)

"""Attacks on the case lifecycle (retry, fork, delete, compaction, queues, schedules) where the store fails at
the wrong moment: a commit whose answer is lost, a Postgres connection cut mid-write, a process restarted."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import anyio
import pytest

from wfsub import (
    CaseExists,
    CaseFailed,
    CaseNotFound,
    Queue,
    Schedule,
    SignalRejected,
    Substrate,
    loop,
    seq,
    task,
    wait,
)
from wfsub.stores import CommitUnknown, MemoryStore, PostgresStore, StoreError

from ..lifecycle._util import KINDS, node, store_maker
from ..stores import _pg
from ..stores._proxy import PROXY_CONNECT, Proxy


class LosesAnswer(MemoryStore):
    """Loses the answer of the first write whose records include one of kind `kind` (once set): committed first
    when `commit`, else not written at all. What a caller hears either way is CommitUnknown."""

    def __init__(self) -> None:
        super().__init__()
        self.kind: str | None = None
        self.commit = True
        self.lost = 0

    async def write(self, change: Any, *, wait: bool = True) -> list[bool]:
        hit = self.kind is not None and not self.lost and any(
            r.get("kind") == self.kind for r in (change.records or ())
        )
        if hit and not self.commit:
            self.lost += 1
            raise CommitUnknown("memory:", "committing: the connection was lost before the answer")
        appended: list[bool] = await super().write(change, wait=wait)
        if hit:
            self.lost += 1
            raise CommitUnknown("memory:", "committing: the answer was lost after the commit")
        return appended


def failing_until_fixed() -> tuple[dict[str, bool], Any]:
    fixed = {"ok": False}

    def step(ctx: Any) -> dict[str, Any]:
        if not fixed["ok"]:
            raise RuntimeError("not fixed yet")
        return {"done": True}

    return fixed, seq(task(step, name="step"))


@pytest.mark.parametrize("commit", [True, False])
async def test_a_retry_whose_commit_answer_was_lost_still_runs_the_case(commit: bool) -> None:
    """retry() raised CommitUnknown: committed, the re-opened case is brought back and runs to its end (not left
    running in the store and in no memory); not committed, it is still failed and a retry again re-opens it."""
    store = LosesAnswer()
    fixed, flow = failing_until_fixed()
    async with Substrate(store=store, workflows={"w": flow}) as sub:
        h = await sub.new_case("w", {}, case_id="c")
        with pytest.raises(CaseFailed):
            await h.result()
        fixed["ok"] = True
        store.kind, store.commit = "retry", commit
        with pytest.raises(CommitUnknown):
            await sub.retry("c")
        if commit:
            with pytest.raises(SignalRejected, match="it is running"):
                await sub.retry("c")  # re-opened already: the refusal says so
        else:
            await sub.retry("c")
        with anyio.fail_after(15):  # brought back at once (the periodic sweep alone would take 30 s)
            assert await sub.await_case("c") == {"done": True}
        kinds = [r.kind for r in await sub.journal("c")]
        assert kinds.count("retry") == 1 and kinds[-1] == "end"


@pytest.mark.parametrize("commit", [True, False])
async def test_a_fork_whose_commit_answer_was_lost_can_be_repeated_and_runs(commit: bool) -> None:
    """fork() raised CommitUnknown: the same fork repeated (same new_case_id, origin and at) answers with the
    case, which runs to its end; a fork with that id of another record is still refused with CaseExists."""
    store = LosesAnswer()
    flow = seq(wait("go"), task(lambda ctx: {"went": ctx["go"]}))
    async with Substrate(store=store, workflows={"w": flow}) as sub:
        await sub.new_case("w", {}, case_id="c")
        await sub.signal("c", "go", 1)
        assert await sub.await_case("c") == {"go": 1, "went": 1}
        store.kind, store.commit = "start", commit
        with pytest.raises(CommitUnknown):
            await sub.fork("c", at=0, new_case_id="f")
        fork = await sub.fork("c", at=0, new_case_id="f")  # the careful caller's repeat
        assert fork.case_id == "f"
        with pytest.raises(CaseExists):
            await sub.fork("c", at=1, new_case_id="f")
        await sub.signal("f", "go", 2)
        with anyio.fail_after(15):
            assert await sub.await_case("f") == {"go": 2, "went": 2}
        assert [r.kind for r in await sub.journal("f")] == ["start", "signal", "end"]


def adder() -> Any:
    def add(ctx: Any) -> dict[str, Any]:
        return {"n": ctx.get("n", 0) + 1, "total": ctx.get("total", 0) + ctx["item"]}

    return loop(seq(wait("add", into="item"), task(add, name="add")), while_=lambda d: d.get("n", 0) < 40)


async def send_once(sub: Substrate, case_id: str, i: int) -> None:
    """Send round i with its request id until an answer says it was applied (a lost answer is sent again)."""
    while True:
        try:
            await sub.signal(case_id, "add", i, request_id=f"r{i}")
            return
        except CommitUnknown:
            await anyio.sleep(0.05)  # the case is read back from its journal, then the repeat applies once


@pytest.mark.skipif(not _pg.ENABLED, reason=_pg.SKIP_REASON)
async def test_compaction_on_postgres_with_answers_lost_keeps_every_signal_once(tmp_path: Path) -> None:
    """A Postgres connection that loses the answer of writes (input commits and compaction writes alike) on an
    endless case compacted every 5 records: every acknowledged signal is applied exactly once, the journal starts
    with a snapshot record, and a restarted node without the faults reads the same data back from it."""
    schema = _pg.emptied_schema()
    proxy = Proxy(_pg.database_dsn())
    workflows = {"cart": adder()}
    try:
        store = PostgresStore(proxy.dsn, schema=schema, retry_for=10, connect_timeout=PROXY_CONNECT)
        async with Substrate(store=store, workflows=workflows, compact_after=5, node_id="n1") as sub:
            await sub.new_case("cart", {}, case_id="c")
            with anyio.fail_after(120):
                for i in range(39):
                    if i % 3 == 1:
                        proxy.drop_answers(1, after=300)
                    await send_once(sub, "c", i)
            kinds = [r.kind for r in await sub.journal("c")]
            assert kinds[0] == "snapshot" and "start" not in kinds
            assert proxy.dropped > 0
    finally:
        proxy.down()
    async with Substrate(store=PostgresStore(_pg.database_dsn(), schema=schema), workflows=workflows,
                         compact_after=5, node_id="n1") as sub:
        await sub.signal("c", "add", 39, request_id="r39")
        with anyio.fail_after(30):
            result = await sub.await_case("c")
        assert result["n"] == 40 and result["total"] == sum(range(40))


@pytest.mark.skipif(not _pg.ENABLED, reason=_pg.SKIP_REASON)
async def test_queued_cases_on_postgres_with_answers_lost_each_start_once_and_end(tmp_path: Path) -> None:
    """A queue of concurrency 2 on Postgres whose connection loses write answers (queue items, claims, starts,
    ends): every case acknowledged as queued starts exactly once and ends; none is stuck queued or counted
    running for good."""
    schema = _pg.emptied_schema()
    proxy = Proxy(_pg.database_dsn())
    flow = seq(task(lambda ctx: {"out": ctx["i"] * 2}, name="double"))
    try:
        store = PostgresStore(proxy.dsn, schema=schema, retry_for=10, connect_timeout=PROXY_CONNECT)
        async with Substrate(store=store, workflows={"w": flow}, queues={"q": Queue(concurrency=2)},
                             node_id="n1") as sub:
            ids: list[str] = []
            with anyio.fail_after(120):
                for i in range(12):
                    if i % 3 == 0:
                        proxy.drop_answers(1)
                    while True:
                        try:
                            await sub.new_case("w", {"i": i}, case_id=f"q{i}", queue="q")
                            break
                        except CommitUnknown:
                            await anyio.sleep(0.05)  # repeated with the same id and data: one case
                    ids.append(f"q{i}")
                for i, case_id in enumerate(ids):
                    if i % 4 == 0:
                        proxy.drop_answers(1)
                    result = await sub.await_case(case_id)
                    assert result["out"] == i * 2
            for case_id in ids:
                kinds = [r.kind for r in await sub.journal(case_id)]
                assert kinds == ["start", "end"], (case_id, kinds)
            assert proxy.dropped > 0
    finally:
        proxy.down()


@pytest.mark.parametrize("kind", KINDS)
async def test_paging_with_before_while_cases_are_started_lists_each_older_case_once(
    kind: str, tmp_path: Path
) -> None:
    """Paging `cases(before=...)` newest first while new cases keep starting between pages: every case that
    existed when paging began is listed exactly once, in order (new ones land above the first page)."""
    flow = seq(wait("go"))
    async with Substrate(store=store_maker(kind, tmp_path)(), workflows={"w": flow}, **node(kind)) as sub:
        for i in range(23):
            await sub.new_case("w", {}, case_id=f"old-{i:02d}", tags={"t": "x"})
        seen: list[str] = []
        before = None
        for page in range(20):
            listed = sub.cases(tags={"t": "x"}, limit=4, before=before)
            await sub.new_case("w", {}, case_id=f"new-{page:02d}", tags={"t": "x"})  # lands above every page
            if not listed:
                break
            seen += [c.case_id for c in listed]
            before = listed[-1].order
        assert seen == [f"old-{i:02d}" for i in reversed(range(23))]


@pytest.mark.parametrize("kind", KINDS)
async def test_a_fork_of_a_compacted_journal_keeps_its_origin_and_tags(kind: str, tmp_path: Path) -> None:
    """A fork at the first record a compacted journal keeps (its snapshot) names its origin in
    status().forked_from and keeps the origin's tags, so cases(tags=...) lists it, as a fork of any record does."""
    async with Substrate(store=store_maker(kind, tmp_path)(), workflows={"cart": adder()}, compact_after=5,
                         **node(kind)) as sub:
        await sub.new_case("cart", {}, case_id="c", tags={"customer": "c-17"})
        for i in range(12):
            await sub.signal("c", "add", i, request_id=f"r{i}")
        first = (await sub.journal("c"))[0]
        assert first.kind == "snapshot"
        await sub.fork("c", at=first.seq, new_case_id="fk")
        status = sub.status("fk")
        assert (status.forked_from, status.tags) == ("c", {"customer": "c-17"})
        assert {c.case_id for c in sub.cases(tags={"customer": "c-17"})} == {"c", "fk"}


@pytest.mark.skipif(not _pg.ENABLED, reason=_pg.SKIP_REASON)
async def test_retry_fork_and_delete_on_postgres_with_their_answers_lost(tmp_path: Path) -> None:
    """On Postgres, the connection resets right after each of retry, fork and delete commits (the answer lost):
    each call still answers as it went (read back), the retried case and the fork run to their ends, and the
    deleted case is gone."""
    schema = _pg.emptied_schema()
    proxy = Proxy(_pg.database_dsn())
    fixed, flow = failing_until_fixed()
    try:
        store = PostgresStore(proxy.dsn, schema=schema, retry_for=10, connect_timeout=PROXY_CONNECT)
        async with Substrate(store=store, workflows={"w": flow}, node_id="n1") as sub:
            with anyio.fail_after(60):
                h = await sub.new_case("w", {}, case_id="c")
                with pytest.raises(CaseFailed):
                    await h.result()
                fixed["ok"] = True
                proxy.drop_answers(1, after=200)
                await sub.retry("c")
                assert await sub.await_case("c") == {"done": True}
                proxy.drop_answers(1, after=200)
                await sub.fork("c", at=0, new_case_id="f")
                assert await sub.await_case("f") == {"done": True}
                proxy.drop_answers(1)
                await sub.delete("c")
                assert [c.case_id for c in sub.cases()] == ["f"]
                assert proxy.dropped == 3
                with pytest.raises(CaseNotFound):
                    await sub.journal("c")
    finally:
        proxy.down()


@pytest.mark.parametrize("kind", KINDS)
async def test_a_queue_full_across_a_restart_cancel_while_queued_and_dedup_reuse(kind: str, tmp_path: Path) -> None:
    """A queue of concurrency 1 held by a case waiting for a signal: the queued cases survive a restart still
    queued; one cancelled while queued ends cancelled and frees its dedup key for a new case; once the holder
    ends, the rest start in priority order, each exactly once."""
    make = store_maker(kind, tmp_path)
    flow = seq(wait("go"), task(lambda ctx: {"went": True}, name="went"))
    queues = {"q": Queue(concurrency=1)}
    async with Substrate(store=make(), workflows={"w": flow}, queues=queues, **node(kind)) as sub:
        await sub.new_case("w", {}, case_id="holder", queue="q")
        for name, priority in [("low", 5), ("high", 0), ("gone", 1)]:
            await sub.new_case("w", {}, case_id=name, queue="q", priority=priority, dedup=name + "-key")
        with anyio.fail_after(30):
            while sub.status("holder").state != "waiting_signal":  # noqa: ASYNC110 - the queue starts it in the background
                await anyio.sleep(0.01)
    async with Substrate(store=make(), workflows={"w": flow}, queues=queues, **node(kind)) as sub:
        assert {c.case_id for c in sub.cases(state="queued")} == {"low", "high", "gone"}
        with pytest.raises(CaseExists, match="gone"):
            await sub.new_case("w", {}, case_id="again", queue="q", dedup="gone-key")
        await sub.cancel("gone")
        assert sub.status("gone").state == "cancelled"
        await sub.new_case("w", {}, case_id="again", queue="q", priority=9, dedup="gone-key")
        await sub.signal("holder", "go", 1)
        with anyio.fail_after(30):
            assert await sub.await_case("holder") == {"go": 1, "went": True}
            while sub.status("high").state != "waiting_signal":  # noqa: ASYNC110 - the queue starts it in the background
                await anyio.sleep(0.01)
            assert {c.case_id for c in sub.cases(state="queued")} == {"low", "again"}
            for name in ["high", "low", "again"]:
                while sub.status(name).state != "waiting_signal":  # noqa: ASYNC110 - the queue starts it in the background
                    await anyio.sleep(0.01)
                await sub.signal(name, "go", name)
                assert (await sub.await_case(name))["went"] is True
        for name in ["holder", "high", "low", "again"]:
            assert [r.kind for r in await sub.journal(name)] == ["start", "signal", "end"]


def test_a_cron_with_a_seconds_field_is_refused_naming_the_five_fields() -> None:
    """A six-field cron (a seconds field, as Quartz writes it) is refused naming the schedule and the five fields
    taken, rather than firing a slot every second."""
    with pytest.raises(ValueError, match=r"Schedule\('nightly'\).*6 fields.*minute hour day-of-month"):
        Schedule("nightly", "report", cron="0 30 2 * * *")


class OutageOnDrop(Proxy):
    """A proxy that, once it swallows an answer, also goes down: the store cannot ask how the write went."""

    def __init__(self, dsn: str) -> None:
        super().__init__(dsn)
        self.went_down = threading.Event()

    def _take_drop(self, server: Any) -> bool:
        if not super()._take_drop(server):
            return False

        def down() -> None:
            self.down()
            self.went_down.set()

        threading.Thread(target=down, daemon=True).start()
        return True


async def send_through(sub: Substrate, case_id: str, i: int) -> None:
    """Send round i (request id r{i}) until it is acknowledged, through outages and lost answers."""
    while True:
        try:
            await sub.signal(case_id, "add", i, request_id=f"r{i}")
            return
        except StoreError:  # (CommitUnknown too) the store was away: the same request id applies once
            await anyio.sleep(0.05)


@pytest.mark.skipif(not _pg.ENABLED, reason=_pg.SKIP_REASON)
async def test_a_compaction_whose_answer_is_lost_in_an_outage_loses_nothing(tmp_path: Path) -> None:
    """The compaction write of an endless case on Postgres loses its answer and the server stays unreachable past
    retry_for (CommitUnknown inside the owner): once it is back the case is read back from whichever journal the
    store holds, takes every later signal once, and a restarted node finishes it with the right totals."""
    schema = _pg.emptied_schema()
    proxy = OutageOnDrop(_pg.database_dsn())
    workflows = {"cart": adder()}
    try:
        store = PostgresStore(proxy.dsn, schema=schema, retry_for=1.0, connect_timeout=PROXY_CONNECT)
        async with Substrate(store=store, workflows=workflows, compact_after=5, node_id="n1") as sub:
            await sub.new_case("cart", {}, case_id="c")
            with anyio.fail_after(90):
                for i in range(4):
                    await send_through(sub, "c", i)
                proxy.drop_answers(1, after=2000)  # only a compaction write (its snapshot record) is that large
                await send_through(sub, "c", 4)  # committed and answered; its compaction then loses its answer
                while not proxy.went_down.is_set():  # noqa: ASYNC110 - the proxy's thread takes it down
                    await anyio.sleep(0.01)
                proxy.up()
                for i in range(5, 20):
                    await send_through(sub, "c", i)
                while sub.data("c").get("n") != 20:  # noqa: ASYNC110 - the last signal is committed; its task next
                    await anyio.sleep(0.01)
                assert sub.data("c")["total"] == sum(range(20))
                assert (await sub.journal("c"))[0].kind == "snapshot"
    finally:
        proxy.down()
    async with Substrate(store=PostgresStore(_pg.database_dsn(), schema=schema), workflows=workflows,
                         compact_after=5, node_id="n1") as sub:
        for i in range(20, 40):
            await send_through(sub, "c", i)
        with anyio.fail_after(30):
            result = await sub.await_case("c")
        assert result["n"] == 40 and result["total"] == sum(range(40))


@pytest.mark.skipif(not _pg.ENABLED, reason=_pg.SKIP_REASON)
async def test_two_nodes_run_one_schedule_while_one_loses_answers_and_pause_holds_on_both() -> None:
    """Two nodes share a schedule on Postgres; one's connection loses write answers (slot starts, its pause): each
    slot still starts exactly one case with one `start` record, a pause made on that node holds on the other, and a
    resume on the other starts the next slots again (the paused ones not caught up)."""
    from wfsub.testing import VirtualClock

    dsn, schema = _pg.database_dsn(), _pg.new_schema()
    proxy = Proxy(dsn)
    flow = seq(task(lambda ctx: {"ran": True}, name="run"))
    s = Schedule("both", "job", every=60, data=lambda slot: {"minute": slot.minute})
    clock = VirtualClock(start=1_767_225_630.0)  # 2026-01-01T00:00:30Z

    def ids(sub: Substrate) -> list[str]:
        return sorted(c.case_id for c in sub.cases(limit=1000) if c.case_id.startswith("both@"))

    try:
        async with (
            Substrate(store=PostgresStore(proxy.dsn, schema=schema, retry_for=10, connect_timeout=PROXY_CONNECT),
                      clock=clock, workflows={"job": flow}, schedules=[s], node_id="a") as a,
            Substrate(store=PostgresStore(dsn, schema=schema), clock=clock, workflows={"job": flow},
                      schedules=[s], node_id="b") as b,
        ):
            with anyio.fail_after(60):
                for _ in range(5):
                    proxy.drop_answers(1, after=300)
                    await clock.advance(60)
                assert len(ids(b)) == 5
                proxy.drop_answers(1)
                await a.pause_schedule("both")
                assert [x.paused for x in await b.schedules()] == [True]
                await clock.advance(180)
                assert len(ids(b)) == 5
                await b.resume_schedule("both")
                await clock.advance(120)
                started = ids(a)
                assert started == ids(b) and len(started) == 7
                for case_id in started:
                    assert (await b.await_case(case_id))["ran"] is True
                    assert [r.kind for r in await a.journal(case_id)] == ["start", "end"]
            assert proxy.dropped > 0
    finally:
        proxy.down()


@pytest.mark.skipif(not _pg.ENABLED, reason=_pg.SKIP_REASON)
async def test_a_case_that_failed_on_a_node_gone_for_good_can_be_retried_on_another() -> None:
    """A case failed on node a, which stopped and whose lease has run out: node b retries it (the refusal's own
    words: 'retry it there (or once that node has gone)') and it runs to its end there."""
    dsn, schema = _pg.database_dsn(), _pg.new_schema()
    fixed, flow = failing_until_fixed()
    async with Substrate(store=PostgresStore(dsn, schema=schema, lease_seconds=1.0), workflows={"w": flow},
                         node_id="a") as a:
        h = await a.new_case("w", {}, case_id="c")
        with pytest.raises(CaseFailed):
            await h.result()
    fixed["ok"] = True
    async with Substrate(store=PostgresStore(dsn, schema=schema, lease_seconds=1.0), workflows={"w": flow},
                         node_id="b") as b:
        with anyio.fail_after(30):
            expired = f"SELECT count(*) FROM {schema}.nodes WHERE node_id = 'a' AND lease_until > {schema}.db_now()"
            while _pg.fetchval(expired):  # noqa: ASYNC110 - node a's lease runs out on the database's clock
                await anyio.sleep(0.05)
            await b.retry("c")
            assert await b.await_case("c") == {"done": True}


async def test_a_fork_queued_while_no_owner_runs_is_not_dropped_by_a_delete_of_its_origin(tmp_path: Path) -> None:
    """With no owner running, a Client queues a fork of an ended case, then deletes that case: either the delete
    is refused (an input for it is pending) or the fork is still made when an owner opens the store; never is
    the acknowledged fork dropped silently."""
    from wfsub import Client

    path = str(tmp_path / "cases.db")
    flow = seq(wait("go"), task(lambda ctx: {"went": True}, name="went"))
    async with Substrate(store=path, workflows={"w": flow}) as sub:
        await sub.new_case("w", {}, case_id="c")
        await sub.signal("c", "go", 1)
        await sub.await_case("c")
    async with Client(path) as client:
        await client.fork("c", at=1, new_case_id="f")  # queued: no owner runs
        try:
            await client.delete("c")
        except SignalRejected:
            return  # refused while an input for it waits: nothing dropped
    async with Substrate(store=path, workflows={"w": flow}) as sub:
        with anyio.fail_after(30):
            assert await sub.await_case("f") == {"go": 1, "went": True}


async def test_a_second_trigger_in_the_same_second_runs_again_or_says_why_not(tmp_path: Path) -> None:
    """Triggering a schedule twice within one second (a double click on 'run now') either runs the workflow twice
    or refuses the second trigger saying so; it never answers with the first run as if it were a new one."""
    from wfsub.testing import VirtualClock

    runs: list[int] = []

    def run(ctx: Any) -> dict[str, Any]:
        runs.append(1)
        return {"ran": True}

    clock = VirtualClock(start=1_767_225_630.0)
    s = Schedule("s", "job", cron="0 3 * * *")
    async with Substrate(store=str(tmp_path / "t.db"), clock=clock, workflows={"job": seq(task(run, name="run"))},
                         schedules=[s]) as sub:
        assert await (await sub.trigger_schedule("s")).result() == {"ran": True}
        try:
            second = await sub.trigger_schedule("s")
        except (CaseExists, SignalRejected):
            return  # refused, saying so
        assert await second.result() == {"ran": True}
        assert len(runs) == 2


def failing_adder(fixed: dict[str, bool]) -> Any:
    def add(ctx: Any) -> dict[str, Any]:
        n = ctx.get("n", 0) + 1
        if n == 9 and not fixed["ok"]:
            raise RuntimeError("bad at 9")
        return {"n": n, "total": ctx.get("total", 0) + ctx["item"]}

    return loop(seq(wait("add", into="item"), task(add, name="add")), while_=lambda d: d.get("n", 0) < 12)


async def failed_compacted_case(sub: Substrate) -> None:
    h = await sub.new_case("cart", {}, case_id="c")
    for i in range(9):
        await sub.signal("c", "add", i, request_id=f"r{i}")
    with pytest.raises(CaseFailed, match="bad at 9"):
        await h.result()
    assert (await sub.journal("c"))[0].kind == "snapshot"


async def test_a_fork_of_a_failed_compacted_case_before_its_failure_runs_the_failed_step_again(
    tmp_path: Path,
) -> None:
    """An endless case that failed after its journal was compacted can also be forked at its last record before
    the failure (a new case instead of a retry): that fork, made after the fix, runs the failed step again and on
    to its end."""
    fixed = {"ok": False}
    workflows = {"cart": failing_adder(fixed)}
    async with Substrate(store=str(tmp_path / "r.db"), workflows=workflows, compact_after=4) as sub:
        await failed_compacted_case(sub)
        fixed["ok"] = True
        journal = await sub.journal("c")
        assert journal[-1].kind == "end"
        await sub.fork("c", at=journal[-2].seq, new_case_id="again")
        for i in range(9, 12):
            await sub.signal("again", "add", i, request_id=f"r{i}")
        with anyio.fail_after(30):
            assert await sub.await_case("again") == {"item": 11, "n": 12, "total": sum(range(12))}


async def test_a_compacted_case_that_failed_can_be_retried(tmp_path: Path) -> None:
    """An endless case that failed after compaction is re-opened by retry at its failed step like any case."""
    fixed = {"ok": False}
    workflows = {"cart": failing_adder(fixed)}
    async with Substrate(store=str(tmp_path / "r.db"), workflows=workflows, compact_after=4) as sub:
        await failed_compacted_case(sub)
        fixed["ok"] = True
        await sub.retry("c")
        for i in range(9, 12):
            await sub.signal("c", "add", i, request_id=f"r{i}")
        with anyio.fail_after(30):
            assert (await sub.await_case("c"))["total"] == sum(range(12))


@pytest.mark.skipif(not _pg.ENABLED, reason=_pg.SKIP_REASON)
@pytest.mark.parametrize("queued", [False, True])
async def test_a_case_deleted_on_another_node_is_gone_here_too_and_its_id_starts_afresh(queued: bool) -> None:
    """Node b deletes an ended case node a ran (and still keeps in memory): on a it is then not found, and a
    new_case with its id starts a new case that is in the store and runs, rather than answering with the
    deleted run."""
    dsn, schema = _pg.database_dsn(), _pg.new_schema()
    runs: list[int] = []

    def run(ctx: Any) -> dict[str, Any]:
        runs.append(1)
        return {"ok": len(runs)}

    workflows = {"w": seq(task(run, name="run"))}
    queues = {"q": Queue(concurrency=5)}
    extra: dict[str, Any] = {"queue": "q"} if queued else {}
    async with (
        Substrate(store=PostgresStore(dsn, schema=schema), workflows=workflows, queues=queues, node_id="a") as a,
        Substrate(store=PostgresStore(dsn, schema=schema), workflows=workflows, queues=queues, node_id="b") as b,
    ):
        with anyio.fail_after(30):
            assert await (await a.new_case("w", {}, case_id="c", **extra)).result() == {"ok": 1}
            await b.delete("c")
            again = await a.new_case("w", {}, case_id="c", **extra)
            assert await again.result() == {"ok": 2}
            assert [r.kind for r in await b.journal("c")] == ["start", "end"]


@pytest.mark.parametrize("kind", KINDS)
async def test_a_deleted_queued_case_id_can_be_queued_again_and_runs(kind: str, tmp_path: Path) -> None:
    """A case started on a queue ends and is deleted; a new_case on the queue with the same id is a new case:
    it is in the store (queued or started) and runs to its end."""
    runs: list[int] = []

    def run(ctx: Any) -> dict[str, Any]:
        runs.append(1)
        return {"ok": len(runs)}

    workflows = {"w": seq(task(run, name="run"))}
    async with Substrate(store=store_maker(kind, tmp_path)(), workflows=workflows,
                         queues={"q": Queue(concurrency=2)}) as sub:
        assert await (await sub.new_case("w", {}, case_id="c", queue="q")).result() == {"ok": 1}
        await sub.delete("c")
        again = await sub.new_case("w", {}, case_id="c", queue="q")
        assert sub.status("c").state in {"queued", "running", "done"}
        with anyio.fail_after(30):
            assert await again.result() == {"ok": 2}


@pytest.mark.skipif(not _pg.ENABLED, reason=_pg.SKIP_REASON)
async def test_a_case_deleted_on_another_node_is_not_found_by_await_case_here() -> None:
    """After node b deletes an ended case that node a ran, a's await_case raises CaseNotFound, as b's does (the
    promise of delete), instead of answering with the deleted run."""
    dsn, schema = _pg.database_dsn(), _pg.new_schema()
    workflows = {"w": seq(task(lambda ctx: {"ok": True}, name="run"))}
    async with (
        Substrate(store=PostgresStore(dsn, schema=schema), workflows=workflows, node_id="a") as a,
        Substrate(store=PostgresStore(dsn, schema=schema), workflows=workflows, node_id="b") as b,
    ):
        assert await (await a.new_case("w", {}, case_id="c")).result() == {"ok": True}
        await b.delete("c")
        with pytest.raises(CaseNotFound):
            await b.await_case("c")
        with pytest.raises(CaseNotFound):
            await a.await_case("c")

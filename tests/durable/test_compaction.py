"""Endless cases: a live case's journal is compacted into a `snapshot` record every `compact_after` records; the
case recovers from it, replays from it, and behaves after recovery exactly as a twin whose journal was never
compacted (effects in flight, timers armed, buffered signals, mi, sagas with compensations pending)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

import wfsub
from wfsub import (
    CaseCancelled,
    JournalRecord,
    Substrate,
    effect,
    loop,
    mi,
    par,
    replay,
    saga,
    seq,
    sleep,
    task,
    wait,
)
from wfsub._errors import CommitUnknown, StoreConflict
from wfsub._store import CaseWrite
from wfsub.stores import MemoryStore
from wfsub.testing import VirtualClock

from .. import _warm
from ._util import field, outside
from ._util import same_store as reopenable


def count(ctx: Any) -> dict[str, Any]:
    return {"n": ctx.get("n", 0) + 1, "total": ctx.get("total", 0) + (ctx.get("item") or 0)}


ENDLESS = loop(seq(wait("add", into="item"), task(count)), while_=lambda d: True)




KINDS = ["memory", "sqlite", "postgres"]


def node(kind: str) -> dict[str, Any]:
    return {"node_id": "n1"} if kind == "postgres" else {}  # the restarted node owns its cases at once


def check_compacted(journal: list[JournalRecord]) -> None:
    """A compacted journal: its `snapshot` record first (holding the start), then contiguous seqs after it."""
    first = journal[0]
    assert first.kind == "snapshot", [r.kind for r in journal[:3]]
    assert field(first, "start")["kind"] == "start"
    seqs = [r.seq for r in journal]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), seqs


@pytest.mark.parametrize("kind", KINDS)
async def test_an_endless_case_keeps_a_bounded_journal_and_recovers_from_it(kind: str, tmp_path: Path) -> None:
    """300 signals with compact_after=20: the journal never holds more than 22 records, starts with a snapshot
    record, recovers after a restart to the same data, replays to the same data, and goes on."""
    store = reopenable(kind, tmp_path)
    longest = 0
    async with Substrate(store=store(), workflows={"cart": ENDLESS}, compact_after=20, **node(kind)) as sub:
        await sub.new_case("cart", {}, case_id="c")
        for i in range(300):
            await sub.signal("c", "add", i)
            if i % 7 == 0:
                longest = max(longest, len(await sub.journal("c")))
        await wait_for(lambda: sub.data("c").get("n") == 300)
        before = sub.data("c")
        journal = await sub.journal("c")
    assert before == {"item": 299, "n": 300, "total": sum(range(300))}
    assert 0 < longest <= 22, longest
    check_compacted(journal)
    assert journal[-1].seq >= 300  # seqs go on from where they were: never renumbered
    report = replay(ENDLESS, journal)
    assert report.divergence is None and report.data == before

    async with Substrate(store=store(), workflows={"cart": ENDLESS}, compact_after=20, **node(kind)) as sub:
        for i in range(5):
            await sub.signal("c", "add", 1000 + i)
        await wait_for(lambda: sub.data("c").get("n") == 305)
        assert sub.data("c")["total"] == sum(range(300)) + 5010
        journal = await sub.journal("c")
    # Read from outside once the Substrate has closed: a MemoryStore is the very object the Substrate used, and
    # closing the reader closes it.
    async with outside(store()) if kind != "postgres" else _nothing() as reader:
        if reader is not None:
            assert await reader.first_seq("c") == journal[0].seq
    check_compacted(journal)
    assert replay(ENDLESS, journal).data["n"] == 305


class _nothing:  # noqa: N801 (an async context manager that gives None)
    async def __aenter__(self) -> None:
        return None

    async def __aexit__(self, *exc: object) -> None:
        return None


async def wait_for(condition: Callable[[], bool], limit: float = 30.0) -> None:
    """Poll a condition on the case (a bound against a hang, not an expected duration)."""
    with anyio.fail_after(limit):
        while not condition():  # noqa: ASYNC110 - the case applies its inputs in the background
            await anyio.sleep(0.005)


async def test_none_keeps_every_record() -> None:
    """compact_after=None: no compaction, the journal holds every record from `start`."""
    async with Substrate(store=MemoryStore(), workflows={"cart": ENDLESS}, compact_after=None) as sub:
        await sub.new_case("cart", {}, case_id="c")
        for i in range(30):
            await sub.signal("c", "add", i)
        journal = await sub.journal("c")
    assert journal[0].kind == "start" and [r.seq for r in journal] == list(range(31))


@pytest.mark.parametrize("bad", [0, 1, -5, 2.5, "1000", True])
def test_compact_after_is_checked(bad: Any) -> None:
    """A compact_after that is not None or an int >= 2 is refused with the fix."""
    with pytest.raises(ValueError, match=r"compact_after must be an int >= 2 .* or None.*compact_after=1000"):
        Substrate(store=MemoryStore(), compact_after=bad)


# -- a twin whose journal was never compacted ------------------------------------------------------------------

GATE: dict[str, anyio.Event] = {}


def booked(ctx: Any) -> dict[str, Any]:
    return {"booked": True}


def unbook(ctx: Any) -> dict[str, Any]:
    return {"unbooked": True}


async def charge(ctx: Any) -> dict[str, Any]:
    await GATE["charge"].wait()
    return {"charged": 42}


def refund(ctx: Any) -> dict[str, Any]:
    return {"refunded": True}


def late_seen(ctx: Any) -> dict[str, Any]:
    return {"late_seen": ctx["late"]}


def part(ctx: Any) -> dict[str, Any]:
    return {"part": "done"}


def ticks(ctx: Any) -> dict[str, Any]:
    return {"n": ctx.get("n", 0) + 1}


RICH = par(
    loop(seq(wait("tick", into="t"), task(ticks)), until=lambda d: d.get("n", 0) >= 30),
    saga((task(booked), task(unbook)), (effect(charge, name="charge"), task(refund)), wait("confirm")),
    seq(sleep(50), wait("late", into="late"), task(late_seen)),
    mi(seq(sleep(10), task(part)), count=0, dynamic="open", name="parts", collect="parts"),
)


async def run_rich(store: Callable[[], Any], compact_after: int | None, extra: dict[str, Any]) -> dict[str, Any]:
    """Phase 1: an effect in flight, timers armed, a buffered signal, an open mi, a saga with a step done, then 20
    ticks, then a restart; phase 2: the effect completes, the timers fire, 10 more ticks, a cancel compensates."""
    GATE["charge"] = anyio.Event()
    clock = VirtualClock()
    opts = {"store": store(), "clock": clock, "workflows": {"rich": RICH}, "compact_after": compact_after, **extra}
    async with Substrate(**opts) as sub:
        await sub.new_case("rich", {}, case_id="r")
        await sub.signal("r", "late", "early bird")  # buffered: its wait comes after the sleep
        await sub.add_instances("r", "parts", [1, 2])
        await clock.advance(0)
        await wait_for(lambda: [e.name for e in sub.status("r").effects] == ["charge"])
        for i in range(20):
            await sub.signal("r", "tick", i)
        await clock.advance(0)
        first = (await sub.journal("r"))[0]
        phase1 = sub.data("r")
    opts["store"] = store()
    async with Substrate(**opts) as sub:
        GATE["charge"].set()
        await clock.advance(10)
        await sub.close_instances("r", "parts")
        await clock.advance(40)
        for i in range(10):
            await sub.signal("r", "tick", 20 + i)
        await clock.advance(0)
        await wait_for(lambda: sub.data("r").get("n") == 30)
        await sub.cancel("r", compensate=True)
        with pytest.raises(CaseCancelled):
            await sub.await_case("r")
        journal = await sub.journal("r")
        final = sub.data("r")
    end = journal[-1]
    assert end.kind == "end"
    return {
        "first": first, "phase1": phase1, "final": final, "outcome": field(end, "outcome"),
        "compensated": field(end, "compensated"), "journal": journal,
    }


@pytest.mark.parametrize("kind", KINDS)
async def test_a_compacted_case_behaves_after_recovery_as_its_uncompacted_twin(kind: str, tmp_path: Path) -> None:
    """Compacted every 4 records while an effect is in flight, three timers are armed, a signal is buffered, an mi
    is open and a saga has a compensation pending: after a restart the case ends exactly as a twin never
    compacted (same data, same outcome, same compensations)."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    compacted = await run_rich(reopenable(kind, tmp_path / "a"), 4, node(kind))
    twin = await run_rich(reopenable(kind, tmp_path / "b"), None, node(kind))
    assert twin["first"].kind == "start"
    first = compacted["first"]
    assert first.kind == "snapshot"
    state = field(first, "state")
    assert len(state["timers"]) == 3  # the sleep and the two mi instances' sleeps were armed when it was taken
    assert compacted["phase1"] == twin["phase1"]
    assert compacted["final"] == twin["final"], (compacted["final"], twin["final"])
    assert compacted["final"]["late_seen"] == "early bird" and len(compacted["final"]["parts"]) == 2
    assert compacted["final"]["charged"] == 42 and compacted["final"]["refunded"] is True
    assert (compacted["outcome"], compacted["compensated"]) == (twin["outcome"], twin["compensated"])
    assert compacted["outcome"] == "cancelled" and compacted["compensated"]
    check_compacted(compacted["journal"])
    assert len(compacted["journal"]) <= 4 + 2 + 3  # bounded: the last compaction, then at most a few inputs


# -- faults --------------------------------------------------------------------------------------------------------


class LosesCompactionAnswer(MemoryStore):
    """A store that loses the answer of its first compaction: committed (`commit=True`) or not, the caller hears
    CommitUnknown."""

    def __init__(self, *, commit: bool) -> None:
        super().__init__()
        self.commit = commit
        self.lost = 0

    async def write(self, change: CaseWrite, *, wait: bool = True) -> list[bool]:
        if change.compact is not None and self.lost == 0:
            self.lost += 1
            if self.commit:
                await super().write(change, wait=wait)
            raise CommitUnknown("memory:", "committing: the answer was lost")
        return await super().write(change, wait=wait)


@pytest.mark.parametrize("commit", [True, False])
async def test_a_compaction_whose_answer_was_lost_is_read_back_from_the_journal(commit: bool) -> None:
    """The owner cannot tell whether its compaction committed: the case leaves memory and is read back from
    whichever journal the store holds (compacted or whole); nothing acknowledged is lost either way."""
    store = LosesCompactionAnswer(commit=commit)
    async with Substrate(store=store, workflows={"cart": ENDLESS}, compact_after=10) as sub:
        await sub.new_case("cart", {}, case_id="c")
        for i in range(40):
            for _ in range(100):  # a careful caller: an input refused while the case went back to its journal
                try:  # (StoreConflict: nothing recorded) is sent again with its request_id, and applies once
                    await sub.signal("c", "add", i, request_id=f"add-{i}")
                    break
                except (StoreConflict, CommitUnknown):
                    await anyio.sleep(0.05)
        await wait_for(lambda: sub.data("c").get("n") == 40)
        assert sub.data("c")["total"] == sum(range(40))
        journal = await sub.journal("c")
    assert store.lost == 1
    check_compacted(journal)
    assert replay(ENDLESS, journal).data["total"] == sum(range(40))


# -- versions and replay ----------------------------------------------------------------------------------------


def count_v2(ctx: Any) -> dict[str, Any]:
    return {"n": ctx.get("n", 0) + 1, "total": ctx.get("total", 0) + 2 * (ctx.get("item") or 0)}


ENDLESS_V2 = loop(seq(wait("add", into="item"), task(count_v2)), while_=lambda d: True)


async def test_a_compacted_case_runs_on_its_own_version_and_is_suspended_on_another(tmp_path: Path) -> None:
    """Its prefix gone, a compacted case migrates to no other version: with only v2 registered it is suspended,
    naming the compaction and the fix; with v1 registered beside v2 it runs on v1."""
    path = str(tmp_path / "cases.db")
    async with Substrate(store=path, workflows={"cart": ENDLESS}, compact_after=5) as sub:
        await sub.new_case("cart", {}, case_id="c")
        for i in range(12):
            await sub.signal("c", "add", i)
    async with Substrate(store=path, workflows={"cart": ENDLESS_V2}, compact_after=5) as sub:
        await wait_for(lambda: sub.status("c").state.value == "suspended")
        reason = sub.status("c").suspended_reason or ""
        assert "removed by compaction" in reason and "register that version" in reason
    async with Substrate(store=path, workflows={"cart": [ENDLESS, ENDLESS_V2]}, compact_after=5) as sub:
        await wait_for(lambda: sub.status("c").state.value != "suspended")
        await sub.signal("c", "add", 100)
        await wait_for(lambda: sub.data("c").get("n") == 13)
        assert sub.data("c")["total"] == sum(range(12)) + 100  # v1's count


async def test_replay_of_a_compacted_journal_checks_the_records_after_the_snapshot() -> None:
    """wfsub.replay restores the snapshot record and checks every record after it: the same program gives the same
    data and a trace from there; another program is a divergence at the snapshot record."""
    async with Substrate(store=MemoryStore(), workflows={"cart": ENDLESS}, compact_after=5) as sub:
        await sub.new_case("cart", {}, case_id="c")
        for i in range(13):
            await sub.signal("c", "add", i)
        await wait_for(lambda: sub.data("c").get("n") == 13)
        journal = await sub.journal("c")
        data = sub.data("c")
    check_compacted(journal)
    report = replay(ENDLESS, journal)
    assert report.divergence is None and report.data == data
    assert report.events and all(e.kind != "case_started" for e in report.events)
    other = replay(ENDLESS_V2, journal)
    assert other.divergence is not None and other.divergence.kind == "snapshot"
    assert other.divergence.seq == journal[0].seq and "removed by compaction" in str(other.divergence)
    tampered = [journal[0], *[r.model_copy(update={"digest": "0" * 16}) for r in journal[1:2]], *journal[2:]]
    if len(journal) > 1:
        bad = replay(ENDLESS, tampered).divergence
        assert bad is not None and bad.seq == journal[1].seq and "digest" in str(bad)
    with pytest.raises(ValueError, match="or, compacted, its snapshot record"):
        replay(ENDLESS, journal[1:])


async def test_a_retried_call_stays_applied_once_after_its_record_was_compacted() -> None:
    """A request id whose record compaction removed is still known (the snapshot record keeps the ids): the
    retried signal is not applied again."""
    async with Substrate(store=MemoryStore(), workflows={"cart": ENDLESS}, compact_after=5) as sub:
        await sub.new_case("cart", {}, case_id="c")
        await sub.signal("c", "add", 7, request_id="once")
        for _ in range(12):
            await sub.signal("c", "add", 0)
        journal = await sub.journal("c")
        assert journal[0].kind == "snapshot" and all(r.model_extra.get("request_id") != "once" for r in journal)
        await sub.signal("c", "add", 7, request_id="once")
        await wait_for(lambda: sub.data("c").get("n") == 13)
        assert sub.data("c")["total"] == 7
    assert wfsub.lowlevel.journaled_request_ids([r.model_dump() for r in journal]) >= {"once"}


# -- twenty thousand signals ----------------------------------------------------------------------------------------

SENDERS = 16


@pytest.mark.parametrize(("kind", "signals"), [("memory", 20_000), ("sqlite", 20_000), ("postgres", 5_000)])
async def test_a_case_serving_many_signals_keeps_its_journal_under_compact_after(
    kind: str, signals: int, tmp_path: Path
) -> None:
    """A case takes `signals` signals from 16 senders at once (20,000 in memory and on SQLite, twenty compactions;
    5,000 on Postgres; `make bench` runs 100,000 on SQLite): its journal never holds more than compact_after +
    16 + 1 records (one commit's inputs and the snapshot record), it recovers from it after a restart with every
    signal counted, and `wfsub.replay` of it reaches the same data."""
    store = reopenable(kind, tmp_path)
    longest = 0
    async with Substrate(store=store(), workflows={"cart": ENDLESS}, **node(kind)) as sub:  # compact_after=1000
        await sub.new_case("cart", {}, case_id="c")

        async def sender(k: int) -> None:
            nonlocal longest
            for i in range(k, signals, SENDERS):
                await sub.signal("c", "add", i)
                if k == 0 and i % (SENDERS * 250) == 0:
                    longest = max(longest, len(await sub.journal("c")))

        async with anyio.create_task_group() as tg:
            for k in range(SENDERS):
                tg.start_soon(sender, k)
        await wait_for(lambda: sub.data("c").get("n") == signals)
        journal = await sub.journal("c")
    assert 0 < longest <= 1000 + SENDERS + 1, longest
    assert len(journal) <= 1000 + SENDERS + 1
    check_compacted(journal)
    total = sum(range(signals))
    report = replay(ENDLESS, journal, trace_level="none")
    assert report.divergence is None and (report.data["n"], report.data["total"]) == (signals, total)
    async with Substrate(store=store(), workflows={"cart": ENDLESS}, **node(kind)) as sub:
        await sub.signal("c", "add", 1)
        await wait_for(lambda: sub.data("c").get("n") == signals + 1)
        assert sub.data("c")["total"] == total + 1


# -- kill -9 under compaction-heavy load ---------------------------------------------------------------------------


def test_kill_9_during_compaction_heavy_load_keeps_every_journal_whole(tmp_path: Path) -> None:
    """A child serving 12 endless cases (an effect per signal, compacted every 7 records) is SIGKILLed at random
    points and restarted, sending only the rounds not acknowledged yet, until every round was: each journal
    starts with its start or a snapshot record and is contiguous after it, every round applied exactly once (the
    totals: an acknowledged round lost, or one applied twice, shows), the file intact, and each journal replays
    to its case's data."""
    import random
    import signal as signals
    import sqlite3
    import subprocess
    import sys
    import time
    from contextlib import closing

    from . import _endless
    from ._util import ROOT

    cases, rounds, kills = 12, 40, 4
    path = tmp_path / "endless.db"
    rng = random.Random(int(__import__("os").environ.get("WFSUB_KILL_SEED", "20261126")))
    acked: set[str] = set()
    for run in range(kills + 1):
        first = [next(r for r in range(rounds + 1) if f"{_endless.case_id(i)} {r}" not in acked) for i in range(cases)]
        proc = _warm.Popen(
            [sys.executable, "-m", "tests.durable._endless", str(path), str(rounds), ",".join(map(str, first))],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        )
        assert proc.stdout is not None
        target = rng.randint(20, cases * rounds // 3) if run < kills else None
        seen = 0
        deadline = time.monotonic() + 120  # a bound against a hang, not an expected duration
        try:
            for line in proc.stdout:
                assert time.monotonic() < deadline, "the child hung"
                if line.startswith("ack ") and line.endswith("\n"):
                    acked.add(line.split(" ", 1)[1].strip())
                    seen += 1
                if (target is not None and seen >= target) or line.startswith("alldone"):
                    break
        finally:
            proc.send_signal(signals.SIGKILL)
            proc.wait()
            proc.stdout.close()
        if run == kills:
            assert line.startswith("alldone"), "the last run did not finish"

    async def check() -> None:
        async with outside(path) as store:
            for i in range(cases):
                cid = _endless.case_id(i)
                journal = [JournalRecord.model_validate(r) for r in await store.journal(cid)]
                seqs = [r.seq for r in journal]
                assert journal[0].kind in ("start", "snapshot") and seqs == list(range(seqs[0], seqs[-1] + 1)), seqs
                assert journal[0].kind == "snapshot"  # 40 rounds of 2 records each: compacted many times
                assert len(journal) <= _endless.COMPACT_AFTER + 2 * 12 + 1
                row = await store.row(cid)
                assert row is not None
                report = replay(_endless.ENDLESS_FX, journal, trace_level="none")
                assert report.divergence is None, report.divergence
                assert (report.data["n"], report.data["total"]) == (rounds, sum(range(rounds))), (cid, report.data)
        with closing(sqlite3.connect(path)) as conn:
            assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"

    assert len(acked) == cases * rounds
    anyio.run(check)


# -- eviction and takeover ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
async def test_an_evicted_compacted_case_is_reloaded_from_its_snapshot_record(kind: str, tmp_path: Path) -> None:
    """A compacted case that leaves memory when idle comes back from its snapshot record on its next signal."""
    clock = VirtualClock()
    store = reopenable(kind, tmp_path)
    async with Substrate(store=store(), clock=clock, workflows={"cart": ENDLESS}, compact_after=5,
                         evict_after=60.0) as sub:
        await sub.new_case("cart", {}, case_id="c")
        for i in range(17):
            await sub.signal("c", "add", i)
        await wait_for(lambda: sub.data("c").get("n") == 17)
        await clock.advance(61)
        await wait_for(lambda: sub.statistics().cases_in_memory == 0)
        assert (await sub.journal("c"))[0].kind == "snapshot"
        await sub.signal("c", "add", 100)
        await wait_for(lambda: sub.data("c").get("n") == 18)
        assert sub.data("c")["total"] == sum(range(17)) + 100


async def test_a_compacted_case_is_taken_over_by_another_node() -> None:
    """Node a's compacted case is taken over by node b when a goes away: b rebuilds it from the snapshot record
    (at its own epoch: the fence holds) and goes on where a left it."""
    from wfsub.stores import PostgresStore

    from ..stores import _pg

    if not _pg.ENABLED:
        pytest.skip(_pg.SKIP_REASON)
    dsn, schema = _pg.database_dsn(), _pg.new_schema()

    def store() -> PostgresStore:
        return PostgresStore(dsn, schema=schema, lease_seconds=1.0)

    async with Substrate(store=store(), workflows={"cart": ENDLESS}, compact_after=5, node_id="b") as b:
        async with Substrate(store=store(), workflows={"cart": ENDLESS}, compact_after=5, node_id="a") as a:
            await a.new_case("cart", {}, case_id="c")
            for i in range(23):
                await a.signal("c", "add", i)
            await wait_for(lambda: a.data("c").get("n") == 23)
            assert (await a.journal("c"))[0].kind == "snapshot"
        await b.signal("c", "add", 100)  # to a's case: through the inbox, to whoever owns it
        await wait_for(lambda: b.data("c").get("n") == 24)
        assert b.data("c")["total"] == sum(range(23)) + 100
        reader = store()
        await reader.open(owner=False, owner_id="reader")
        try:
            row = await reader.row("c")
            assert row is not None and (row.owner, row.epoch) == ("b", 2)
            epochs = await reader.journal_epochs("c")
        finally:
            await reader.close()
        assert epochs[0][0] > 0 and epochs[-1][1] == 2


# -- updates ----------------------------------------------------------------------------------------------------


def add_item(ctx: Any) -> dict[str, Any]:
    return {"total": ctx.get("total", 0) + ctx["item"]}


UPDATED = loop(seq(wait("add", into="item", reply=lambda c: c.get("total", 0) + c["item"]), task(add_item)),
               while_=lambda d: True)


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
async def test_an_update_retried_after_its_record_was_compacted_gets_its_answer(kind: str, tmp_path: Path) -> None:
    """An update answered, its record then compacted away and the Substrate restarted: the call retried with its
    request id is answered as the first was, and not applied again."""
    store = reopenable(kind, tmp_path)
    async with Substrate(store=store(), workflows={"cart": UPDATED}, compact_after=5) as sub:
        await sub.new_case("cart", {}, case_id="c")
        assert await sub.update("c", "add", 7, request_id="u1") == 7
        for i in range(1, 13):
            await sub.update("c", "add", i)
        journal = await sub.journal("c")
        assert journal[0].kind == "snapshot" and all(field(r, "request_id") != "u1" for r in journal)
    async with Substrate(store=store(), workflows={"cart": UPDATED}, compact_after=5) as sub:
        assert await sub.update("c", "add", 7, request_id="u1") == 7
        assert await sub.update("c", "add", 1) == 7 + sum(range(1, 13)) + 1

"""Recovery in detail, on a VirtualClock where time matters: the journal's numbering after a restart, timers that
fall due while the Substrate is closed, case deadlines, snapshots, seeded schedulers, request ids across restarts,
and what a later run can still read (status, data, cases, journal, await_case, prune)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio
import pytest

import wfsub
from wfsub import (
    CaseCancelled,
    CaseNotFound,
    Substrate,
    defer,
    effect,
    loop,
    mi,
    par,
    scope,
    seq,
    sleep,
    task,
    wait,
)
from wfsub.lowlevel import Seeded
from wfsub.stores import Listing, MemoryStore, SqliteStore
from wfsub.testing import VirtualClock

from ._util import check_shape, eventually, field, kinds, outside, wait_all_blocked

T0 = 1000.0


def mark(name: str) -> wfsub.Term:
    def fn(ctx: Mapping[str, Any]) -> dict[str, Any]:
        return {"order": [*ctx.get("order", []), name]}

    fn.__qualname__ = fn.__name__ = f"mark_{name}"
    return task(fn, name=f"mark_{name}")


class Gate:
    """An effect that hangs while `closed` (its call is then cancelled by the closing Substrate) and returns
    {name: True} once opened: an effect in flight across a restart."""

    def __init__(self) -> None:
        self.closed = True
        self.calls = 0

    async def __call__(self, ctx: Mapping[str, Any]) -> dict[str, Any]:
        self.calls += 1
        if self.closed:
            await anyio.sleep_forever()
        return {"gate": True}


GATE = Gate()


@pytest.fixture
def gate() -> Any:
    GATE.closed, GATE.calls = True, 0
    yield GATE
    GATE.closed = True


def stores(tmp_path: Path) -> dict[str, Any]:
    return {"memory": MemoryStore(), "sqlite": str(tmp_path / "cases.db")}


STORE_KINDS = ["memory", "sqlite"]

# -- the journal's numbering across a restart -----------------------------------------------------------------

SIGNAL_THEN_EFFECT = seq(wait("a", into="a"), par(effect(GATE, name="gate"), wait("b", into="b")))


@pytest.mark.parametrize("kind", STORE_KINDS)
async def test_a_case_that_took_inputs_while_running_goes_on_after_a_restart(kind: str, tmp_path: Path,
                                                                             gate: Gate) -> None:
    """Inputs journaled while a case was running (its row not rewritten) do not block its journal after a restart."""
    store = stores(tmp_path)[kind]
    flows = {"flow": SIGNAL_THEN_EFFECT}
    async with Substrate(store=store, workflows=flows) as sub:
        await sub.new_case("flow", {}, case_id="c")
        await sub.signal("c", "a", 1)  # taken before the case first parked: its row is not rewritten
        await wait_all_blocked()
        assert sub.status("c").state == "waiting_effect"
    gate.closed = False
    async with Substrate(store=store, workflows=flows) as sub:
        await sub.signal("c", "b", 2)  # raises StoreError: case 'c' already has a record at seq 1
        assert await sub.await_case("c") == {"a": 1, "gate": True, "b": 2}
        journal = await sub.journal("c")
    check_shape(journal)
    assert kinds(journal) in (["start", "signal", "effect", "signal", "end"],
                              ["start", "signal", "signal", "effect", "end"])


# -- timers that fell due while the Substrate was closed ------------------------------------------------------


async def test_an_overdue_timer_fires_at_once_after_a_restart() -> None:
    """A timer that fell due while the Substrate was closed fires as soon as it is back (recorded after its due)."""
    store, clock = MemoryStore(), VirtualClock(T0)
    flows = {"flow": seq(sleep(10), mark("after"))}
    async with Substrate(store=store, workflows=flows, clock=clock) as sub:
        await sub.new_case("flow", {}, case_id="c")
        await clock.advance(1)
        assert [t.due for t in sub.status("c").timers] == [T0 + 10]
    await clock.advance(30)  # nobody runs: the timer is overdue when the next Substrate starts
    async with Substrate(store=store, workflows=flows, clock=clock) as sub:
        await clock.advance(0)
        assert await sub.await_case("c", timeout=0) == {"order": ["after"]}
        journal = await sub.journal("c")
    assert kinds(journal) == ["start", "timer", "end"]
    assert journal[1].time == T0 + 31 and field(journal[1], "path") == "seq[0].sleep"


TWO_TIMERS = par(seq(sleep(5), mark("five")), seq(sleep(3), mark("three")))


async def test_overdue_timers_fire_in_due_order_after_a_restart() -> None:
    """Two timers overdue at restart fire in the order they fell due, as they would have without the restart."""
    store, clock = MemoryStore(), VirtualClock(T0)
    flows = {"flow": TWO_TIMERS}
    async with Substrate(store=store, workflows=flows, clock=clock) as sub:
        await sub.new_case("flow", {}, case_id="ref")
        await clock.advance(10)
        assert await sub.await_case("ref") == {"order": ["three", "five"]}
        await sub.new_case("flow", {}, case_id="c")
        await clock.advance(1)
    await clock.advance(10)
    async with Substrate(store=store, workflows=flows, clock=clock) as sub:
        await clock.advance(0)
        assert await sub.await_case("c") == {"order": ["three", "five"]}  # got ['five', 'three']


DEFER = seq(defer({"go": mark("took_go")}, timeout=10, on_timeout=mark("timed_out")), wait("end"))


async def test_an_overdue_timer_comes_before_a_signal_sent_after_the_restart() -> None:
    """A signal sent after a restart comes after a timer that fell due while the Substrate was closed."""
    store, clock = MemoryStore(), VirtualClock(T0)
    flows = {"flow": DEFER}
    async with Substrate(store=store, workflows=flows, clock=clock) as sub:
        await sub.new_case("flow", {}, case_id="c")
        await clock.advance(1)
    await clock.advance(60)  # the defer's timeout fell due at T0 + 10
    async with Substrate(store=store, workflows=flows, clock=clock) as sub:
        await sub.signal("c", "go")  # at T0 + 61: the timeout came first
        await clock.advance(0)
        assert sub.data("c")["order"] == ["timed_out"]  # got ['took_go']
        journal = await sub.journal("c")
    assert kinds(journal)[:2] == ["start", "timer"]


async def test_an_overdue_timer_comes_before_an_inbox_input_written_after_its_due_time(tmp_path: Path) -> None:
    """An inbox signal written after a timer's due time (Substrate closed) is applied after that timer fires."""
    path, clock = str(tmp_path / "cases.db"), VirtualClock(T0)
    flows = {"flow": DEFER}
    async with Substrate(store=path, workflows=flows, clock=clock) as sub:
        await sub.new_case("flow", {}, case_id="c")
        await clock.advance(1)
    await clock.advance(60)
    async with outside(path) as cli:
        await cli.inbox_put("c", "signal", {"name": "go"}, request_id="cli-1", created_at=clock.now())
    async with Substrate(store=path, workflows=flows, clock=clock) as sub:
        async def three() -> bool:
            await clock.advance(0)
            return len(await sub.journal("c")) >= 3

        await eventually(three, every=0.02)
        assert sub.data("c")["order"] == ["timed_out"]


async def test_virtual_clock_advance_fires_the_timer_of_a_case_parked_in_the_store() -> None:
    """After a restart, advancing a VirtualClock past a parked case's timer fires it within that advance."""
    store, clock = MemoryStore(), VirtualClock(T0)
    flows = {"flow": seq(sleep(10), mark("after"))}
    async with Substrate(store=store, workflows=flows, clock=clock) as sub:
        await sub.new_case("flow", {}, case_id="c")
        await clock.advance(1)
    async with Substrate(store=store, workflows=flows, clock=clock) as sub:
        await clock.advance(20)
        assert sub.status("c").state == "done"  # still 'waiting_timer' until the next real-time poll


async def test_a_case_deadline_that_passed_while_closed_cancels_the_case_on_restart() -> None:
    """A case whose `timeout=` deadline passed while the Substrate was closed is cancelled ("timeout") on restart."""
    store, clock = MemoryStore(), VirtualClock(T0)
    flows = {"flow": seq(wait("never"), mark("never"))}
    async with Substrate(store=store, workflows=flows, clock=clock) as sub:
        await sub.new_case("flow", {}, case_id="c", timeout=5)
        await clock.advance(1)
        assert sub.status("c").state == "waiting_signal"
    await clock.advance(10)
    async with Substrate(store=store, workflows=flows, clock=clock) as sub:
        await clock.advance(0)
        with pytest.raises(CaseCancelled, match="timeout"):
            await sub.await_case("c")
        journal = await sub.journal("c")
    assert kinds(journal) == ["start", "cancel", "end"]
    assert field(journal[1], "reason") == "timeout" and field(journal[2], "outcome") == "cancelled"
    assert journal[0].model_extra is not None and journal[0].model_extra["deadline"] == T0 + 5


# -- snapshots, seeded schedulers -----------------------------------------------------------------------------

COUNTER = seq(
    loop(seq(wait("tick", into="last"), task(lambda c: {"n": c.get("n", 0) + c["last"]})),
         until=lambda c: c.get("n", 0) >= 100),
    mark("end"),
)


@pytest.mark.parametrize("kind", STORE_KINDS)
async def test_a_case_recovered_from_a_snapshot_ends_as_without_a_restart(kind: str, tmp_path: Path) -> None:
    """A case with more records than a snapshot interval, restarted twice, ends with the data of one unbroken run."""
    store = stores(tmp_path)[kind]
    flows = {"flow": COUNTER}
    async with Substrate(store=store, workflows=flows) as sub:
        await sub.new_case("flow", {}, case_id="c")
        for _ in range(40):
            await sub.signal("c", "tick", 1)
        await wait_all_blocked()
    async with Substrate(store=store, workflows=flows) as sub:
        for _ in range(40):
            await sub.signal("c", "tick", 1)
    async with Substrate(store=store, workflows=flows) as sub:
        for _ in range(20):
            await sub.signal("c", "tick", 1)
        result = await sub.await_case("c")
        journal = await sub.journal("c")
    assert result == {"last": 1, "n": 100, "order": ["end"]}
    check_shape(journal)
    assert kinds(journal) == ["start", *["signal"] * 100, "end"]
    report = wfsub.replay(COUNTER, journal)
    assert report.divergence is None and report.state == "done" and report.data == result


SEEDED = seq(par(*(seq(mark(f"x{i}"), mark(f"y{i}"), wait(f"s{i}"), mark(f"z{i}")) for i in range(4))), mark("end"))


async def test_a_seeded_case_records_its_seed_and_replays_identically() -> None:
    """A case started with Seeded(n) records the seed; its journal replays to the same data, step for step."""
    async with Substrate(store=MemoryStore(), workflows={"flow": SEEDED}) as sub:
        await sub.new_case("flow", {}, case_id="c", scheduler=Seeded(7))
        for i in (2, 0, 3, 1):
            await sub.signal("c", f"s{i}")
        result = await sub.await_case("c")
        journal = await sub.journal("c")
    assert journal[0].model_extra is not None and journal[0].model_extra["scheduler"] == {"kind": "seeded", "seed": 7}
    report = wfsub.replay(SEEDED, journal)
    assert report.divergence is None and report.data == result
    unseeded = [r.model_dump() for r in journal]
    unseeded[0]["scheduler"] = {"kind": "deterministic"}
    other = wfsub.replay(SEEDED, unseeded)
    assert other.divergence is not None  # the seed matters to this workflow: the task digests differ


# -- request ids ----------------------------------------------------------------------------------------------

DYNAMIC = seq(mi(wait("ok", into="ok"), count=1, dynamic=True, name="rev", collect="out"), mark("end"))


@pytest.mark.parametrize("kind", STORE_KINDS)
async def test_a_repeated_request_id_is_applied_once_across_a_restart(kind: str, tmp_path: Path) -> None:
    """signal, add_instances and close_instances repeated with the same request_id (also after a restart): once."""
    store = stores(tmp_path)[kind]
    flows = {"flow": seq(wait("first", into="first"), DYNAMIC)}
    async with Substrate(store=store, workflows=flows) as sub:
        await sub.new_case("flow", {}, case_id="c")
        await sub.signal("c", "first", "x", request_id="sig-1")
        await sub.signal("c", "first", "y", request_id="sig-1")
        await sub.add_instances("c", "rev", ["a"], request_id="add-1")
        await sub.add_instances("c", "rev", ["a"], request_id="add-1")
    async with Substrate(store=store, workflows=flows) as sub:
        await sub.signal("c", "first", "z", request_id="sig-1")
        await sub.add_instances("c", "rev", ["a"], request_id="add-1")
        await sub.close_instances("c", "rev", request_id="close-1")
        await sub.close_instances("c", "rev", request_id="close-1")
        await sub.signal("c", "ok", 1)
        await sub.signal("c", "ok", 2)
        result = await sub.await_case("c")
        journal = await sub.journal("c")
    assert result == {"first": "x", "out": [{"ok": 1}, {"ok": 2}], "order": ["end"]}
    assert kinds(journal) == ["start", "signal", "add_instances", "close_instances", "signal", "signal", "end"]
    check_shape(journal, contiguous=False)


async def test_a_repeated_request_id_leaves_no_gap_in_the_journal() -> None:
    """A retried call that is applied once leaves the journal's seqs gapless (0, 1, 2, ...)."""
    async with Substrate(store=MemoryStore(), workflows={"flow": seq(wait("a"), wait("a"), wait("a"))}) as sub:
        await sub.new_case("flow", {}, case_id="c")
        await sub.signal("c", "a", 1, request_id="r1")
        await sub.signal("c", "a", 1, request_id="r1")
        await sub.signal("c", "a", 2, request_id="r2")
        await sub.signal("c", "a", 3, request_id="r3")
        await sub.await_case("c")
        journal = await sub.journal("c")
    assert [r.seq for r in journal] == list(range(len(journal)))  # got [0, 1, 3, 4, 5]


# -- reading cases of earlier runs, pruning -------------------------------------------------------------------


@pytest.mark.parametrize("kind", STORE_KINDS)
async def test_status_data_cases_journal_and_await_work_for_cases_of_an_earlier_run(kind: str,
                                                                                   tmp_path: Path) -> None:
    """status, data, cases, journal and await_case answer for ended and parked cases of an earlier run."""
    store, clock = stores(tmp_path)[kind], VirtualClock(T0)
    flows = {"flow": seq(wait("go", into="go"), mark("end")), "boom": seq(task(lambda c: 1 / 0))}
    async with Substrate(store=store, workflows=flows, clock=clock) as sub:
        await sub.new_case("flow", {"k": 1}, case_id="done")
        await sub.signal("done", "go", "yes")
        await sub.new_case("flow", {"k": 2}, case_id="parked")
        await sub.new_case("boom", {}, case_id="failed")
        await sub.new_case("flow", {"k": 3}, case_id="cancelled")
        await clock.advance(0)
        await sub.cancel("cancelled")
        await clock.advance(0)
    async with Substrate(store=store, workflows=flows, clock=clock) as sub:
        assert sub.status("done").state == "done" and sub.data("done") == {"k": 1, "go": "yes", "order": ["end"]}
        assert sub.status("parked").state == "waiting_signal" and sub.status("parked").signals == ("go",)
        assert sub.status("failed").state == "failed" and "ZeroDivisionError" in str(sub.status("failed").failure)
        assert sub.status("cancelled").state == "cancelled"
        assert {c.case_id for c in sub.cases()} == {"done", "parked", "failed", "cancelled"}
        assert [c.case_id for c in sub.cases(state="done")] == ["done"]
        assert kinds(await sub.journal("done")) == ["start", "signal", "end"]
        assert await sub.await_case("done") == {"k": 1, "go": "yes", "order": ["end"]}
        with pytest.raises(wfsub.CaseFailed) as failed:
            await sub.await_case("failed")
        assert isinstance(failed.value.__cause__, wfsub.RestoredError)
        with pytest.raises(CaseCancelled):
            await sub.await_case("cancelled")
        waiting = [0]

        async def waiter() -> None:
            assert await sub.await_case("parked") == {"k": 2, "go": "late", "order": ["end"]}
            waiting[0] += 1

        async with anyio.create_task_group() as tg:
            for _ in range(3):
                tg.start_soon(waiter)
            await wait_all_blocked()
            await sub.signal("parked", "go", "late")
        assert waiting == [3]
        with pytest.raises(CaseNotFound):
            sub.status("nobody")
        with pytest.raises(CaseNotFound):
            await sub.journal("nobody")
        with pytest.raises(CaseNotFound):
            await sub.await_case("nobody")


@pytest.mark.parametrize("kind", STORE_KINDS)
async def test_prune_removes_old_ended_cases_only(kind: str, tmp_path: Path) -> None:
    """prune(older_than) removes cases ended long enough ago, never a live one; a pruned case is CaseNotFound."""
    store, clock = stores(tmp_path)[kind], VirtualClock(T0)
    flows = {"flow": seq(wait("go"), mark("end"))}
    async with Substrate(store=store, workflows=flows, clock=clock) as sub:
        await sub.new_case("flow", {}, case_id="old")
        await sub.signal("old", "go")
        await sub.new_case("flow", {}, case_id="live")
        await clock.advance(100)
        await sub.new_case("flow", {}, case_id="young")
        await sub.signal("young", "go")
        await clock.advance(1)
        assert await sub.prune(older_than=50) == 1
        with pytest.raises(CaseNotFound):
            await sub.await_case("old")
        assert await sub.await_case("young") == {"go": None, "order": ["end"]}
    async with Substrate(store=store, workflows=flows, clock=clock) as sub:
        with pytest.raises(CaseNotFound):
            await sub.await_case("old")
        with pytest.raises(CaseNotFound):
            await sub.journal("old")
        assert sub.status("live").state == "waiting_signal"
        assert await sub.prune(older_than=0.5) == 1
        assert {c.case_id for c in sub.cases()} == {"live"}


@pytest.mark.parametrize("kind", STORE_KINDS)
async def test_prune_removes_a_case_that_ended_exactly_older_than_seconds_ago(kind: str, tmp_path: Path) -> None:
    """prune(older_than=s) removes a case that ended exactly s seconds ago (and prune(0) one that just ended)."""
    store, clock = stores(tmp_path)[kind], VirtualClock(T0)
    async with Substrate(store=store, workflows={"flow": seq(mark("end"))}, clock=clock) as sub:
        await sub.new_case("flow", {}, case_id="c")
        await sub.await_case("c")
        await clock.advance(10)
        assert await sub.prune(older_than=10) == 1  # got 0


async def test_a_store_reopened_in_another_run_keeps_the_sqlite_integrity(tmp_path: Path) -> None:
    """After the runs above, a SQLite store file passes SQLite's integrity check (and is still a wfsub store)."""
    import sqlite3
    from contextlib import closing

    path = tmp_path / "cases.db"
    async with Substrate(store=str(path), workflows={"flow": seq(mark("end"))}) as sub:
        for i in range(20):
            await sub.new_case("flow", {"i": i})
    async with outside(SqliteStore(path)) as reader:
        assert len(await reader.cases(Listing(limit=100))) == 20
    with closing(sqlite3.connect(path)) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


# -- a late result of a withdrawn effect ----------------------------------------------------------------------


async def last_kind_is(sub: Substrate, case_id: str, kind: str) -> bool:
    return kinds(await sub.journal(case_id))[-1] == kind


class Shielded:
    """An effect that finishes its work even when cancelled (a shielded section), then returns: its result arrives
    after the runtime withdrew it, and is journaled and discarded."""

    def __init__(self) -> None:
        self.release = anyio.Event()

    async def __call__(self, ctx: Mapping[str, Any]) -> dict[str, Any]:
        with anyio.CancelScope(shield=True):
            await self.release.wait()
        return {"late": True}


SHIELDED = Shielded()
LATE = seq(
    loop(wait("t"), times=31),  # 31 records: the 32nd (the cancel_region) makes the next park write a snapshot
    scope("s", seq(effect(SHIELDED, name="shielded"), wait("never")), on_cancel=mark("on_cancel")),
    wait("end", into="end"),
)


@pytest.mark.parametrize("kind", STORE_KINDS)
async def test_a_late_result_of_a_withdrawn_effect_does_not_break_recovery(kind: str, tmp_path: Path) -> None:
    """A result that arrives after its effect was withdrawn (and a snapshot taken) still lets the case recover."""
    SHIELDED.release = anyio.Event()
    store = stores(tmp_path)[kind]
    flows = {"flow": LATE}
    async with Substrate(store=store, workflows=flows) as sub:
        await sub.new_case("flow", {}, case_id="c")
        for _ in range(31):
            await sub.signal("c", "t")
        await wait_all_blocked()
        assert sub.status("c").state == "waiting_effect"
        await sub.cancel_region("c", "s")  # the effect is withdrawn; the case parks (and writes a snapshot)
        await wait_all_blocked()
        SHIELDED.release.set()  # ... then the effect's result arrives anyway
        await eventually(lambda: last_kind_is(sub, "c", "effect"))
        assert sub.status("c").state == "waiting_signal"
    async with Substrate(store=store, workflows=flows) as sub:
        await sub.signal("c", "end", "now")  # SignalRejected: the case was suspended by its recovery
        assert await sub.await_case("c") == {"t": None, "order": ["on_cancel"], "end": "now"}


@pytest.mark.parametrize("kind", STORE_KINDS)
async def test_an_ended_case_row_records_the_seq_of_its_end(kind: str, tmp_path: Path) -> None:
    """Once a case ended, its stored row's last_seq is the seq of its `end` record."""
    store = stores(tmp_path)[kind]
    async with Substrate(store=store, workflows={"flow": seq(wait("go"), mark("end"))}) as sub:
        await sub.new_case("flow", {}, case_id="c")
        await sub.signal("c", "go")
        await sub.await_case("c")
        journal = await sub.journal("c")
    async with outside(store if isinstance(store, MemoryStore) else SqliteStore(store)) as reader:
        row = await reader.row("c")
    assert row is not None and row.state == "done"
    assert row.last_seq == journal[-1].seq  # got journal[-1].seq - 1

"""The store interface, on every backend (`STORE_KINDS`): each test takes an unopened `store` and nothing else,
so `test_store_trio.py` runs the same functions on trio."""

from __future__ import annotations

import math
import os
import time

import anyio
import pytest
from structlog.testing import capture_logs

from wfsub import WfsubError
from wfsub._errors import StoreConflict, StoreError
from wfsub._store import CaseWrite, MemoryStore, ProgramSummary, SqliteStore, Store
from wfsub.stores import Listing

from ._helpers import end, first_write, opened, row, signal, snapshot, snapshot_count, start, twin


async def test_first_write_creates_the_case_and_orders_cases_by_creation(store: Store) -> None:
    """A case's first write stores its journal and row; `order` grows with each new case and survives replaces."""
    async with opened(store):
        assert await store.write(first_write("a")) == [True]
        assert await store.write(first_write("b")) == [True]
        await store.write(CaseWrite("a", records=[signal(1)], row=row("a", "waiting_signal", last_seq=1)))
        a, b = await store.row("a"), await store.row("b")
        assert a is not None and b is not None
        assert 0 < a.order < b.order
        assert (a.state, a.last_seq) == ("waiting_signal", 1)
        assert await store.journal("a") == [start("a"), signal(1)]


async def test_row_round_trips_every_field(store: Store) -> None:
    """Every CaseRow field comes back as written (JSON-typed), with the store's `order`."""
    full = row(
        "c", "failed", started_at=10.5, updated_at=20.25, ended_at=30.0, last_seq=7, at=["seq[1]", "seq[2].par[0]"],
        signals=["go"], effects=[{"effect_id": "e1", "path": "seq[0]", "name": "charge"}],
        timers=[{"timer_id": "t1", "path": "seq[3]", "due": 99.5}], next_due=99.5, data={"n": 1, "items": [1, 2]},
        error={"type": "ValueError", "message": "bad", "path": "seq[1]", "traceback": "..."},
        cancel_reason="r", suspended_reason="s", order=12345,
    )
    async with opened(store):
        await store.write(CaseWrite("c", records=[start("c")], row=full))
        got = await store.row("c")
    assert got is not None
    full.order = got.order
    if store.shared:  # the store records who owns the case, at which epoch
        assert (got.owner, got.epoch) == ("test-substrate", 1)
        full.owner, full.epoch = got.owner, got.epoch
    assert got == full
    assert got.order != 12345  # assigned by the store, not taken from the caller


async def test_duplicate_request_id_is_skipped_once_per_case(store: Store) -> None:
    """A record whose request_id the case already holds is not appended (False), in a later write or the same one."""
    async with opened(store):
        await store.write(first_write("a"))
        await store.write(first_write("b"))
        assert await store.write(CaseWrite("a", records=[signal(1, request_id="r1")])) == [True]
        flags = await store.write(CaseWrite("a", records=[signal(2, request_id="r1"), signal(2, request_id="r2"),
                                                          signal(3, request_id="r2")]))
        assert flags == [False, True, False]
        assert await store.write(CaseWrite("b", records=[signal(1, request_id="r1")])) == [True]  # per case
        assert [r["seq"] for r in await store.journal("a")] == [0, 1, 2]
        assert [r.get("request_id") for r in await store.journal("a")] == [None, "r1", "r2"]


async def test_second_end_is_refused_and_its_write_changes_nothing(store: Store) -> None:
    """A second `end` raises StoreError; nothing of that write (records, row) is kept."""
    async with opened(store):
        await store.write(first_write("a"))
        await store.write(CaseWrite("a", records=[end(1)], row=row("a", "done", last_seq=1, ended_at=2000.0)))
        with pytest.raises(StoreError, match=r"already has its `end` record") as caught:
            await store.write(CaseWrite("a", records=[signal(2), end(3)], row=row("a", "failed", last_seq=3)))
        assert isinstance(caught.value, WfsubError)
        assert [r["seq"] for r in await store.journal("a")] == [0, 1]
        still = await store.row("a")
        assert still is not None and (still.state, still.last_seq) == ("done", 1)


async def test_two_ends_in_one_write_are_refused(store: Store) -> None:
    """A write carrying two `end` records is refused whole."""
    async with opened(store):
        await store.write(first_write("a"))
        with pytest.raises(StoreError, match="`end`"):
            await store.write(CaseWrite("a", records=[end(1), end(2)]))
        assert [r["seq"] for r in await store.journal("a")] == [0]


async def test_a_seq_written_twice_is_refused(store: Store) -> None:
    """Appending a seq the journal holds raises StoreError naming the seq; the earlier record stays."""
    async with opened(store):
        await store.write(first_write("a"))
        await store.write(CaseWrite("a", records=[signal(1, name="first")]))
        with pytest.raises(StoreError, match="already has a record at seq 1"):
            await store.write(CaseWrite("a", records=[signal(1, name="second")]))
        assert (await store.journal("a"))[1]["name"] == "first"


async def test_load_returns_row_start_newest_snapshot_and_the_records_after_it(store: Store) -> None:
    """load(): the row, `start`, the newest snapshot, and only the records after the snapshot's seq."""
    async with opened(store):
        await store.write(first_write("a"))
        await store.write(CaseWrite("a", records=[signal(1), signal(2)], snapshot=snapshot("a", 2)))
        await store.write(CaseWrite("a", records=[signal(3), signal(4)], snapshot=snapshot("a", 4)))
        await store.write(CaseWrite("a", records=[signal(5)], row=row("a", last_seq=5)))
        loaded = await store.load("a")
    assert loaded is not None
    assert loaded.start == start("a")
    assert loaded.snapshot == snapshot("a", 4)
    assert loaded.records == [signal(5)]
    assert loaded.row.last_seq == 5


async def test_load_without_a_snapshot_returns_every_record_after_start(store: Store) -> None:
    """With no snapshot, load() gives the records after `start`; an unknown case loads as None."""
    async with opened(store):
        await store.write(first_write("a"))
        await store.write(CaseWrite("a", records=[signal(1), signal(2)]))
        loaded = await store.load("a")
        assert loaded is not None and loaded.snapshot is None
        assert loaded.records == [signal(1), signal(2)]
        assert await store.load("nope") is None
        assert await store.row("nope") is None
        assert await store.journal("nope") == []


async def test_a_row_or_records_without_the_start_of_a_case_not_in_the_store_are_refused(store: Store) -> None:
    """A write of a row, or of records after `start`, for a case the store does not hold (never started, or
    deleted meanwhile) is refused with StoreConflict saying so, and writes nothing (load() finds no case)."""
    async with opened(store):
        for change in (CaseWrite("a", row=row("a")), CaseWrite("a", records=[signal(1)], row=row("a"))):
            with pytest.raises(StoreConflict, match="is not in the store"):
                await store.write(change)
        assert await store.load("a") is None
        assert await store.journal("a") == []


async def test_only_the_two_newest_snapshots_are_kept(store: Store) -> None:
    """After three snapshots of a case, the store keeps the newest two; another case's are untouched."""
    async with opened(store):
        await store.write(first_write("a"))
        await store.write(first_write("b"))
        await store.write(CaseWrite("b", records=[signal(1)], snapshot=snapshot("b", 1)))
        for seq in (1, 2, 3):
            await store.write(CaseWrite("a", records=[signal(seq)], snapshot=snapshot("a", seq)))
        assert snapshot_count(store, "a") == 2
        assert snapshot_count(store, "b") == 1
        loaded = await store.load("a")
        assert loaded is not None and loaded.snapshot == snapshot("a", 3)


async def test_cases_are_listed_newest_first_filtered_and_paged(store: Store) -> None:
    """cases(): newest first by order, filtered by state and workflow, `limit` long, strictly before `before`."""
    async with opened(store):
        for i in range(10):
            state = "done" if i % 2 else "running"
            workflow = "orders" if i < 5 else "refunds"
            await store.write(CaseWrite(f"c{i}", records=[start(f"c{i}")], row=row(f"c{i}", state, workflow=workflow)))
        every = await store.cases(Listing())
        assert [r.case_id for r in every] == [f"c{i}" for i in reversed(range(10))]
        page1 = await store.cases(Listing(limit=4))
        page2 = await store.cases(Listing(limit=4, before=page1[-1].order))
        page3 = await store.cases(Listing(limit=4, before=page2[-1].order))
        assert [r.case_id for r in page1 + page2 + page3] == [r.case_id for r in every]
        assert [r.case_id for r in await store.cases(Listing(state="done"))] == ["c9", "c7", "c5", "c3", "c1"]
        assert [r.case_id for r in await store.cases(Listing(workflow="orders"))] == ["c4", "c3", "c2", "c1", "c0"]
        refunds_done = Listing(state="done", workflow="refunds", limit=2)
        assert [r.case_id for r in await store.cases(refunds_done)] == ["c9", "c7"]
        assert await store.cases(Listing(state="cancelled")) == []
        assert await store.cases(Listing(limit=0)) == []


async def test_live_lists_running_cases_and_cases_with_effects_in_flight(store: Store) -> None:
    """live(): initializing, running, waiting_effect, and any parked case with effects in flight; oldest first."""
    effect = [{"effect_id": "e1", "path": "seq[0]", "name": "charge"}]
    cases = [
        ("init", "initializing", []), ("run", "running", []), ("eff", "waiting_effect", effect),
        ("sig", "waiting_signal", []), ("sig_eff", "waiting_signal", effect), ("timer", "waiting_timer", []),
        ("done", "done", []),
    ]
    async with opened(store):
        for case_id, state, effects in cases:
            await store.write(CaseWrite(case_id, records=[start(case_id)], row=row(case_id, state, effects=effects)))
        assert [r.case_id for r in await store.live()] == ["init", "run", "eff", "sig_eff"]
        await store.write(CaseWrite("run", row=row("run", "waiting_signal")))
        assert [r.case_id for r in await store.live()] == ["init", "eff", "sig_eff"]


async def test_due_and_next_due_see_only_parked_cases(store: Store) -> None:
    """due(until) and next_due() cover parked cases with a next_due, earliest first, `limit` long."""
    async with opened(store):
        assert await store.next_due() is None
        specs = [("t30", "waiting_timer", 30.0), ("s10", "waiting_signal", 10.0), ("t20", "waiting_timer", 20.0),
                 ("run5", "running", 5.0), ("done1", "done", 1.0), ("none", "waiting_signal", None)]
        for case_id, state, due in specs:
            await store.write(CaseWrite(case_id, records=[start(case_id)], row=row(case_id, state, next_due=due)))
        assert await store.next_due() == 10.0
        assert [r.case_id for r in await store.due(25.0)] == ["s10", "t20"]
        assert [r.case_id for r in await store.due(100.0, limit=2)] == ["s10", "t20"]
        assert await store.due(9.99) == []
        await store.write(CaseWrite("s10", row=row("s10", "running", next_due=10.0)))  # woken: no longer parked
        assert await store.next_due() == 20.0


async def test_due_pages_and_next_due_after_a_time(store: Store) -> None:
    """due(after=) reads the page after a (next_due, order) row, ties by order; next_due(after=) skips what is due
    by then (the due-timer loop looks past the due rows of cases in memory)."""
    async with opened(store):
        for case_id, due in [("a", 10.0), ("b", 10.0), ("c", 10.0), ("d", 20.0), ("e", 30.0)]:
            await store.write(CaseWrite(case_id, records=[start(case_id)], row=row(case_id, "waiting_timer",
                                                                                     next_due=due)))
        first = await store.due(25.0, limit=2)
        assert [r.case_id for r in first] == ["a", "b"]
        after = (first[-1].next_due or 0.0, first[-1].order)
        assert [r.case_id for r in await store.due(25.0, limit=2, after=after)] == ["c", "d"]
        assert await store.next_due(after=10.0) == 20.0
        assert await store.next_due(after=5.0) == 10.0
        assert await store.next_due(after=30.0) is None


async def test_inbox_ids_increase_and_moves_and_refusals_are_recorded(store: Store) -> None:
    """inbox_put ids increase; inbox_done deletes, inbox_refused marks, inbox_take skips both."""
    async with opened(store):
        await store.write(first_write("a"))
        ids = [
            await store.inbox_put("a", "signal", {"name": "go", "payload": i}, request_id=f"r{i}", created_at=5.0 + i)
            for i in range(3)
        ]
        assert ids == sorted(ids) and len(set(ids)) == 3
        taken = await store.inbox_take()
        assert [(r.id, r.body["payload"], r.request_id) for r in taken] == [(ids[i], i, f"r{i}") for i in range(3)]
        assert [r.id for r in await store.inbox_take(after=ids[0], limit=1)] == [ids[1]]
        await store.write(CaseWrite("a", records=[signal(1, request_id="r0")], inbox_done=[ids[0]],
                                    inbox_refused=[(ids[1], "the case waits for no signal 'go'")]))
        assert await store.inbox_row(ids[0]) is None
        refused = await store.inbox_row(ids[1])
        assert refused is not None and refused.refused == "the case waits for no signal 'go'"
        assert [r.id for r in await store.inbox_take()] == [ids[2]]
        later = await store.inbox_put("a", "cancel", {}, request_id=None, created_at=9.0)
        assert later > ids[2]


async def test_inbox_moves_for_an_unknown_case_need_no_case(store: Store) -> None:
    """A write that only refuses an inbox row of a case the store does not hold creates no case."""
    async with opened(store):
        inbox_id = await store.inbox_put("ghost", "signal", {"name": "go"}, request_id=None, created_at=1.0)
        assert await store.write(CaseWrite("ghost", inbox_refused=[(inbox_id, "no such case")])) == []
        assert await store.row("ghost") is None and await store.cases(Listing()) == []
        found = await store.inbox_row(inbox_id)
        assert found is not None and found.refused == "no such case"


async def test_changed_turns_true_after_an_inbox_put(store: Store) -> None:
    """changed() is true after an inbox_put since the last call, then false until the next change."""
    async with opened(store):
        store.changed()
        assert store.changed() is False
        await store.inbox_put("a", "signal", {"name": "go"}, request_id=None, created_at=1.0)
        assert store.changed() is True
        assert store.changed() is False


async def test_prune_removes_only_cases_that_ended_before_the_time(store: Store) -> None:
    """prune(t): cases with an `end` that ended before t go (row, journal, snapshots); others stay."""
    async with opened(store):
        for case_id, ended_at in (("old", 100.0), ("new", 300.0)):
            await store.write(first_write(case_id))
            await store.write(CaseWrite(case_id, records=[end(1)], snapshot=snapshot(case_id, 1),
                                        row=row(case_id, "done", ended_at=ended_at, last_seq=1)))
        await store.write(first_write("no_end"))  # a row that says ended, but no `end` record
        await store.write(CaseWrite("no_end", row=row("no_end", "done", ended_at=50.0)))
        await store.write(first_write("running"))
        assert await store.prune(200.0) == 1
        assert await store.row("old") is None and await store.journal("old") == []
        assert await store.load("old") is None and snapshot_count(store, "old") == 0
        assert {r.case_id for r in await store.cases(Listing())} == {"new", "no_end", "running"}
        assert await store.prune(200.0) == 0


async def test_prune_with_a_limit_removes_at_most_that_many(store: Store) -> None:
    """prune(t, limit=n) removes n of the prunable cases per call, so a long prune can go in batches."""
    async with opened(store):
        for i in range(5):
            case_id = f"c{i}"
            await store.write(first_write(case_id))
            await store.write(CaseWrite(case_id, records=[end(1)], row=row(case_id, "done", ended_at=10.0, last_seq=1)))
        assert [await store.prune(100.0, limit=2) for _ in range(4)] == [2, 2, 1, 0]
        assert await store.cases(Listing()) == []


async def test_owner_names_the_running_owner_and_none_after_it_closes(store: Store) -> None:
    """owner() is the open owning Substrate (seen by a non-owner too for files), None once it has closed."""
    async with opened(store, owner_id="the-owner"):
        found = await store.owner()
        assert found is not None and found.owner_id == "the-owner" and found.pid == os.getpid()
    async with opened(store, owner=False):
        assert await store.owner() is None


async def test_wait_false_returns_at_once_and_still_commits_in_order(store: Store) -> None:
    """write(wait=False) returns [] at once; its records are committed before a later write of the same case."""
    async with opened(store):
        await store.write(first_write("a"))
        assert await store.write(CaseWrite("a", records=[signal(1)]), wait=False) == []
        assert await store.write(CaseWrite("a", records=[signal(2)], row=row("a", last_seq=2))) == [True]
        assert [r["seq"] for r in await store.journal("a")] == [0, 1, 2]


async def test_a_refused_wait_false_write_is_logged(store: Store) -> None:
    """A wait=False write that breaks a rule raises nothing in the caller and logs store_write_failed."""
    async with opened(store):
        await store.write(first_write("a"))
        with capture_logs() as logs:
            await store.write(CaseWrite("a", records=[start("a")]), wait=False)
            await store.write(CaseWrite("a", records=[signal(1)]))  # the failed one was handled before this
        failed = [entry for entry in logs if entry["event"] == "store_write_failed"]
        assert len(failed) == 1 and "seq 0" in failed[0]["error"] and "'a'" in failed[0]["job"]


async def test_a_cancelled_waiter_does_not_withdraw_its_write(store: Store) -> None:
    """Cancelling the task that awaits write() leaves the write applied."""
    async with opened(store):
        with anyio.CancelScope() as scope:
            scope.cancel()
            await store.write(first_write("a"))
        assert scope.cancelled_caught
        await store.write(first_write("b"))  # a later write: the cancelled one was applied before it
        assert await store.journal("a") == [start("a")]


async def test_many_concurrent_writers_all_commit_in_order(store: Store) -> None:
    """200 tasks writing 5 records each, concurrently: every journal complete, in seq order."""
    async def case(i: int) -> None:
        await store.write(first_write(f"c{i}"))
        for seq in range(1, 5):
            assert await store.write(CaseWrite(f"c{i}", records=[signal(seq)], row=row(f"c{i}", last_seq=seq))) == [
                True
            ]

    async with opened(store):
        async with anyio.create_task_group() as tg:
            for i in range(200):
                tg.start_soon(case, i)
        for i in range(200):
            assert [r["seq"] for r in await store.journal(f"c{i}")] == [0, 1, 2, 3, 4]
        assert len(await store.cases(Listing(limit=1000))) == 200


async def test_a_refused_write_does_not_fail_the_writes_beside_it(store: Store) -> None:
    """Concurrent with a refused write (second `end`), the other writes all commit."""
    results: dict[str, object] = {}

    async def attempt(case_id: str, change: CaseWrite) -> None:
        try:
            results[case_id] = await store.write(change)
        except StoreError as exc:
            results[case_id] = exc

    async with opened(store):
        await store.write(first_write("bad"))
        await store.write(CaseWrite("bad", records=[end(1)]))
        for i in range(20):
            await store.write(first_write(f"ok{i}"))
        async with anyio.create_task_group() as tg:
            for i in range(20):
                change = CaseWrite(f"ok{i}", records=[signal(1)], row=row(f"ok{i}", last_seq=1))
                tg.start_soon(attempt, f"ok{i}", change)
                if i == 10:
                    tg.start_soon(attempt, "bad", CaseWrite("bad", records=[end(2)]))
        assert isinstance(results.pop("bad"), StoreError)
        assert results == {f"ok{i}": [True] for i in range(20)}
        for i in range(20):
            assert len(await store.journal(f"ok{i}")) == 2


async def test_values_that_are_not_json_are_refused_before_anything_is_written(store: Store) -> None:
    """NaN, sets and records without a seq raise StoreError in the caller, naming what, and nothing is written."""
    async with opened(store):
        await store.write(first_write("a"))
        bad_writes = [
            CaseWrite("a", records=[signal(1, value=math.nan)]),
            CaseWrite("a", records=[signal(1)], row=row("a", data={"s": {1, 2}})),
            CaseWrite("a", records=[{"kind": "signal"}]),
        ]
        for change in bad_writes:
            with pytest.raises(StoreError, match="case 'a'"):
                await store.write(change)
        with pytest.raises(StoreError, match="JSON"):
            await store.inbox_put("a", "signal", {"payload": math.inf}, request_id=None, created_at=1.0)
        assert await store.journal("a") == [start("a")]


async def test_what_a_store_returns_is_a_copy(store: Store) -> None:
    """Mutating a written record or a returned row afterwards does not change what the store holds."""
    async with opened(store):
        record = start("a", items=[1])
        await store.write(CaseWrite("a", records=[record], row=row("a", data={"n": 1})))
        record["data"]["items"].append(2)
        got = await store.row("a")
        assert got is not None and got.data is not None
        got.data["n"] = 99
        again = await store.row("a")
        assert again is not None and again.data == {"n": 1}
        assert (await store.journal("a"))[0]["data"] == {"items": [1]}


async def test_everything_is_there_after_close_and_reopen(store: Store) -> None:
    """Closing and reopening the store gives back every case, row and inbox row."""
    # On a shared store the node's live cases come back one epoch on: the new opener fences any earlier process.
    async with opened(store):
        await store.write(first_write("a"))
        await store.write(CaseWrite("a", records=[signal(1)], snapshot=snapshot("a", 1), row=row("a", last_seq=1)))
        inbox_id = await store.inbox_put("a", "signal", {"name": "go"}, request_id=None, created_at=1.0)
        before = await store.load("a")
    again = twin(store)
    async with opened(again):
        after = await again.load("a")
        if store.shared:
            assert before is not None and after is not None and after.row.epoch == before.row.epoch + 1
            after.row.epoch = before.row.epoch
        assert after == before
        assert [r.id for r in await again.inbox_take()] == [inbox_id]
        await again.write(first_write("b"))
        b, a = await again.row("b"), await again.row("a")
        assert a is not None and b is not None and b.order > a.order


async def test_a_second_owner_is_refused_until_the_first_closes(store: Store) -> None:
    """A second owner is refused by name until the first closes (a shared store admits it at once)."""
    async with opened(store, owner_id="first-substrate"):
        other = twin(store)
        if store.shared:
            async with opened(other, owner_id="second-substrate"):
                assert {n.owner_id for n in await other.nodes()} == {"first-substrate", "second-substrate"}
        else:
            with pytest.raises(StoreError, match="first-substrate"):
                await other.open(owner=True, owner_id="second-substrate")
    async with opened(twin(store), owner_id="second-substrate") as second:
        assert await second.cases(Listing()) == []


async def test_a_non_owner_opens_beside_the_owner_and_posts_inputs(store: Store) -> None:
    """open(owner=False) works while an owner has the store; its inbox_put is seen by the owner."""
    async with opened(store, owner_id="owner"):
        await store.write(first_write("a"))
        store.changed()
        viewer = twin(store)
        if viewer is store:  # one MemoryStore object: the owner and the viewer share it
            inbox_id = await store.inbox_put("a", "signal", {"name": "go"}, request_id="x", created_at=1.0)
        else:
            async with opened(viewer, owner=False, owner_id="wfsub-cli"):
                assert [r.case_id for r in await viewer.cases(Listing())] == ["a"]
                inbox_id = await viewer.inbox_put("a", "signal", {"name": "go"}, request_id="x", created_at=1.0)
        if store.shared:  # told by NOTIFY, a moment after the commit
            with anyio.fail_after(5):
                while not store.changed():
                    await store.wait_changed(1.0)
        else:
            assert store.changed() is True
        assert [r.id for r in await store.inbox_take()] == [inbox_id]


async def test_using_a_store_that_is_not_open_raises_store_error(store: Store) -> None:
    """Before open() and after close(), every method raises StoreError saying to open the store first."""
    with pytest.raises(StoreError, match=r"not open.*open\("):
        await store.write(first_write("a"))
    async with opened(store):
        pass
    for call in (store.row("a"), store.cases(Listing()), store.inbox_take(), store.prune(1.0)):
        with pytest.raises(StoreError, match="not open"):
            await call
    with pytest.raises(StoreError, match="not open"):
        store.changed()


async def test_opening_a_store_object_twice_is_refused_the_same_on_every_database(store: Store) -> None:
    """open() on a file or database store object that is open already says to close it first; it stays usable."""
    if isinstance(store, MemoryStore):
        pytest.skip("one MemoryStore object is the store itself: a second opener is another user of it")
    async with opened(store):
        with pytest.raises(StoreError, match=r"already open: close\(\) it first") as caught:
            await store.open(owner=False, owner_id="again")
        assert store.url.removeprefix("sqlite:///") in str(caught.value)  # names the file or the database
        await store.write(first_write("a"))
        assert [r["seq"] for r in await store.journal("a")] == [0]


async def test_wait_changed_returns_soon_after_another_connection_puts_an_input(store: Store) -> None:
    """wait_changed() returns soon after another connection's inbox_put, leaving changed() unconsumed."""
    async with opened(store, owner_id="owner"):
        await store.write(first_write("a"))
        await store.wait_changed(0)  # what opening reported
        store.changed()
        viewer = twin(store)

        async def put() -> None:
            await anyio.sleep(0.05)
            if viewer is store:
                await store.inbox_put("a", "signal", {"name": "go"}, request_id=None, created_at=1.0)
                return
            async with opened(viewer, owner=False, owner_id="wfsub-cli"):
                await viewer.inbox_put("a", "signal", {"name": "go"}, request_id=None, created_at=1.0)

        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                tg.start_soon(put)
                await store.wait_changed(30.0)
            assert store.changed() is True


async def test_single_node_stores_have_no_leases_takeovers_or_queue(store: Store) -> None:
    """Single-node stores: nothing to take or claim, the local clock, and no placement='any'."""
    if store.shared:
        pytest.skip("a shared store: see test_postgres.py")
    async with opened(store):
        assert await store.take_over() == [] and await store.claim_queued(["fp-1"], 10) == []
        assert abs(await store.renew_lease() - time.time()) < 5 and abs(await store.database_time() - time.time()) < 5
        if isinstance(store, SqliteStore):  # other processes queue cases for its owner: see tests/processes
            return
        with pytest.raises(StoreError, match="placement='any' needs a shared store"):
            await store.queue_case(first_write("a"))
        assert await store.row("a") is None


async def test_program_summaries_are_kept_once_per_fingerprint(store: Store) -> None:
    """put_program keeps the first summary of a fingerprint; newest_program gives the last version registered."""
    async with opened(store):
        assert await store.program("fp-a") is None and await store.newest_program("order") is None
        await store.put_program(ProgramSummary("fp-a", "order", {"signals": {"go": None}}))
        await store.put_program(ProgramSummary("fp-a", "order", {"signals": {}}))
        await store.put_program(ProgramSummary("fp-b", "order", {"signals": {"stop": None}}))
        first = await store.program("fp-a")
        assert first is not None and first.summary == {"signals": {"go": None}}
        newest = await store.newest_program("order")
        assert newest is not None and newest.fingerprint == "fp-b"


async def test_heartbeats_are_kept_beside_the_row_and_come_back_with_load(store: Store) -> None:
    """put_heartbeats replaces what a case keeps; a row replace leaves it; load() gives it back (none: {}); a case
    without a row is left alone; on a shared store a write at an epoch the node no longer holds changes nothing."""
    beat = {"7": {"details": {"page": 3}, "at": 6.5, "attempt": 2}}
    async with opened(store):
        await store.write(first_write("a"))
        loaded = await store.load("a")
        assert loaded is not None and loaded.heartbeats == {}
        await store.put_heartbeats("a", {"7": {"details": {"page": 2}, "at": 5.0, "attempt": 1}}, epoch=1)
        await store.put_heartbeats("a", beat, epoch=1)
        await store.write(CaseWrite("a", records=[signal(1)], row=row("a", "waiting_effect", last_seq=1), epoch=1))
        loaded = await store.load("a")
        assert loaded is not None and loaded.heartbeats == beat
        await store.put_heartbeats("nobody", beat, epoch=1)
        assert await store.row("nobody") is None
        if store.shared:
            await store.put_heartbeats("a", {}, epoch=2)  # fenced: the node holds the case at epoch 1
            loaded = await store.load("a")
            assert loaded is not None and loaded.heartbeats == beat

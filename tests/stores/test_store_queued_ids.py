"""A queue item that waits (queued, or claimed and its case not written) holds its case id: any write that starts
a case of that id (a `start`, a fork's `snapshot` head, a start queued for any node) is refused with StoreConflict
and writes nothing, except the item's own (`CaseWrite.from_queue`); a start and a queueing of one id at once never
both commit. On every backend."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from wfsub._errors import CaseExists, StoreConflict
from wfsub._store import CaseWrite, Store
from wfsub._store._queueing import QueueItem, QueueLimits
from wfsub.stores import MemoryStore, PostgresStore, SqliteStore

from ._helpers import STORE_PARAMS, first_write, make_store, opened, row, twin
from .test_compaction_store import snap_record


def item(case_id: str, queue: str = "q") -> QueueItem:
    return QueueItem(case_id, queue, None, 0, None, {"workflow": "orders", "data": {}, "timeout": None, "seed": None},
                     0.0, 1000.0)


def own(change: CaseWrite) -> CaseWrite:
    """The same write, as its queue item's own start."""
    change.from_queue = True
    return change


async def refused_and_nothing_written(store: Store, case_id: str) -> None:
    with pytest.raises(StoreConflict, match=f"case {case_id!r} waits in its queue"):
        await store.write(first_write(case_id))
    with pytest.raises(StoreConflict, match="waits in its queue"):  # a fork that begins with a snapshot record
        await store.write(CaseWrite(case_id, records=[snap_record(case_id, 6)], row=row(case_id)))
    assert await store.row(case_id) is None and await store.load(case_id) is None


async def test_a_start_of_an_id_whose_queue_item_waits_is_refused_unless_it_is_the_items_own(store: Store) -> None:
    """While w's item is queued, and again once claimed, a start (or fork) of w is refused and writes nothing,
    while another case's start in the same moment commits; w's own start (from_queue) then commits, and after it
    a start of w is refused as any taken id."""
    async with opened(store):
        await store.queue_put(item("w"))
        await refused_and_nothing_written(store, "w")
        async with anyio.create_task_group() as tg:  # (likely one group: the other start is not held back)
            tg.start_soon(refused_and_nothing_written, store, "w")
            tg.start_soon(store.write, first_write("other"))
        assert await store.row("other") is not None
        claimed, _ = await store.queue_claim("q", QueueLimits(concurrency=1), "n1", 1000.0, 10)
        assert [i.case_id for i in claimed] == ["w"]
        await refused_and_nothing_written(store, "w")
        assert await store.write(own(first_write("w"))) == [True]
        with pytest.raises(StoreConflict, match="seq 0"):
            await store.write(first_write("w"))
        assert [r["kind"] for r in await store.journal("w")] == ["start"]


async def test_an_id_whose_item_is_cancelled_or_whose_case_was_deleted_is_not_held(store: Store) -> None:
    """A cancelled item's id is its ended case's (refused as a taken id, not as waiting); a case deleted while its
    item had started leaves the id free to start anew."""
    async with opened(store):
        await store.queue_put(item("c"))
        ended = first_write("c", "cancelled", ended_at=1000.0)
        ended.from_queue = True
        assert await store.queue_cancel("c", ended) is not None
        with pytest.raises(StoreConflict, match="seq 0"):
            await store.write(first_write("c"))
        await store.queue_put(item("d"))
        await store.queue_claim("q", QueueLimits(), "n1", 1000.0, 10)
        await store.write(own(first_write("d")))
        await store.write(CaseWrite("d", records=[{"seq": 1, "kind": "end", "time": 1001.0, "outcome": "done"}],
                                    row=row("d", "done", ended_at=1001.0)))
        assert await store.delete("d")
        assert await store.write(first_write("d")) == [True]


@pytest.mark.parametrize("kind", [k for k in STORE_PARAMS if k != "memory"])
async def test_a_start_for_any_node_of_an_id_whose_queue_item_waits_is_refused(kind: str, tmp_path: Path) -> None:
    """queue_case (a Client's or a standby's start) of an id a queue item waits for is refused and writes
    nothing."""
    store = make_store(kind, tmp_path)
    async with opened(store):
        await store.queue_put(item("w"))
        async with opened(twin(store), owner=False, owner_id="client") as client:
            with pytest.raises(StoreConflict, match="waits in its queue"):
                await client.queue_case(first_write("w"))
        assert await store.row("w") is None


async def outcome(what: str, done: dict[str, bool], call: object) -> None:
    try:
        await call  # type: ignore[misc]
    except (CaseExists, StoreConflict):
        done[what] = False
    else:
        done[what] = True


@pytest.mark.parametrize("kind", STORE_PARAMS)
async def test_a_start_and_a_queueing_of_one_id_at_once_never_both_commit(kind: str, tmp_path: Path) -> None:
    """Two stores on one place: one queues id r<i> while the other writes its start, at once, 30 times: each time
    exactly one of them commits, and the id is then either a waiting item or a case, never both."""
    store = make_store(kind, tmp_path)
    async with opened(store, owner_id="A") as a:
        other = twin(store)
        shared = isinstance(store, PostgresStore)
        async with opened(other, owner=shared, owner_id="B") as b:
            for i in range(30):
                case_id = f"r{i}"
                done: dict[str, bool] = {}
                async with anyio.create_task_group() as tg:
                    tg.start_soon(outcome, "queued", done, b.queue_put(item(case_id)))
                    tg.start_soon(outcome, "started", done, a.write(first_write(case_id)))
                assert sorted(done.values()) == [False, True], (case_id, done)
                waiting = a.read_queue_item(case_id) is not None
                started = await a.row(case_id) is not None
                assert (waiting, started) == (done["queued"], done["started"]), (case_id, done)
    assert isinstance(store, MemoryStore | SqliteStore | PostgresStore)

"""Compaction at the store: a write carrying a `snapshot` record and `compact=seq` removes the case's records and
snapshots before that seq in the same transaction, on every backend; a refused or failing compaction changes
nothing; `first_seq` and `load` start from the first record kept."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path

import pytest

from wfsub._errors import StoreConflict, StoreError
from wfsub._store import CaseWrite, Record, Store
from wfsub.stores import PostgresStore, SqliteStore

from . import _pg
from ._helpers import first_write, make_store, opened, row, signal, snapshot, snapshot_count, start


def snap_record(case_id: str, seq: int) -> Record:
    """A `snapshot` record as the runtime writes one (the store reads only its seq and kind)."""
    return {"seq": seq, "kind": "snapshot", "step": seq * 3, "time": 1000.0 + seq, "digest": None,
            "start": start(case_id), "fingerprint": "fp-1", "format": 1, "bytecode": 1, "state": {"seq": seq}}


async def five_records(store: Store, case_id: str = "c") -> None:
    await store.write(first_write(case_id))
    await store.write(CaseWrite(case_id, records=[signal(i) for i in range(1, 6)], snapshot=snapshot(case_id, 3)))


async def test_a_compaction_leaves_the_journal_starting_with_its_snapshot_record(store: Store) -> None:
    """Records and snapshots before the snapshot record's seq go; seqs are kept; load and first_seq start there."""
    async with opened(store):
        await five_records(store)
        assert await store.first_seq("c") == 0
        assert await store.write(CaseWrite("c", records=[snap_record("c", 6)], compact=6, epoch=1)) == [True]
        assert [r["seq"] for r in await store.journal("c")] == [6]
        assert await store.first_seq("c") == 6
        assert snapshot_count(store, "c") == 0
        await store.write(CaseWrite("c", records=[signal(7), signal(8)], epoch=1))
        loaded = await store.load("c")
        assert loaded is not None
        assert (loaded.start["kind"], loaded.start["seq"], loaded.start["start"]["case_id"]) == ("snapshot", 6, "c")
        assert loaded.snapshot is None
        assert [r["seq"] for r in loaded.records] == [7, 8]
        assert await store.first_seq("nobody") is None


async def test_a_snapshot_from_before_the_compaction_is_not_loaded(store: Store) -> None:
    """A snapshot at a seq the compaction removed (a parked row's, written late) is not used: the records after it
    are gone, so load starts from the snapshot record."""
    async with opened(store):
        await five_records(store)
        await store.write(CaseWrite("c", records=[snap_record("c", 6)], compact=6, epoch=1))
        await store.write(CaseWrite("c", snapshot=snapshot("c", 4), epoch=1))  # late
        await store.write(CaseWrite("c", records=[signal(7)], epoch=1))
        loaded = await store.load("c")
        assert loaded is not None
        assert loaded.snapshot is None and loaded.start["seq"] == 6
        assert [r["seq"] for r in loaded.records] == [7]
        await store.write(CaseWrite("c", snapshot=snapshot("c", 7), epoch=1))
        loaded = await store.load("c")
        assert loaded is not None and loaded.snapshot is not None and loaded.snapshot.seq == 7
        assert loaded.records == []


async def test_a_refused_compaction_removes_nothing(store: Store) -> None:
    """A compaction whose snapshot record's seq is taken is refused whole: every record and snapshot stays."""
    async with opened(store):
        await five_records(store)
        with pytest.raises(StoreConflict, match="seq 5"):
            await store.write(CaseWrite("c", records=[snap_record("c", 5)], compact=5, epoch=1))
        assert [r["seq"] for r in await store.journal("c")] == [0, 1, 2, 3, 4, 5]
        assert snapshot_count(store, "c") == 1
        assert await store.first_seq("c") == 0


async def test_a_compaction_without_its_snapshot_record_is_refused_before_anything(store: Store) -> None:
    """`compact=seq` needs the write's own `snapshot` record at that seq: a StoreError says so, nothing written."""
    async with opened(store):
        await five_records(store)
        with pytest.raises(StoreError, match="without a `snapshot` record at that seq"):
            await store.write(CaseWrite("c", records=[signal(6)], compact=6, epoch=1))
        assert [r["seq"] for r in await store.journal("c")] == [0, 1, 2, 3, 4, 5]


def _fail_deletes(store: Store) -> None:
    """Make every DELETE from the journal fail inside the database (a fault between the append and the delete)."""
    if isinstance(store, SqliteStore):
        with closing(sqlite3.connect(store.path)) as conn:
            conn.execute("CREATE TRIGGER no_delete BEFORE DELETE ON journal BEGIN SELECT RAISE(ABORT, 'no'); END")
            conn.commit()
        return
    assert isinstance(store, PostgresStore)
    schema = f'"{store.schema}"'
    _pg.fetchval(
        f"CREATE FUNCTION {schema}.no_delete() RETURNS trigger LANGUAGE plpgsql AS "
        "$$ BEGIN RAISE EXCEPTION 'no deletes'; END $$"
    )
    _pg.fetchval(
        f"CREATE TRIGGER no_delete BEFORE DELETE ON {schema}.journal FOR EACH ROW EXECUTE FUNCTION {schema}.no_delete()"
    )


@pytest.mark.parametrize("kind", ["sqlite", *(["postgres"] if _pg.ENABLED else [])])
async def test_a_fault_at_the_delete_undoes_the_snapshot_record_too(kind: str, tmp_path: Path) -> None:
    """The snapshot record and the delete are one transaction: when the delete fails, the record is not there
    either (no journal is ever left with a snapshot record and the records it replaced, or with neither)."""
    store = make_store(kind, tmp_path)
    async with opened(store):
        await five_records(store)
        _fail_deletes(store)
        with pytest.raises(StoreError):
            await store.write(CaseWrite("c", records=[snap_record("c", 6)], compact=6, epoch=1))
        assert [r["seq"] for r in await store.journal("c")] == [0, 1, 2, 3, 4, 5]
        assert snapshot_count(store, "c") == 1
        # the other writes of the store go on
        assert await store.write(CaseWrite("c", records=[signal(6)], row=row("c", last_seq=6), epoch=1)) == [True]
        if isinstance(store, PostgresStore):  # (the schema is emptied for the next test, not dropped)
            _pg.fetchval(f'DROP TRIGGER no_delete ON "{store.schema}".journal')


@pytest.mark.skipif(not _pg.ENABLED, reason=_pg.SKIP_REASON)
async def test_a_fenced_node_cannot_compact(tmp_path: Path) -> None:
    """A node whose case was taken over is refused its compaction like any write: the journal stays whole."""
    from .test_postgres import expire, new_store, nodes

    async with nodes(new_store(tmp_path), "A", "B") as (a, b):
        await five_records(a)
        expire(a, "A")
        assert [r.case_id for r in await b.take_over()] == ["c"]
        with pytest.raises(StoreConflict, match="node 'B' at epoch 2"):
            await a.write(CaseWrite("c", records=[snap_record("c", 6)], compact=6, epoch=1))
        assert [r["seq"] for r in await b.journal("c")] == [0, 1, 2, 3, 4, 5]
        assert await b.write(CaseWrite("c", records=[snap_record("c", 6)], compact=6, epoch=2)) == [True]
        assert await b.journal_epochs("c") == [(6, 2)]


async def test_a_start_for_a_compacted_case_is_refused(store: Store) -> None:
    """After a compaction the case's seq 0 is gone but the case is not: starting a case with its id again (a
    write or a queued start) is refused as a taken id, and changes nothing."""
    async with opened(store):
        await five_records(store)
        await store.write(CaseWrite("c", records=[snap_record("c", 6)], compact=6, epoch=1))
        with pytest.raises(StoreConflict, match="seq 0"):
            await store.write(first_write("c"))
        if store.shared:
            with pytest.raises(StoreConflict, match="seq 0"):
                await store.queue_case(first_write("c"))
        # in a group with another case's start, the other one starts
        other = first_write("d")
        assert await store.write(other) == [True]
        assert [r["seq"] for r in await store.journal("c")] == [6]
        found = await store.row("c")
        assert found is not None and found.state == "running"


@pytest.mark.skipif(not _pg.ENABLED, reason=_pg.SKIP_REASON)
@pytest.mark.parametrize("commit", [True, False])
async def test_a_compaction_whose_answer_was_lost_is_answered_as_it_went(commit: bool, tmp_path: Path) -> None:
    """Postgres loses the connection with a compaction in flight: committed, it is read back and answered as
    applied (the journal compacted once); not committed, it is sent again. Either way the journal starts with the
    snapshot record, whole after it."""
    from .test_postgres import LosesAnswer, new_store, nodes

    async with nodes(new_store(tmp_path), "A") as (a,):
        await five_records(a)
        a._c.writer = LosesAnswer(a, commit=commit)
        assert await a.write(CaseWrite("c", records=[snap_record("c", 6)], compact=6, epoch=1)) == [True]
        assert [r["seq"] for r in await a.journal("c")] == [6]
        a._c.writer = LosesAnswer(a, commit=True)  # a start of the compacted case, its answer lost: still refused
        with pytest.raises(StoreConflict, match="seq 0"):
            await a.write(first_write("c"))
        assert [r["seq"] for r in await a.journal("c")] == [6]


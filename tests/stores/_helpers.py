"""Shared pieces of the store tests: the stores under test, realistic records and rows, open/close helpers."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, closing
from pathlib import Path
from typing import Any

import pytest

from wfsub._store import CaseRow, CaseWrite, Record, Snapshot, Store
from wfsub.stores import MemoryStore, PostgresStore, SqliteStore

from . import _pg

STORE_KINDS = ["memory", "sqlite", *(["postgres"] if _pg.ENABLED else [])]
"""Every backend the store-generic tests run on; a new backend joins by adding its name here and in make_store.
Postgres joins when WFSUB_TEST_POSTGRES names a server (see _pg.py)."""

STORE_PARAMS = [
    *STORE_KINDS,
    *([] if _pg.ENABLED else [pytest.param("postgres", marks=pytest.mark.skip(reason=_pg.SKIP_REASON))]),
]
"""STORE_KINDS as pytest parameters: without a server, Postgres is there too, skipped with how to run it."""


def make_store(kind: str, tmp_path: Path, **options: Any) -> Store:
    """A new, unopened store of this kind (an empty place each time: a new file, an emptied Postgres schema)."""
    if kind == "memory":
        return MemoryStore()
    if kind == "sqlite":
        return SqliteStore(tmp_path / "cases.db")
    if kind == "postgres":
        return PostgresStore(_pg.database_dsn(), schema=_pg.emptied_schema(), **options)
    raise AssertionError(f"unknown store kind {kind!r}")


def twin(store: Store, **options: Any) -> Store:
    """Another handle on the same place: a new object on the same file or schema; a MemoryStore is its own
    place."""
    if isinstance(store, SqliteStore):
        return SqliteStore(store.path, synchronous=store.synchronous)
    if isinstance(store, PostgresStore):
        options.setdefault("lease_seconds", store.lease_seconds)
        options.setdefault("retry_for", store.retry_for)
        return PostgresStore(store.dsn, schema=store.schema, **options)
    return store


@asynccontextmanager
async def opened(store: Store, *, owner: bool = True, owner_id: str = "test-substrate") -> AsyncIterator[Store]:
    await store.open(owner=owner, owner_id=owner_id)
    try:
        yield store
    finally:
        await store.close()


def row(case_id: str, state: str = "running", **fields: Any) -> CaseRow:
    fields.setdefault("started_at", 1000.0)
    fields.setdefault("updated_at", fields["started_at"])
    return CaseRow(case_id=case_id, workflow=fields.pop("workflow", "orders"), fingerprint="fp-1", state=state,
                   **fields)


def start(case_id: str, **data: Any) -> Record:
    return {
        "seq": 0, "kind": "start", "case_id": case_id, "workflow": "orders", "fingerprint": "fp-1",
        "data": data, "scheduler": {"kind": "deterministic"}, "deadline": None, "time": 1000.0,
    }


def signal(seq: int, name: str = "go", request_id: str | None = None, **payload: Any) -> Record:
    record: Record = {"seq": seq, "kind": "signal", "step": seq * 3, "time": 1000.0 + seq, "digest": f"d{seq}",
                      "name": name, "payload": payload}
    if request_id is not None:
        record["request_id"] = request_id
    return record


def end(seq: int, outcome: str = "done") -> Record:
    return {"seq": seq, "kind": "end", "time": 2000.0, "outcome": outcome, "result": {"ok": True}}


def snapshot(case_id: str, seq: int) -> Snapshot:
    return Snapshot(case_id, seq, format=1, bytecode=1, state={"taken_after": seq, "objects": [{"type": "Token"}]})


def first_write(case_id: str, state: str = "running", **fields: Any) -> CaseWrite:
    """What the runtime writes when a case starts: its `start` record with its row."""
    return CaseWrite(case_id, records=[start(case_id)], row=row(case_id, state, **fields))


def snapshot_count(store: Store, case_id: str) -> int:
    """How many snapshots the store keeps for a case (backend-specific peek)."""
    if isinstance(store, PostgresStore):
        count: int = _pg.fetchval(f'SELECT count(*) FROM "{store.schema}".snapshots WHERE case_id = $1', case_id)
        return count
    if isinstance(store, SqliteStore):
        with closing(sqlite3.connect(store.path)) as conn:
            count: int = conn.execute("SELECT count(*) FROM snapshots WHERE case_id = ?", (case_id,)).fetchone()[0]
            return count
    assert isinstance(store, MemoryStore)
    return len(store._cases[case_id].snapshots) if case_id in store._cases else 0

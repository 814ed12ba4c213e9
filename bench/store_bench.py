"""Benchmarks of the SQLite store, each beside a bare sqlite3 baseline measured in the same run.

- Commit latency: one `write()` at a time (a signal record and the case row), synchronous=FULL, p50 and p99,
  beside a bare sqlite3 loop of BEGIN IMMEDIATE / INSERT / COMMIT on the same journal table and pragmas.
- Group commit: 1,000 concurrent writers, 10 writes each, one record per write: records/s, beside one bare
  executemany of as many records in one transaction (the ceiling: no fsync per group, no event loop).
- `changed()`: the cost of one call (PRAGMA data_version on the store's own connection).

No targets are set for these yet: each line says "(no target)". Figures are recorded lower-is-better (latency
in us, group commit as us per record).
"""

from __future__ import annotations

import sqlite3
import tempfile
import time
from contextlib import closing
from pathlib import Path
from typing import Any

import anyio

from wfsub._store import CaseRow, CaseWrite
from wfsub._store._sql import QUERIES
from wfsub.stores import SqliteStore

from ._figures import percentile, record

LATENCY_WRITES = 1000
WRITERS = 1000
WRITES_EACH = 10



def case_row(case_id: str, seq: int) -> CaseRow:
    return CaseRow(case_id=case_id, workflow="orders", fingerprint="fp", state="waiting_signal", started_at=1.0,
                   updated_at=1.0 + seq, last_seq=seq)


def signal(seq: int) -> dict[str, Any]:
    return {"seq": seq, "kind": "signal", "step": seq, "time": 1.0 + seq, "digest": "d", "name": "go",
            "payload": {"n": seq}}


async def store_latency(path: Path, synchronous: str) -> list[float]:
    store = SqliteStore(path, synchronous=synchronous)
    await store.open(owner=True, owner_id="bench")
    try:
        await store.write(CaseWrite("c", records=[{"seq": 0, "kind": "start"}], row=case_row("c", 0)))
        samples = []
        for seq in range(1, LATENCY_WRITES + 51):
            start = time.perf_counter()
            await store.write(CaseWrite("c", records=[signal(seq)], row=case_row("c", seq)))
            if seq > 50:  # after a warm-up
                samples.append(time.perf_counter() - start)
        return samples
    finally:
        await store.close()


def bare_connection(path: Path) -> sqlite3.Connection:
    """A database with the store's layout and pragmas, written by hand."""
    async def build() -> None:
        store = SqliteStore(path)
        await store.open(owner=False, owner_id="bench")
        await store.close()

    anyio.run(build)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA synchronous = FULL")
    return conn


def bare_latency(path: Path) -> list[float]:
    insert = QUERIES["record_append"]
    samples = []
    with closing(bare_connection(path)) as conn:
        for seq in range(LATENCY_WRITES + 50):
            params = {"case_id": "c", "seq": seq, "kind": "signal", "request_id": None, "record": '{"seq":1}'}
            start = time.perf_counter()
            conn.execute("BEGIN IMMEDIATE")
            conn.execute(insert, params)
            conn.execute("COMMIT")
            if seq >= 50:
                samples.append(time.perf_counter() - start)
    return samples


async def store_throughput(path: Path) -> tuple[float, int]:
    store = SqliteStore(path)
    await store.open(owner=True, owner_id="bench")
    try:
        async def writer(i: int) -> None:
            case_id = f"c{i}"
            await store.write(CaseWrite(case_id, records=[{"seq": 0, "kind": "start"}], row=case_row(case_id, 0)))
            for seq in range(1, WRITES_EACH):
                await store.write(CaseWrite(case_id, records=[signal(seq)]))

        assert store._writer is not None
        groups = store._writer.groups
        start = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for i in range(WRITERS):
                tg.start_soon(writer, i)
        elapsed = time.perf_counter() - start
        return elapsed, store._writer.groups - groups
    finally:
        await store.close()


def bare_throughput(path: Path) -> float:
    rows = [
        {"case_id": f"c{i}", "seq": seq, "kind": "signal", "request_id": None, "record": '{"seq":1}'}
        for i in range(WRITERS) for seq in range(WRITES_EACH)
    ]
    with closing(bare_connection(path)) as conn:
        start = time.perf_counter()
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany(QUERIES["record_append"], rows)
        conn.execute("COMMIT")
        return time.perf_counter() - start


async def changed_cost(path: Path) -> float:
    store = SqliteStore(path)
    await store.open(owner=False, owner_id="bench")
    try:
        calls = 20_000
        start = time.perf_counter()
        for _ in range(calls):
            store.changed()
        return (time.perf_counter() - start) / calls
    finally:
        await store.close()


def run() -> list[str]:
    lines = ["== store (SQLite file, WAL) =="]
    with tempfile.TemporaryDirectory(prefix="wfsub-bench-") as folder:
        tmp = Path(folder)
        full = anyio.run(store_latency, tmp / "full.db", "full")
        normal = anyio.run(store_latency, tmp / "normal.db", "normal")
        bare = bare_latency(tmp / "bare.db")
        p50, p99 = record("store_commit_p50_us", percentile(full, 0.5) * 1e6, "us"), percentile(full, 0.99) * 1e6
        record("store_commit_p99_us", p99, "us")
        b50, b99 = percentile(bare, 0.5) * 1e6, percentile(bare, 0.99) * 1e6
        n50 = record("store_commit_normal_p50_us", percentile(normal, 0.5) * 1e6, "us")
        lines.append(
            f"commit latency, FULL, one write at a time  p50 {p50:6.0f} us  p99 {p99:6.0f} us  (no target)   "
            f"bare sqlite3 INSERT+COMMIT p50 {b50:6.0f} us  p99 {b99:6.0f} us ({p50 / b50:4.1f}x at p50)"
        )
        lines.append(f"  the same with synchronous=NORMAL       p50 {n50:6.0f} us  p99 {percentile(normal, 0.99) * 1e6:6.0f} us")
        for backend in ("asyncio", "trio"):
            elapsed, groups = anyio.run(store_throughput, tmp / f"group-{backend}.db", backend=backend)
            records = WRITERS * WRITES_EACH
            rate = records / elapsed
            if backend == "asyncio":
                record("store_group_commit_us_per_record", elapsed / records * 1e6, "us")
                base = records / bare_throughput(tmp / "bare-many.db")
                lines.append(
                    f"group commit, {WRITERS:,} writers x {WRITES_EACH}        {rate:9,.0f} records/s (no target)   "
                    f"bare executemany, one transaction {base:11,.0f} records/s ({base / rate:4.1f}x); "
                    f"{records:,} writes in {groups} commits"
                )
            else:
                lines.append(f"  the same on trio                       {rate:9,.0f} records/s; {records:,} writes in {groups} commits")
        cost = record("store_changed_us", anyio.run(changed_cost, tmp / "full.db") * 1e6, "us")
        lines.append(f"changed() (PRAGMA data_version)          {cost:6.1f} us per call (no target)")
    return lines

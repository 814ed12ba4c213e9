"""Benchmarks of the Postgres store, each beside the bare driver (asyncpg) doing the same in the same run.

- Commit latency: one `write()` at a time (a signal record and the case row), p50 and p99, beside a bare
  autocommit INSERT (one round trip, one commit: what a write costs the store at best) and a bare
  BEGIN / INSERT / COMMIT (three round trips).
- Group commit: 1,000 concurrent writers, 10 writes each: records/s, beside one bare executemany of as many
  rows in one transaction (the ceiling: no fencing, no per-write subtransaction, no event loop hand-off).
- NOTIFY latency: node A puts an input for node B's case; the time until B's `wait_changed()` returns, beside a
  bare `pg_notify` (autocommit) until a bare listener's callback runs. Both include the commit.

The server is WFSUB_BENCH_POSTGRES, else WFSUB_TEST_POSTGRES, else postgresql://postgres@127.0.0.1:5432/test;
when it cannot be reached the suite prints why and measures nothing. Each run works in a schema of its own,
dropped at the end. No targets are set yet: each line says "(no target)".
"""

from __future__ import annotations

import asyncio
import os
import secrets
import time
from typing import Any

import anyio
import anyio.lowlevel

from wfsub._store import CaseWrite
from wfsub.stores import PostgresStore

from ._figures import percentile, record
from .store_bench import LATENCY_WRITES, WRITERS, WRITES_EACH, case_row, signal

DSN = os.environ.get("WFSUB_BENCH_POSTGRES") or os.environ.get("WFSUB_TEST_POSTGRES") or (
    "postgresql://postgres@127.0.0.1:5432/test"
)
NOTIFIES = 300


def start(case_id: str) -> CaseWrite:
    return CaseWrite(case_id, records=[{"seq": 0, "kind": "start"}], row=case_row(case_id, 0))


async def reachable() -> str | None:
    """None when the server answers; else why not."""
    try:
        import asyncpg
    except ImportError:
        return "asyncpg is not installed (pip install 'wfsub[postgres]')"
    try:
        conn = await asyncpg.connect(DSN, timeout=2)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    await conn.close()
    return None


async def sql(text: str, *args: Any) -> Any:
    import asyncpg

    conn = await asyncpg.connect(DSN)
    try:
        return await conn.fetchval(text, *args)
    finally:
        await conn.close()


async def store_latency(schema: str) -> list[float]:
    store = PostgresStore(DSN, schema=schema)
    await store.open(owner=True, owner_id="bench")
    try:
        await store.write(start("c"))
        samples = []
        for seq in range(1, LATENCY_WRITES + 51):
            began = time.perf_counter()
            await store.write(CaseWrite("c", records=[signal(seq)], row=case_row("c", seq), epoch=1))
            if seq > 50:  # after a warm-up
                samples.append(time.perf_counter() - began)
        return samples
    finally:
        await store.close()


async def bare_latency(table: str, *, explicit: bool) -> list[float]:
    import asyncpg

    conn = await asyncpg.connect(DSN)
    try:
        insert = await conn.prepare(f"INSERT INTO {table} (case_id, seq, record) VALUES ($1, $2, $3)")
        samples = []
        for seq in range(LATENCY_WRITES + 50):
            began = time.perf_counter()
            if explicit:
                async with conn.transaction():
                    await insert.fetch("c", seq, '{"seq":1}')
            else:
                await insert.fetch("c", seq, '{"seq":1}')
            if seq >= 50:
                samples.append(time.perf_counter() - began)
        return samples
    finally:
        await conn.close()


async def store_throughput(schema: str) -> float:
    store = PostgresStore(DSN, schema=schema)
    await store.open(owner=True, owner_id="bench")
    try:
        async def writer(i: int) -> None:
            await store.write(start(f"g{i}"))
            for seq in range(1, WRITES_EACH):
                await store.write(CaseWrite(f"g{i}", records=[signal(seq)], epoch=1))

        began = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for i in range(WRITERS):
                tg.start_soon(writer, i)
        return time.perf_counter() - began
    finally:
        await store.close()


async def bare_throughput(table: str) -> float:
    import asyncpg

    rows = [(f"g{i}", seq, '{"seq":1}') for i in range(WRITERS) for seq in range(WRITES_EACH)]
    conn = await asyncpg.connect(DSN)
    try:
        began = time.perf_counter()
        async with conn.transaction():
            await conn.executemany(f"INSERT INTO {table} (case_id, seq, record) VALUES ($1, $2, $3)", rows)
        return time.perf_counter() - began
    finally:
        await conn.close()


async def store_notify(schema: str) -> list[float]:
    a, b = PostgresStore(DSN, schema=schema), PostgresStore(DSN, schema=schema)
    await a.open(owner=True, owner_id="A")
    await b.open(owner=True, owner_id="B")
    try:
        await b.write(start("b-case"))
        samples = []
        for _ in range(NOTIFIES):
            await b.wait_changed(0)
            woke = anyio.Event()

            async def wait(done: anyio.Event) -> None:
                await b.wait_changed(10.0)
                done.set()

            async with anyio.create_task_group() as tg:
                tg.start_soon(wait, woke)
                await anyio.lowlevel.checkpoint()  # the waiter is registered before the put
                began = time.perf_counter()
                await a.inbox_put("b-case", "signal", {"name": "go"}, request_id=None, created_at=1.0)
                await woke.wait()
                samples.append(time.perf_counter() - began)
        return samples
    finally:
        await a.close()
        await b.close()


async def bare_notify(channel: str) -> list[float]:
    import asyncpg

    sender, listener = await asyncpg.connect(DSN), await asyncpg.connect(DSN)
    arrived: asyncio.Queue[float] = asyncio.Queue()
    try:
        await listener.add_listener(channel, lambda *_: arrived.put_nowait(time.perf_counter()))
        samples = []
        for _ in range(NOTIFIES):
            began = time.perf_counter()
            await sender.execute("SELECT pg_notify($1, 'x')", channel)
            samples.append(await arrived.get() - began)
        return samples
    finally:
        await sender.close()
        await listener.close()


def us(samples: list[float], fraction: float) -> float:
    return percentile(samples, fraction) * 1e6


def run() -> list[str]:
    lines = ["== store (Postgres) =="]
    why = anyio.run(reachable)
    if why is not None:
        lines.append(f"skipped: the server at {DSN} cannot be reached ({why}); set WFSUB_BENCH_POSTGRES")
        return lines
    tag = secrets.token_hex(3)
    schema, table = f"bench_{tag}", f"bench_bare_{tag}"
    anyio.run(sql, f"CREATE TABLE {table} (case_id text, seq bigint, record text, PRIMARY KEY (case_id, seq))")
    try:
        mine = anyio.run(store_latency, schema + "_lat")
        auto = anyio.run(partial_bare_latency, table, False)
        anyio.run(sql, f"TRUNCATE {table}")
        three = anyio.run(partial_bare_latency, table, True)
        anyio.run(sql, f"TRUNCATE {table}")
        p50 = record("pg_commit_p50_us", us(mine, 0.5), "us")
        p99 = record("pg_commit_p99_us", us(mine, 0.99), "us")
        lines.append(
            f"commit latency, one write at a time      p50 {p50:6.0f} us  p99 {p99:6.0f} us  (no target)   "
            f"bare autocommit INSERT p50 {us(auto, 0.5):6.0f} us  p99 {us(auto, 0.99):6.0f} us "
            f"({p50 / us(auto, 0.5):4.1f}x at p50); BEGIN/INSERT/COMMIT p50 {us(three, 0.5):6.0f} us"
        )
        trio = anyio.run(store_latency, schema + "_trio", backend="trio")
        lines.append(f"  the same on trio                       p50 {us(trio, 0.5):6.0f} us  p99 {us(trio, 0.99):6.0f} us")
        elapsed = anyio.run(store_throughput, schema + "_group")
        records = WRITERS * WRITES_EACH
        record("pg_group_commit_us_per_record", elapsed / records * 1e6, "us")
        base = records / anyio.run(bare_throughput, table)
        lines.append(
            f"group commit, {WRITERS:,} writers x {WRITES_EACH}        {records / elapsed:9,.0f} records/s (no target)   "
            f"bare executemany, one transaction {base:11,.0f} records/s ({base / (records / elapsed):4.1f}x)"
        )
        note = anyio.run(store_notify, schema + "_notify")
        bare = anyio.run(bare_notify, f"bench_{tag}")
        n50 = record("pg_notify_p50_us", us(note, 0.5), "us")
        lines.append(
            f"NOTIFY, inbox_put to wait_changed       p50 {n50:6.0f} us  p99 {us(note, 0.99):6.0f} us  (no target)   "
            f"bare pg_notify to callback p50 {us(bare, 0.5):6.0f} us  p99 {us(bare, 0.99):6.0f} us"
        )
    finally:
        anyio.run(sql, f"DROP TABLE IF EXISTS {table}")
        for suffix in ("_lat", "_trio", "_group", "_notify"):
            anyio.run(sql, f'DROP SCHEMA IF EXISTS "{schema}{suffix}" CASCADE')
    return lines


async def partial_bare_latency(table: str, explicit: bool) -> list[float]:
    return await bare_latency(table, explicit=explicit)

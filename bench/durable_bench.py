"""Durable cases on a SQLite file (synchronous=FULL, the default), each figure beside a same-run baseline.

- throughput: N three-effect cases started by one coroutine and awaited, with the store and without it;
- signal acknowledgement with 10,000 parked cases (the call returns once the signal is committed), beside the
  same signal without a store;
- recovery: 10,000 parked cases, the Substrate re-entered, until a signal to the last case round-trips;
- disk per three-effect case (journal, row and snapshots; the data itself is a few bytes);
- the inbox: an input written by another connection (as the `wfsub` command does) until the owner has it in
  the case's journal, beside the poll period;
- `cases()` on a store of 100,000 cases, one page of 100; and `status` / `data` of a live case beside a dict copy.
"""

from __future__ import annotations

import gc
import os
import random
import sqlite3
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel

from wfsub import Substrate, effect, seq, task, wait
from wfsub._store import CaseRow, CaseWrite
from wfsub.stores import SqliteStore

from ._figures import percentile, record

N_THROUGHPUT = 2_000
N_PARKED = 10_000
N_SIGNALS = 1_000
N_LISTED = 100_000
N_INBOX = 20
REPEAT = 3


async def _a(ctx: Mapping[str, Any]) -> dict[str, Any]:
    return {"a": 1}


async def _b(ctx: Mapping[str, Any]) -> dict[str, Any]:
    return {"b": 2}


async def _c(ctx: Mapping[str, Any]) -> dict[str, Any]:
    return {"c": 3}


THREE_EFFECTS = seq(effect(_a), effect(_b), effect(_c))
PARKED = seq(wait("go"), task(lambda ctx: {"went": True}, name="went"))
FLOWS = {"three": THREE_EFFECTS, "parked": PARKED}


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"



def disk_bytes(path: Path) -> int:
    return sum(os.path.getsize(f"{path}{suffix}") for suffix in ("", "-wal") if os.path.exists(f"{path}{suffix}"))


# -- throughput ----------------------------------------------------------------------------------------------


async def throughput(path: Path | None, n: int) -> float:
    """Seconds for n three-effect cases started one after another by one coroutine, then awaited."""
    async with Substrate(store=path, workflows=FLOWS, retain_ended=n) as sub:
        gc.collect()
        start = time.perf_counter()
        handles = [await sub.new_case("three") for _ in range(n)]
        for handle in handles:
            await handle.result()
        return time.perf_counter() - start


# -- signals with many parked cases ------------------------------------------------------------------------------


async def park(sub: Substrate, n: int) -> list[str]:
    ids = [(await sub.new_case("parked", case_id=f"p{i}")).case_id for i in range(n)]
    while sub.status(ids[-1]).state != "waiting_signal":
        await anyio.sleep(0.01)
    return ids


async def signal_acks(path: Path | None) -> list[float]:
    """Seconds per `await sub.signal()` (returns once committed) to distinct parked cases, 10,000 parked."""
    async with Substrate(store=path, workflows=FLOWS, retain_ended=N_PARKED) as sub:
        ids = await park(sub, N_PARKED)
        await anyio.sleep(0.2)  # the parked rows' writes land
        gc.collect()
        samples = []
        for case_id in ids[:: N_PARKED // N_SIGNALS]:
            start = time.perf_counter()
            await sub.signal(case_id, "go")
            samples.append(time.perf_counter() - start)
        return samples


async def fill_parked(path: Path) -> None:
    async with Substrate(store=path, workflows=FLOWS) as sub:
        await park(sub, N_PARKED)
        await anyio.sleep(0.3)


async def recovery(path: Path) -> float:
    """Seconds from entering a Substrate on a store of parked cases until a signal to the last one round-trips."""
    start = time.perf_counter()
    async with Substrate(store=path, workflows=FLOWS) as sub:
        await sub.signal(f"p{N_PARKED - 1}", "go")
        await sub.await_case(f"p{N_PARKED - 1}")
        return time.perf_counter() - start


async def empty_entry(path: Path) -> float:
    """The baseline: entering and leaving a Substrate on a new store file."""
    start = time.perf_counter()
    async with Substrate(store=path, workflows=FLOWS):
        pass
    return time.perf_counter() - start


# -- disk -----------------------------------------------------------------------------------------------------


def disk_per_case(folder: Path) -> tuple[float, float]:
    """(bytes per three-effect case, bytes of an empty store) after a checkpoint folds the WAL into the file."""
    empty, full = folder / "empty.db", folder / "disk.db"
    anyio.run(empty_entry, empty)
    anyio.run(throughput, full, N_THROUGHPUT)
    for path in (empty, full):
        conn = sqlite3.connect(path, isolation_level=None)
        try:
            conn.execute("VACUUM")  # pages as full as SQLite packs them, then the WAL folded into the file
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            conn.close()
    base = disk_bytes(empty)
    return (disk_bytes(full) - base) / N_THROUGHPUT, base


# -- the inbox -----------------------------------------------------------------------------------------------------


async def inbox_latency(path: Path) -> list[float]:
    """Seconds from an outside inbox write (committed) until the owner has journaled it, for distinct cases."""
    async with Substrate(store=path, workflows=FLOWS) as sub:
        ids = await park(sub, N_INBOX)
        outside = SqliteStore(path, create=False)
        await outside.open(owner=False, owner_id="bench-outside")
        samples = []
        try:
            for case_id in ids:
                await anyio.sleep(random.uniform(0.0, 0.25))  # land anywhere in the owner's poll period
                start = time.perf_counter()
                await outside.inbox_put(case_id, "signal", {"name": "go"}, request_id=None, created_at=time.time())
                while sub.status(case_id).state == "waiting_signal":
                    await anyio.sleep(0.001)
                samples.append(time.perf_counter() - start)
        finally:
            await outside.close()
        return samples


# -- listing and status ----------------------------------------------------------------------------------------------


async def page_of_cases(path: Path) -> tuple[float, float]:
    """(seconds for one page of 100 from `cases()` via the Substrate, the same page read from the store)."""
    store = SqliteStore(path)
    await store.open(owner=True, owner_id="bench-filler")
    try:
        async def fill(lo: int, hi: int) -> None:
            for i in range(lo, hi):
                case_id = f"c{i:06d}"
                row = CaseRow(case_id=case_id, workflow="three" if i % 2 else "parked", fingerprint="f",
                              state="done" if i % 3 else "waiting_signal", started_at=float(i), updated_at=float(i))
                start = {"seq": 0, "kind": "start", "case_id": case_id, "workflow": row.workflow, "time": float(i)}
                await store.write(CaseWrite(case_id, [start], row), wait=False)
            await store.write(CaseWrite("c-last", [{"seq": 0, "kind": "start", "time": 0.0}], CaseRow(
                case_id="c-last", workflow="three", fingerprint="f", state="done", started_at=0.0, updated_at=0.0)))

        await fill(0, N_LISTED)
    finally:
        await store.close()
    async with Substrate(store=path, workflows=FLOWS) as sub:
        samples, raw = [], []
        for _ in range(50):
            start = time.perf_counter()
            page = sub.cases(state="done", workflow="three", limit=100)
            samples.append(time.perf_counter() - start)
            assert len(page) == 100
            start = time.perf_counter()
            rows = sub._store.read_cases(state="done", workflow="three", limit=100)  # type: ignore[union-attr]
            raw.append(time.perf_counter() - start)
            assert len(rows) == 100
        return percentile(samples, 0.5), percentile(raw, 0.5)


async def status_and_data() -> tuple[float, float, float]:
    """Seconds per `status()` and `data()` of a live parked case with 20 data keys, and per dict copy."""
    data = {f"k{i}": i for i in range(20)}
    async with Substrate(workflows=FLOWS) as sub:
        handle = await sub.new_case("parked", data)
        await anyio.sleep(0.01)
        n = 20_000
        gc.collect()
        start = time.perf_counter()
        for _ in range(n):
            sub.status(handle.case_id)
        status = (time.perf_counter() - start) / n
        start = time.perf_counter()
        for _ in range(n):
            sub.data(handle.case_id)
        got = (time.perf_counter() - start) / n
        start = time.perf_counter()
        for _ in range(n):
            dict(data)
        copy = (time.perf_counter() - start) / n
        await sub.cancel(handle.case_id)
    return status, got, copy


# -- the figures -----------------------------------------------------------------------------------------------------


def run() -> list[str]:
    lines = ["== durable cases (SQLite file, synchronous=FULL) =="]
    with tempfile.TemporaryDirectory(prefix="wfsub-bench-") as folder:
        tmp = Path(folder)
        stored, memory = [], []
        for i in range(REPEAT):  # interleaved: drift hits both alike
            stored.append(anyio.run(throughput, tmp / f"t{i}.db", N_THROUGHPUT))
            memory.append(anyio.run(throughput, None, N_THROUGHPUT))
        rate = N_THROUGHPUT / min(stored)
        base = N_THROUGHPUT / min(memory)
        record("durable_us_per_case", min(stored) / N_THROUGHPUT * 1e6, "us")
        lines.append(
            f"{N_THROUGHPUT:,} three-effect cases, one starter  {rate:7,.0f} cases/s (target >= 2,000) "
            f"{verdict(rate >= 2000)}   without a store {base:7,.0f} cases/s ({base / rate:4.1f}x)"
        )

        acks = anyio.run(signal_acks, tmp / "acks.db")
        plain = anyio.run(signal_acks, None)
        p50 = record("durable_signal_ack_p50_us", percentile(acks, 0.5) * 1e6, "us")
        p99 = record("durable_signal_ack_p99_us", percentile(acks, 0.99) * 1e6, "us")
        lines.append(
            f"signal ack, {N_PARKED:,} parked          p50 {p50 / 1e3:5.2f} ms (target <= 1) {verdict(p50 <= 1000)}  "
            f"p99 {p99 / 1e3:5.2f} ms (target <= 10) {verdict(p99 <= 10_000)}   without a store p50 "
            f"{percentile(plain, 0.5) * 1e6:4.0f} us p99 {percentile(plain, 0.99) * 1e6:4.0f} us"
        )

        anyio.run(fill_parked, tmp / "parked.db")
        took = record("durable_recovery_s", anyio.run(recovery, tmp / "parked.db"), "s")
        entry = anyio.run(empty_entry, tmp / "empty-entry.db")
        lines.append(
            f"recovery, {N_PARKED:,} parked cases       {took:6.2f} s (target <= 3) {verdict(took <= 3)}   "
            f"entering a Substrate on a new store {entry * 1e3:5.1f} ms"
        )

        per_case, empty = disk_per_case(tmp)
        record("durable_bytes_per_case", per_case, "B")
        lines.append(
            f"disk per three-effect case           {per_case:7,.0f} B (target <= 2,048) {verdict(per_case <= 2048)}   "
            f"an empty store {empty:,} B"
        )

        inbox = anyio.run(inbox_latency, tmp / "inbox.db")  # inputs land at random points of the poll period
        worst = record("durable_inbox_max_ms", max(inbox) * 1e3, "ms")
        lines.append(
            f"inbox input until journaled          p50 {percentile(inbox, 0.5) * 1e3:5.0f} ms  max {worst:5.0f} ms "
            f"(target <= 200) {verdict(worst <= 200)}   the owner's poll period 200 ms"
        )

        page, raw = anyio.run(page_of_cases, tmp / "listed.db")
        record("durable_cases_page_ms", page * 1e3, "ms")
        lines.append(
            f"cases(), a page of 100 of {N_LISTED:,}   {page * 1e3:6.2f} ms (target <= 50) {verdict(page <= 0.05)}   "
            f"the store's own read {raw * 1e3:5.2f} ms"
        )

    status, data, copy = anyio.run(status_and_data)
    record("status_us", status * 1e6, "us")
    lines.append(
        f"status() / data() of a live case     {status * 1e6:5.2f} / {data * 1e6:5.2f} us   a dict copy of its data "
        f"{copy * 1e6:5.2f} us  (data {data / copy:3.1f}x, status {status / copy:3.1f}x the copy)"
    )
    return lines

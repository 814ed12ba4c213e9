"""Durable cases on a SQLite file (synchronous=FULL, the default), each figure beside a same-run baseline.

- throughput: N three-effect cases started by one coroutine (one after another) and by 100 at once, each awaited,
  with the store and without it (the same workflow in memory), the ratio beside its target;
- where a durable case's time goes: one probed run per starter shape (`_probe.py`), microseconds per case by
  step and thread (encode, hand-off, SQL, COMMIT with its fsync, wake-up, linger; the loop's CPU beside the same
  workflow in memory, its idle time and its wait for the GIL), and the Python calls per case on each thread;
- signal acknowledgement with 10,000 parked cases (the call returns once the signal is committed), beside the
  same signal without a store, and a probed run saying where an ack's time goes;
- JSON: the stdlib, orjson and msgspec on the values a durable case writes, side by side;
- recovery: 10,000 parked cases, the Substrate re-entered, until a signal to the last case round-trips;
- disk per three-effect case (journal, row and snapshots; the data itself is a few bytes);
- the inbox: an input written by another connection (as the `wfsub` command does) until the owner has it in
  the case's journal, beside the poll period;
- `cases()` on a store of 100,000 cases, one page of 100; and `status` / `data` of a live case beside a dict copy.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import random
import sqlite3
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel

from wfsub import Substrate, effect, seq, task, wait
from wfsub._store import CaseRow, CaseWrite
from wfsub.stores import Listing, SqliteStore

from ._figures import percentile, record
from ._probe import Probe

N_THROUGHPUT = 2_000
STARTERS = (1, 100)  # one coroutine starting cases one after another; 100 doing so at once
N_CALLS = 200  # cases run under sys.setprofile to count Python calls
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


async def throughput(path: Path | None, n: int, starters: int = 1) -> float:
    """Seconds for n three-effect cases started by `starters` coroutines (each starting its share one after
    another: `await sub.new_case(...)` returns once the start record is committed), then awaited."""
    async with Substrate(store=path, workflows=FLOWS, retain_ended=n) as sub:
        return await _started_and_awaited(sub, n, starters)


async def _started_and_awaited(sub: Substrate, n: int, starters: int, collect: bool = True) -> float:
    if collect:
        gc.collect()
    handles: list[Any] = []

    async def starter(count: int) -> None:
        handles.extend([await sub.new_case("three") for _ in range(count)])

    start = time.perf_counter()
    if starters == 1:
        await starter(n)
    else:
        async with anyio.create_task_group() as tg:
            for i in range(starters):
                tg.start_soon(starter, n // starters + (i < n % starters))
    for handle in handles:
        await handle.result()
    return time.perf_counter() - start


# -- where a durable case's time goes ----------------------------------------------------------------------------


async def probed(path: Path | None, n: int, starters: int, probe: Probe | None) -> tuple[float, int, int]:
    """(seconds, loop-thread CPU ns, writer-thread CPU ns) for the throughput workload, probes installed."""
    async with Substrate(store=path, workflows=FLOWS, retain_ended=n) as sub:
        gc.collect()  # before the probe counts collections: the garbage of earlier runs is not this run's
        if probe is not None:
            probe.count_gc()
        writer_cpu = probe.writer_cpu_ns() if probe is not None else 0
        loop_cpu = time.thread_time_ns()
        if probe is None:
            took = await _started_and_awaited(sub, n, starters, collect=False)
        else:
            with probe.idle_of(asyncio.get_running_loop()):
                took = await _started_and_awaited(sub, n, starters, collect=False)
        loop_cpu = time.thread_time_ns() - loop_cpu
        writer_cpu = (probe.writer_cpu_ns() - writer_cpu) if probe is not None else 0
    return took, loop_cpu, writer_cpu


def python_calls(path: Path | None, n: int) -> dict[str, float]:
    """Python function calls per case (sys.setprofile 'call' events), by thread: the loop's and the writer's."""
    counts: Counter[str] = Counter()

    def counter(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            counts[threading.current_thread().name.split(" ")[0]] += 1

    threading.setprofile(counter)  # the writer thread and the worker threads started from here on
    sys.setprofile(counter)
    try:
        anyio.run(throughput, path, n)
    finally:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]
    return {name: count / n for name, count in counts.items()}


WRITER_ORDER = [
    "writer: group transaction (all of it)", "writer: BEGIN IMMEDIATE", "writer: SQL execute (records, rows)",
    "writer: COMMIT (WAL write + fsync)", "writer: deliver (run_sync_soon per loop)", "writer: linger for the loop's turn",
]


def breakdown(folder: Path, starters: int, plain_rate: float) -> tuple[list[str], str]:
    """Microseconds per durable case by step and thread, from one instrumented run beside an in-memory one; and
    the line that says where a case's wall time goes (printed under a missed target)."""
    n = N_THROUGHPUT
    mem_probe = Probe()
    with mem_probe.installed():  # only its garbage collections are timed: nothing else runs without a store
        mem_took, mem_loop, _ = anyio.run(probed, None, n, starters, mem_probe)
    mem_gc = sum(v for k, v in mem_probe.spent.items() if k.startswith("gc:")) * 1e-3 / n
    probe = Probe()
    with probe.installed():
        took, loop_cpu, writer_cpu = anyio.run(probed, folder / f"probed-{starters}.db", n, starters, probe)
    us = 1e-3 / n  # ns summed over the run -> us per case

    def spent(step: str) -> float:
        return probe.spent[step] * us

    groups = probe.calls["writer: group transaction (all of it)"]
    writes = probe.calls["loop: hand-off (Job, Event, token, submit)"]
    loop_steps = [k for k in probe.spent if k.startswith("loop:")]
    durable_loop = loop_cpu * us - (mem_loop * us - mem_gc)
    gc_steps = sorted(k for k in probe.spent if k.startswith("gc:"))
    named = sum(spent(k) for k in loop_steps) + sum(spent(k) for k in gc_steps if k.endswith("loop"))
    lines = [
        f"  where a durable case's time goes, {'one starter' if starters == 1 else f'{starters} starters'} "
        f"(probed run {n / took:,.0f} cases/s, plain run {plain_rate:,.0f}; us per case, summed over the run / {n:,})",
        f"    wall clock per case                                   {took / n * 1e6:7.1f} us   "
        f"({writes / n:.2f} writes, {groups / n:.3f} group commits, {writes / max(groups, 1):.1f} writes per group)",
        f"    loop thread CPU                                       {loop_cpu * us:7.1f} us   "
        f"(the same workflow in memory: {mem_loop * us:.1f} us, of which gc {mem_gc:.1f} us; wall "
        f"{mem_took / n * 1e6:.1f} us)",
        f"      vm + actor, as in memory (less its gc)              {mem_loop * us - mem_gc:7.1f} us",
        f"      durable path on the loop, and all the loop's gc     {durable_loop:7.1f} us",
    ]
    lines += [f"        {k[6:]:<50}{spent(k):7.1f} us   ({probe.calls[k] / n:.2f} calls)" for k in sorted(loop_steps)]
    lines += [f"        {k[4:]:<50}{spent(k):7.1f} us   ({probe.calls[k] / n:.3f} per case)"
              for k in gc_steps if k.endswith("loop")]
    lines.append(
        f"        {'the rest: records, rows, awaits, selector wake-ups':<50}{durable_loop - named:7.1f} us   "
        "(journal records and rows built, CaseWrite, the awaits and task switches per write)"
    )
    lines += [f"      {k[4:]:<52}{spent(k):7.1f} us   ({probe.calls[k] / n:.3f} per case)"
              for k in gc_steps if not k.endswith("loop")]
    idle = probe.spent["loop idle in its selector"] * us
    lines.append(f"    loop idle in its selector (waiting for a commit)      {idle:7.1f} us")
    lines.append(f"    loop waiting for the GIL or a core (wall-CPU-idle) {took / n * 1e6 - loop_cpu * us - idle:7.1f} us")
    lines.append(f"    writer thread CPU                                     {writer_cpu * us:7.1f} us   "
                 "(holds the GIL except inside sqlite3 calls)")
    for k in sorted((k for k in probe.spent if k.startswith("writer:")), key=WRITER_ORDER.index):
        per_group = probe.spent[k] / max(probe.calls[k], 1) / 1e3
        lines.append(f"      {k[8:]:<52}{spent(k):7.1f} us   ({per_group:.1f} us per call, wall)")
    for k in ("queued until its group starts", "committed until its task runs again",
              "submitted until its task runs again"):
        if probe.waited[k]:
            lines.append(f"    per write: {k:<43}{probe.waits[k] / probe.waited[k] / 1e3:7.1f} us   (mean)")
    if probe.missing:
        lines.append(f"    not measured (not in this wfsub): {', '.join(probe.missing)}")
    loop_gc = sum(spent(k) for k in gc_steps if k.endswith("loop"))
    commit = spent("writer: COMMIT (WAL write + fsync)")
    wall = took / n * 1e6
    where = (
        f"    where the {wall:,.0f} us of a case go (probed): loop CPU {loop_cpu * us:,.0f} us (vm + actor "
        f"{mem_loop * us - mem_gc:,.0f}, durable path {durable_loop - loop_gc:,.0f}, gc {loop_gc:,.0f}), loop idle "
        f"waiting for commits {idle:,.0f} us (COMMIT with fsync {commit:,.0f} us/case, {groups / n:.2f} per case), "
        f"loop waiting for the GIL or a core {wall - loop_cpu * us - idle:,.0f} us"
    )
    return lines, where


# -- JSON encoders on the records wfsub writes ----------------------------------------------------------------


def written_values(folder: Path) -> list[Any]:
    """Every record, row detail and snapshot state one run of each workflow hands the SQLite store to encode."""
    import wfsub._store._rows as rows
    import wfsub._store._sqlite as sqlite_store

    values: list[Any] = []
    encode_write = sqlite_store.encode_write

    def capture(store: str, change: CaseWrite) -> Any:
        values.extend(change.records)
        if change.row is not None:
            values.append({name: getattr(change.row, name) for name in rows._DETAIL})
        if change.snapshot is not None:
            values.append(change.snapshot.state)
        return encode_write(store, change)

    async def one_of_each() -> None:
        async with Substrate(store=folder / "json.db", workflows=FLOWS) as sub:
            await (await sub.new_case("three")).result()
            parked = await sub.new_case("parked", {"order": {"id": "o-17", "lines": [1, 2, 3], "total": 12.5}})
            while sub.status(parked.case_id).state != "waiting_signal":
                await anyio.sleep(0.001)
            await sub.signal(parked.case_id, "go", {"by": "bench", "note": "é ✓"})
            await parked.result()

    sqlite_store.encode_write = capture  # type: ignore[assignment]
    try:
        anyio.run(one_of_each)
    finally:
        sqlite_store.encode_write = encode_write
    return values


def json_figures(folder: Path) -> dict[str, tuple[float, float, float]]:
    """us per value, by library: (encode, encode checked by a decode compared equal, decode), best of REPEAT."""
    values = written_values(folder)
    std_encode = json.JSONEncoder(allow_nan=False, separators=(",", ":"), ensure_ascii=False).encode
    libraries: dict[str, tuple[Any, Any]] = {"json (stdlib)": (std_encode, json.loads)}
    try:
        import orjson

        libraries["orjson"] = (lambda v: orjson.dumps(v).decode(), orjson.loads)
    except ImportError:
        pass
    try:
        import msgspec

        encoder, decoder = msgspec.json.Encoder(), msgspec.json.Decoder()
        libraries["msgspec"] = (lambda v: encoder.encode(v).decode(), decoder.decode)
    except ImportError:
        pass
    texts = [std_encode(v) for v in values]
    rounds = max(1, 20_000 // len(values))
    out = {}
    for name, (encode, decode) in libraries.items():

        def checked(v: Any, encode: Any = encode, decode: Any = decode, name: str = name) -> None:
            if decode(encode(v)) != v:
                raise AssertionError(f"{name} did not give back {v!r}")

        figures = []
        for fn, inputs in ((encode, values), (checked, values), (decode, texts)):
            best = float("inf")
            for _ in range(REPEAT):
                start = time.perf_counter_ns()
                for _ in range(rounds):
                    for v in inputs:
                        fn(v)
                best = min(best, (time.perf_counter_ns() - start) / rounds / len(inputs) / 1e3)
            figures.append(best)
        out[name] = (figures[0], figures[1], figures[2])
    return out


# -- signals with many parked cases ------------------------------------------------------------------------------


async def park(sub: Substrate, n: int) -> list[str]:
    ids = [(await sub.new_case("parked", case_id=f"p{i}")).case_id for i in range(n)]
    while sub.status(ids[-1]).state != "waiting_signal":
        await anyio.sleep(0.01)
    return ids


async def parked_rows_written(sub: Substrate, n: int) -> None:
    """Wait until the store's rows say the `n` cases are parked (those writes are not waited for by the cases, and
    would otherwise share the writer with the first acks measured)."""
    store = sub._store
    if store is None:
        return
    while len(await store.cases(Listing(state="waiting_signal", limit=n))) < n:
        await anyio.sleep(0.01)


async def signal_acks(path: Path | None, probe: Probe | None = None) -> list[float]:
    """Seconds per `await sub.signal()` (returns once committed) to distinct parked cases, 10,000 parked."""
    async with Substrate(store=path, workflows=FLOWS, retain_ended=N_PARKED) as sub:
        ids = await park(sub, N_PARKED)
        await parked_rows_written(sub, len(ids))
        gc.collect()
        if probe is not None:
            probe.reset()  # only the acks from here on
        samples = []
        for case_id in ids[:: N_PARKED // N_SIGNALS]:
            start = time.perf_counter()
            await sub.signal(case_id, "go")
            samples.append(time.perf_counter() - start)
        return samples


def ack_breakdown(path: Path, p50: float) -> list[str]:
    """Where a signal acknowledgement's time goes (one probed run of `signal_acks`): per ack, the commit's steps
    and the waits between them."""
    probe = Probe()
    with probe.installed():
        samples = anyio.run(signal_acks, path, probe)
    acks = len(samples)
    lines = [f"  where a signal ack's time goes (probed run p50 {percentile(samples, 0.5) * 1e6:,.0f} us, plain run "
             f"{p50:,.0f} us; mean us per call of each step)"]
    lines += [f"      {k[8:]:<52}{probe.spent[k] / probe.calls[k] / 1e3:7.1f} us   ({probe.calls[k] / acks:.2f} per ack)"
              for k in WRITER_ORDER if probe.calls[k]]
    lines += [f"      {k[6:]:<52}{probe.spent[k] / probe.calls[k] / 1e3:7.1f} us   (loop CPU; {probe.calls[k] / acks:.2f} "
              "per ack)" for k in sorted(probe.spent) if k.startswith("loop:") and probe.calls[k]]
    lines += [f"    per write: {k:<43}{probe.waits[k] / probe.waited[k] / 1e3:7.1f} us   (mean)"
              for k in ("queued until its group starts", "committed until its task runs again",
                        "submitted until its task runs again") if probe.waited[k]]
    return lines


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
            rows = sub._store.read_cases(Listing("done", "three", 100))  # type: ignore[union-attr]
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
        rates: dict[int, float] = {}
        missed: dict[int, bool] = {}
        for starters in STARTERS:
            stored, memory = [], []
            for i in range(REPEAT):  # interleaved: drift hits both alike
                stored.append(anyio.run(throughput, tmp / f"t{starters}-{i}.db", N_THROUGHPUT, starters))
                memory.append(anyio.run(throughput, None, N_THROUGHPUT, starters))
            rate = rates[starters] = N_THROUGHPUT / min(stored)
            base = N_THROUGHPUT / min(memory)
            key = "" if starters == 1 else f"_{starters}_starters"
            record(f"durable_us_per_case{key}", min(stored) / N_THROUGHPUT * 1e6, "us")
            shape = "one starter " if starters == 1 else f"{starters} starters"
            missed[starters] = rate < 2000 or rate / base < 0.6
            lines.append(
                f"{N_THROUGHPUT:,} three-effect cases, {shape} {rate:7,.0f} cases/s (target >= 2,000) "
                f"{verdict(rate >= 2000)}   in memory {base:7,.0f} cases/s: {rate / base:4.2f}x (target >= 0.6x) "
                f"{verdict(rate / base >= 0.6)}"
            )
        head = len(lines)
        for i, starters in enumerate(STARTERS):
            steps, where = breakdown(tmp, starters, rates[starters])
            lines += steps
            if missed[starters]:  # under its target: where the time goes, beside it
                lines.insert(head - len(STARTERS) + i + 1 + sum(missed[s] for s in STARTERS[:i]), where)
        calls = python_calls(tmp / "calls.db", N_CALLS)
        plain_calls = python_calls(None, N_CALLS)
        lines.append(
            f"  Python calls per case ({N_CALLS} cases, one starter): loop thread {calls.get('MainThread', 0):,.0f} "
            f"(in memory {plain_calls.get('MainThread', 0):,.0f}), writer thread "
            f"{calls.get('wfsub-store-writer', 0):,.0f}, worker threads {calls.get('AnyIO', 0):,.0f}"
        )

        encoders = json_figures(tmp)
        std = encoders["json (stdlib)"]
        lines.append("JSON of the values a durable case writes (records, row details; us per value, best of "
                     f"{REPEAT}): encode / encode+decode compared equal / decode")
        for name, (enc, chk, dec) in encoders.items():
            record(f"json_encode_us_{name.split()[0]}", enc, "us")
            lines.append(f"  {name:<14} {enc:5.2f} / {chk:5.2f} / {dec:5.2f} us   ({std[0] / enc:4.1f}x / "
                         f"{std[1] / chk:4.1f}x / {std[2] / dec:4.1f}x the stdlib)")

        acks = anyio.run(signal_acks, tmp / "acks.db")
        plain = anyio.run(signal_acks, None)
        p50 = record("durable_signal_ack_p50_us", percentile(acks, 0.5) * 1e6, "us")
        p99 = record("durable_signal_ack_p99_us", percentile(acks, 0.99) * 1e6, "us")
        lines.append(
            f"signal ack, {N_PARKED:,} parked          p50 {p50 / 1e3:5.2f} ms (target <= 1) {verdict(p50 <= 1000)}  "
            f"p99 {p99 / 1e3:5.2f} ms (target <= 10) {verdict(p99 <= 10_000)}   without a store p50 "
            f"{percentile(plain, 0.5) * 1e6:4.0f} us p99 {percentile(plain, 0.99) * 1e6:4.0f} us"
        )
        lines += ack_breakdown(tmp / "acks-probed.db", p50)  # right under its target: where an ack's time goes

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

"""Benchmarks of the runtime (Substrate, case actors, trace sink), each beside a baseline measured in the same run.

Baselines are bare anyio actors: a task in a task group with a memory-object-stream mailbox that receives one
message and sets an event. Times are the best of several repetitions (the least disturbed one); ratios to the
same-run baseline are what to compare across machines.
"""

from __future__ import annotations

import gc
import sys
import time
import tracemalloc
from collections import Counter
from typing import Any

import anyio
import anyio.lowlevel
import structlog
from anyio.abc import TaskGroup

from wfsub import MemorySink, Substrate, TraceLevel, mi, seq, task, wait

from ._figures import percentile, record

N_CASES = 10_000
N_IDLE_MEMORY = 20_000
N_ROUND_TRIPS = 2_000
N_BIG_MI = 1_000_000
REPEAT = 5

THREE_TASKS = seq(
    task(lambda c: {"a": 1}, name="a"),
    task(lambda c: {"b": c["a"] + 1}, name="b"),
    task(lambda c: {"c": c["b"] + 1}, name="c"),
)
PARKED = wait("go")
PING = seq(wait("ping"), task(lambda c: {"pong": True}, name="pong"))


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


# -- the bare anyio actor ------------------------------------------------------------------------------------


async def _bare_actor(receive: Any, done: anyio.Event) -> None:
    async with receive:
        await receive.receive()
    done.set()


def _bare_start(tg: TaskGroup) -> tuple[Any, anyio.Event]:
    send, receive = anyio.create_memory_object_stream[int](1024)
    done = anyio.Event()
    tg.start_soon(_bare_actor, receive, done)
    return send, done


async def bare_cases(n: int) -> float:
    """n bare actors started, each sent one message, and awaited: seconds."""
    async with anyio.create_task_group() as tg:
        gc.collect()
        start = time.perf_counter()
        actors = []
        for i in range(n):
            send, done = _bare_start(tg)
            send.send_nowait(i)
            send.close()
            actors.append(done)
        for done in actors:
            await done.wait()
        elapsed = time.perf_counter() - start
    return elapsed


async def substrate_cases(n: int, level: TraceLevel) -> float:
    """n three-task cases started and awaited (and, when traced, every event delivered to a MemorySink)."""
    sink = MemorySink()
    sinks = [sink] if level != "none" else []
    async with Substrate(trace_level=level, sinks=sinks, retain_ended=n) as sub:
        gc.collect()
        start = time.perf_counter()
        handles = [await sub.new_case(THREE_TASKS) for _ in range(n)]
        for handle in handles:
            await handle.result()
        if sinks:
            while len(sink) < sub.statistics().trace_events - sub.statistics().trace_dropped:
                await anyio.lowlevel.checkpoint()
        elapsed = time.perf_counter() - start
        stats = sub.statistics()
    assert stats.cases_done == n, stats
    if sinks:
        assert stats.trace_dropped == 0, stats
        # MemorySink builds TraceEvent models when they are first read: time that apart, so the cost a
        # reader pays later is reported too (READ_COST), not hidden.
        READ_COST.append(_read_all(sink) / n)
    return elapsed


READ_COST: list[float] = []


def _read_all(sink: MemorySink) -> float:
    start = time.perf_counter()
    events = sink.events
    assert all(e.case_id for e in events)
    return time.perf_counter() - start


# -- memory -----------------------------------------------------------------------------------------------------


async def idle_memory(n: int) -> tuple[float, float]:
    """Bytes per idle case parked on a signal, and per bare actor parked on its mailbox (tracemalloc)."""
    async with Substrate(trace_level="none") as sub:
        gc.collect()
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        handles = [await sub.new_case(PARKED) for _ in range(n)]
        while sub.statistics().cases_started and any(h.status().state == "initializing" for h in handles[-10:]):
            await anyio.lowlevel.checkpoint()
        for _ in range(3):
            await anyio.lowlevel.checkpoint()
        gc.collect()
        per_case = (tracemalloc.get_traced_memory()[0] - before) / n
        tracemalloc.stop()
        assert all(h.status().state == "waiting_signal" for h in handles)
        del handles
    async with anyio.create_task_group() as tg:
        gc.collect()
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        actors = [_bare_start(tg) for _ in range(n)]
        for _ in range(3):
            await anyio.lowlevel.checkpoint()
        gc.collect()
        per_bare = (tracemalloc.get_traced_memory()[0] - before) / n
        tracemalloc.stop()
        for send, _ in actors:
            send.send_nowait(0)
            send.close()
    return per_case, per_bare


# -- signal round trip ---------------------------------------------------------------------------------------------



async def substrate_round_trips(idle: int, trips: int) -> list[float]:
    """Signal -> case resumes -> completes -> await returns, with `idle` parked cases around."""
    async with Substrate(trace_level="none") as sub:
        for _ in range(idle):
            await sub.new_case(PARKED)
        probes = [await sub.new_case(PING) for _ in range(trips)]
        for _ in range(5):
            await anyio.lowlevel.checkpoint()
        gc.collect()
        samples = []
        for probe in probes:
            start = time.perf_counter()
            await probe.signal("ping")
            await probe.result()
            samples.append(time.perf_counter() - start)
    return samples


async def round_trip_calls(trips: int) -> tuple[float, Counter[str]]:
    """Python calls per signal round trip (sys.setprofile 'call' events on the loop's thread), and where they are:
    by package module (wfsub's own by file, anyio, asyncio, ...). A call added to the round trip shows here."""
    counts: Counter[str] = Counter()

    def counter(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            path = frame.f_code.co_filename
            for marker in ("/wfsub/", "/anyio/", "/asyncio/", "/pydantic/", "/structlog/", "/sniffio/"):
                at = path.rfind(marker)
                if at >= 0:
                    inner = path[at + 1 :].removesuffix(".py").split("/")
                    counts[".".join(inner[:3] if inner[0] == "wfsub" else inner[:1])] += 1
                    return
            counts["other"] += 1

    async with Substrate(trace_level="none") as sub:
        probes = [await sub.new_case(PING) for _ in range(trips)]
        for _ in range(5):
            await anyio.lowlevel.checkpoint()
        sys.setprofile(counter)
        try:
            for probe in probes:
                await probe.signal("ping")
                await probe.result()
        finally:
            sys.setprofile(None)
    counts.pop("bench", None)
    return sum(counts.values()) / trips, Counter({k: round(v / trips) for k, v in counts.items()})


async def bare_round_trips(idle: int, trips: int) -> list[float]:
    """The same round trip through bare actors: send one message, the actor sets its event, await the event."""
    async with anyio.create_task_group() as tg:
        parked = [_bare_start(tg) for _ in range(idle)]
        probes = [_bare_start(tg) for _ in range(trips)]
        for _ in range(5):
            await anyio.lowlevel.checkpoint()
        gc.collect()
        samples = []
        for send, done in probes:
            start = time.perf_counter()
            await send.send(0)
            await done.wait()
            samples.append(time.perf_counter() - start)
            send.close()
        for send, _ in parked:
            send.send_nowait(0)
            send.close()
    return samples


async def big_mi_loop_gap(n: int) -> float:
    """The longest the event loop went unserved (seconds) while one case ran an n-instance mi of no-op tasks, seen
    by a ticker task that only yields and notes the time between its turns."""
    longest = 0.0
    running = True

    async def ticker() -> None:
        nonlocal longest
        last = time.perf_counter()
        while running:
            await anyio.lowlevel.checkpoint()
            now = time.perf_counter()
            longest = max(longest, now - last)
            last = now

    async with Substrate(trace_level="none", max_instances=n) as sub, anyio.create_task_group() as tg:
        tg.start_soon(ticker)
        await anyio.lowlevel.checkpoint()
        handle = await sub.new_case(mi(task(lambda c: None, name="noop"), count=n, max=n))
        await handle.result()
        running = False
    return longest


# -- the figures -------------------------------------------------------------------------------------------------


async def _main(lines: list[str]) -> None:
    runs: dict[str, list[float]] = {"bare": [], "none": [], "min": []}
    for _ in range(REPEAT):  # interleaved, so drift in the machine's state hits all three alike
        runs["bare"].append(await bare_cases(N_CASES))
        runs["none"].append(await substrate_cases(N_CASES, "none"))
        runs["min"].append(await substrate_cases(N_CASES, "min"))
    bare, none, traced = min(runs["bare"]), min(runs["none"]), min(runs["min"])
    per_bare, per_none, per_min = (t / N_CASES * 1e6 for t in (bare, none, traced))
    record("case_3_tasks_us", per_none, "us")
    record("case_3_tasks_traced_us", per_min, "us")
    ratio = none / bare
    lines.append(
        f"{N_CASES:,} concurrent 3-task cases   {per_none:6.1f} us/case started+awaited, bare anyio actor "
        f"{per_bare:5.1f} us: {ratio:4.2f}x (target <= 2x)  {verdict(ratio <= 2)}"
    )
    overhead = traced / none - 1
    lines.append(
        f"  trace min + MemorySink          {per_min:6.1f} us/case vs none {per_none:5.1f} us: "
        f"{overhead * 100:+5.1f}% (target <= +15%)  {verdict(overhead <= 0.15)}"
    )
    lines.append(
        f"    then reading every event back from the MemorySink (models built on first read): "
        f"{min(READ_COST) * 1e6:5.1f} us/case, outside the cases (no target)"
    )

    with structlog.testing.capture_logs():  # leaving with idle cases logs their cancellation; not news here
        per_case, per_actor = await idle_memory(N_IDLE_MEMORY)
        samples = await substrate_round_trips(N_CASES, N_ROUND_TRIPS)
    structlog.reset_defaults()  # capture_logs leaves structlog marked as configured: the later suites would print
    record("idle_case_bytes", per_case, "B")
    lines.append(
        f"idle case parked on a signal      {per_case / 1024:6.2f} KB/case over {N_IDLE_MEMORY:,} (target <= 10 KB)  "
        f"{verdict(per_case <= 10 * 1024)}   bare actor parked on its mailbox {per_actor / 1024:5.2f} KB"
    )

    base = await bare_round_trips(N_CASES, N_ROUND_TRIPS)
    p50, p99 = percentile(samples, 0.5) * 1e6, percentile(samples, 0.99) * 1e6
    b50, b99 = percentile(base, 0.5) * 1e6, percentile(base, 0.99) * 1e6
    record("signal_round_trip_p50_us", p50, "us")
    record("signal_round_trip_p99_us", p99, "us")
    lines.append(
        f"signal round trip, {N_CASES:,} idle around  p50 {p50:6.1f} us (target <= 150 us)  {verdict(p50 <= 150)}   "
        f"p99 {p99:7.1f} us (target <= 2000 us)  {verdict(p99 <= 2000)}"
    )
    lines.append(f"  bare anyio actor round trip     p50 {b50:6.1f} us, p99 {b99:7.1f} us ({p50 / b50:4.1f}x at p50)")
    gap = record("mi_1m_loop_gap_ms", await big_mi_loop_gap(N_BIG_MI) * 1e3, "ms")
    lines.append(
        f"longest event-loop gap while a {N_BIG_MI:,}-instance mi runs  {gap:6.1f} ms (target <= 50 ms)  "
        f"{verdict(gap <= 50)}"
    )
    calls, where = await round_trip_calls(200)
    record("signal_round_trip_calls", calls, "calls")
    lines.append(
        f"  Python calls per round trip     {calls:6.0f} (no target; each one costs ~0.1 us and more): "
        + ", ".join(f"{name} {count}" for name, count in where.most_common() if count)
    )


def run() -> list[str]:
    lines = ["== runtime (Substrate, case actors, trace sink; asyncio) =="]
    anyio.run(_main, lines)
    return lines


if __name__ == "__main__":
    for line in run():
        print(line)

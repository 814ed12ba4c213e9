"""Many nodes on Postgres: throughput with 1, 2 and 3 node processes, the signal round trip across nodes, and the
time a dead node's cases take to answer again on another node.

- throughput: N three-effect cases in all, split between 1, 2 or 3 node processes, each starting its share one
  after another and awaiting them; cases/s over the whole run, beside the same cases in one process without a
  store. This machine has 2 cores (and the Postgres server runs on them too): more nodes than cores cannot add
  throughput here; the figures show what the per-case cost is and where it goes.
- cross-node round trip: node B signals a case node A owns (through the inbox; A is woken by NOTIFY) and awaits
  its end (B is woken by the end's NOTIFY); beside the same round trip on one node.
- failover: node A parks 10,000 cases and is killed with SIGKILL; node B (lease 2 s) must answer a signal to one
  of them: the time from the kill until that case's end, beside the lease length.

The server is WFSUB_BENCH_POSTGRES, else WFSUB_TEST_POSTGRES, else postgresql://postgres@127.0.0.1:5432/test;
unreachable, the suite prints why and measures nothing.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import anyio

from wfsub import Substrate
from wfsub.stores import PostgresStore

from ._figures import percentile, record
from ._node_proc import FLOWS
from .postgres_bench import DSN, reachable, sql

N_CASES = 1200
N_TRIPS = 200
N_PARKED = 10_000
ROOT = Path(__file__).parents[1]


def node(mode: str, schema: str, node_id: str, n: int) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "bench._node_proc", mode, DSN, schema, node_id, str(n)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT,
    )


def stop(procs: list[subprocess.Popen[str]]) -> None:
    for proc in procs:
        if proc.poll() is None and proc.stdin is not None:
            with contextlib.suppress(BrokenPipeError):
                proc.stdin.close()
    for proc in procs:
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def throughput(nodes: int) -> float:
    """Cases/s of N_CASES three-effect cases split between `nodes` node processes started together."""
    schema = f"bench_nodes_{secrets.token_hex(3)}"
    procs = [node("throughput", schema, f"n{i}", N_CASES // nodes) for i in range(nodes)]
    try:
        time.sleep(1.5)  # the nodes open the store (the first builds the schema)
        start = time.perf_counter()
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        for proc in procs:
            assert proc.stdout is not None
            proc.stdout.readline()
        return N_CASES / (time.perf_counter() - start)
    finally:
        stop(procs)
        anyio.run(sql, f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


async def no_store() -> float:
    async with Substrate(workflows=FLOWS, trace_level="none", retain_ended=N_CASES) as sub:
        start = time.perf_counter()
        handles = [await sub.new_case("three") for _ in range(N_CASES)]
        for handle in handles:
            await handle.result()
        return N_CASES / (time.perf_counter() - start)


async def round_trips(schema: str, across: bool) -> list[float]:
    """Signal and await N_TRIPS cases owned by node A, from node B (across) or from A itself."""
    async with Substrate(store=PostgresStore(DSN, schema=schema, lease_seconds=2.0), workflows=FLOWS,
                         node_id="a", trace_level="none") as a, \
            Substrate(store=PostgresStore(DSN, schema=schema, lease_seconds=2.0), workflows=FLOWS,
                      node_id="b", trace_level="none") as b:
        ids = [(await a.new_case("parked")).case_id for _ in range(N_TRIPS)]
        while any(a.status(c).state != "waiting_signal" for c in ids):
            await anyio.sleep(0.05)
        await anyio.sleep(0.3)
        caller = b if across else a
        samples = []
        for case_id in ids:
            start = time.perf_counter()
            await caller.signal(case_id, "go")
            await caller.await_case(case_id)
            samples.append(time.perf_counter() - start)
        return samples


async def failover(schema: str) -> float:
    """Seconds from SIGKILL of the node holding N_PARKED parked cases until another node ends one of them."""
    owner = node("parked", schema, "dying", N_PARKED)
    assert owner.stdout is not None
    owner.stdout.readline()
    async with Substrate(store=PostgresStore(DSN, schema=schema, lease_seconds=2.0), workflows=FLOWS,
                         node_id="survivor", trace_level="none") as survivor:
        await anyio.sleep(0.5)
        owner.send_signal(signal.SIGKILL)
        killed = time.perf_counter()
        owner.wait()
        await survivor.signal(f"p{N_PARKED - 1}", "go")  # into the inbox: whoever owns it takes it
        with anyio.fail_after(60):
            await survivor.await_case(f"p{N_PARKED - 1}")
        took = time.perf_counter() - killed
    if owner.stdout is not None:
        owner.stdout.close()
    if owner.stdin is not None:
        owner.stdin.close()
    return took


def run() -> list[str]:
    lines = ["== many nodes (Postgres) =="]
    why = anyio.run(reachable)
    if why is not None:
        lines.append(f"skipped: the server at {DSN} cannot be reached ({why}); set WFSUB_BENCH_POSTGRES")
        return lines
    base = anyio.run(no_store)
    rates = {n: throughput(n) for n in (1, 2, 3)}
    record("nodes_1_us_per_case", 1e6 / rates[1], "us")
    lines.append(
        f"{N_CASES:,} three-effect cases        1 node {rates[1]:6,.0f}/s   2 nodes {rates[2]:6,.0f}/s   "
        f"3 nodes {rates[3]:6,.0f}/s (no target)   one process without a store {base:6,.0f}/s; "
        f"{os.cpu_count()} cores shared with the server"
    )
    tag = secrets.token_hex(3)
    try:
        across = anyio.run(round_trips, f"bench_rt_{tag}", True)
        local = anyio.run(round_trips, f"bench_rl_{tag}", False)
        p50 = record("nodes_cross_rtt_p50_ms", percentile(across, 0.5) * 1e3, "ms")
        lines.append(
            f"signal round trip across nodes          p50 {p50:6.2f} ms  p99 {percentile(across, 0.99) * 1e3:6.2f} ms "
            f"(no target)   on the owning node p50 {percentile(local, 0.5) * 1e3:5.2f} ms "
            f"p99 {percentile(local, 0.99) * 1e3:5.2f} ms"
        )
        took = record("nodes_failover_s", anyio.run(failover, f"bench_fo_{tag}"), "s")
        lines.append(
            f"failover, {N_PARKED:,} parked cases          {took:6.2f} s from SIGKILL to a case ending on another "
            "node (no target)   lease 2.0 s"
        )
    finally:
        for prefix in ("bench_rt_", "bench_rl_", "bench_fo_"):
            anyio.run(sql, f'DROP SCHEMA IF EXISTS "{prefix}{tag}" CASCADE')
    return lines

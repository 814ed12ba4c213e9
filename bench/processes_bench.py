"""Several processes on one SQLite store: the owner in a child process, a standby Substrate here.

- an input sent from the standby until the owner has applied it (the case's next effect stamps the time it
  starts: the signal was journaled and applied just before), target p50 <= 10 ms, p99 <= 50 ms;
- a standby's `status()` (a read of the case row on the calling thread);
- a standby's `await_case` wake-up: from the case's end (its `ended_at`, written by the owner) until the awaiter
  in the standby has the result.

- throughput of a FastAPI app under `uvicorn --workers 3` against `--workers 1` on one SQLite file, in the same
  run: loans started, approved and awaited over HTTP by CONCURRENCY clients at once. With 3 workers one owns the
  file and runs every case; the two standbys forward their starts and signals through the store's inbox and
  await through it. On a 2-core machine three workers and the HTTP client share two cores, so more workers buy
  no CPU: the figure shows what forwarding costs, not a speed-up (the bench prints the core count beside it).

    python -m bench processes
    python -m bench.processes_bench owner PATH      (the owner child; the bench starts it)
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio

from ._figures import percentile, record

CASES = 120
ROOT = Path(__file__).resolve().parents[1]


async def stamp(ctx: Mapping[str, Any]) -> dict[str, Any]:
    return {"applied_at": time.time()}


def workflows() -> dict[str, Any]:
    from wfsub import effect, seq, wait

    return {"pong": seq(wait("go"), effect(stamp))}


async def owner(path: str) -> None:
    from wfsub import Substrate

    async with Substrate(store=path, workflows=workflows(), trace_level="none", standby=False):
        print("ready", flush=True)
        await anyio.to_thread.run_sync(sys.stdin.read)


async def measure(path: str) -> tuple[list[float], list[float], list[float]]:
    from wfsub import Substrate

    applied: list[float] = []
    reads: list[float] = []
    wakes: list[float] = []
    async with Substrate(store=path, workflows=workflows(), trace_level="none") as sub:
        assert sub.standby, "the bench's Substrate should be a standby: the child owns the store"
        for i in range(CASES):
            case_id = f"p{i}"
            await sub.new_case("pong", {}, case_id=case_id)
            while True:
                start = time.perf_counter()
                state = sub.status(case_id).state
                reads.append(time.perf_counter() - start)
                if state == "waiting_signal":
                    break
                await anyio.sleep(0.0005)
            sent = time.time()
            await sub.signal(case_id, "go")
            result = await sub.await_case(case_id)
            woke = time.time()
            applied.append(result["applied_at"] - sent)
            ended_at = sub.status(case_id).ended_at
            assert ended_at is not None
            wakes.append(woke - ended_at)
    return applied, reads, wakes


HTTP_CASES = 240
CONCURRENCY = 24


def serve(workers: int, path: str, port: int) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "BENCH_DB": path}
    return subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "bench._loans_app:app", "--workers", str(workers), "--port", str(port),
         "--log-level", "warning"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )


async def workers_up(url: str, workers: int) -> None:
    """Wait until every worker has answered once (each with its Substrate open, exactly one of them the owner)."""
    import httpx

    seen: dict[int, bool] = {}
    with anyio.fail_after(120):
        while len(seen) < workers or sum(not standby for standby in seen.values()) != 1:
            try:
                async with httpx.AsyncClient(timeout=10) as http:  # a new connection: any worker may take it
                    who = (await http.get(f"{url}/whoami")).json()
                seen[who["pid"]] = who["standby"]
            except httpx.TransportError:
                await anyio.sleep(0.05)


async def drive(url: str, prefix: str) -> float:
    """Loans per second: HTTP_CASES loans, each started, approved and awaited, CONCURRENCY at a time."""
    import httpx

    ids = iter(range(HTTP_CASES))
    limits = httpx.Limits(max_connections=CONCURRENCY, max_keepalive_connections=CONCURRENCY)
    async with httpx.AsyncClient(timeout=60, limits=limits) as http:

        async def client() -> None:
            for i in ids:
                case = f"{url}/loans/{prefix}{i}"
                assert (await http.post(case)).status_code == 201
                assert (await http.post(f"{case}/approve")).status_code == 200
                while (got := await http.get(f"{case}/result")).status_code == 202:
                    pass
                assert got.status_code == 200 and got.json()["paid"] == 5, got.text

        start = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for _ in range(CONCURRENCY):
                tg.start_soon(client)
        return HTTP_CASES / (time.perf_counter() - start)


def uvicorn_throughput(workers: int) -> float:
    import signal
    import socket

    with tempfile.TemporaryDirectory(prefix="wfsub-bench-") as folder:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        url = f"http://127.0.0.1:{port}"
        server = serve(workers, str(Path(folder) / "loans.db"), port)
        try:
            anyio.run(workers_up, url, workers)
            anyio.run(drive, url, "warm")  # first calls pay imports and connection set-up
            return anyio.run(drive, url, "run")
        finally:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(timeout=60)


def run() -> list[str]:
    lines = ["== processes (SQLite: the owner in a child process, a standby here) =="]
    with tempfile.TemporaryDirectory(prefix="wfsub-bench-") as folder:
        path = str(Path(folder) / "shared.db")
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        with subprocess.Popen(
            [sys.executable, "-m", "bench.processes_bench", "owner", path], cwd=ROOT, env=env,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        ) as child:
            assert child.stdin is not None
            assert child.stdout is not None
            try:
                assert child.stdout.readline().strip() == "ready"
                applied, reads, wakes = anyio.run(measure, path)
            finally:
                child.stdin.close()
                child.wait(timeout=60)
    p50 = record("standby_input_applied_p50_ms", percentile(applied, 0.5) * 1e3, "ms")
    p99 = record("standby_input_applied_p99_ms", percentile(applied, 0.99) * 1e3, "ms")
    verdict = "ok" if p50 <= 10 and p99 <= 50 else "FAIL"
    lines.append(
        f"input from a standby until applied      p50 {p50:6.1f} ms  p99 {p99:6.1f} ms  "
        f"(target p50 <= 10 ms, p99 <= 50 ms) {verdict}"
    )
    s50 = record("standby_status_us", percentile(reads, 0.5) * 1e6, "us")
    s99 = percentile(reads, 0.99) * 1e6
    lines.append(f"a standby's status()                     p50 {s50:6.0f} us  p99 {s99:6.0f} us (no target)")
    w50 = record("standby_await_wake_p50_ms", percentile(wakes, 0.5) * 1e3, "ms")
    lines.append(
        f"a standby's await_case, end to wake-up  p50 {w50:6.1f} ms  p99 {percentile(wakes, 0.99) * 1e3:6.1f} ms "
        "(no target)"
    )
    one = record("uvicorn_1_worker_loans_per_s", uvicorn_throughput(1), "loans/s")
    three = record("uvicorn_3_workers_loans_per_s", uvicorn_throughput(3), "loans/s")
    lines.append(
        f"uvicorn app, loans started+approved+awaited over HTTP ({CONCURRENCY} clients): 1 worker {one:6.0f}/s, "
        f"3 workers {three:6.0f}/s ({three / one:4.2f}x)"
    )
    lines.append(
        f"    {os.cpu_count()} cores here: one worker owns the file and runs every case, the standbys forward through "
        "the store; with 2 cores the three workers and the client share them, so 3 workers add no CPU for the "
        "cases (the ratio is what forwarding costs)"
    )
    return lines


if __name__ == "__main__":
    if sys.argv[1:2] == ["owner"]:
        anyio.run(owner, sys.argv[2])
    else:
        print("\n".join(run()))

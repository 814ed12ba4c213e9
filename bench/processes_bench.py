"""Several processes on one SQLite store: the owner in a child process, a standby Substrate here.

- an input sent from the standby until the owner has applied it (the case's next effect stamps the time it
  starts: the signal was journaled and applied just before), target p50 <= 10 ms, p99 <= 50 ms;
- a standby's `status()` (a read of the case row on the calling thread);
- a standby's `await_case` wake-up: from the case's end (its `ended_at`, written by the owner) until the awaiter
  in the standby has the result.

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
    return lines


if __name__ == "__main__":
    if sys.argv[1:2] == ["owner"]:
        anyio.run(owner, sys.argv[2])
    else:
        print("\n".join(run()))

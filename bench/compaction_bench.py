"""Endless cases on a SQLite file (synchronous=FULL): what compaction costs, and what it saves at recovery.

- cost: one case serving 100,000 signals from 16 senders with `compact_after=1000` (the default), beside the same
  signals with `compact_after=None` (every record kept), the same run: the time the case spends compacting
  (building its snapshot record, waiting for the commit that appends it and deletes what it replaces) per record
  journaled, and the end-to-end time per signal both ways; the journal's length at the end says what it bounds;
- recovery: the Substrate re-entered on each of the two files, until a signal to the case round-trips (the case
  rebuilt from its snapshot record and at most 1,000 records after it; kept whole, from the newest snapshot a
  parked case writes every 32 records and the records after it: recovery was already bounded by snapshots, so
  the two are alike, and the figure shows it);
- what compaction does bound: the file (journal bytes on disk), and reading and replaying the journal offline
  (`sub.journal` then `wfsub.replay`, as `wfsub replay` and `wfsub trace` do), both ways.
"""

from __future__ import annotations

import gc
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio

from wfsub import Substrate, loop, replay, seq, task, wait
from wfsub._runtime import _compact

from ._figures import record

N_SIGNALS = 100_000
SENDERS = 16
COMPACT_AFTER = 1000
REPEAT = 2


def _count(ctx: Any) -> dict[str, Any]:
    return {"n": ctx.get("n", 0) + 1, "total": ctx.get("total", 0) + (ctx.get("item") or 0)}


ENDLESS = loop(seq(wait("add", into="item"), task(_count)), while_=lambda d: True)
FLOWS = {"cart": ENDLESS}


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


async def _until(sub: Substrate, n: int) -> None:
    while sub.data("c").get("n") != n:  # noqa: ASYNC110 - the case applies its inputs in the background
        await anyio.sleep(0.001)


async def serve(path: Path, compact_after: int | None) -> tuple[float, int, int, float]:
    """(seconds for N_SIGNALS signals from SENDERS senders, the journal's length at the end, records journaled,
    seconds the case spent compacting: building its snapshot record and waiting for that write's commit)."""
    spent = [0.0]
    real = _compact.compact

    async def timed(actor: Any) -> bool:
        start = time.perf_counter()
        try:
            return await real(actor)
        finally:
            spent[0] += time.perf_counter() - start

    _compact.compact = timed
    try:
        async with Substrate(store=path, workflows=FLOWS, compact_after=compact_after) as sub:
            await sub.new_case("cart", {}, case_id="c")
            gc.collect()

            async def sender(k: int) -> None:
                for i in range(k, N_SIGNALS, SENDERS):
                    await sub.signal("c", "add", i)

            start = time.perf_counter()
            async with anyio.create_task_group() as tg:
                for k in range(SENDERS):
                    tg.start_soon(sender, k)
            await _until(sub, N_SIGNALS)
            took = time.perf_counter() - start
            journal = await sub.journal("c")
            return took, len(journal), journal[-1].seq, spent[0]
    finally:
        _compact.compact = real


async def recover(path: Path, compact_after: int | None) -> float:
    """Seconds from entering a Substrate on the file until a signal to the endless case has been applied."""
    gc.collect()
    start = time.perf_counter()
    async with Substrate(store=path, workflows=FLOWS, compact_after=compact_after) as sub:
        await sub.signal("c", "add", 1)
        await _until(sub, N_SIGNALS + 1)
        return time.perf_counter() - start


async def offline(path: Path) -> tuple[float, int]:
    """(seconds to read the case's journal and replay it offline, its record count)."""
    gc.collect()
    async with Substrate(store=path, workflows=FLOWS) as sub:
        start = time.perf_counter()
        journal = await sub.journal("c")
        report = replay(ENDLESS, journal, trace_level="none")
        took = time.perf_counter() - start
    assert report.divergence is None and report.data["n"] == N_SIGNALS + 1
    return took, len(journal)


def disk(path: Path) -> int:
    return sum(p.stat().st_size for p in path.parent.glob(path.name + "*") if not p.name.endswith("-lock"))


def run() -> list[str]:
    lines = ["== endless cases: compaction (SQLite file, synchronous=FULL) =="]
    with tempfile.TemporaryDirectory(prefix="wfsub-bench-") as folder:
        tmp = Path(folder)
        runs: dict[int | None, list[tuple[float, int, int, float]]] = {COMPACT_AFTER: [], None: []}
        for i in range(REPEAT):  # interleaved: drift hits both alike
            for compact_after in runs:
                path = tmp / f"{'compacted' if compact_after else 'whole'}-{i}.db"
                runs[compact_after].append(anyio.run(serve, path, compact_after))
        compacted = min(runs[COMPACT_AFTER])
        whole = min(runs[None])
        per_signal = compacted[0] / N_SIGNALS * 1e6
        per_signal_whole = whole[0] / N_SIGNALS * 1e6
        cost = record("compaction_cost_us_per_record", compacted[3] / compacted[2] * 1e6, "us")
        lines.append(
            f"{N_SIGNALS:,} signals to one case, {SENDERS} senders (best of {REPEAT}): compaction costs {cost:5.2f} us "
            f"per record journaled (the case's time building snapshot records and waiting for their commits; "
            f"target <= 10% of a signal's {per_signal_whole:.0f} us) {verdict(cost <= per_signal_whole * 0.1)}"
        )
        lines.append(
            f"  end to end: compact_after={COMPACT_AFTER} {per_signal:6.1f} us per signal, every record kept "
            f"{per_signal_whole:6.1f} us ({per_signal / per_signal_whole:4.2f}x)"
        )
        bound = COMPACT_AFTER + SENDERS + 1
        lines.append(
            f"  journal at the end: {compacted[1]:,} records compacted (target <= {bound:,}) "
            f"{verdict(compacted[1] <= bound)}, {whole[1]:,} kept whole"
        )
        compacted_db, whole_db = tmp / "compacted-0.db", tmp / "whole-0.db"
        fast = record("compaction_recovery_s", anyio.run(recover, compacted_db, COMPACT_AFTER), "s")
        slow = anyio.run(recover, whole_db, None)
        lines.append(
            f"recovery of the endless case until a signal applies: compacted {fast * 1e3:7.1f} ms (target <= 500) "
            f"{verdict(fast <= 0.5)}, every record kept {slow * 1e3:7.1f} ms ({slow / fast:4.1f}x: snapshots "
            "bound recovery either way)"
        )
        small, kept = anyio.run(offline, compacted_db)
        big, kept_whole = anyio.run(offline, whole_db)
        record("compaction_offline_replay_s", small, "s")
        lines.append(
            f"journal read and replayed offline: compacted {kept:,} records {small * 1e3:7.1f} ms, every record kept "
            f"{kept_whole:,} records {big * 1e3:7.1f} ms ({big / small:5.1f}x)"
        )
        lines.append(
            f"file size: compacted {disk(compacted_db) / 1e6:6.1f} MB, every record kept "
            f"{disk(whole_db) / 1e6:6.1f} MB"
        )
    return lines


if __name__ == "__main__":
    for line in run():
        print(line)

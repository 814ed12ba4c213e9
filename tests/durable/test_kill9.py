"""kill -9 under load: a child runs a durable Substrate on a SQLite file (hundreds of cases with effects, some
retried, real-clock timers and signals with request ids, see `_load.py`) and is SIGKILLed at random points; it is
restarted on the same file until every case has finished. Checked: every case whose `new_case` returned and every
acknowledged signal is in the store, every case ends done with the right result, with one `end`, and every effect
whose result is journaled ran (at least once) under one stable idempotency key."""

from __future__ import annotations

import os
import random
import signal
import sqlite3
import subprocess
import threading
import time
from contextlib import closing
from pathlib import Path

import anyio
import pytest

from wfsub import JournalRecord
from wfsub.stores import Listing

from .. import _warm
from . import _load
from ._flows import read_side
from ._util import ROOT, check_shape, child_cmd, field, outside

N = 240  # cases
KILLS = 4  # runs killed before the one left to finish
SEED = int(os.environ.get("WFSUB_KILL_SEED", "20251126"))
TROUBLE = ("could not journal inputs", "could not record a case's end", "case actor crashed")
BOUND = 120.0  # seconds a run may take before it counts as hung (a bound against hangs, not an expected time)


class Run:
    """One child: its stdout lines as they come, and the wfsub errors it logs (a journaling failure is a bug here:
    the disk is fine, so an input that cannot be journaled means the case is stuck)."""

    def __init__(self, path: Path, side: Path, seed: int, log: Path) -> None:
        self.lines: list[str] = []
        self.trouble: list[str] = []
        self.proc = _warm.Popen(child_cmd("load", str(path), str(side), str(seed), str(N)), cwd=ROOT,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.log = log
        self.readers = [threading.Thread(target=self._out), threading.Thread(target=self._err)]
        for t in self.readers:
            t.start()

    def _out(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)

    def _err(self) -> None:
        assert self.proc.stderr is not None
        with self.log.open("a") as log:
            for line in self.proc.stderr:
                log.write(line)
                if any(t in line for t in TROUBLE):
                    self.trouble.append(line.strip())

    def count(self, prefix: str) -> int:
        return sum(1 for line in list(self.lines) if line.startswith(prefix))

    def wait_for(self, n: int, *prefixes: str) -> None:
        """Until `n` lines start with one of `prefixes` (or the child ended, or logged trouble)."""
        deadline = time.monotonic() + BOUND
        while sum(self.count(p) for p in prefixes) < n and self.proc.poll() is None and not self.trouble:
            assert time.monotonic() < deadline, f"the child hung: see {self.log}"
            time.sleep(0.002)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        for t in self.readers:
            t.join()
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()

    def acknowledged(self, kind: str) -> set[str]:
        """Case ids of the complete lines `kind ID` (a line cut by the kill was not acknowledged whole)."""
        return {line.split()[1] for line in self.lines if line.startswith(kind + " ") and line.endswith("\n")}


@pytest.mark.long
def test_kill_9_under_load_loses_nothing_acknowledged(tmp_path: Path) -> None:
    """SIGKILLed at random points under load and restarted: acknowledged cases and signals kept, all end right."""
    path, side = tmp_path / "load.db", tmp_path / "side.jsonl"
    rng = random.Random(SEED)
    started: set[str] = set()
    signalled: set[str] = set()
    trouble: list[str] = []
    finished = False
    for run in range(KILLS + 1):
        child = Run(path, side, rng.randrange(2**31), tmp_path / f"run{run}.log")
        try:
            child.wait_for(1, "ready")
            if run == 0:  # while cases are being started: many have effects in flight
                child.wait_for(rng.randint(N // 4, N // 2), "start ")
            elif run < KILLS:  # after a random number of acknowledged signals of this run: mid-load
                child.wait_for(rng.randint(N // 10, N // 2), "signal ", "ended ")
            else:
                child.wait_for(1, "alldone")
        finally:
            child.kill()
        started |= child.acknowledged("start")
        signalled |= child.acknowledged("signal")
        trouble += child.trouble
        finished = finished or any(line.startswith("alldone") for line in child.lines)
        assert not child.trouble, f"(seed {SEED}) run {run}: {child.trouble[:3]}"
        errors = [line for line in child.lines if line.startswith("error ")]
        assert not errors, errors[:5]
    assert finished, f"(seed {SEED}) the last run did not finish: see {tmp_path}"
    assert len(started) >= N // 10

    async def check() -> None:
        async with outside(path) as store:
            rows = {row.case_id: row for row in await store.cases(Listing(limit=10 * N))}
            assert set(rows) == {_load.case_id(i) for i in range(N)}, "a case that was never started is stored"
            calls = read_side(side)
            by_key: dict[str, list[dict[str, object]]] = {}
            for call in calls:
                by_key.setdefault(str(call["key"]), []).append(call)
            for i in range(N):
                cid = _load.case_id(i)
                journal = [JournalRecord.model_validate(r) for r in await store.journal(cid)]
                check_shape(journal, contiguous=False)
                end = journal[-1]
                assert end.kind == "end" and field(end, "outcome") == "done", (cid, end)
                assert field(end, "result") == _load.expected(i), cid
                assert rows[cid].state == "done"
                sigs = [r for r in journal if r.kind == "signal"]
                assert [field(r, "request_id") for r in sigs] == [f"sig-{cid}"], (cid, sigs)
                for record in journal:
                    if record.kind != "effect":
                        continue
                    key = f"{cid}:{field(record, 'effect_id')}:{field(record, 'path')}"
                    mine = by_key.get(key)
                    assert mine, f"{cid}: effect {key} journaled but never called"
                    assert {c["name"] for c in mine} == {field(record, "name")} and {c["case"] for c in mine} == {cid}
                    assert 1 in {c["attempt"] for c in mine}
                    if field(record, "name") == "first" and i % 5 == 0:
                        assert 2 in {c["attempt"] for c in mine}, "the flaky effect was retried"
            assert {str(c["case"]) for c in calls} <= set(rows)
        with closing(sqlite3.connect(path)) as conn:
            assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"

    assert started <= {_load.case_id(i) for i in range(N)}
    assert signalled <= started | {_load.case_id(i) for i in range(N)}
    anyio.run(check)

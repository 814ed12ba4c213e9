"""Crash safety and ownership, tested by killing processes: a writer killed with SIGKILL at random moments loses
no acknowledged record and leaves no case half-written; an owner excludes other processes until it closes or dies.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from contextlib import closing
from pathlib import Path

import anyio
import pytest

from wfsub._errors import StoreError
from wfsub.stores import Listing, PostgresStore, SqliteStore

from .. import _warm
from . import _pg
from ._helpers import opened, snapshot_count

CHILD = str(Path(__file__).with_name("_child.py"))
WRITES = 5000  # CaseWrites one child makes if it is not killed first
RUNS = [  # (synchronous, how the kill moment is drawn, backend of the child)
    ("full", "acks", "asyncio"),
    ("full", "time", "trio"),
    ("normal", "acks", "trio"),
    ("normal", "time", "asyncio"),
    ("full", "acks", "asyncio"),
    ("full", "time", "asyncio"),
    ("normal", "acks", "asyncio"),
    ("full", "acks", "trio"),
]
SEED = int(os.environ.get("WFSUB_CRASH_SEED", "20250601"))


def run_and_kill(path: Path, run: int, synchronous: str, how: str, backend: str, rng: random.Random,
                 log: Path, dsn: str | None = None) -> tuple[list[tuple[str, int]], bool]:
    """Start a writer, SIGKILL it at a random moment; the (case, seq) pairs it acknowledged, whether it finished."""
    with log.open("w") as stderr:
        proc = _warm.Popen(
            [sys.executable, CHILD, "crash", dsn or str(path), f"r{run}", str(rng.randrange(2**32)), synchronous,
             str(WRITES), backend],
            stdout=subprocess.PIPE, stderr=stderr, text=True,
        )
        assert proc.stdout is not None
        lines: list[str] = []
        reader = threading.Thread(target=lambda: lines.extend(proc.stdout or []))
        reader.start()
        try:
            deadline = time.monotonic() + 60
            while not lines and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.001)
            assert lines and lines[0] == "ready\n", f"the writer did not start: see {log}"
            if how == "acks":  # after a random number of acknowledged writes
                target = rng.randint(1, WRITES)
                while len(lines) <= target and proc.poll() is None and time.monotonic() < deadline:
                    time.sleep(0.0005)
            else:  # after a random time
                time.sleep(rng.uniform(0.0, 0.3))  # a whole run takes about 0.3-0.8 s on 2 cores
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            reader.join()
            proc.stdout.close()
    acked = []
    for line in lines:
        if line.startswith("ack ") and line.endswith("\n"):  # a line cut by the kill was not acknowledged whole
            _, case_id, seqs = line.split()
            acked.extend((case_id, int(seq)) for seq in seqs.split(","))
    return acked, "done\n" in lines


@pytest.mark.long
def test_killed_writers_lose_no_acknowledged_record_and_leave_no_case_half_written(tmp_path: Path) -> None:
    """Writers SIGKILLed at random moments lose no acknowledged record and leave gapless journals, rows in step."""
    # Eight runs on one file: synchronous FULL and NORMAL, children on asyncio and on trio. Checked: every
    # acknowledged record is there, journals are gapless, each row matches its journal's last record and `end`,
    # snapshots lie within the journal, and SQLite's integrity check passes.
    path = tmp_path / "crash.db"
    rng = random.Random(SEED)
    acked: list[tuple[str, int]] = []
    finished = []
    for run, (synchronous, how, backend) in enumerate(RUNS):
        got, done = run_and_kill(path, run, synchronous, how, backend, rng, tmp_path / f"run{run}.log")
        acked += got
        finished.append(done)
    assert acked and not all(finished), "the kills must land while writes are in flight"

    async def check() -> None:
        store = SqliteStore(path)
        async with opened(store):  # as owner: the killed owners' locks went with their processes
            rows = {row.case_id: row for row in await store.cases(Listing(limit=10**6))}
            cases = {case_id for case_id, _ in acked} | set(rows)
            journals = {case_id: await store.journal(case_id) for case_id in cases}
            for case_id, seq in acked:
                assert seq in {r["seq"] for r in journals[case_id]}, f"acknowledged {case_id} seq {seq} lost ({SEED=})"
            for case_id, journal in journals.items():
                seqs = [r["seq"] for r in journal]
                assert seqs == list(range(len(seqs))), f"{case_id}: gaps in {seqs} ({SEED=})"
                row = rows[case_id]
                assert row.last_seq == seqs[-1], f"{case_id}: row at {row.last_seq}, journal at {seqs[-1]}"
                ended = [r for r in journal if r["kind"] == "end"]
                assert (row.state == "done") == bool(ended) and (not ended or ended[0] is journal[-1]), case_id
                loaded = await store.load(case_id)
                assert loaded is not None
                assert loaded.snapshot is None or loaded.snapshot.seq <= seqs[-1]
                assert snapshot_count(store, case_id) <= 2
        with closing(sqlite3.connect(path)) as conn:
            assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"

    anyio.run(check)


@pytest.mark.skipif(not _pg.ENABLED, reason=_pg.SKIP_REASON)
def test_killed_postgres_writers_lose_no_acknowledged_record(tmp_path: Path) -> None:
    """Postgres nodes SIGKILLed at random moments lose no acknowledged record; journals stay gapless."""
    dsn = f"{_pg.database_dsn()}?schema={_pg.new_schema()}"
    rng = random.Random(SEED)
    acked: list[tuple[str, int]] = []
    finished = []
    kills = [("acks", "asyncio"), ("time", "trio"), ("acks", "trio"), ("time", "asyncio")]
    for run, (how, backend) in enumerate(kills):
        got, done = run_and_kill(Path(dsn), run, "full", how, backend, rng, tmp_path / f"run{run}.log", dsn=dsn)
        acked += got
        finished.append(done)
    assert acked and not all(finished), "the kills must land while writes are in flight"

    async def check() -> None:
        store = PostgresStore(dsn)
        async with opened(store, owner=False):
            rows = {row.case_id: row for row in await store.cases(Listing(limit=10**6))}
            for case_id in {case_id for case_id, _ in acked} | set(rows):
                seqs = [r["seq"] for r in await store.journal(case_id)]
                assert seqs == list(range(len(seqs))), f"{case_id}: gaps in {seqs} ({SEED=})"
                assert rows[case_id].last_seq == seqs[-1], f"{case_id}: row at {rows[case_id].last_seq}"
                assert rows[case_id].owner is not None and rows[case_id].owner.startswith("crash-r")
            for case_id, seq in acked:
                assert seq <= rows[case_id].last_seq, f"acknowledged {case_id} seq {seq} lost ({SEED=})"

    anyio.run(check)


@pytest.mark.parametrize(("synchronous", "backend"), [("full", "asyncio"), ("normal", "trio")])
def test_a_kill_between_a_commit_and_its_wake_up_loses_nothing(tmp_path: Path, synchronous: str, backend: str) -> None:
    """Killed after a group commits and before its waiters wake, a writer keeps that group and all it acknowledged."""
    path = tmp_path / "unwoken.db"
    done = subprocess.run([sys.executable, CHILD, "unwoken", str(path), synchronous, backend],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == -signal.SIGKILL, done.stderr
    assert done.stdout.count("ack ") == 20 and "not killed" not in done.stdout

    async def check() -> None:
        async with opened(SqliteStore(path)) as store:
            kept = {row.case_id for row in await store.cases(Listing(limit=100))}
            assert {f"a{i}" for i in range(20)} <= kept and "u0" in kept
            for case_id in kept:
                assert [r["seq"] for r in await store.journal(case_id)] == [0]

    anyio.run(check)


def start_holder(path: Path, owner_id: str) -> subprocess.Popen[str]:
    proc = _warm.Popen([sys.executable, CHILD, "hold", str(path), owner_id],
                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline() == f"owned {proc.pid}\n"
    return proc


async def refused_while_owned(path: Path, holder: subprocess.Popen[str], owner_id: str) -> None:
    with pytest.raises(StoreError) as caught:
        await SqliteStore(path).open(owner=True, owner_id="parent")
    message = str(caught.value)
    assert f"Substrate {owner_id!r}" in message and f"pid {holder.pid} on host {socket.gethostname()!r}" in message
    assert f"kill {holder.pid}" in message and "wfsub.Client" in message and str(path) in message
    assert "owner=False" not in message  # (a Substrate has no such option: the message names what exists)
    async with opened(SqliteStore(path), owner=False, owner_id="wfsub-cli") as viewer:  # beside the owner
        await viewer.inbox_put("a", "signal", {"name": "go"}, request_id=None, created_at=1.0)


def test_another_process_owns_the_store_until_it_closes_or_dies(tmp_path: Path) -> None:
    """Another process's ownership is refused by name (pid, host, how to stop it) until it closes or is killed."""
    path = tmp_path / "owned.db"
    holder = start_holder(path, "holder-one")
    anyio.run(refused_while_owned, path, holder, "holder-one")
    assert holder.communicate(input="", timeout=30)[0] == ""  # closes its store, then exits
    assert holder.returncode == 0

    async def own(epoch: int) -> None:
        async with opened(SqliteStore(path), owner_id="parent") as store:
            assert isinstance(store, SqliteStore) and store.owner_epoch == epoch

    anyio.run(own, 2)
    holder = start_holder(path, "holder-two")
    anyio.run(refused_while_owned, path, holder, "holder-two", backend="trio")
    holder.kill()
    holder.communicate()
    anyio.run(own, 4, backend="trio")

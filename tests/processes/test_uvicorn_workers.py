"""`uvicorn --workers 3` with one SQLite file: one worker owns the store, the others are standbys that hand their
calls to it through the store; SIGKILL of the owner mid-run hands the store to one standby. Checked: the server
keeps serving, every acknowledged case finishes with the right result, and effects ran in one worker at a time
(the effect log's pids form at most two runs: the killed owner's, then its successor's)."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import time
from contextlib import closing
from pathlib import Path

import pytest

from ._http import BOUND, Server, call

N = 30  # loans


def _owner_pid(db: Path) -> int:
    with closing(sqlite3.connect(db, timeout=10)) as conn:
        found = conn.execute("SELECT pid FROM owner WHERE id = 1").fetchone()
    return int(found[0]) if found else 0


def _workers(server: Server, count: int) -> dict[int, bool]:
    """{pid: standby} of the workers, once `count` different ones have answered (new connection per call)."""
    seen: dict[int, bool] = {}
    deadline = time.monotonic() + BOUND
    while len(seen) < count or list(seen.values()).count(False) != 1:
        assert time.monotonic() < deadline, f"workers seen: {seen}"
        answer = call("GET", f"{server.url}/whoami").json()
        seen[answer["pid"]] = answer["standby"]
    return seen


def _runs(log: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


@pytest.mark.long
def test_three_uvicorn_workers_share_one_store_and_survive_the_owner_killed(tmp_path: Path) -> None:
    """Three workers on one SQLite file serve every call; the owner SIGKILLed mid-run loses no acknowledged case."""
    db, runs = tmp_path / "loans.db", tmp_path / "runs.jsonl"
    server = Server("tests.processes._app:app", 3, {"LOANS_DB": str(db), "LOANS_LOG": str(runs)}, tmp_path / "uv.log")
    try:
        workers = _workers(server, 3)
        owner = _owner_pid(db)
        assert workers[owner] is False and sorted(workers.values()) == [False, True, True]

        for i in range(N):  # each start sent twice, as a client that lost the first answer would
            for _ in range(2):
                assert call("POST", f"{server.url}/loans", json={"id": f"l{i}", "amount": 100 + i}).json() == {
                    "id": f"l{i}"
                }
        assert call("POST", f"{server.url}/loans", json={"id": "l0", "amount": 1}, ok=(409,)).json()["error"] == (
            "CaseExists"
        )
        half = N // 2
        for i in range(half):
            call("POST", f"{server.url}/loans/l{i}/approve", params={"request_id": f"a{i}"}, json={"by": "ann"})
        for i in range(half):
            assert call("GET", f"{server.url}/loans/l{i}/result").json()["paid"] == 100 + i

        os.kill(owner, signal.SIGKILL)  # mid-run: the other half wait for their approval
        for i in range(half, N):  # retried through the takeover, with a request id: applied once
            call("POST", f"{server.url}/loans/l{i}/approve", params={"request_id": f"a{i}"}, json={"by": "bob"})
        for i in range(N):
            answer = call("GET", f"{server.url}/loans/l{i}/result")
            assert answer.json() == {"amount": 100 + i, "score": (100 + i) % 7, "approve": {"by": (
                "ann" if i < half else "bob")}, "paid": 100 + i}, answer.text
        assert server.proc.poll() is None  # the server kept running
        successor = _owner_pid(db)
        assert successor not in (0, owner)
    finally:
        server.stop()

    done = _runs(runs)
    pids = [run["pid"] for run in done]
    streaks = [pid for k, pid in enumerate(pids) if k == 0 or pids[k - 1] != pid]
    assert streaks in ([owner, successor], [owner]), f"effects ran in turns by {streaks}: two workers ran cases"
    keys: dict[tuple[object, object], set[object]] = {}
    for run in done:
        keys.setdefault((run["case"], run["effect"]), set()).add(run["key"])
    assert {case for case, _ in keys} == {f"l{i}" for i in range(N)}
    assert all(len(k) == 1 for k in keys.values()), "an effect ran under two idempotency keys"
    assert {effect for _, effect in keys} == {"score", "disburse"}

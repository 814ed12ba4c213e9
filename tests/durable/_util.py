"""Helpers of the durable tests: children started from the repo root, reading a store from outside, journal checks."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

import wfsub
from wfsub.stores import MemoryStore, SqliteStore, Store

from .. import _warm

ROOT = Path(__file__).resolve().parents[2]


def child_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "tests.durable._child", *args]


def run_child(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run a child to its end (or its own SIGKILL); stdout and stderr captured."""
    return _warm.run(child_cmd(*args), cwd=ROOT, timeout=timeout)


def child_report(*args: str) -> dict[str, Any]:
    done = run_child(*args)
    assert done.returncode == 0, done.stderr[-4000:]
    found: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


@asynccontextmanager
async def outside(store: Store | str | Path) -> AsyncIterator[Store]:
    """The store opened as an outside reader/writer (owner=False), as the `wfsub` command opens it."""
    s: Store = SqliteStore(store) if isinstance(store, str | Path) else store
    await s.open(owner=False, owner_id="outside-test")
    try:
        yield s
    finally:
        await s.close()


def reopenable(store: Store | str | Path) -> Any:
    """What to give the next Substrate: the same MemoryStore object, or the path again."""
    return store if isinstance(store, MemoryStore) else str(store)


def kinds(journal: Sequence[wfsub.JournalRecord | dict[str, Any]]) -> list[str]:
    return [r.kind if isinstance(r, wfsub.JournalRecord) else r["kind"] for r in journal]


def check_shape(journal: Sequence[wfsub.JournalRecord], *, contiguous: bool = True) -> None:
    """A journal's invariants: `start` at seq 0, seqs increasing (gapless with `contiguous`), exactly one `end`,
    last; input records carry step, time and digest, steps never go back, times never go back."""
    seqs = [r.seq for r in journal]
    assert journal and journal[0].kind == "start" and seqs[0] == 0, seqs
    if contiguous:
        assert seqs == list(range(len(seqs))), f"gaps in the journal's seqs: {seqs}"
    else:
        assert seqs == sorted(set(seqs)), f"seqs not increasing: {seqs}"
    ends = [r for r in journal if r.kind == "end"]
    assert len(ends) <= 1 and (not ends or ends[0] is journal[-1]), kinds(journal)
    steps = [r.step for r in journal[1:] if r.kind != "end" and r.step is not None]
    assert steps == sorted(steps), f"steps go back: {steps}"
    times = [r.time for r in journal]
    assert times == sorted(times), f"times go back: {times}"
    for r in journal[1:]:
        if r.kind != "end":
            extra = r.model_extra or {}
            assert r.step is not None and r.digest is not None, r
            if r.kind in ("effect", "timer"):
                assert "path" in extra, r


def field(record: wfsub.JournalRecord, name: str) -> Any:
    return (record.model_extra or {}).get(name)


async def wait_all_blocked() -> None:
    """Let every other task run until it blocks (a few scheduler passes: no timing involved)."""
    import anyio.lowlevel

    for _ in range(20):
        await anyio.lowlevel.checkpoint()


async def eventually(check: Any, limit: float = 30.0, every: float = 0.005) -> None:
    """Poll `check()` (sync or async) until it is true; `limit` seconds bound a hang (it is not a timing)."""
    import inspect

    import anyio

    with anyio.fail_after(limit):
        while True:
            found = check()
            if inspect.isawaitable(found):
                found = await found
            if found:
                return
            await anyio.sleep(every)


def same_store(kind: str, tmp_path: Path) -> Callable[[], Any]:
    """A maker of the store each Substrate of a test opens ("none", "memory", "sqlite" or "postgres"): the same
    place each time, so a restart sees what the last one wrote (Postgres: a new store object on one new schema;
    skipped where no server is reachable)."""
    if kind == "none":
        return lambda: None
    if kind == "memory":
        memory = MemoryStore()
        return lambda: memory
    if kind == "sqlite":
        return lambda: str(tmp_path / "cases.db")
    from wfsub.stores import PostgresStore

    from ..stores import _pg

    if not _pg.ENABLED:
        pytest.skip(_pg.SKIP_REASON)
    dsn, schema = _pg.database_dsn(), _pg.new_schema()
    return lambda: PostgresStore(dsn, schema=schema)

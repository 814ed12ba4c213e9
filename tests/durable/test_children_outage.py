"""A child's cancel survives a store outage: a parent that withdraws the step waiting for its child while the store
fails (a SQLite file locked by another process, a Postgres connection cut) keeps sending the cancel until the store
is back and the child has it, instead of giving up until the next open or takeover."""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio
import pytest
from structlog.testing import capture_logs

from wfsub import CaseNotFound, CaseState, Substrate, cancel_region, par, scope, seq, start_case, task, wait
from wfsub.stores import StoreError

from ..stores import _pg
from ..stores._proxy import PROXY_CONNECT, Proxy

BOUND = 30.0  # seconds: a bound against a hang, not a latency requirement
outage: dict[str, Any] = {}  # what the parent's `outage` step does: start the test's store outage


def start_outage(ctx: Mapping[str, Any]) -> None:
    """A step of the parent run right before it cancels the region holding its child: the store fails from here,
    so the child's cancel is sent while it is out (the parent's own signal before it was journaled)."""
    outage["start"]()


FLOWS = {
    "parent": seq(
        par(
            scope("kids", start_case("child", case_id=lambda c: "kid")),
            seq(wait("go"), task(start_outage, name="outage"), cancel_region("kids")),
        ),
        wait("never"),
    ),
    "child": seq(wait("never")),
}


def _state(sub: Substrate, case_id: str) -> CaseState | None:
    try:
        return sub.status(case_id).state
    except CaseNotFound:  # (not started yet)
        return None
    except StoreError:  # (the store is out: a status that reads the case's row cannot be had meanwhile)
        return None


def _handed_over(logs: list[dict[str, Any]]) -> bool:
    """Whether the step, its cancel still not delivered after CANCEL_WAIT, left it to a task beside the cases."""
    return any(entry.get("child") == "kid" and "beside the cases" in entry["event"] for entry in logs)


async def _cancelled_after_the_outage(sub: Substrate, end_outage: Any) -> None:
    with capture_logs() as logs:
        await sub.new_case("parent", {}, case_id="p")
        with anyio.fail_after(BOUND):
            while _state(sub, "kid") != CaseState.WAITING_SIGNAL:  # noqa: ASYNC110 (a state poll)
                await anyio.sleep(0.01)
        await sub.signal("p", "go")
        with anyio.fail_after(BOUND):  # the step gave up waiting: the cancel is sent again from beside the cases
            while not _handed_over(logs):  # noqa: ASYNC110 (waits on what the runtime did, not on a delay)
                await anyio.sleep(0.01)
        assert _state(sub, "kid") != CaseState.CANCELLED  # (not yet: the store is still out)
        end_outage()
        with anyio.fail_after(BOUND):
            while _state(sub, "kid") != CaseState.CANCELLED:  # noqa: ASYNC110 (a state poll)
                await anyio.sleep(0.01)
    assert sub.status("kid").cancel_reason == "its parent 'p' was cancelled"
    assert sub.status("p").state == CaseState.WAITING_SIGNAL  # the parent went on past the withdrawn step


async def test_a_child_cancel_sent_while_the_sqlite_file_is_locked_is_delivered_once_it_is_free(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SQLite: the file locked by another process (past the busy timeout) when the parent withdraws the step
    waiting for its child; once the lock goes, the child gets its cancel and ends cancelled, no restart needed."""
    from wfsub._runtime import _children
    from wfsub._store import _sqlite

    monkeypatch.setattr(_sqlite, "BUSY_TIMEOUT", 0.2)  # (a short busy timeout: the test need not wait 10 s)
    monkeypatch.setattr(_children, "CANCEL_WAIT", 0.5, raising=False)  # (the hand-over beside the cases, soon)
    path = tmp_path / "cases.db"
    held: list[sqlite3.Connection] = []

    def lock() -> None:
        conn = sqlite3.connect(path, timeout=10, isolation_level=None)
        conn.execute("BEGIN EXCLUSIVE")
        held.append(conn)

    def unlock() -> None:
        while held:
            conn = held.pop()
            conn.rollback()
            conn.close()

    outage["start"] = lock
    try:
        async with Substrate(store=str(path), workflows=FLOWS) as sub:
            await _cancelled_after_the_outage(sub, unlock)
    finally:
        unlock()


@pytest.mark.skipif(not _pg.ENABLED, reason=_pg.SKIP_REASON)
async def test_a_child_cancel_sent_while_postgres_is_cut_off_is_delivered_once_it_is_back(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    """Postgres: the connection cut (every connection dropped, new ones refused) when the parent withdraws the step
    waiting for its child; once it is back, the child gets its cancel and ends cancelled, no takeover needed."""
    from wfsub._runtime import _children
    from wfsub.stores import PostgresStore

    monkeypatch.setattr(_children, "CANCEL_WAIT", 0.5, raising=False)
    proxy = Proxy(_pg.database_dsn())
    outage["start"] = proxy.down
    try:
        store = PostgresStore(proxy.dsn, schema=_pg.new_schema(), retry_for=0.2, connect_timeout=PROXY_CONNECT)
        async with Substrate(store=store, workflows=FLOWS, node_id="n1") as sub:
            await _cancelled_after_the_outage(sub, proxy.up)
    finally:
        proxy.down()

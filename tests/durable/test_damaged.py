"""Entries of a SQLite store edited or damaged by hand: the case they belong to is suspended with the reason (or
rebuilt from its journal when only its row is damaged); the Substrate, the other cases and the command go on."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Mapping
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from wfsub import SignalRejected, StoreError, Substrate, loop, seq, task, wait

from .. import _warm
from ._util import ROOT, wait_all_blocked


def done(ctx: Mapping[str, Any]) -> dict[str, Any]:
    return {"done": True}


FLOWS = {"wait": seq(wait("go", into="go"), task(done))}


async def two_parked(path: Path) -> None:
    """Cases `bad` and `good`, both parked waiting for signal `go` (each with its start and nothing else)."""
    async with Substrate(store=str(path), workflows=FLOWS) as sub:
        await sub.new_case("wait", {}, case_id="bad")
        await sub.new_case("wait", {}, case_id="good")
        await wait_all_blocked()


def edit(path: Path, sql: str, *args: Any) -> None:
    with closing(sqlite3.connect(path)) as conn, conn:
        assert conn.execute(sql, args).rowcount == 1


async def good_goes_on(sub: Substrate) -> None:
    await sub.signal("good", "go", 2)
    assert await sub.await_case("good") == {"go": 2, "done": True}


@pytest.mark.parametrize("live", [True, False], ids=["live", "parked"])
async def test_a_case_row_that_is_not_json_is_shown_suspended_and_rebuilt_from_its_journal(
    tmp_path: Path, live: bool,
) -> None:
    """A case row whose detail is not JSON: the Substrate opens, lists it suspended with why, and rebuilds it."""
    path = tmp_path / "cases.db"
    await two_parked(path)
    state = "running" if live else "waiting_signal"
    edit(path, "UPDATE cases SET detail = '{not json', state = ?, live = ?, parked = ? WHERE case_id = 'bad'",
         state, int(live), int(not live))
    if not live:
        listed = await _warm.acommand("cases", str(path), cwd=ROOT, env={**os.environ, "COLUMNS": "200"})
        out, err = listed.stdout, listed.stderr
        assert listed.returncode == 0 and "Traceback" not in err, err
        assert "bad" in out and "suspended" in out
    async with Substrate(store=str(path), workflows=FLOWS) as sub:
        await good_goes_on(sub)
        await sub.signal("bad", "go", 1)
        assert await sub.await_case("bad") == {"go": 1, "done": True}


@pytest.mark.parametrize("record", ["{damaged", '{"seq": 1, "kind": "signal", "step": 3}'], ids=["json", "fields"])
async def test_a_damaged_record_of_a_parked_case_suspends_it_with_the_reason(tmp_path: Path, record: str) -> None:
    """A journal record that is not JSON or lacks fields: a signal to its case is refused naming why, the case
    is marked suspended, reading its journal is a StoreError naming the case; the other cases go on."""
    path = tmp_path / "cases.db"
    async with Substrate(store=str(path), workflows={"two": seq(wait("go"), wait("go"), task(done))}) as sub:
        for case_id in ("bad", "good"):
            await sub.new_case("two", {}, case_id=case_id)
            await sub.signal(case_id, "go", 0)
        await wait_all_blocked()
    edit(path, "UPDATE journal SET record = ? WHERE case_id = 'bad' AND seq = 1", record)
    async with Substrate(store=str(path), workflows={"two": seq(wait("go"), wait("go"), task(done))}) as sub:
        with pytest.raises(SignalRejected, match="suspended") as refused:
            await sub.signal("bad", "go", 1)
        assert "bad" in str(refused.value)
        assert sub.status("bad").state == "suspended"
        if record.startswith("{damaged"):
            with pytest.raises(StoreError, match="'bad' cannot be read back.*backup"):
                await sub.journal("bad")
        await sub.signal("good", "go", 2)
        assert (await sub.await_case("good"))["done"] is True


async def test_a_live_case_whose_start_record_is_gone_is_suspended_saying_so(tmp_path: Path) -> None:
    """A live case without its `start` record: suspended at recovery, naming the missing start; others go on."""
    path = tmp_path / "cases.db"
    await two_parked(path)
    edit(path, "UPDATE cases SET state = 'running', live = 1, parked = 0 WHERE case_id = 'bad'")
    edit(path, "DELETE FROM journal WHERE case_id = 'bad' AND seq = 0")
    async with Substrate(store=str(path), workflows=FLOWS) as sub:
        await good_goes_on(sub)
        status = sub.status("bad")
        assert status.state == "suspended" and "start" in (status.suspended_reason or ""), status
        with pytest.raises(SignalRejected, match="suspended"):
            await sub.signal("bad", "go", 1)


async def test_an_inbox_row_that_is_not_json_is_refused_and_the_substrate_goes_on(tmp_path: Path) -> None:
    """An inbox row whose body is not JSON is refused (marked) by the owner, which goes on."""
    path = tmp_path / "cases.db"
    await two_parked(path)
    with closing(sqlite3.connect(path)) as conn, conn:
        conn.execute("INSERT INTO inbox (case_id, kind, body, created_at) VALUES ('bad', 'signal', '{x', 1.0)")
    async with Substrate(store=str(path), workflows=FLOWS) as sub:
        await sub.signal("bad", "go", 1)
        assert await sub.await_case("bad") == {"go": 1, "done": True}
        await good_goes_on(sub)


def count(ctx: Mapping[str, Any]) -> dict[str, Any]:
    return {"n": ctx.get("n", 0) + 1}


TICKS = {"ticks": seq(loop(seq(wait("tick"), task(count)), until=lambda c: c.get("n", 0) >= 40), task(done))}


async def test_a_damaged_snapshot_is_not_used_and_the_whole_journal_is_replayed(tmp_path: Path) -> None:
    """A snapshot that is not JSON is passed over: the case comes back from its whole journal and goes on."""
    path = tmp_path / "cases.db"
    async with Substrate(store=str(path), workflows=TICKS) as sub:
        await sub.new_case("ticks", {}, case_id="c")
        for _ in range(39):
            await sub.signal("c", "tick")
        await wait_all_blocked()
    with closing(sqlite3.connect(path)) as conn, conn:
        assert conn.execute("UPDATE snapshots SET state = '{cut' WHERE case_id = 'c'").rowcount >= 1
    async with Substrate(store=str(path), workflows=TICKS) as sub:
        await sub.signal("c", "tick")
        assert await sub.await_case("c") == {"n": 40, "tick": None, "done": True}

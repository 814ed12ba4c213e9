"""`wfsub schedules STORE`: the schedules a store knows, with their last and next slots, read by the command."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from wfsub import Schedule, Substrate, seq, task

from .. import _warm

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def wfsub(cwd: Path, *args: str) -> tuple[int, str, str]:
    proc = await _warm.acommand(*args, cwd=cwd, env={**os.environ, "COLUMNS": "200"})
    return proc.returncode, proc.stdout, proc.stderr


async def test_schedules_lists_each_with_its_last_and_next_slot(tmp_path: Path) -> None:
    """The command lists every schedule of the store (a paused one says so) with its next slot computed from its
    cron or period, as JSON and as a table, while the owner runs."""
    db = tmp_path / "cases.db"
    flow = seq(task(lambda c: {"ran": True}, name="run"))
    schedules = [Schedule("hourly", "job", every=3600), Schedule("nightly", "job", cron="0 2 * * *", tz="Asia/Tokyo")]
    async with Substrate(store=db, workflows={"job": flow}, schedules=schedules) as sub:
        await sub.pause_schedule("nightly")
        listed = {s.name: s for s in await sub.schedules()}
        code, out, err = await wfsub(tmp_path, "schedules", str(db), "--json")
        assert code == 0, err
        rows = {row["name"]: row for row in map(json.loads, out.splitlines())}
        assert rows["hourly"]["every"] == 3600 and rows["hourly"]["paused"] is False
        assert rows["nightly"]["cron"] == "0 2 * * *" and rows["nightly"]["paused"] is True
        for name in ("hourly", "nightly"):
            assert rows[name]["next_slot"] == _iso(listed[name].next_slot)
            assert rows[name]["last_slot"] == _iso(listed[name].last_slot)
        assert rows["nightly"]["next_slot"].endswith("T17:00:00+00:00")  # 02:00 in Tokyo
        code, out, err = await wfsub(tmp_path, "schedules", str(db))
        assert code == 0, err
        assert "nightly" in out and "0 2 * * * (Asia/Tokyo)" in out and "every 3600s (UTC)" in out


def _iso(t: float | None) -> str | None:
    from datetime import UTC, datetime

    return None if t is None else datetime.fromtimestamp(t, UTC).isoformat(timespec="seconds")


async def test_cases_state_queued_lists_queued_cases_and_cancel_cancels_one(tmp_path: Path) -> None:
    """`wfsub cases --state queued` lists the cases waiting in a queue, `wfsub show` shows one with its queue
    options, and `wfsub cancel` of one cancels it (it never starts), seen by the owner."""
    from wfsub import Queue, wait

    db = tmp_path / "cases.db"
    flows = {"waits": seq(wait("go")), "job": seq(task(lambda c: {"ran": True}, name="run"))}
    async with Substrate(store=db, workflows=flows, queues={"mail": Queue(concurrency=1)}) as sub:
        await sub.new_case("waits", queue="mail", case_id="blocker")
        await sub.new_case("job", queue="mail", priority=2, dedup="k1", case_id="q1")
        await sub.new_case("job", queue="mail", case_id="q2")
        code, out, err = await wfsub(tmp_path, "cases", str(db), "--state", "queued", "--json")
        assert code == 0, err
        rows = [json.loads(line) for line in out.splitlines()]
        assert [(row["case_id"], row["queue"], row["priority"], row["dedup"]) for row in rows] == [
            ("q2", "mail", 0, None), ("q1", "mail", 2, "k1")]
        code, out, err = await wfsub(tmp_path, "cases", str(db), "--state", "queued")
        assert code == 0 and "q1" in out and "mail" in out, err
        code, out, err = await wfsub(tmp_path, "show", str(db), "q1", "--json")
        assert code == 0, err
        shown = json.loads(out)
        assert (shown["state"], shown["queue"], shown["priority"], shown["dedup"]) == ("queued", "mail", 2, "k1")
        code, out, err = await wfsub(tmp_path, "cancel", str(db), "q1")
        assert code == 0 and "was queued: cancelled" in out, err
        assert sub.status("q1").state == "cancelled"
        assert [s.case_id for s in sub.cases(state="queued")] == ["q2"]

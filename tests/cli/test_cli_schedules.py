"""`wfsub schedules STORE`: the schedules a store knows, with their last and next slots, read by the command."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import anyio
import pytest

from wfsub import Schedule, Substrate, seq, task

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def wfsub(cwd: Path, *args: str) -> tuple[int, str, str]:
    proc = await anyio.run_process([sys.executable, "-m", "wfsub", *args], cwd=cwd, check=False,
                                   env={**os.environ, "COLUMNS": "200"})
    return proc.returncode, proc.stdout.decode(), proc.stderr.decode()


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

"""A migrated case keeps the due times of the timers it had armed: a new version that changed a sleep's length
applies it only to timers armed after the migration. The `version` record carries the pinned due times, so a
restart (snapshot or whole-journal replay) and an offline replay agree; `status()` shows `version` and
`migrated_from`."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

import wfsub
from wfsub import Substrate, seq, sleep, task
from wfsub.stores import MemoryStore, PostgresStore, SqliteStore
from wfsub.testing import VirtualClock

from ..stores import _pg
from ._util import eventually, field, kinds

T0 = 1_800_000_000.0


def woke(ctx: Mapping[str, Any]) -> dict[str, Any]:
    return {"woke": True}


def flow(timeout: float) -> Any:
    """Two timeouts of one length (a constant read from the environment, say), then a task."""
    return seq(sleep(timeout), sleep(timeout), task(woke))


OLD, NEW = flow(100), flow(110)


def reopenable(kind: str, tmp_path: Path) -> Callable[[], Any]:
    if kind == "memory":
        memory = MemoryStore()
        return lambda: memory
    if kind == "sqlite":
        return lambda: SqliteStore(tmp_path / "cases.db")
    if not _pg.ENABLED:
        pytest.skip(_pg.SKIP_REASON)
    dsn, schema = _pg.database_dsn(), _pg.new_schema()
    return lambda: PostgresStore(dsn, schema=schema)


async def migrated(sub: Substrate) -> bool:
    return "version" in kinds(await sub.journal("c"))


@pytest.mark.parametrize("kind", ["memory", "sqlite", "postgres"])
async def test_an_armed_timer_keeps_its_due_time_across_a_migration_and_a_restart(kind: str, tmp_path: Path) -> None:
    """A timer armed at T0+100 by the old version stays due at T0+100 after migrating to a version whose sleep is
    110 s, and after a restart; the next timer, armed after the migration, takes the new 110 s."""
    store = reopenable(kind, tmp_path)
    same_node: dict[str, Any] = {"node_id": "n1"} if kind == "postgres" else {}
    old_fp, new_fp = wfsub.compile(OLD).fingerprint, wfsub.compile(NEW).fingerprint
    clock = VirtualClock(start=T0)
    async with Substrate(store=store(), clock=clock, workflows={"w": OLD}, **same_node) as sub:
        await sub.new_case("w", {}, case_id="c")
        await clock.advance(0)
        status = sub.status("c")
        assert [t.due for t in status.timers] == [T0 + 100]
        assert (status.version, status.migrated_from) == (old_fp, None)
    clock = VirtualClock(start=T0 + 10)
    async with Substrate(store=store(), clock=clock, workflows={"w": NEW}, **same_node) as sub:
        await eventually(lambda: migrated(sub))
        await clock.advance(0)
        status = sub.status("c")
        assert [t.due for t in status.timers] == [T0 + 100], "the armed timer kept its due time"
        assert (status.version, status.migrated_from) == (new_fp, old_fp)
        [version] = [r for r in await sub.journal("c") if r.kind == "version"]
        assert (field(version, "from"), field(version, "to")) == (old_fp, new_fp)
        assert field(version, "timers") == {str(status.timers[0].timer_id): T0 + 100}
    clock = VirtualClock(start=T0 + 20)
    async with Substrate(store=store(), clock=clock, workflows={"w": NEW}, **same_node) as sub:
        await clock.advance(0)
        status = sub.status("c")
        assert [t.due for t in status.timers] == [T0 + 100], "kept across a restart"
        assert (status.version, status.migrated_from) == (new_fp, old_fp)
        await clock.advance(80)  # T0+100: the first timer fires; the second is armed on the new version
        await eventually(lambda: [t.due for t in sub.status("c").timers] == [T0 + 100 + 110])
        await clock.advance(110)
        assert await sub.await_case("c", timeout=60) == {"woke": True}
        journal = await sub.journal("c")
        assert sub.status("c").migrated_from == old_fp
    assert kinds(journal) == ["start", "version", "timer", "timer", "end"]
    assert [r.time for r in journal if r.kind == "timer"] == [T0 + 100, T0 + 210]
    report = wfsub.replay(NEW, journal)  # offline: the version record's due times hold in replay too
    assert report.divergence is None and report.state == "done"


async def test_a_restart_that_replays_the_whole_journal_keeps_the_pinned_due_time(tmp_path: Path) -> None:
    """With the snapshot the migration wrote gone, the journal's `version` record alone pins the due time."""
    import sqlite3
    from contextlib import closing

    path = tmp_path / "cases.db"
    clock = VirtualClock(start=T0)
    async with Substrate(store=str(path), clock=clock, workflows={"w": OLD}) as sub:
        await sub.new_case("w", {}, case_id="c")
        await clock.advance(0)
    async with Substrate(store=str(path), clock=clock, workflows={"w": NEW}) as sub:
        await eventually(lambda: migrated(sub))
    with closing(sqlite3.connect(path)) as conn, conn:
        conn.execute("DELETE FROM snapshots")
    clock = VirtualClock(start=T0 + 100)  # the timer is due: the case is rebuilt from its journal and it fires
    async with Substrate(store=str(path), clock=clock, workflows={"w": NEW}) as sub:
        await clock.advance(0)
        await eventually(lambda: [t.due for t in sub.status("c").timers] == [T0 + 100 + 110])
        assert [r.time for r in await sub.journal("c") if r.kind == "timer"] == [T0 + 100]

"""After `pause_schedule` returns, no new slot of that schedule starts, on any node: a slot read as due before the
pause committed is refused in the transaction that would start its case (on Postgres the pause waits for a start
already in that transaction). On Memory, SQLite and Postgres (the pause sent through another node)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from wfsub import Queue, Schedule, Substrate
from wfsub.stores import MemoryStore, SqliteStore
from wfsub.testing import VirtualClock

from .test_schedules import WORKFLOWS, scheduled

T0 = 1_800_000_000.0  # a multiple of 60: the schedule's next slot is T0 + 60


def held(base: type[Any]) -> type[Any]:
    """`base` (a store class) whose next read of the schedules, armed by `hold`, returns only once `release` is
    set, after telling `read`: the schedule loop then goes on with what it read before (a slot that was due)."""

    class Held(base):  # type: ignore[misc, valid-type]
        armed = False
        read = anyio.Event()
        release = anyio.Event()

        def hold(self) -> None:
            self.armed, self.read, self.release = True, anyio.Event(), anyio.Event()

        async def schedules(self) -> Any:
            rows = await super().schedules()
            if self.armed:
                self.armed = False
                self.read.set()
                await self.release.wait()
            return rows

    return Held


def stores(kind: str, tmp_path: Path) -> tuple[Any, Any]:
    """The held store the schedule runs on, and a store for a second Substrate on the same place (Postgres: a
    second node; elsewhere the same Substrate pauses)."""
    if kind == "memory":
        return held(MemoryStore)(), None
    if kind == "sqlite":
        return held(SqliteStore)(str(tmp_path / "cases.db")), None
    from wfsub.stores import PostgresStore

    from ..stores import _pg

    if not _pg.ENABLED:
        pytest.skip(_pg.SKIP_REASON)
    dsn, schema = _pg.database_dsn(), _pg.new_schema()
    return held(PostgresStore)(dsn, schema=schema), PostgresStore(dsn, schema=schema)


@pytest.mark.parametrize("queue", [None, "q"])
@pytest.mark.parametrize("kind", ["memory", "sqlite", "postgres"])
async def test_a_slot_read_before_a_pause_does_not_start_after_it_returned(
    kind: str, queue: str | None, tmp_path: Path
) -> None:
    """The schedule loop reads its row (not paused) at a slot; pause_schedule commits and returns (Postgres: on
    another node); the loop then goes on to start the slot: nothing starts (nor queues), the slot is let go, and
    after resume_schedule the next slot starts."""
    store, other = stores(kind, tmp_path)
    clock, other_clock = VirtualClock(start=T0), VirtualClock(start=T0)
    options: dict[str, Any] = {"workflows": WORKFLOWS, "schedules": [Schedule("tick", "job", every=60, queue=queue)],
                               "queues": {"q": Queue()}}
    async with Substrate(store=store, clock=clock, node_id="a", **options) as sub:
        pauser = Substrate(store=other, clock=other_clock, node_id="b", **options) if other is not None else None
        if pauser is not None:
            await pauser.__aenter__()
        try:
            await clock.advance(0)  # registered
            store.hold()
            async with anyio.create_task_group() as tg:
                tg.start_soon(clock.advance, 60)  # the slot T0 + 60 comes due: the loop reads the row, held
                with anyio.fail_after(30):
                    await store.read.wait()
                await (pauser or sub).pause_schedule("tick")
                store.release.set()
            assert scheduled(sub, "tick") == []
            listed = {s.name: s for s in await sub.schedules()}
            assert listed["tick"].paused and listed["tick"].last_slot == T0 + 60
            await (pauser or sub).resume_schedule("tick")
            await clock.advance(60)
            assert scheduled(sub, "tick") == ["tick@2027-01-15T08:02:00Z"]
        finally:
            if pauser is not None:
                await pauser.__aexit__(None, None, None)

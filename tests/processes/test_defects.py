"""Defects of processes sharing a store, each pinned: a standby's takeover uses a connection of its own (the event
loop polls the watch connection meanwhile); two concurrent `placement="any"` starts with one case id in one
Substrate write one start (the second joins the first)."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio
import pytest

from wfsub import CaseExists, Substrate, seq, task, wait
from wfsub._store import CaseWrite
from wfsub.stores import PostgresStore, SqliteStore

from ..stores import _pg


class ThreadsSeen:
    """The watch connection of a store, wrapped: which threads ran a statement on it (it forwards every call)."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.threads: set[int] = set()

    def execute(self, *args: Any) -> Any:
        self.threads.add(threading.get_ident())
        return self.conn.execute(*args)

    def __getattr__(self, name: str) -> Any:
        self.threads.add(threading.get_ident())
        return getattr(self.conn, name)


async def test_a_standby_takeover_leaves_the_watch_connection_to_the_event_loop(tmp_path: Path) -> None:
    """Taking ownership runs on a worker thread with a connection of its own: the watch connection, which the
    event loop polls, is only ever used by the loop's thread."""
    path = tmp_path / "cases.db"
    owner, standby = SqliteStore(path), SqliteStore(path)
    await owner.open(owner=True, owner_id="first")
    await standby.open(owner=False, owner_id="second")
    try:
        seen = ThreadsSeen(standby._watch)
        standby._watch = seen  # type: ignore[assignment]
        assert not await standby.take_ownership("second")  # the owner holds the file
        await owner.close()
        taken = False
        with anyio.fail_after(30):
            while not taken:
                standby.changed()  # the loop polls meanwhile, as a standby's watcher does
                taken = await standby.take_ownership("second")
        standby.changed()
        assert seen.threads == {threading.get_ident()}, "the takeover used the watch connection on another thread"
        assert (await standby.owner()).owner_id == "second"  # type: ignore[union-attr]
    finally:
        await standby.close()
        await owner.close()


def done(ctx: Mapping[str, Any]) -> dict[str, Any]:
    return {"done": True}


FLOW = seq(wait("go"), task(done))


class CountedStarts(PostgresStore):
    """A Postgres store that counts the queued starts it is asked to write."""

    queued = 0

    async def queue_case(self, change: CaseWrite) -> None:
        CountedStarts.queued += 1
        await super().queue_case(change)


@pytest.mark.skipif(not _pg.ENABLED, reason=_pg.SKIP_REASON)
@pytest.mark.parametrize("same_data", [True, False])
async def test_two_concurrent_any_placement_starts_with_one_id_write_one_start(same_data: bool) -> None:
    """Two `placement="any"` starts of one case id at once: the second waits for the first and answers from it
    (the same case, or CaseExists naming the data that differs); only one start is written."""
    CountedStarts.queued = 0
    store = CountedStarts(_pg.database_dsn(), schema=_pg.new_schema())
    async with Substrate(store=store, workflows={"w": FLOW}, node_id="n1") as sub:
        outcomes: list[object] = [None, None]

        async def start(i: int, data: dict[str, Any]) -> None:
            try:
                outcomes[i] = (await sub.new_case("w", data, case_id="x", placement="any")).case_id
            except CaseExists as exc:
                outcomes[i] = exc

        async with anyio.create_task_group() as tg:
            tg.start_soon(start, 0, {"n": 1})
            tg.start_soon(start, 1, {"n": 1 if same_data else 2})
        assert CountedStarts.queued == 1
        if same_data:
            assert outcomes == ["x", "x"]
        else:
            assert outcomes[0] == "x" and isinstance(outcomes[1], CaseExists), outcomes
            assert "keys that differ: 'n'" in str(outcomes[1])
        journal = await sub.journal("x")
        assert [r.kind for r in journal] == ["start"] and journal[0].model_extra["data"] == {"n": 1}  # type: ignore[index]

"""A region operation a durable case refuses (its region is not active when the operation is taken) is never
journaled, and its sender hears why, through the API and the inbox alike. MemoryStore, SQLite and Postgres."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio
import pytest

from wfsub import SignalRejected, Substrate, scope, seq, task, wait
from wfsub.stores import SqliteStore

from ._util import kinds, outside
from ._util import same_store as reopenable


def _noted(ctx: Mapping[str, Any]) -> dict[str, Any]:
    return {"region_cancelled": True}


FLOWS = {"w": seq(wait("a"), scope("R", wait("b"), on_cancel=task(_noted)))}




@pytest.mark.parametrize("kind", ["memory", "sqlite", "postgres"])
async def test_a_refused_region_operation_is_not_journaled(kind: str, tmp_path: Path) -> None:
    """cancel_region of a region not entered yet raises, writes nothing, and the case goes on as before (also
    after a restart, replaying its journal)."""
    store = reopenable(kind, tmp_path)
    same_node: dict[str, Any] = {"node_id": "n1"} if kind == "postgres" else {}
    async with Substrate(store=store(), workflows=FLOWS, **same_node) as sub:
        handle = await sub.new_case("w", {}, case_id="c")
        with anyio.fail_after(10):
            while handle.status().state != "waiting_signal":  # noqa: ASYNC110 - polling the public status
                await anyio.sleep(0.01)
        with pytest.raises(SignalRejected, match="region 'R' is not active now"):
            await sub.cancel_region("c", "R")
        assert kinds(await sub.journal("c")) == ["start"]
    async with Substrate(store=store(), workflows=FLOWS, **same_node) as sub:
        await sub.signal("c", "a")
        await sub.cancel_region("c", "R")
        assert await sub.await_case("c", timeout=10) == {"a": None, "region_cancelled": True}
        assert kinds(await sub.journal("c")) == ["start", "signal", "cancel_region", "end"]


async def test_a_region_operation_the_owner_refuses_from_the_inbox_is_marked_not_journaled(tmp_path: Path) -> None:
    """Queued in the inbox before the case reached its region: the cancel is refused when the owner takes it, its
    inbox row says why, and nothing is journaled for it (the command reports that)."""
    path = tmp_path / "cases.db"
    async with Substrate(store=path, workflows=FLOWS) as sub:
        handle = await sub.new_case("w", {}, case_id="c")
        with anyio.fail_after(10):
            while handle.status().state != "waiting_signal":  # noqa: ASYNC110 - polling the public status
                await anyio.sleep(0.01)
    async with outside(SqliteStore(path)) as cli:
        # (not queued behind the signal into R: the case may run on into R between taking the two)
        region = await cli.inbox_put("c", "cancel_region", {"region": "R"}, request_id=None, created_at=0.0)
    async with Substrate(store=path, workflows=FLOWS) as sub:
        async with outside(SqliteStore(path)) as cli:
            with anyio.fail_after(10):
                while (row := await cli.inbox_row(region)) is not None and row.refused is None:  # noqa: ASYNC110
                    await anyio.sleep(0.02)
        assert row is not None and row.refused is not None and "region 'R' is not active now" in row.refused
        assert kinds(await sub.journal("c")) == ["start"]
        await sub.signal("c", "a")
        await sub.cancel_region("c", "R")  # entered now: taken
        assert await sub.await_case("c", timeout=10) == {"a": None, "region_cancelled": True}

"""What an endless case remembers of the request ids it took stays bounded: a compaction keeps the ids of the latest
`REQUEST_IDS_KEPT` inputs (oldest dropped first) in its snapshot record and in the owner's memory, a retry of an id
in that window is still a retry through every door (after a restart too), and one that left it is a new input."""

from __future__ import annotations

from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import anyio
import pytest

from wfsub import Client, Substrate, loop, seq, task, wait
from wfsub._runtime import _request_ids
from wfsub._runtime._request_ids import kept_kinds, window

from ._util import eventually, same_store

KEPT = 300  # the window the test runs with (the real one, 10,000, takes longer to fill than a test should)
SIGNALS = 10_000
SENDERS = 4
COMPACT_AFTER = 20


RETRY = 10**9  # the payload of a retried signal: were it applied again, `total` could never come back below it


def _count(ctx: Any) -> dict[str, Any]:
    return {"n": ctx.get("n", 0) + 1, "total": ctx.get("total", 0) + ctx["item"]}


ENDLESS = {"cart": loop(seq(wait("add", into="item"), task(_count)), while_=lambda d: True)}


def _node(kind: str) -> dict[str, Any]:
    return {"node_id": "n1"} if kind == "postgres" else {}


async def _snapshot_ids(sub: Substrate) -> dict[str, str | None]:
    """The request ids the case's `snapshot` record keeps (empty: not compacted yet)."""
    journal = await sub.journal("c")
    first = journal[0]
    return kept_kinds((first.model_extra or {}).get("state")) if first.kind == "snapshot" else {}


def test_the_window_keeps_the_latest_ids_in_the_order_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    """`window` keeps the last REQUEST_IDS_KEPT ids of an index in the order taken (not sorted), all of a smaller
    one; old snapshots (a sorted dict, a bare list) still load."""
    monkeypatch.setattr(_request_ids, "REQUEST_IDS_KEPT", 3)
    taken = {"z": "signal", "a": "update", "m": "cancel", "b": "signal", "y": None}
    assert list(window(taken).items()) == [("m", "cancel"), ("b", "signal"), ("y", None)]
    assert window({"a": "signal"}) == {"a": "signal"}
    assert kept_kinds({"request_ids": {"a": "signal", "b": "update"}}) == {"a": "signal", "b": "update"}
    assert kept_kinds({"request_ids": ["a", "b"]}) == {"a": None, "b": None}


@pytest.mark.parametrize(("kind", "signals"), [("memory", SIGNALS), ("sqlite", 10_000), ("postgres", 2_000)])
async def test_an_endless_case_keeps_a_bounded_window_of_request_ids(
    kind: str, signals: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A case compacted every 20 records takes 10,000 signals with ids from 4 senders (fewer on the durable stores
    to keep the suite quick: still tens of windows): its snapshot record never keeps more than the window's ids,
    nor its owner more than the window and one journal's; a retry of a recent id is still a retry (at its owner,
    after a restart, through a Client), one of an id that left the window is a new input."""
    monkeypatch.setattr(_request_ids, "REQUEST_IDS_KEPT", KEPT)
    store = same_store(kind, tmp_path)
    widest_snapshot = widest_memory = 0
    async with Substrate(store=store(), workflows=ENDLESS, compact_after=COMPACT_AFTER, **_node(kind)) as sub:
        await sub.new_case("cart", {}, case_id="c")

        def held() -> dict[str, str | None]:
            journal = sub._cases["c"].journal
            assert journal is not None
            return journal.request_ids

        async def sender(k: int) -> None:
            nonlocal widest_snapshot, widest_memory
            for i in range(k, signals, SENDERS):
                await sub.signal("c", "add", 0, request_id=f"s{i}")
                widest_memory = max(widest_memory, len(held()))
                if k == 0 and i % (SENDERS * 100) == 0:
                    widest_snapshot = max(widest_snapshot, len(await _snapshot_ids(sub)))

        async with anyio.create_task_group() as tg:
            for k in range(SENDERS):
                tg.start_soon(sender, k)
        await eventually(lambda: sub.data("c").get("n") == signals)
        kept = await _snapshot_ids(sub)
        widest_snapshot = max(widest_snapshot, len(kept))
        assert 0 < widest_snapshot <= KEPT, widest_snapshot
        # the window and the records since the last compaction (at most compact_after and one commit's inputs)
        assert widest_memory <= KEPT + COMPACT_AFTER + SENDERS + 1, widest_memory
        assert f"s{signals - 1}" in held() and "s0" not in kept and "s0" not in held()

        # inputs apply in order: once the new one after a retry is counted, a retry applied again would be too
        await sub.signal("c", "add", RETRY, request_id=f"s{signals - 1}")  # recent: a retry, applied once
        await sub.signal("c", "add", 1, request_id="s0")  # left the window: a new input
        await eventually(lambda: sub.data("c")["total"] in (1, RETRY + 1))
        assert (sub.data("c")["n"], sub.data("c")["total"]) == (signals + 1, 1)

    async with AsyncExitStack() as stack:
        sub = await stack.enter_async_context(
            Substrate(store=store(), workflows=ENDLESS, compact_after=COMPACT_AFTER, **_node(kind))
        )
        await sub.signal("c", "add", RETRY, request_id=f"s{signals - 2}")  # recovered from its snapshot: a retry
        await sub.signal("c", "add", 1, request_id="s1")  # still out of the window: new
        new = 2
        if kind != "memory":  # (a Client opens a store another process can reach)
            client = await stack.enter_async_context(Client(store()))
            await client.signal("c", "add", RETRY, request_id=f"s{signals - 3}")  # a retry: nothing written
            await client.signal("c", "add", 1, request_id="s2")  # new: the owner takes it from the inbox
            new = 3
        await eventually(lambda: sub.data("c")["total"] % RETRY == new)
        assert (sub.data("c")["n"], sub.data("c")["total"]) == (signals + new, new)

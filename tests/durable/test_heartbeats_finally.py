"""Heartbeats and `scope(finally_=)` on durable stores (memory, SQLite, Postgres) across a restart: an effect's
heartbeat details survive recovery (kept beside the case row, not journaled) and reach its next attempt; heartbeat
writes are throttled; a finally_ branch that was running when the Substrate stopped completes exactly once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from wfsub import Substrate, effect, effect_info, heartbeat, replay, scope, seq, task, wait
from wfsub.stores import MemoryStore
from wfsub.testing import VirtualClock

from ._util import outside
from .test_timers import reopenable

T0 = 1_800_000_000.0
KINDS = ["memory", "sqlite", "postgres"]
STATE: dict[str, Any] = {}  # the clock of the running Substrate, whether attempts hang, what the effects saw


def node(kind: str) -> dict[str, Any]:
    return {"node_id": "n1"} if kind == "postgres" else {}  # the restarted node owns its cases


async def crawl(ctx: Any) -> dict[str, Any]:
    """Crawls pages 1..3, one a second, heartbeating each; resumes after the last page its heartbeats name."""
    info = effect_info()
    STATE["seen"].append((info.attempt, info.heartbeat))
    start = (info.heartbeat or {}).get("page", 0)
    for page in range(start + 1, 4):
        heartbeat({"page": page})
        await STATE["clock"].sleep(1)
    if STATE["hang"]:
        await anyio.sleep_forever()  # the process stops here (the Substrate closes under it)
    return {"pages": 3, "resumed_from": start}


CRAWL = effect(crawl, name="crawl", heartbeat_timeout=30.0)


@pytest.mark.parametrize("kind", KINDS)
async def test_heartbeat_details_survive_a_restart_and_reach_the_next_attempt(kind: str, tmp_path: Path) -> None:
    """Heartbeats sent before a stop are kept in the store beside the case row (not in the journal); after the
    restart, status shows them and the restarted effect reads them as effect_info().heartbeat."""
    store = reopenable(kind, tmp_path)
    STATE.update(seen=[], hang=True)
    clock = STATE["clock"] = VirtualClock(start=T0)
    async with Substrate(store=store(), clock=clock, workflows={"w": CRAWL}, **node(kind)) as sub:
        await sub.new_case("w", case_id="c")
        for _ in range(3):
            await clock.advance(1)
        beat = sub.status("c").effects[0].last_heartbeat
        assert beat is not None and (beat.details, beat.at) == ({"page": 3}, T0 + 2)
        journal = await sub.journal("c")
    assert [r.kind for r in journal] == ["start"]  # heartbeats are never journaled
    async with outside(store()) as kept:
        stored = await kept.load("c")
    assert stored is not None and list(stored.heartbeats.values()) == [{"details": {"page": 3}, "at": T0 + 2,
                                                                         "attempt": 1}]
    STATE.update(hang=False)
    clock = STATE["clock"] = VirtualClock(start=T0 + 100)
    async with Substrate(store=store(), clock=clock, workflows={"w": CRAWL}, **node(kind)) as sub:
        result = await sub.await_case("c")
        journal = await sub.journal("c")
    assert result == {"pages": 3, "resumed_from": 3}
    assert STATE["seen"] == [(1, None), (1, {"page": 3})]
    assert replay(CRAWL, journal).divergence is None


class CountingStore(MemoryStore):
    """A MemoryStore that counts its heartbeat writes."""

    def __init__(self) -> None:
        super().__init__()
        self.beat_writes: list[dict[str, Any]] = []

    async def put_heartbeats(self, case_id: str, heartbeats: Any, *, epoch: int | None = None) -> None:
        self.beat_writes.append(dict(heartbeats))
        await super().put_heartbeats(case_id, heartbeats, epoch=epoch)


async def test_a_hot_heartbeat_loop_writes_at_most_once_a_second() -> None:
    """Two thousand heartbeats within one second of the case clock cost two writes: the first at once, the rest
    together at the end of the second, with the newest details."""
    store = CountingStore()
    clock = VirtualClock(start=T0)

    async def hot(ctx: Any) -> None:
        for i in range(1000):
            heartbeat(i)
        await clock.sleep(0.5)
        for i in range(1000, 2000):
            heartbeat(i)
        await clock.sleep(10)

    async with Substrate(store=store, clock=clock, workflows={"w": effect(hot)}) as sub:
        await sub.new_case("w", case_id="c")
        await clock.advance(0)
        assert [list(w.values())[0]["details"] for w in store.beat_writes] == [999]
        await clock.advance(0.5)
        assert len(store.beat_writes) == 1  # the second burst waits for the end of the first second
        await clock.advance(0.5)
        assert [list(w.values())[0]["details"] for w in store.beat_writes] == [999, 1999]
        kept = (await store.load("c"))
        assert kept is not None and list(kept.heartbeats.values()) == [{"details": 1999, "at": T0 + 0.5, "attempt": 1}]
        await clock.advance(10)
        await sub.await_case("c")
    assert len(store.beat_writes) == 2


CALLS: list[str] = []


async def release(ctx: Any) -> dict[str, Any]:
    CALLS.append("release")
    return {"released": True}


async def audit(ctx: Any) -> dict[str, Any]:
    CALLS.append("audit")
    return {"audited": True}


# The finally_ branch parks on a signal between two effects: a restart falls in the middle of it.
FINALLY = seq(
    scope("hold", wait("work"),
          finally_=seq(effect(release, name="release"), wait("resume"), effect(audit, name="audit"))),
    task(lambda c: {"after": True}, name="after"),
)


async def parked_on(sub: Substrate, signal: str) -> None:
    """Return once case "c" waits for `signal` (and nothing else): a state to wait on, not a time."""
    while (status := sub.status("c")).state != "waiting_signal" or status.signals != (signal,):  # noqa: ASYNC110
        await anyio.sleep(0.01)  # (the case runs in the background)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("how", ["ended", "cancelled"])
async def test_a_finally_running_when_the_process_stops_completes_once_after_the_restart(
    kind: str, how: str, tmp_path: Path
) -> None:
    """A finally_ stopped half-way (after the body ended, or while a cancel withdraws the body) resumes after the
    restart where it was: each of its effects runs once, and the case ends as it would have."""
    store = reopenable(kind, tmp_path)
    CALLS.clear()
    async with Substrate(store=store(), workflows={"w": FINALLY}, **node(kind)) as sub:
        handle = await sub.new_case("w", case_id="c")
        await parked_on(sub, "work")
        if how == "ended":
            await handle.signal("work", 1)
        else:
            await sub.cancel("c")
        await parked_on(sub, "resume")
    assert CALLS == ["release"]
    async with Substrate(store=store(), workflows={"w": FINALLY}, **node(kind)) as sub:
        await sub.signal("c", "resume")
        if how == "ended":
            result = await sub.await_case("c")
            assert result == {"work": 1, "released": True, "resume": None, "audited": True, "after": True}
        else:
            with pytest.raises(Exception, match="cancelled"):
                await sub.await_case("c")
            assert sub.status("c").state == "cancelled"
        journal = await sub.journal("c")
    assert CALLS == ["release", "audit"]
    assert replay(FINALLY, journal).divergence is None


async def oversized(ctx: Any) -> dict[str, Any]:
    """Heartbeats small details, then details over max_payload_bytes (catching what it raises), then returns."""
    heartbeat({"page": 1})
    try:
        heartbeat({"pages": "x" * 2_000})
    except ValueError as exc:
        return {"refused": str(exc), "path": effect_info().path}
    return {"refused": None}


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
async def test_heartbeat_details_over_max_payload_bytes_are_refused_and_not_kept(kind: str, tmp_path: Path) -> None:
    """In a durable case, heartbeat details larger than max_payload_bytes raise ValueError naming the effect, its
    node path, the size, the limit and the fix; the row keeps the previous heartbeat (without a store, no bound)."""
    store = reopenable(kind, tmp_path)
    clock = VirtualClock(start=T0)
    flow = {"w": effect(oversized, name="big")}
    async with Substrate(store=store(), clock=clock, workflows=flow, max_payload_bytes=1_000) as sub:
        await sub.new_case("w", case_id="c")
        result = await sub.await_case("c")
    refused = result["refused"]
    assert refused is not None, result
    assert f"heartbeat details of effect 'big' at {result['path']} are 2,012 bytes of JSON" in refused
    assert "more than max_payload_bytes=1,000" in refused and "raise Substrate(max_payload_bytes=...)" in refused
    async with outside(store()) as kept:
        stored = await kept.load("c")
    assert stored is not None and [b["details"] for b in stored.heartbeats.values()] in ([], [{"page": 1}])
    async with Substrate(clock=VirtualClock(start=T0), max_payload_bytes=1_000) as sub:  # kept nowhere: unbounded
        handle = await sub.new_case(effect(oversized, name="big"))
        assert (await handle.result())["refused"] is None

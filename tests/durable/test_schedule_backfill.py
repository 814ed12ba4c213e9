"""backfill_schedule(name, start, end): one case per slot of a past range, with the slot's usual id, so a repeated
or overlapping backfill starts nothing twice; bad input is refused saying what and how to fix it. On a Substrate
(no store, Memory, SQLite, Postgres), a Client and the `wfsub` command (both through the owner)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from wfsub import Schedule, Substrate
from wfsub.testing import VirtualClock

from ._util import same_store as store_maker
from .test_schedules import WORKFLOWS, scheduled

T0 = 1_800_000_000.0  # 2027-01-15T08:00:00Z, a whole hour
HOUR = 3600.0


def hourly(**options: Any) -> Schedule:
    return Schedule("hourly", "job", every=3600, data=lambda slot: {"hour": slot.hour}, **options)


@pytest.mark.parametrize("kind", ["none", "memory", "sqlite", "postgres"])
async def test_a_backfill_starts_each_past_slot_once(kind: str, tmp_path: Path) -> None:
    """Backfilling 03:00 to 07:00 starts five cases named by their slots, with the slot's data; the same backfill
    again starts nothing; an overlapping one starts only the slots it adds; a paused schedule backfills too, and a
    backfill does not move the schedule's last slot."""
    clock = VirtualClock(start=T0)
    async with Substrate(store=store_maker(kind, tmp_path)(), clock=clock, workflows=WORKFLOWS,
                         schedules=[hourly()]) as sub:
        await clock.advance(0)
        before = {s.name: s for s in await sub.schedules()}["hourly"].last_slot
        handles = await sub.backfill_schedule("hourly", T0 - 5 * HOUR, datetime(2027, 1, 15, 7, tzinfo=UTC))
        ids = [f"hourly@2027-01-15T0{h}:00:00Z" for h in range(3, 8)]
        assert [h.case_id for h in handles] == ids
        for handle, hour in zip(handles, range(3, 8), strict=True):
            assert await handle.result() == {"hour": hour, "ran": True}
        again = await sub.backfill_schedule("hourly", T0 - 5 * HOUR, T0 - HOUR)
        assert [h.case_id for h in again] == ids and scheduled(sub, "hourly") == ids
        await sub.pause_schedule("hourly")
        wider = await sub.backfill_schedule("hourly", T0 - 6.5 * HOUR, T0 - 4 * HOUR)
        assert [h.case_id for h in wider] == [f"hourly@2027-01-15T0{h}:00:00Z" for h in (2, 3, 4)]
        assert scheduled(sub, "hourly") == ["hourly@2027-01-15T02:00:00Z", *ids]
        if kind != "none":
            for case_id in ids:
                assert [r.kind for r in await sub.journal(case_id)] == ["start", "end"]
        after = {s.name: s for s in await sub.schedules()}["hourly"]
        assert after.last_slot == before and after.paused
        assert await sub.backfill_schedule("hourly", T0 - 0.5 * HOUR, T0 - 0.25 * HOUR) == []  # no slot in it


@pytest.mark.parametrize(
    ("start", "end", "error", "message"),
    [
        (T0 - HOUR, T0 - 2 * HOUR, ValueError, "end 2027-01-15T06:00:00Z is before start 2027-01-15T07:00:00Z"),
        (T0 - HOUR, T0 + HOUR, ValueError, "is after now .* past slots only"),
        (T0 + HOUR, T0 + 2 * HOUR, ValueError, "is after now"),
        (T0 - 2000 * HOUR, T0, ValueError, "more than 1000 slots .* split it into several calls"),
        (datetime(2027, 1, 15, 3), T0, TypeError, "has no time zone: pass an aware datetime"),
        ("yesterday", T0, TypeError, "start must be an aware datetime or seconds since the epoch"),
        (T0 - HOUR, float("nan"), TypeError, "end must be an aware datetime"),
    ],
)
async def test_a_bad_backfill_is_refused_saying_what_and_how_to_fix_it(
    start: Any, end: Any, error: type[Exception], message: str
) -> None:
    """An end before the start, a range reaching past now, more than 1,000 slots, a naive datetime or another type
    is refused naming the schedule, what is wrong and the fix; an unknown schedule names the configured ones."""
    clock = VirtualClock(start=T0)
    async with Substrate(clock=clock, workflows=WORKFLOWS, schedules=[hourly()]) as sub:
        with pytest.raises(error, match=message) as caught:
            await sub.backfill_schedule("hourly", start, end)
        assert "backfill_schedule('hourly')" in str(caught.value)
        with pytest.raises(ValueError, match="no schedule 'hourlyy' \\(configured: 'hourly'\\)"):
            await sub.backfill_schedule("hourlyy", T0 - HOUR, T0)
        assert scheduled(sub, "hourly") == []


async def registered(sub: Substrate) -> None:
    """Once the schedules of `sub` are in its store (a Substrate registers them as its schedule loop starts)."""
    from ._util import eventually

    async def known() -> bool:
        return all(s.last_slot is not None for s in await sub.schedules())

    await eventually(known)


def past_hours() -> tuple[float, list[str]]:
    """The start of the hour before last (wall clock), and the ids of the hourly slots from 2 h before it to it."""
    import math
    import time

    hour = math.floor(time.time() / HOUR) * HOUR - HOUR
    return hour, [f"hourly@{datetime.fromtimestamp(hour - k * HOUR, UTC):%Y-%m-%dT%H:%M:%SZ}" for k in (2, 1, 0)]


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
async def test_a_client_backfills_through_the_substrate_that_runs_the_schedule(kind: str, tmp_path: Path) -> None:
    """A Client's backfill is done by the owner, which has the schedule's data function: the slots' cases start
    with it, once each however often it is asked; a range the store's schedule refuses is refused at the Client,
    and an owner that does not run the schedule refuses it with its reason."""
    import wfsub

    make = store_maker(kind, tmp_path)
    hour, ids = past_hours()
    spec = str(tmp_path / "cases.db") if kind == "sqlite" else None
    async with Substrate(store=make(), workflows=WORKFLOWS, schedules=[hourly()], node_id="n1") as sub:
        await registered(sub)
        async with (wfsub.Client(spec) if spec else wfsub.Client(make())) as client:
            handles = await client.backfill_schedule("hourly", hour - 2 * HOUR, hour)
            assert [h.case_id for h in handles] == ids
            for handle in handles:
                assert (await handle.result())["hour"] == datetime.fromtimestamp(
                    hour - (len(ids) - 1 - handles.index(handle)) * HOUR, UTC).hour
            again = await client.backfill_schedule("hourly", hour - 2 * HOUR, hour)
            assert [h.case_id for h in again] == ids and scheduled(sub, "hourly")[:3] == ids
            for case_id in ids:
                assert [r.kind for r in await client.journal(case_id)] == ["start", "end"]
            with pytest.raises(ValueError, match="no schedule 'hourlyy' \\(configured: 'hourly'\\)"):
                await client.backfill_schedule("hourlyy", hour - HOUR, hour)
            with pytest.raises(ValueError, match="is after now"):
                await client.backfill_schedule("hourly", hour, hour + 10 * HOUR)
    async with (
        Substrate(store=make(), workflows=WORKFLOWS, node_id="n1"),  # runs no schedule
        wfsub.Client(spec) if spec else wfsub.Client(make()) as client,
    ):
        with pytest.raises(wfsub.SignalRejected, match="refused: .*no schedule 'hourly'"):
            await client.backfill_schedule("hourly", hour - 5 * HOUR, hour - 4 * HOUR)


async def test_the_command_backfills_through_the_owner(tmp_path: Path) -> None:
    """`wfsub backfill STORE NAME START END` (ISO times or seconds) has the owner start the slots' cases and prints
    their ids; a range ending before it starts is refused (status 1), a time that is neither a usage error (2)."""
    import anyio

    from ..cli.test_cli_schedules import wfsub

    db = tmp_path / "cases.db"
    hour, ids = past_hours()
    start = datetime.fromtimestamp(hour - 2 * HOUR, UTC).isoformat().replace("+00:00", "Z")
    async with Substrate(store=db, workflows=WORKFLOWS, schedules=[hourly()]) as sub:
        await registered(sub)
        code, out, err = await wfsub(tmp_path, "backfill", str(db), "hourly", start, str(hour))
        assert code == 0, err
        assert out.split() == ids and "done: the backfill of schedule 'hourly' (3 slots)" in err
        with anyio.fail_after(30):
            for case_id in ids:
                assert (await sub.await_case(case_id))["ran"] is True
        code, out, err = await wfsub(tmp_path, "backfill", str(db), "hourly", str(hour), start)
        assert code == 1 and "is before start" in err and "nothing was sent" in err
        code, out, err = await wfsub(tmp_path, "backfill", str(db), "hourly", "yesterday", start)
        assert code == 2 and "neither seconds since the epoch nor an ISO 8601 time" in err

"""Schedules: one case per slot (cron in a time zone, or every N seconds), across DST changes, outages with each
catch-up policy, restarts and two nodes; overlap, pause, resume and trigger."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

import wfsub
from wfsub import Schedule, Substrate, seq, task, wait
from wfsub.testing import VirtualClock

from ._util import same_store as store_maker

KINDS = ["memory", "sqlite", "postgres"]

ONE_STEP = seq(task(lambda c: {"ran": True}, name="run"))
WAITS = seq(wait("go"), task(lambda c: {"ran": True}, name="run"))
WORKFLOWS = {"job": ONE_STEP, "waits": WAITS}



def at(text: str) -> float:
    """Seconds since the epoch of an ISO time with a zone."""
    return datetime.fromisoformat(text).timestamp()




def node(kind: str, name: str = "n1") -> dict[str, Any]:
    return {"node_id": name} if kind == "postgres" else {}  # a restarted node owns its cases again


def scheduled(sub: Substrate, name: str) -> list[str]:
    """The ids of the cases schedule `name` started, oldest first."""
    return sorted(s.case_id for s in sub.cases(limit=10_000) if s.case_id.startswith(f"{name}@"))


# -- slots ---------------------------------------------------------------------------------------------------------


def test_cron_slots_in_berlin_fire_once_on_both_dst_days() -> None:
    """'30 2 * * *' in Europe/Berlin fires at 03:00 local on the spring-forward day and once (not twice) on the
    fall-back day; 'every=' slots are multiples of the period since the epoch."""
    daily = Schedule("daily", "job", cron="30 2 * * *", tz="Europe/Berlin")
    t, spring = at("2026-03-28T00:00:00+00:00"), []
    for _ in range(3):
        t = daily.next_after(t)
        spring.append(datetime.fromtimestamp(t, UTC).isoformat())
    assert spring == ["2026-03-28T01:30:00+00:00", "2026-03-29T01:00:00+00:00", "2026-03-30T00:30:00+00:00"]
    t, fall = at("2026-10-24T12:00:00+00:00"), []
    for _ in range(2):
        t = daily.next_after(t)
        fall.append(datetime.fromtimestamp(t, UTC).isoformat())
    assert fall == ["2026-10-25T00:30:00+00:00", "2026-10-26T01:30:00+00:00"]
    hourly = Schedule("hourly", "job", every=3600)
    assert hourly.next_after(7200.0) == 10800.0 and hourly.next_after(7199.5) == 7200.0


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({}, "exactly one of cron= and every="),
        ({"cron": "0 2 * *"}, "does not parse"),
        ({"cron": "0 2 * * *", "every": 60}, "exactly one of"),
        ({"every": 0.5}, "whole number of seconds"),
        ({"every": 60, "tz": "Mars/Olympus"}, "no time zone 'Mars/Olympus'"),
        ({"every": 60, "overlap": "queue"}, "overlap must be 'skip' or 'allow'"),
        ({"every": 60, "catchup": "some"}, "catchup must be 'latest', 'all' or 'none'"),
    ],
)
def test_a_bad_schedule_is_refused_naming_it_and_the_fix(options: dict[str, Any], message: str) -> None:
    """A Schedule with a bad field raises at construction, naming the schedule, what is wrong and how to fix it."""
    with pytest.raises(ValueError, match="Schedule\\('nightly'\\)") as caught:
        Schedule("nightly", "job", **options)
    assert message in str(caught.value)


async def test_a_schedule_of_an_unregistered_workflow_or_twice_named_is_refused() -> None:
    """Substrate(schedules=) refuses a schedule whose workflow is not registered and two schedules of one name."""
    with pytest.raises(wfsub.WorkflowNotRegistered, match="registered: job, waits"):
        Substrate(workflows=WORKFLOWS, schedules=[Schedule("s", "nope", every=60)])
    with pytest.raises(ValueError, match="two schedules named 's'"):
        Substrate(workflows=WORKFLOWS, schedules=[Schedule("s", "job", every=60), Schedule("s", "job", every=5)])
    async with Substrate(workflows=WORKFLOWS, schedules=[Schedule("s", "job", every=60)]) as sub:
        with pytest.raises(ValueError, match="no schedule 'x' \\(configured: 's'\\)"):
            await sub.pause_schedule("x")


# -- running on a store ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
async def test_a_cron_schedule_over_both_dst_changes_starts_one_case_per_local_day(kind: str, tmp_path: Path) -> None:
    """Under a VirtualClock across the spring and fall DST changes in Berlin, '30 2 * * *' starts one case per day
    with the slot's UTC time in its id, and data computed from the slot in local time."""
    daily = Schedule("daily", "job", cron="30 2 * * *", tz="Europe/Berlin",
                     data=lambda slot: {"local": slot.isoformat()})
    for season, start, days, expected in [
        ("spring", "2026-03-27T12:00:00+00:00", 3,
         ["daily@2026-03-28T01:30:00Z", "daily@2026-03-29T01:00:00Z", "daily@2026-03-30T00:30:00Z"]),
        ("fall", "2026-10-24T12:00:00+00:00", 2, ["daily@2026-10-25T00:30:00Z", "daily@2026-10-26T01:30:00Z"]),
    ]:
        (tmp_path / season).mkdir()
        store = store_maker(kind, tmp_path / season)
        clock = VirtualClock(start=at(start))
        async with Substrate(store=store(), clock=clock, workflows=WORKFLOWS, schedules=[daily], **node(kind)) as sub:
            await clock.advance(days * 86400)
            assert scheduled(sub, "daily") == expected
            for case_id in expected:
                assert await sub.await_case(case_id) == {"local": sub.data(case_id)["local"], "ran": True}
            local = {"spring": ("daily@2026-03-29T01:00:00Z", "2026-03-29T03:00:00+02:00"),
                     "fall": ("daily@2026-10-25T00:30:00Z", "2026-10-25T02:30:00+02:00")}[season]
            assert sub.data(local[0])["local"] == local[1]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("catchup", ["all", "latest", "none"])
async def test_slots_missed_over_a_three_day_outage_follow_catchup(kind: str, catchup: str, tmp_path: Path) -> None:
    """An hourly schedule that ran two slots, then saw no process for three days, starts every missed slot
    ('all'), only the newest ('latest') or none ('none') when a Substrate enters again, then goes on hourly."""
    store = store_maker(kind, tmp_path)
    hourly = Schedule("hourly", "job", every=3600, catchup=catchup)  # type: ignore[arg-type]
    t0 = at("2026-05-04T08:10:00+00:00")
    clock = VirtualClock(start=t0)
    async with Substrate(store=store(), clock=clock, workflows=WORKFLOWS, schedules=[hourly], **node(kind)) as sub:
        await clock.advance(2 * 3600)
        assert scheduled(sub, "hourly") == ["hourly@2026-05-04T09:00:00Z", "hourly@2026-05-04T10:00:00Z"]
    await clock.advance(3 * 86400)  # no process runs
    async with Substrate(store=store(), clock=clock, workflows=WORKFLOWS, schedules=[hourly], **node(kind)) as sub:
        await clock.advance(0)
        after = scheduled(sub, "hourly")[2:]
        missed = [hourly.case_id(at("2026-05-04T10:00:00+00:00") + 3600 * i) for i in range(1, 73)]
        assert missed[-1] == "hourly@2026-05-07T10:00:00Z"
        expected = {"all": missed, "latest": missed[-1:], "none": []}[catchup]
        assert after == expected
        for case_id in after:
            assert await sub.await_case(case_id) == {"ran": True}
        await clock.advance(3600)
        assert scheduled(sub, "hourly")[2:] == [*expected, "hourly@2026-05-07T11:00:00Z"]
        (listed,) = await sub.schedules()
        assert listed.last_case == "hourly@2026-05-07T11:00:00Z"
        assert listed.last_slot == at("2026-05-07T11:00:00+00:00")
        assert listed.next_slot == at("2026-05-07T12:00:00+00:00")


@pytest.mark.parametrize("kind", KINDS)
async def test_a_restart_between_slots_starts_each_slot_once(kind: str, tmp_path: Path) -> None:
    """Restarting a Substrate (same store, same schedule) many times over a span starts exactly one case per slot."""
    store = store_maker(kind, tmp_path)
    every = Schedule("tick", "job", every=60, catchup="all")
    clock = VirtualClock(start=at("2026-01-01T00:00:30+00:00"))
    for _ in range(4):
        async with Substrate(store=store(), clock=clock, workflows=WORKFLOWS, schedules=[every],
                             **node(kind)) as sub:
            await clock.advance(90)
    async with Substrate(store=store(), clock=clock, workflows=WORKFLOWS, **node(kind)) as sub:
        ids = scheduled(sub, "tick")
        for case_id in ids:
            journal = await sub.journal(case_id)
            assert [r.kind for r in journal].count("start") == 1
    assert ids == [every.case_id(at("2026-01-01T00:00:00+00:00") + 60 * i) for i in range(1, 7)]


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
@pytest.mark.parametrize("overlap", ["skip", "allow"])
async def test_overlap_skip_passes_slots_while_the_last_case_is_live(kind: str, overlap: str, tmp_path: Path) -> None:
    """With overlap='skip' slots that come due while the schedule's last case waits are passed, and the first slot
    after it ended starts a case; with 'allow' every slot starts one."""
    store = store_maker(kind, tmp_path)
    s = Schedule("w", "waits", every=60, overlap=overlap)  # type: ignore[arg-type]
    clock = VirtualClock(start=at("2026-01-01T00:00:30+00:00"))
    async with Substrate(store=store(), clock=clock, workflows=WORKFLOWS, schedules=[s]) as sub:
        await clock.advance(180)
        ids = scheduled(sub, "w")
        assert len(ids) == (1 if overlap == "skip" else 3)
        for case_id in ids:
            await sub.signal(case_id, "go")
            await sub.await_case(case_id)
        await clock.advance(60)
        assert len(scheduled(sub, "w")) == len(ids) + 1


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
async def test_pause_resume_and_trigger(kind: str, tmp_path: Path) -> None:
    """A paused schedule lets its slots pass (not caught up at resume), resumes at its next slot, and
    trigger_schedule starts a case named for now whether or not it is paused."""
    store = store_maker(kind, tmp_path)
    s = Schedule("p", "job", every=60, data={"from": "schedule"})
    clock = VirtualClock(start=at("2026-01-01T00:00:30+00:00"))
    async with Substrate(store=store(), clock=clock, workflows=WORKFLOWS, schedules=[s]) as sub:
        await clock.advance(0)
        await sub.pause_schedule("p")
        (listed,) = await sub.schedules()
        assert listed.paused and listed.next_slot == at("2026-01-01T00:01:00+00:00")
        await clock.advance(150)
        assert scheduled(sub, "p") == []
        handle = await sub.trigger_schedule("p")
        assert handle.case_id == "p@2026-01-01T00:03:00Z"
        assert await handle.result() == {"from": "schedule", "ran": True}
        await sub.resume_schedule("p")
        await clock.advance(60)
        assert scheduled(sub, "p") == ["p@2026-01-01T00:03:00Z", "p@2026-01-01T00:04:00Z"]
        (listed,) = await sub.schedules()
        assert not listed.paused and listed.last_case == "p@2026-01-01T00:04:00Z"


async def test_a_schedule_without_a_store_runs_in_memory() -> None:
    """A Substrate without a store runs its schedules on its clock (state in memory)."""
    s = Schedule("m", "job", every=10)
    clock = VirtualClock(start=5.0)
    async with Substrate(clock=clock, workflows=WORKFLOWS, schedules=[s]) as sub:
        await clock.advance(30)
        assert scheduled(sub, "m") == ["m@1970-01-01T00:00:10Z", "m@1970-01-01T00:00:20Z", "m@1970-01-01T00:00:30Z"]


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
async def test_a_schedule_dropped_from_schedules_starts_nothing_more(kind: str, tmp_path: Path) -> None:
    """A schedule no longer given to the Substrate starts no case; the cases it started stay."""
    store = store_maker(kind, tmp_path)
    s = Schedule("d", "job", every=60)
    clock = VirtualClock(start=at("2026-01-01T00:00:30+00:00"))
    async with Substrate(store=store(), clock=clock, workflows=WORKFLOWS, schedules=[s]) as sub:
        await clock.advance(60)
    async with Substrate(store=store(), clock=clock, workflows=WORKFLOWS) as sub:
        await clock.advance(600)
        assert scheduled(sub, "d") == ["d@2026-01-01T00:01:00Z"]
        assert await sub.schedules() == []


async def test_two_nodes_on_one_postgres_store_start_each_slot_once() -> None:
    """Two nodes running the same schedule on one Postgres store start exactly one case per slot (the slot's id makes
    the second start the same case), each with one `start` record."""
    from wfsub.stores import PostgresStore

    from ..stores import _pg

    if not _pg.ENABLED:
        pytest.skip(_pg.SKIP_REASON)
    dsn, schema = _pg.database_dsn(), _pg.new_schema()
    s = Schedule("both", "job", every=60, data=lambda slot: {"minute": slot.minute})
    clock = VirtualClock(start=at("2026-01-01T00:00:30+00:00"))
    async with (
        Substrate(store=PostgresStore(dsn, schema=schema), clock=clock, workflows=WORKFLOWS, schedules=[s],
                  node_id="a") as a,
        Substrate(store=PostgresStore(dsn, schema=schema), clock=clock, workflows=WORKFLOWS, schedules=[s],
                  node_id="b") as b,
    ):
        await clock.advance(600)
        ids = scheduled(a, "both")
        assert ids == [s.case_id(at("2026-01-01T00:00:00+00:00") + 60 * i) for i in range(1, 11)]
        assert scheduled(b, "both") == ids
        for case_id in ids:
            assert (await a.await_case(case_id))["ran"] is True
            assert [r.kind for r in await b.journal(case_id)] == ["start", "end"]


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
async def test_a_schedule_on_a_queue_starts_its_slots_through_it(kind: str, tmp_path: Path) -> None:
    """Schedule(queue=) queues each slot's case on that queue: with concurrency 1 and overlap='allow', the later
    slots wait `queued` behind the first until it ends; a queue the Substrate does not configure is refused."""
    store = store_maker(kind, tmp_path)
    s = Schedule("q", "waits", every=60, overlap="allow", queue="one")
    with pytest.raises(ValueError, match="no queue 'one' \\(configured: none\\)"):
        Substrate(workflows=WORKFLOWS, schedules=[s])
    clock = VirtualClock(start=at("2026-01-01T00:00:30+00:00"))
    async with Substrate(store=store(), clock=clock, workflows=WORKFLOWS, schedules=[s],
                         queues={"one": wfsub.Queue(concurrency=1)}) as sub:
        await clock.advance(150)
        first, second, third = "q@2026-01-01T00:01:00Z", "q@2026-01-01T00:02:00Z", "q@2026-01-01T00:03:00Z"
        assert sub.status(first).state == "waiting_signal"
        assert [c.case_id for c in sub.cases(state="queued")] == [third, second]  # newest first
        await sub.signal(first, "go")
        await sub.await_case(first)
        await clock.advance(30)
        assert sub.status(second).state == "waiting_signal" and sub.status(third).state == "queued"

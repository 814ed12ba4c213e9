"""Attacks where two features meet: backfill against the edges of the calendar, delete against a retried child
waiting in its queue."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import pytest

from wfsub import CaseFailed, Queue, Schedule, SignalRejected, Substrate, seq, start_case, task, wait
from wfsub.testing import VirtualClock

from ..lifecycle._util import KINDS, node, store_maker

T0 = 1_800_000_000.0  # 2027-01-15T08:00:00Z


def _job(ctx: Any) -> dict[str, Any]:
    return {"ran": True}


WORKFLOWS = {"job": seq(task(_job, name="job"))}


def schedules() -> list[Schedule]:
    return [Schedule("c", "job", cron="0 3 * * *", tz="Europe/Berlin"), Schedule("h", "job", every=3600)]


async def test_a_backfill_ending_before_a_far_future_start_is_refused_naming_the_schedule() -> None:
    """backfill_schedule with an end before a start past year 9999 is refused as any end before its start."""
    async with Substrate(clock=VirtualClock(start=T0), workflows=WORKFLOWS, schedules=schedules()) as sub:
        with pytest.raises(ValueError, match=r"backfill_schedule\('h'\)"):
            await sub.backfill_schedule("h", 1e18, 0)


async def test_a_huge_cron_backfill_reaching_before_year_one_says_split_it() -> None:
    """A cron backfill from -1e11 s (before year 1) to now holds more than 1,000 slots: refused saying to split it."""
    async with Substrate(clock=VirtualClock(start=T0), workflows=WORKFLOWS, schedules=schedules()) as sub:
        with pytest.raises(ValueError, match="more than 1000 slots"):
            await sub.backfill_schedule("c", -1e11, T0)


async def test_a_cron_backfill_in_year_one_starts_its_slots_or_is_refused_naming_the_schedule() -> None:
    """A cron backfill of 0001-01-01..03 starts the slots there or is a ValueError naming the schedule, never an
    OverflowError from the calendar library."""
    async with Substrate(clock=VirtualClock(start=T0), workflows=WORKFLOWS, schedules=schedules()) as sub:
        outcome: Any
        try:
            outcome = await sub.backfill_schedule("c", datetime(1, 1, 1, tzinfo=UTC), datetime(1, 1, 3, tzinfo=UTC))
        except ValueError as exc:
            outcome = str(exc)
        assert outcome, outcome
        assert not isinstance(outcome, str) or "backfill_schedule('c')" in outcome, outcome


async def test_a_backfilled_slot_in_an_early_year_has_the_documented_id_form() -> None:
    """A slot's case id is `{name}@YYYY-MM-DDTHH:MM:SSZ` for any year a backfill reaches (four-digit year)."""
    async with Substrate(clock=VirtualClock(start=T0), workflows=WORKFLOWS, schedules=schedules()) as sub:
        handles = await sub.backfill_schedule("h", datetime(1, 1, 1, tzinfo=UTC), datetime(1, 1, 1, 1, tzinfo=UTC))
        ids = [h.case_id for h in handles]
        assert ids and all(re.fullmatch(r"h@\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", i) for i in ids), ids


async def test_a_backfill_outside_the_times_a_slot_can_name_is_refused_naming_the_limit() -> None:
    """A backfill whose slots would reach outside years 1..9999 (or before the cron zone's local year 1) is
    refused naming the schedule and the earliest start it takes."""
    sub_schedules = [*schedules(), Schedule("ny", "job", cron="0 * * * *", tz="America/New_York")]
    async with Substrate(clock=VirtualClock(start=T0), workflows=WORKFLOWS, schedules=sub_schedules) as sub:
        with pytest.raises(ValueError, match=r"backfill_schedule\('h'\): start .*before year 1.* 0001-01-01T00:00:00Z"):
            await sub.backfill_schedule("h", -1e18, datetime(1, 1, 1, 2, tzinfo=UTC))
        with pytest.raises(ValueError, match=r"backfill_schedule\('ny'\): start .*America/New_York.*"
                                             r"0001-01-01T04:56:02Z"):
            await sub.backfill_schedule("ny", datetime(1, 1, 1, tzinfo=UTC), datetime(1, 1, 1, 6, tzinfo=UTC))
        handles = await sub.backfill_schedule("ny", datetime(1, 1, 1, 4, 56, 2, tzinfo=UTC),
                                              datetime(1, 1, 1, 6, tzinfo=UTC))
        assert [h.case_id for h in handles] == ["ny@0001-01-01T04:56:02Z", "ny@0001-01-01T05:56:02Z"]


@pytest.mark.parametrize("kind", KINDS)
async def test_deleting_a_failed_parent_whose_child_is_retried_in_its_queue_names_no_cancel(
    kind: str, tmp_path: Path
) -> None:
    """A failed parent whose waited-for child was retried and waits in a full queue: the delete's refusal says the
    child is live (retried), not that a cancel with its parent is under way (none is: the parent failed)."""
    fixed = {"ok": False}

    def step(ctx: Any) -> dict[str, Any]:
        if not fixed["ok"]:
            raise RuntimeError("boom")
        return {"done": True}

    flows = {"child": seq(task(step, name="step")), "blocker": seq(wait("go")),
             "parent": seq(start_case("child", case_id=lambda c: "kid", queue="q"))}
    async with Substrate(store=store_maker(kind, tmp_path)(), workflows=flows, queues={"q": Queue(concurrency=1)},
                         **node(kind)) as sub:
        with pytest.raises(CaseFailed):
            await (await sub.new_case("parent", {}, case_id="p")).result()
        blocker = await sub.new_case("blocker", {}, case_id="b", queue="q")
        with anyio.fail_after(30):
            while blocker.status().state != "waiting_signal":  # noqa: ASYNC110 - the blocker holds the queue
                await anyio.sleep(0.01)
        fixed["ok"] = True
        await sub.retry("kid")
        assert sub.status("kid").state == "queued"
        with pytest.raises(SignalRejected) as refused:
            await sub.delete("p")
        assert "kid" in str(refused.value)
        assert "cancel is under way" not in str(refused.value), str(refused.value)
        assert "retry re-opened" in str(refused.value), str(refused.value)
        await blocker.signal("go", {})
        with anyio.fail_after(30):
            assert await sub.await_case("kid") == {"done": True}
        await sub.delete("p")


async def test_the_command_refuses_a_backfill_ending_before_a_far_future_start(tmp_path: Path) -> None:
    """`wfsub backfill STORE h 1e18 0` is refused as an end before its start (status 1, no traceback)."""
    from ..cli.test_cli_schedules import wfsub
    from ..durable.test_schedule_backfill import registered

    db = tmp_path / "cases.db"
    async with Substrate(store=db, workflows=WORKFLOWS, schedules=[Schedule("h", "job", every=3600)]) as sub:
        await registered(sub)
    code, _, err = await wfsub(tmp_path, "backfill", str(db), "h", "1e18", "0")
    assert code == 1 and "Traceback" not in err and "is before start" in err, (code, err)

"""The schedules table of every store: the newest registration wins, a slot only moves forward, pause is kept."""

from __future__ import annotations

from wfsub._store import Store

from ._helpers import opened, twin

SPEC = {"workflow": "report", "cron": "0 2 * * *", "every": None, "tz": "UTC", "overlap": "skip",
        "catchup": "latest", "queue": None}


async def test_a_schedule_row_registers_advances_only_forward_and_pauses(store: Store) -> None:
    """register keeps the first slot and takes the newest spec; advance moves the slot forward once (a second
    advance to the same or an older slot is refused); pause and resume are kept; all survive a reopen."""
    async with opened(store) as s:
        row = await s.schedule_register("nightly", SPEC, 100.0)
        assert (row.name, row.last_slot, row.last_case, row.paused) == ("nightly", 100.0, None, False)
        assert await s.schedule_advance("nightly", 200.0, "nightly@200")
        assert not await s.schedule_advance("nightly", 200.0, "nightly@200")  # another node got there first
        assert not await s.schedule_advance("nightly", 150.0, None)
        assert await s.schedule_advance("nightly", 300.0, None)  # skipped: the last case stays
        assert not await s.schedule_advance("unknown", 300.0, None)
        assert await s.schedule_pause("nightly", True)
        assert not await s.schedule_pause("unknown", True)
        again = await s.schedule_register("nightly", {**SPEC, "cron": "0 3 * * *"}, 999.0)
        assert (again.last_slot, again.last_case, again.paused, again.spec["cron"]) == (
            300.0, "nightly@200", True, "0 3 * * *")
    async with opened(twin(store)) as s:
        (row,) = await s.schedules()
        assert (row.name, row.last_slot, row.last_case, row.paused) == ("nightly", 300.0, "nightly@200", True)
        assert row.spec == {**SPEC, "cron": "0 3 * * *"}

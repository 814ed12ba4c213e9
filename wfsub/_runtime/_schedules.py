"""Schedules: a workflow started at every slot of a cron expression or of a fixed period.

`Substrate(schedules=[Schedule("nightly", "report", cron="0 2 * * *", tz="Europe/Berlin")])`. Each slot starts
one case with the id `{name}@{slot as YYYY-MM-DDTHH:MM:SSZ}` (the slot in UTC). Starting a case with an id that
exists with the same workflow and start data returns that case, so a slot starts exactly one case across
restarts and across nodes sharing a store: every node runs every schedule it registers, and the slot's id makes
the second start a no-op. That is why `data=` is either fixed or a function of the slot only.

Decisions written down here:
- Slots. `every=seconds` (whole seconds, at least 1): the multiples of `every` since the Unix epoch, so
  `every=3600` fires on the hour, whatever time the process started. `cron=`: five fields, computed in `tz` (an
  IANA zone name, default "UTC") by cronsim (below).
- A schedule seen for the first time starts with the first slot after that moment (nothing before it is
  "missed"). The store keeps each schedule's newest slot dealt with (started, skipped or let go), its last case
  and whether it is paused; without a store they live in memory and a new Substrate starts afresh.
- Missed slots: a slot whose time passed while no process ran (found when a Substrate enters) or while this one
  was too late for it (more than one slot due at a wake-up). `catchup="latest"` (the default) starts only the
  newest of them, `"all"` starts each (the newest `MAX_CATCHUP` at most; older ones are let go with a WARNING),
  `"none"` starts none. A slot that comes due while the process runs is started at its time.
- `overlap="skip"` (the default): a slot comes due while the schedule's last case is still live (not ended) is
  skipped (logged at INFO). `"allow"` starts it anyway. The slots of one catch-up with `catchup="all"` are all
  started (catching up is what was asked for).
- `pause_schedule(name)` makes its slots pass without starting anything until `resume_schedule(name)`; the slots
  that passed meanwhile are not caught up. Once it has returned no slot of the schedule starts, on any node: the
  write that starts a slot's case (or queues it) checks in its own transaction that the schedule is not paused
  (`CaseWrite.schedule`; on Postgres under a share lock on the schedule's row, which a pause waits for), so a
  slot a node read as due before the pause committed is let go. A slot's case queued before the pause still
  starts when its queue has room (it had started: it waits only for room).
- `trigger_schedule(name)` starts a case now, with id `{name}@{now}` (two triggers in one second are one case),
  whether or not the schedule is paused; it does not count as a slot.
- `backfill_schedule(name, start, end)` starts one case per slot from `start` to `end`, both included, with the
  slot's usual id, so a repeated (or overlapping) backfill starts nothing twice, and a slot the schedule started
  itself is that case; paused or not (as a trigger), whatever `overlap` and `catchup` say, and not counted as the
  schedule's progress (its last slot stays). `start` and `end` are aware datetimes or seconds since the epoch;
  refused with ValueError: an end before the start, an end after now (past slots only: the schedule starts the
  slots from now on itself), a range of more than MAX_BACKFILL slots (split it into several calls); TypeError for
  a naive datetime or another type. A range without a slot starts nothing. A Client or `wfsub backfill` asks the
  owner through the inbox (a schedule's `data=` may be a function, which only a Substrate that configures it has).
- A schedule dropped from `schedules=` starts nothing more; its cases stay, and the store keeps its row (listed by
  `wfsub schedules STORE`).
- Two nodes may both see a slot come due while the last case is ending: one may skip it while the other starts it
  (the slot still starts at most one case). Only the owner of a store runs schedules: a standby starts running
  them when it takes ownership.

The cron library: cronsim (pure Python, no dependencies, typed), chosen over croniter, python-crontab and
cron-converter by what each does on the days clocks change, measured in Europe/Berlin: for "30 2 * * *" on the
spring-forward day cronsim fires once at 03:00 local, the instant after the gap (as Debian's cron does), and on
the fall-back day once, at the first 02:30; croniter (and python-crontab, whose schedules use croniter) fire
twice on the fall-back day; cron-converter returns a local time that does not exist on the spring day and, for
"0 * * * *", the same instant twice in spring and skips the repeated hour in autumn. For "0 * * * *" cronsim fires
every real hour: 01:00, 03:00 on the spring day, and both 02:00s on the fall day.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import anyio
from cronsim import CronSim, CronSimError
from pydantic import BaseModel, ConfigDict

from .._errors import NOTHING, CaseExists, SchedulePaused, StoreError, bad_option, unknown_name
from .._store import ScheduleRow, ScheduleTable, Store
from .._trace import get_logger
from . import _inputs as inputs

_log = get_logger("wfsub.runtime")

MAX_CATCHUP = 1000  # catchup="all": the most missed slots one catch-up starts (the newest)
MAX_BACKFILL = 1000  # backfill_schedule: the most slots one call starts (a bigger range is refused: split it)
RETRY_AFTER = 1.0  # seconds before a schedule tries again after the store failed

Overlap = Literal["skip", "allow"]
Catchup = Literal["latest", "all", "none"]


FIRST_SLOT = datetime(1, 1, 1, tzinfo=UTC).timestamp()  # the earliest time a slot id can name (0001-01-01T00:00:00Z)
LAST_SLOT = datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC).timestamp()  # and the latest (9999-12-31T23:59:59Z)


def slot_text(slot: float) -> str:
    """A slot as case ids and listings spell it: `2026-03-29T01:00:00Z`, the year always four digits (strftime
    writes year 1 as '1'). Only for a time from FIRST_SLOT to LAST_SLOT (`time_text` spells any time)."""
    moment = datetime.fromtimestamp(slot, UTC)
    return f"{moment.year:04d}{moment.strftime('-%m-%dT%H:%M:%SZ')}"


def time_text(t: float) -> str:
    """A time for a message: as a slot where a slot id can name it, else as seconds since the epoch (a date
    outside years 1..9999 cannot be written, and formatting one raises)."""
    if FIRST_SLOT <= t <= LAST_SLOT:
        return slot_text(t)
    return f"{t:g} s since the epoch ({'before year 1' if t < FIRST_SLOT else 'after year 9999'})"


@dataclass(frozen=True, slots=True, init=False)
class Schedule:
    """A workflow started at every slot of `cron=` (in `tz`) or of `every=` seconds (the docs: guide, Schedules and
    queues).

    `data`: None, a JSON mapping, or `fn(slot) -> mapping` given the slot as an aware datetime in `tz` (it must
    depend on the slot only: every node computes it, and the same slot must give the same start). `queue`: the
    queue the cases start on.
    """

    name: str
    workflow: str
    cron: str | None
    every: int | None
    data: Any
    tz: str
    overlap: Overlap
    catchup: Catchup
    queue: str | None

    def __init__(
        self,
        name: str,
        workflow: str,
        *,
        cron: str | None = None,
        every: float | None = None,
        data: Any = None,
        tz: str = "UTC",
        overlap: Overlap = "skip",
        catchup: Catchup = "latest",
        queue: str | None = None,
    ) -> None:
        owner = f"Schedule({name!r})" if isinstance(name, str) else "Schedule"
        if not isinstance(name, str) or not name or name != name.strip() or "@" in name or len(name) > 200:
            raise bad_option(owner, "name must be a visible str of at most 200 characters without '@'", name,
                             fix="its cases are named '{name}@{slot}'; pass a name like 'nightly-report'")
        inputs.check_case_id(f"{name}@{slot_text(0)}", f"{owner}: the id of each case it starts ('{{name}}@{{slot}}')",
                             fix="give the schedule a name of visible characters, like 'nightly-report'")
        if not isinstance(workflow, str) or not workflow:
            raise bad_option(owner, "workflow must be the name of a registered workflow", workflow,
                             fix="pass the name it has in Substrate(workflows={name: term})", error=TypeError)
        if (cron is None) == (every is None):
            raise bad_option(owner, "give exactly one of cron= and every=", NOTHING,
                             fix="cron='0 2 * * *' (in tz) or every=3600 (seconds)")
        zone = _zone(owner, tz)
        if cron is not None:
            _check_cron(owner, cron, zone)
        if every is not None:
            every = _whole_seconds(owner, every)
        if overlap not in ("skip", "allow"):
            raise bad_option(owner, "overlap must be 'skip' or 'allow'", overlap,
                             fix="'skip' passes a slot while the last case is live; 'allow' starts it anyway")
        if catchup not in ("latest", "all", "none"):
            raise bad_option(owner, "catchup must be 'latest', 'all' or 'none'", catchup,
                             fix="it says which slots missed while no process ran are started")
        if data is not None and not callable(data) and not isinstance(data, Mapping):
            raise bad_option(owner, "data must be None, a mapping, or a function of the slot", data,
                             fix="e.g. data=lambda slot: {'day': slot.date().isoformat()}", error=TypeError)
        if queue is not None and (not isinstance(queue, str) or not queue):
            raise bad_option(owner, "queue must be the name of a configured queue, or None", queue,
                             fix="pass a name from Substrate(queues={...})", error=TypeError)
        for attr, value in (
            ("name", name), ("workflow", workflow), ("cron", cron), ("every", every), ("data", data), ("tz", tz),
            ("overlap", overlap), ("catchup", catchup), ("queue", queue),
        ):
            object.__setattr__(self, attr, value)

    # -- slots ---------------------------------------------------------------------------------------------------

    @property
    def zone(self) -> ZoneInfo:
        return ZoneInfo(self.tz)

    @property
    def spec(self) -> dict[str, Any]:
        """What the store keeps of it (the command lists it and computes its next slot from it)."""
        return {"workflow": self.workflow, "cron": self.cron, "every": self.every, "tz": self.tz,
                "overlap": self.overlap, "catchup": self.catchup, "queue": self.queue}

    def next_after(self, t: float) -> float:
        """The first slot strictly after `t`."""
        return next_after(self.cron, self.every, self.tz, t)

    def newest(self, after: float | None, until: float, limit: int) -> tuple[list[float], bool]:
        """The newest `limit` slots in (after, until], oldest first, and whether older ones were left out."""
        found: list[float] = []
        for slot in _backwards(self.cron, self.every, self.tz, until):
            if after is not None and slot <= after:
                return found[::-1], False
            if len(found) == limit:
                return found[::-1], True
            found.append(slot)
        return found[::-1], False

    def case_id(self, slot: float) -> str:
        return f"{self.name}@{slot_text(slot)}"

    def data_for(self, slot: float) -> Any:
        if callable(self.data):
            return self.data(datetime.fromtimestamp(slot, self.zone))
        return self.data


def _check_cron(owner: str, cron: object, zone: ZoneInfo) -> None:
    """A schedule's `cron=`: five fields that parse (in its time zone)."""
    if not isinstance(cron, str):
        raise bad_option(owner, "cron must be a str of five fields", cron, fix="e.g. cron='0 2 * * *'",
                         error=TypeError)
    if len(cron.split()) > 5:  # cronsim takes a sixth field as seconds: a slot a second, not what is meant
        raise bad_option(owner, f"cron expression {cron!r} has {len(cron.split())} fields (a seconds field "
                         "is not taken)", NOTHING,
                         fix="five fields: minute hour day-of-month month day-of-week, e.g. '30 2 * * *'")
    try:
        CronSim(cron, datetime.now(zone))
    except CronSimError as exc:
        raise bad_option(owner, f"cron expression {cron!r} does not parse ({exc})", NOTHING,
                         fix="five fields: minute hour day-of-month month day-of-week, e.g. '30 2 * * *'"
                         ) from None


def _whole_seconds(owner: str, every: object) -> int:
    """A schedule's `every=`: a whole number of seconds, at least 1."""
    if (isinstance(every, bool) or not isinstance(every, int | float) or not math.isfinite(every)
            or every < 1 or every != int(every)):
        raise bad_option(owner, "every must be a whole number of seconds, at least 1", every,
                         fix="e.g. every=60 (slots are multiples of it since the epoch)")
    return int(every)


def _zone(owner: str, tz: object) -> ZoneInfo:
    if not isinstance(tz, str) or not tz:
        raise bad_option(owner, "tz must be an IANA time zone name", tz, fix="e.g. tz='Europe/Berlin'",
                         error=TypeError)
    try:
        return ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError):
        raise bad_option(owner, f"no time zone {tz!r}", NOTHING,
                         fix="pass an IANA name such as 'UTC' or 'America/New_York' (install tzdata where the "
                             "system has no zone database)") from None


def next_after(cron: str | None, every: int | None, tz: str, t: float) -> float:
    """The first slot strictly after `t` of a schedule's spec (also what `wfsub schedules` prints)."""
    if every is not None:
        return float((math.floor(t / every) + 1) * every)
    assert cron is not None
    return next(CronSim(cron, datetime.fromtimestamp(t, ZoneInfo(tz)))).timestamp()


def earliest(cron: str | None, tz: str) -> float:
    """The earliest slot a schedule can have: what a slot id can name (FIRST_SLOT) and, for cron, what cronsim can
    compute (it works in `tz`'s local time, which ends at 0001-01-01T00:00 there)."""
    if cron is None:
        return FIRST_SLOT
    return max(FIRST_SLOT, datetime(1, 1, 1, tzinfo=ZoneInfo(tz)).timestamp())


def _backwards(cron: str | None, every: int | None, tz: str, until: float) -> Iterator[float]:
    """The slots at or before `until`, newest first, down to `earliest(cron, tz)` (none before it)."""
    edge = earliest(cron, tz)
    if every is not None:
        slot = math.floor(until / every) * every
        while slot >= edge:
            yield float(slot)
            slot -= every
        return
    assert cron is not None
    if until < edge:
        return
    # cronsim walks backwards from strictly before a whole minute: step past `until` and drop what is after it
    zone = ZoneInfo(tz)
    try:
        for moment in CronSim(cron, datetime.fromtimestamp(math.floor(until) + 60, zone), reverse=True):
            at = moment.timestamp()
            if at < edge:
                return
            if at <= until:
                yield at
    except OverflowError:  # (cronsim stepped before the local 0001-01-01: there is no slot it can compute there)
        return


def moment(owner: str, name: str, value: object) -> float:
    """A time given to `backfill_schedule`: an aware datetime or seconds since the epoch, as seconds."""
    if isinstance(value, datetime):
        if value.tzinfo is None or value.utcoffset() is None:
            raise TypeError(f"{owner}: {name}={value.isoformat()!r} has no time zone: pass an aware datetime, e.g. "
                            "datetime(2026, 3, 1, tzinfo=UTC), or seconds since the epoch")
        return value.timestamp()
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise TypeError(f"{owner}: {name} must be an aware datetime or seconds since the epoch (a finite number), "
                        f"got {value!r}")
    return float(value)


def backfill_slots(
    name: str, cron: str | None, every: int | None, tz: str, start: object, end: object, now: float
) -> list[float]:
    """The slots of a schedule from `start` to `end`, both included, oldest first: what `backfill_schedule` starts
    (see the module for the refusals)."""
    owner = f"backfill_schedule({name!r})"
    first, last = moment(owner, "start", start), moment(owner, "end", end)
    if last < first:
        raise ValueError(f"{owner}: end {time_text(last)} is before start {time_text(first)}: pass start <= end")
    edge = earliest(cron, tz)
    if not edge <= last <= LAST_SLOT:
        raise _outside(owner, "end", last, edge, cron, tz)
    if last > now:
        raise ValueError(
            f"{owner}: end {slot_text(last)} is after now ({time_text(now)}): a backfill starts past slots only (the "
            "schedule starts the slots from now on itself); pass an end at or before now"
        )
    found: list[float] = []
    for slot in _backwards(cron, every, tz, last):
        if slot < first:
            break
        if len(found) == MAX_BACKFILL:
            raise ValueError(
                f"{owner}: the range {time_text(first)} to {slot_text(last)} holds more than {MAX_BACKFILL} slots "
                f"(one backfill starts at most {MAX_BACKFILL}): split it into several calls"
            )
        found.append(slot)
    else:  # the slots ran out at the edge before reaching `first`: the range starts where no slot can be
        if first < edge:
            raise _outside(owner, "start", first, edge, cron, tz)
    return found[::-1]


def _outside(owner: str, name: str, t: float, edge: float, cron: str | None, tz: str) -> ValueError:
    """A backfill's start or end outside the times a slot can have (see `earliest`): say which and the limit."""
    why = "slot ids name years 1 to 9999"
    if cron is not None and edge > FIRST_SLOT:
        why += f", and cron slots are computed in {tz} local time, which starts at 0001-01-01T00:00 there"
    return ValueError(
        f"{owner}: {name} {time_text(t)} is outside the times a slot of this schedule can have ({why}): pass "
        f"{'an' if name == 'end' else 'a'} {name} from {slot_text(edge)} to {slot_text(LAST_SLOT)}"
    )


def backfill_request(
    rows: list[ScheduleRow], name: object, start: object, end: object, now: float
) -> tuple[list[str], dict[str, Any]]:
    """What a Client (or `wfsub backfill`) asks an owner for (see the module): the ids of the slots' cases, oldest
    first, and the body of the `backfill` inbox input (the range checked against the schedule the store keeps:
    the same refusals as `backfill_schedule`)."""
    found = {row.name: row for row in rows}
    row = found.get(name) if isinstance(name, str) else None
    if row is None:
        raise unknown_name("schedule", name, found,
                           fix="name one a Substrate on this store runs (`wfsub schedules STORE` lists them)")
    spec = row.spec
    every = spec.get("every")
    slots = backfill_slots(row.name, spec.get("cron"), None if every is None else int(every), spec.get("tz") or "UTC",
                           start, end, now)
    ids = [f"{row.name}@{slot_text(slot)}" for slot in slots]
    body: dict[str, Any] = {"schedule": row.name, "start": slots[0], "end": slots[-1]} if slots else {}
    return ids, body


class ScheduleStatus(BaseModel):
    """One schedule as `Substrate.schedules()` lists it (times in seconds since the epoch)."""

    model_config = ConfigDict(frozen=True)

    name: str
    workflow: str
    cron: str | None
    every: int | None
    tz: str
    overlap: str
    catchup: str
    queue: str | None
    paused: bool
    last_slot: float | None  # the newest slot dealt with (started, skipped or let go)
    last_case: str | None  # the case it started last
    next_slot: float  # when it starts its next case (unless paused)


StartCase = Callable[[Schedule, float, str], Awaitable[object]]


class Schedules:
    """Runs a Substrate's schedules: one task per schedule, sleeping on the Substrate's clock until its next slot."""

    def __init__(
        self,
        schedules: list[Schedule],
        *,
        now: Callable[[], float],
        sleep: Callable[[float], Awaitable[None]],
        busy: Callable[[int], None],
        start: StartCase,
        live: Callable[[str], bool],
    ) -> None:
        self.by_name = {s.name: s for s in schedules}
        self.now = now
        self.sleep = sleep
        self.busy = busy
        self.start = start
        self.live = live
        self.table: Store | ScheduleTable = ScheduleTable()  # a store's table once `use(store)` says so

    def use(self, store: Store) -> None:
        self.table = store

    def get(self, name: object) -> Schedule:
        found = self.by_name.get(name) if isinstance(name, str) else None
        if found is None:
            raise unknown_name("schedule", name, self.by_name,
                               fix="name one given as Substrate(schedules=[Schedule(name, ...)])")
        return found

    async def _register(self, s: Schedule) -> ScheduleRow:
        now = self.now()
        newest, _ = s.newest(None, now, 1)
        first = newest[0] if newest else now  # a new schedule's first slot is the first after now
        table = self.table
        if isinstance(table, ScheduleTable):
            return table.register(s.name, s.spec, first)
        return await table.schedule_register(s.name, s.spec, first)

    async def _rows(self) -> dict[str, ScheduleRow]:
        table = self.table
        rows = table.rows() if isinstance(table, ScheduleTable) else await table.schedules()
        return {row.name: row for row in rows}

    async def _advance(self, s: Schedule, slot: float, case_id: str | None) -> bool:
        table = self.table
        if isinstance(table, ScheduleTable):
            return table.advance(s.name, slot, case_id)
        return await table.schedule_advance(s.name, slot, case_id)

    async def pause(self, name: str, paused: bool) -> None:
        s = self.get(name)
        table = self.table
        if isinstance(table, ScheduleTable):
            known = table.pause(s.name, paused)
        else:
            known = await table.schedule_pause(s.name, paused)
        if not known:  # not registered yet (the Substrate is still entering): register it, then pause
            await self._register(s)
            if isinstance(table, ScheduleTable):
                table.pause(s.name, paused)
            else:
                await table.schedule_pause(s.name, paused)

    async def statuses(self) -> list[ScheduleStatus]:
        rows = await self._rows()
        now = self.now()
        listed = []
        for s in self.by_name.values():
            row = rows.get(s.name)
            last = None if row is None else row.last_slot
            listed.append(ScheduleStatus(
                name=s.name, workflow=s.workflow, cron=s.cron, every=s.every, tz=s.tz, overlap=s.overlap,
                catchup=s.catchup, queue=s.queue, paused=bool(row and row.paused), last_slot=last,
                last_case=None if row is None else row.last_case,
                next_slot=s.next_after(now if last is None else max(now, last)),
            ))
        return sorted(listed, key=lambda status: status.name)

    # -- running -------------------------------------------------------------------------------------------------

    async def run(self) -> None:
        """Run every schedule until cancelled (the Substrate's task group cancels it on exit)."""
        async with anyio.create_task_group() as tg:
            for s in self.by_name.values():
                tg.start_soon(self._run_one, s)

    async def _run_one(self, s: Schedule) -> None:
        first = True
        while True:
            retry = False
            self.busy(1)
            try:
                if first:
                    await self._register(s)
                row = (await self._rows()).get(s.name)
                if row is not None:
                    await self._due(s, row, missed_only=first)
                first = False
            except StoreError as exc:
                _log.error("schedule: the store failed; trying again", schedule=s.name, error=str(exc))
                retry = True
            finally:
                self.busy(-1)
            now = self.now()
            wait = s.next_after(now) - now
            await self.sleep(min(wait, RETRY_AFTER) if retry else wait)

    async def _due(self, s: Schedule, row: ScheduleRow, *, missed_only: bool) -> None:
        """Deal with the slots in (last slot, now]: one on time is started; missed ones as `catchup` says."""
        now = self.now()
        limit = 2 if s.catchup != "all" else MAX_CATCHUP
        slots, more = s.newest(row.last_slot, now, limit)
        if not slots:
            return
        if len(slots) == 1 and not more and not missed_only:  # on time
            await self._slot(s, row, slots[0], check_overlap=True)
            return
        if s.catchup == "none" or row.paused:
            _log.info("schedule: missed slots let go (catchup='none' or paused)", schedule=s.name,
                      newest=slot_text(slots[-1]))
            await self._advance(s, slots[-1], None)
        elif s.catchup == "latest":
            await self._slot(s, row, slots[-1], check_overlap=True)
        else:
            if more:
                _log.warning("schedule: more slots were missed than one catch-up starts; the oldest are let go",
                             schedule=s.name, started=len(slots), max_catchup=MAX_CATCHUP)
            for slot in slots:
                await self._slot(s, row, slot, check_overlap=False)

    async def _slot(self, s: Schedule, row: ScheduleRow, slot: float, *, check_overlap: bool) -> None:
        if row.paused:
            await self._advance(s, slot, None)
            return
        if check_overlap and s.overlap == "skip" and row.last_case is not None and self.live(row.last_case):
            _log.info("schedule: slot skipped, the last case is still live", schedule=s.name,
                      slot=slot_text(slot), last_case=row.last_case)
            await self._advance(s, slot, None)
            return
        case_id = s.case_id(slot)
        table = self.table
        if isinstance(table, ScheduleTable) and table.paused(s.name):  # (no store: paused since the row was read;
            await self._advance(s, slot, None)  # nothing awaits between this check and the case's start)
            return
        try:
            await self.start(s, slot, case_id)
        except SchedulePaused:  # paused since the row was read: the store refused the start in its transaction
            _log.info("schedule: slot let go, the schedule was paused", schedule=s.name, slot=slot_text(slot))
            await self._advance(s, slot, None)
            return
        except CaseExists as exc:  # the same slot started with other data: data= is not a function of the slot
            _log.error("schedule: the slot's case exists with another start", schedule=s.name, error=str(exc))
        except StoreError:
            raise
        except Exception as exc:  # data= raised, a payload too large, ...: the slot is let go, the schedule goes on
            _log.error("schedule: could not start the slot's case", schedule=s.name, slot=slot_text(slot),
                       error=f"{type(exc).__name__}: {exc}")
            await self._advance(s, slot, None)
            return
        await self._advance(s, slot, case_id)


__all__ = [
    "MAX_BACKFILL",
    "Schedule",
    "ScheduleStatus",
    "Schedules",
    "backfill_request",
    "backfill_slots",
    "next_after",
    "slot_text",
]

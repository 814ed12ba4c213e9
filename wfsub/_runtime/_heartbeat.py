"""Heartbeats: an effect telling its case it is still working, and the timeout that notices when it stops.

- `wfsub.heartbeat(details=None)`, called inside an effect (its async function, a task it awaits, or a worker
  thread it awaits, such as `anyio.to_thread.run_sync`: the call is handed to the event loop), records
  `details` (JSON: dicts, lists, str, numbers, bool, None; copied as JSON when called, so later changes to the
  object do not show) and the time, on the case's clock. Outside an effect it raises `RuntimeError`. In a durable
  case the details are bounded by the Substrate's `max_payload_bytes`, as every payload it keeps is: larger
  details raise `ValueError` (naming the effect, its node path, the size and the limit) and are not kept (the
  previous heartbeat stands, and the call does not count as a heartbeat for `heartbeat_timeout`).
- `effect(..., heartbeat_timeout=seconds)`: each attempt is watched on the case's clock; an attempt that goes that
  long without a heartbeat (counted from the attempt's start, then from each heartbeat) is cancelled and fails with
  `HeartbeatTimeout`, and the effect's retry policy decides what follows, as for any failed attempt.
- `effect_info().heartbeat` is the details of the newest heartbeat sent before the current attempt started (by an
  earlier attempt, in this process or before a restart); None when there was none.
- `status().effects[i].last_heartbeat` is the newest heartbeat of that effect in flight (`details`, `at`,
  `attempt`), or None.

A durable case keeps the newest heartbeat of each of its in-flight effects beside its case row
(`Store.put_heartbeats`), never in the journal: a replay does not read them, and a recovered effect's first attempt
gets them as `effect_info().heartbeat`. Writes are throttled per case, by the case's clock: a heartbeat that comes
`WRITE_EVERY` seconds or more after the case's last heartbeat write is written at once; one that comes sooner is
written at the end of that window, together with every other heartbeat of the case that came meanwhile (the newest
of each effect). So a hot loop calling `heartbeat()` costs one small write a second, and a crash loses at most the
heartbeats of the last second.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio
import anyio.from_thread
import anyio.lowlevel

from .._errors import HeartbeatTimeout, StoreError, heartbeat_not_json, heartbeat_too_large
from .._json import decode, encode, journaled, output_problem
from .._trace import get_logger
from ._clock import Clock

if TYPE_CHECKING:
    from ._case import CaseActor

_log = get_logger("wfsub.runtime")

WRITE_EVERY = 1.0
"""Seconds of the case clock between two heartbeat writes of one durable case (see the module docstring)."""


@dataclass(slots=True, eq=False)
class Beats:
    """The heartbeats of one effect in flight, across its attempts."""

    clock: Clock
    details: Any = None  # of the newest heartbeat
    at: float | None = None  # when the newest heartbeat came (None: none yet)
    attempt: int = 0  # the attempt that sent it
    since: float = 0.0  # the heartbeat timeout counts from here: the attempt's start or its newest heartbeat
    current: int = 0  # the attempt running now
    on_beat: Callable[[], None] | None = None  # a durable case persists it
    thread: int | None = None  # the event loop's thread (a heartbeat from another thread is handed to it)
    token: Any = None  # the event loop, for that hand-over
    limit: int | None = None  # a durable case's max_payload_bytes: the details are kept beside its row

    def start_attempt(self, attempt: int) -> Any:
        """An attempt starts now: its heartbeat timeout counts from here; returns what `effect_info().heartbeat`
        shows it (the newest details sent before it)."""
        self.current = attempt
        self.since = self.clock.now()
        self.thread, self.token = threading.get_ident(), anyio.lowlevel.current_token()
        return self.details

    def beat(self, name: str, path: str, details: Any) -> None:
        """Record a heartbeat; from a worker thread (a blocking job the effect runs in `anyio.to_thread` or
        `asyncio.to_thread`), it is handed to the event loop, which owns the clock, the timeout and the writes."""
        if self.thread is not None and threading.get_ident() != self.thread:
            anyio.from_thread.run_sync(self._beat, name, path, details, token=self.token)
        else:
            self._beat(name, path, details)

    def _beat(self, name: str, path: str, details: Any) -> None:
        if details is None:
            copy = None
        else:
            found = journaled(details)
            if found is None:
                problem = output_problem(details, "details")
                if problem is not None:
                    raise heartbeat_not_json(name, path, problem)
                text = encode(details)
                copy, size = decode(text), len(text.encode())  # (a tuple: JSON, but not as itself)
            else:
                copy, size = found
            if self.limit is not None and size > self.limit:
                raise heartbeat_too_large(name, path, size, self.limit)
        self.details = copy
        self.at = self.since = self.clock.now()
        self.attempt = self.current
        if self.on_beat is not None:
            self.on_beat()

    def stored(self) -> dict[str, Any]:
        return {"details": self.details, "at": self.at, "attempt": self.attempt}

    @classmethod
    def recovered(cls, clock: Clock, kept: Any) -> Beats:
        """The heartbeats of an effect as its case row kept them (or none)."""
        beats = cls(clock)
        if isinstance(kept, dict) and isinstance(kept.get("at"), int | float):
            beats.details, beats.at = kept.get("details"), float(kept["at"])
            attempt = kept.get("attempt")
            beats.attempt = attempt if isinstance(attempt, int) else 0
        return beats


async def watched(
    attempt: Callable[[], Awaitable[Any]],
    beats: Beats,
    limit: float,
    *,
    name: str,
    path: str,
    starting: Callable[[int], None] | None = None,
) -> Any:
    """Run one attempt under its heartbeat timeout: a watchdog beside it, on the case clock, cancels it once
    `limit` seconds pass without a heartbeat; it then fails with HeartbeatTimeout. Anything else the attempt
    raises or returns passes through unchanged (a cancellation from outside included)."""
    clock = beats.clock
    scope = anyio.CancelScope()
    expired = started = ending = False  # (the watchdog fired; it ran; the attempt is over, its outcome not posted)

    async def watchdog() -> None:
        nonlocal expired, started
        started = True
        if starting is not None:
            starting(-1)
        while True:
            left = beats.since + limit - clock.now()
            if left <= 0:
                expired = True
                scope.cancel()
                return
            await clock.sleep(left)

    caught: BaseException | None = None
    output: Any = None
    try:
        async with anyio.create_task_group() as tg:
            if starting is not None:
                starting(1)  # counted busy until it runs: a VirtualClock must not move time past it unseen
            tg.start_soon(watchdog)
            with scope:
                try:
                    output = await attempt()
                except anyio.get_cancelled_exc_class():
                    raise
                except BaseException as exc:  # carried out of the task group as it is (not in an ExceptionGroup)
                    caught = exc
            tg.cancel_scope.cancel()
            if starting is not None:  # the attempt is over: busy until its outcome is posted (the watchdog's
                starting(1)  # exit takes event-loop rounds a VirtualClock would otherwise count as idle)
                ending = True
    finally:
        if starting is not None:
            if ending:
                starting(-1)
            if not started:
                starting(-1)  # cancelled before it ever ran (asyncio then never starts its body)
    if caught is not None:
        raise caught
    if expired and scope.cancelled_caught:
        raise _timed_out(name, path, limit, beats)
    return output


def _timed_out(name: str, path: str, limit: float, beats: Beats) -> HeartbeatTimeout:
    """The failure of an attempt that sent no heartbeat for `limit` seconds (with its last details, if any)."""
    details = beats.details if beats.attempt == beats.current and beats.at is not None else None
    return HeartbeatTimeout(name, path, limit, beats.current, details)


# -- keeping heartbeats beside the case row ----------------------------------------------------------------------


@dataclass(slots=True, eq=False)
class BeatWriter:
    """The throttled heartbeat writes of one durable case (see the module docstring)."""

    last: float = -math.inf  # the clock time of the last write started
    pending: bool = False  # a write waits for the end of the window


def note_beat(actor: CaseActor) -> None:
    """An effect of a durable case sent a heartbeat: write the case's heartbeats now, or at the window's end."""
    j = actor.journal
    start_soon = actor.shared.start_soon
    if j is None:
        return
    writer = actor.beat_writer
    if writer is None:
        writer = actor.beat_writer = BeatWriter()
    if writer.pending:
        return  # the write at the end of the window takes this one too
    clock = actor.shared.clock
    wait = writer.last + WRITE_EVERY - clock.now()
    writer.pending = True
    shared = actor.shared
    shared.busy += 1

    async def write() -> None:
        try:
            if wait > 0:
                shared.busy -= 1  # waiting on the clock is idle: a VirtualClock may move time meanwhile
                try:
                    await clock.sleep(wait)
                finally:
                    shared.busy += 1
            writer.pending = False
            writer.last = clock.now()
            beats = {str(eid): b.stored() for eid, b in actor.beats.items() if b.at is not None}
            await j.store.put_heartbeats(actor.case_id, beats, epoch=j.epoch)
        except StoreError as exc:
            _log.warning("could not record an effect's heartbeat", case_id=actor.case_id, error=str(exc))
        finally:
            writer.pending = False
            shared.busy -= 1

    start_soon(write)

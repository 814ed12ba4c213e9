"""The runtime's public read models: a case's state and status, and the Substrate's statistics."""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict


class CaseState(StrEnum):
    """Where a case is in its life. The last three are final."""

    INITIALIZING = "initializing"  # registered, its actor has not run yet
    QUEUED = "queued"  # started on a queue (new_case(queue=)): waits for room; no journal yet
    RUNNING = "running"  # the actor is running vm bursts
    WAITING_EFFECT = "waiting_effect"  # parked; at least one effect is in flight
    WAITING_SIGNAL = "waiting_signal"  # parked; no effect in flight, tokens wait on signals (or region inputs)
    WAITING_TIMER = "waiting_timer"  # parked; only timers can wake it
    SUSPENDED = "suspended"  # durable: no registered version can run it (see suspended_reason); still cancellable
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def ended(self) -> bool:
        return self in _FINAL

    @property
    def parked(self) -> bool:
        """Waiting for a signal or a timer, nothing in flight: a case that may be evicted or left in the store."""
        return self in _PARKED


_FINAL = frozenset({CaseState.DONE, CaseState.FAILED, CaseState.CANCELLED})
FINAL = _FINAL  # `state in FINAL` where it is read per case: an enum property costs a Python call
_PARKED = frozenset({CaseState.WAITING_SIGNAL, CaseState.WAITING_TIMER})


class Heartbeat(BaseModel):
    """An effect's newest heartbeat: its details (JSON), when it came (the Substrate clock's seconds), and the
    attempt that sent it."""

    model_config = ConfigDict(frozen=True)

    details: Any = None
    at: float
    attempt: int = 1


class EffectStatus(BaseModel):
    """An effect in flight: which, where, its attempt (1 for the first) and when that attempt started; while it
    waits out a retry's backoff, `retry_at` is when the next attempt starts."""

    model_config = ConfigDict(frozen=True)

    effect_id: int
    name: str
    path: str
    attempt: int = 1
    started_at: float | None = None
    retry_at: float | None = None
    last_heartbeat: Heartbeat | None = None  # the newest `wfsub.heartbeat()` of the effect (any attempt), or None


class TimerStatus(BaseModel):
    """An armed timer: where, and when it falls due (seconds of the Substrate's clock)."""

    model_config = ConfigDict(frozen=True)

    timer_id: int
    path: str
    due: float


class RefusedInput(BaseModel):
    """An input sent through the store's inbox (the `wfsub` command, a `Client`, a standby) that the case's owner
    refused, or a buffered signal or update that a wait's `check=` refused when it took it: its kind (`signal`,
    `update`, `cancel`, `cancel_region`, ...), the signal or region it named, why, when it was sent (seconds of the
    sender's clock; for a check's refusal, when the wait took it) and its `request_id`."""

    model_config = ConfigDict(frozen=True)

    kind: str
    name: str | None = None
    reason: str
    time: float
    request_id: str | None = None


class Failure(BaseModel):
    """Why a case failed: the error's type and message, the node path, its traceback, what was compensated."""

    model_config = ConfigDict(frozen=True)

    type: str
    message: str
    path: str
    traceback: str | None = None
    compensated: tuple[str, ...] = ()


class CaseStatus(BaseModel):
    """A snapshot of one case, as `Substrate.status(case_id)` returns it.

    Times are in seconds of the Substrate's clock (`time.time()` for the real clock). For a durable case of an
    earlier run that is not loaded, the fields are as the store last recorded them.
    """

    model_config = ConfigDict(frozen=True)

    case_id: str
    state: CaseState
    steps: int  # vm instructions executed so far
    signals: tuple[str, ...]  # signal names tokens are parked on
    effects_pending: int  # effects in flight
    timers_armed: int
    regions: tuple[str, ...]  # named regions (scopes, named MIs) that are live
    wakeups: int  # times the actor was woken from its mailbox (a burst of messages costs one)
    started_at: float | None  # None while queued
    ended_at: float | None = None
    error: str | None = None  # failed: the CaseFailed message
    cancel_reason: str | None = None  # cancelled: why ("cancelled", "timeout", "substrate closed", ...)
    workflow: str | None = None  # the registered name it started from (None: started from a term)
    at: tuple[str, ...] = ()  # node paths where its threads are now
    effects: tuple[EffectStatus, ...] = ()  # in flight
    timers: tuple[TimerStatus, ...] = ()  # armed
    failure: Failure | None = None  # failed: type, message, node path, traceback
    suspended_reason: str | None = None  # suspended: the ReplayDivergence text
    order: int | None = None  # the paging key of `cases()`: pass the last case's as before= for the next page
    tags: dict[str, str] = {}  # given at `new_case(..., tags=)` (a fork keeps its origin's)
    forked_from: str | None = None  # the case this one was forked from (`Substrate.fork`)
    version: str | None = None  # durable: the fingerprint of the program version the case runs on
    migrated_from: str | None = None  # durable: the fingerprint it ran on before its latest migration
    refused: tuple[RefusedInput, ...] = ()  # durable: the latest ten inbox inputs its owner refused, newest first
    queue: str | None = None  # started on a queue: its name, priority, dedup and partition keys, and when it
    priority: int | None = None  # left the queue (its start)
    dedup: str | None = None
    partition: str | None = None
    dequeued_at: float | None = None
    parent: str | None = None  # a child case (`start_case`): the id of the case that started it
    children: tuple[str, ...] = ()  # `status()`: the ids of the cases it started, oldest first (see `cases(parent=)`)

    @property
    def ended(self) -> bool:
        return self.state.ended


class SubstrateStatistics(BaseModel):
    """Counters of a Substrate, as `Substrate.statistics()` returns them."""

    model_config = ConfigDict(frozen=True)

    cases_started: int
    cases_live: int
    cases_done: int
    cases_failed: int
    cases_cancelled: int
    cases_retained: int  # ended cases whose result is still kept in memory
    cases_evicted: int  # ended cases dropped from memory by the `retain_ended` bound
    trace_events: int  # events handed to the trace hub
    trace_dropped: int  # events dropped because a trace buffer was full
    sink_errors: int  # times a sink raised
    cases_idle_evicted: int = 0  # durable cases dropped from memory while they waited (`evict_after`)
    cases_in_memory: int = 0  # case actors in memory now (live ones, and ended ones still retained)

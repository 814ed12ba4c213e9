"""The runtime's public read models: a case's state and status, and the Substrate's statistics."""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict


class CaseState(StrEnum):
    """Where a case is in its life. The last three are final."""

    INITIALIZING = "initializing"  # registered, its actor has not run yet
    RUNNING = "running"  # the actor is running vm bursts
    WAITING_EFFECT = "waiting_effect"  # parked; at least one effect is in flight
    WAITING_SIGNAL = "waiting_signal"  # parked; no effect in flight, tokens wait on signals (or region inputs)
    WAITING_TIMER = "waiting_timer"  # parked; only timers can wake it
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def ended(self) -> bool:
        return self in _FINAL


_FINAL = frozenset({CaseState.DONE, CaseState.FAILED, CaseState.CANCELLED})


class CaseStatus(BaseModel):
    """A snapshot of one case, as `Substrate.status(case_id)` returns it.

    Times are in seconds of the Substrate's clock (`time.time()` for the real clock).
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
    started_at: float
    ended_at: float | None = None
    error: str | None = None  # failed: the CaseFailed message
    cancel_reason: str | None = None  # cancelled: why ("cancelled", "timeout", "substrate closed", ...)

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
    cases_retained: int  # ended cases whose result is still kept
    cases_evicted: int  # ended cases dropped by the `retain_ended` bound
    trace_events: int  # events handed to the trace-sink actor
    trace_dropped: int  # events dropped because a trace buffer was full
    sink_errors: int  # times a sink raised

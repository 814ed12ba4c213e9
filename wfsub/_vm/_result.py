"""What one `Machine.run()` reports: its status, and what the driver must start or stop."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from ._requests import EffectRequest, TimerRequest


class RunStatus(StrEnum):
    """Where a machine stands after a run (a str, so `status == "done"` reads naturally)."""

    YIELDED = "yielded"  # the step budget ran out; run again
    BLOCKED = "blocked"  # every live thread waits for an input (signal, effect result, timer)
    DONE = "done"
    CANCELLED = "cancelled"
    FAILED = "failed"


@dataclass(slots=True)
class RunResult:
    """What one `run()` did and what the driver must do next."""

    status: RunStatus
    steps: int
    effects: list[EffectRequest] = field(default_factory=list)  # start these
    timers: list[TimerRequest] = field(default_factory=list)  # arm these
    cancelled_effects: list[int] = field(default_factory=list)  # stop these (started in earlier runs)
    cancelled_timers: list[int] = field(default_factory=list)  # disarm these
    signals: tuple[str, ...] = ()  # blocked: the signal names some thread waits for
    error: BaseException | None = None  # failed: the step's exception (or a CaseFailed for a limit)
    error_path: str | None = None  # failed: the node path
    error_message: str | None = None  # failed: what happened

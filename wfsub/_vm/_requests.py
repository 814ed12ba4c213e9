"""What the vm asks of its driver: effects to start and timers to arm, each answered by an input later."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .._terms import Retry


@dataclass(slots=True)
class EffectRequest:
    """Start `fn(ctx)` for the runtime; report back with `complete_effect(effect_id, ...)`."""

    effect_id: int
    fn: Callable[..., Any]
    ctx: Mapping[str, Any]
    path: str
    name: str
    timeout: float | None
    retry: Retry | None
    heartbeat_timeout: float | None = None  # seconds an attempt may go without a heartbeat


@dataclass(slots=True)
class TimerRequest:
    """Arm a timer; report back with `fire_timer(timer_id)` after `seconds`, or at epoch time `at` when it is set
    (`sleep(until=)`: a point in time the data named, the same on replay)."""

    timer_id: int
    seconds: float
    path: str
    at: float | None = None

    def due(self, base: float) -> float:
        """When it falls due, for a driver whose timers count from `base` (the time of the last input applied)."""
        return self.at if self.at is not None else base + self.seconds

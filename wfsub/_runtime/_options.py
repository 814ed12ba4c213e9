"""The Substrate's options, checked once where it is made, and the small checks its doors share.

Every option is checked in `Options.checked` and kept in one frozen `Options`: the rooms of the Substrate read
their settings there. A bad option is a ValueError or TypeError naming it, what it got and what fits.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .._terms import MAX_SECONDS
from .._trace import LEVELS, TraceLevel, TraceSink, check_sink, get_logger
from ._clock import Clock
from ._compact import check_compact_after

_log = get_logger("wfsub.runtime")

DEFAULT_MAX_PAYLOAD = 1 << 20  # 1 MiB of JSON per durable input

DEFAULT_MAX_RECOVERIES = 5
"""`Substrate(max_recoveries=)`: recoveries in a row without a new journal record before a case is suspended."""


def positive(value: object, name: str, *, allow_none: bool = False) -> None:
    """A number of seconds that must be positive and at most `MAX_SECONDS` (None too, with `allow_none`)."""
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ValueError(f"{name} must be a positive number, got {value!r}")
    if value > MAX_SECONDS:
        fix = "pass None for no limit" if allow_none else "pass a number of seconds"
        raise ValueError(f"{name}={value!r} is more than {MAX_SECONDS:g} seconds (about 31 years): {fix}")


def check_await_timeout(timeout: object) -> None:
    """An awaiter's `timeout`: None, or a number of seconds >= 0 (0: look without waiting)."""
    if timeout is None:
        return
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not math.isfinite(timeout) or timeout < 0:
        raise ValueError(f"timeout must be a number of seconds >= 0 (0: check without waiting), got {timeout!r}")


def no_redaction(value: Any) -> Any:
    return value


def guarded(redact: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """`redact` as the runtime calls it: one that raises withholds the value (never shows it unredacted).

    It runs where a case ends, in the trace hub and in `status`: an error from it must not fail a case, crash the
    Substrate or make `status` raise. The error is logged (the first, then every 1,000th); its message is not
    shown, since it may quote the value.
    """
    errors = 0

    def guarded(value: Any) -> Any:
        nonlocal errors
        try:
            return redact(value)
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:
            errors += 1
            if errors == 1 or errors % 1000 == 0:
                _log.error("redact raised; the value is withheld", error=type(exc).__name__, errors=errors)
            withheld = f"<withheld: redact raised {type(exc).__name__}>"
            return {"withheld": withheld} if isinstance(value, Mapping) else withheld

    return guarded


@dataclass(frozen=True, slots=True)
class Options:
    """A Substrate's settings, checked (see `Substrate` for what each means)."""

    level: TraceLevel
    sinks: tuple[TraceSink, ...]
    quanta: int
    mailbox_size: int
    retain: int
    trace_buffer: int
    shutdown_timeout: float
    max_instances: int
    max_payload: int
    max_recoveries: int
    redact: Callable[[Any], Any]
    evict_after: float | None
    compact_after: int | None
    owner: str  # this Substrate's name as a store's owner (`node_id`)
    standby_ok: bool

    @property
    def case_level(self) -> str:
        """The trace level a new case starts at: none while no sink would see its events."""
        return self.level if self.sinks else "none"

    @staticmethod
    def checked(
        *, trace_level: TraceLevel, sinks: Sequence[TraceSink], quanta: int, clock: Clock | None, mailbox_size: int,
        retain_ended: int, trace_buffer: int, shutdown_timeout: float, max_instances: int, max_payload_bytes: int,
        redact: Callable[[Any], Any] | None, evict_after: float | None, node_id: str | None, standby: bool,
        max_recoveries: int, compact_after: int | None,
    ) -> Options:
        """The options of `Substrate(...)`, checked: ValueError or TypeError naming the first that does not fit."""
        if trace_level not in LEVELS:
            raise ValueError(f"trace_level must be one of {', '.join(LEVELS)}, got {trace_level!r}")
        for value, name in (
            (quanta, "quanta"),
            (mailbox_size, "mailbox_size"),
            (trace_buffer, "trace_buffer"),
            (max_instances, "max_instances"),
            (max_payload_bytes, "max_payload_bytes"),
            (max_recoveries, "max_recoveries"),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if isinstance(retain_ended, bool) or not isinstance(retain_ended, int) or retain_ended < 0:
            raise ValueError(f"retain_ended must be an int >= 0, got {retain_ended!r}")
        positive(shutdown_timeout, "shutdown_timeout")
        positive(evict_after, "evict_after", allow_none=True)
        if isinstance(sinks, TraceSink) or not isinstance(sinks, Sequence):
            raise TypeError("sinks must be a sequence of sinks, e.g. sinks=[MemorySink()]")
        for i, sink in enumerate(sinks):
            check_sink(sink)
            if any(s is sink for s in sinks[:i]):  # one sink listed twice would get every event twice
                raise ValueError(f"sinks lists {sink!r} twice: each sink gets every event once; list it once")
        if clock is not None and not isinstance(clock, Clock):
            raise TypeError(f"clock must provide now(), sleep() and deadline_scope(); got {type(clock).__name__}")
        if redact is not None and not callable(redact):
            raise TypeError(f"redact must be a function over data (or None), got {type(redact).__name__}")
        compact = check_compact_after(compact_after)
        if node_id is not None and (not isinstance(node_id, str) or not node_id.strip() or len(node_id) > 200):
            raise ValueError(f"node_id must be a non-empty str of at most 200 characters, got {node_id!r}")
        if not isinstance(standby, bool):
            raise TypeError(f"standby must be True or False, got {standby!r}")
        return Options(
            level=trace_level, sinks=tuple(sinks), quanta=quanta, mailbox_size=mailbox_size, retain=retain_ended,
            trace_buffer=trace_buffer, shutdown_timeout=shutdown_timeout, max_instances=max_instances,
            max_payload=max_payload_bytes, max_recoveries=max_recoveries,
            redact=guarded(redact) if redact is not None else no_redaction, evict_after=evict_after,
            compact_after=compact, owner=node_id or f"substrate-{secrets.token_hex(6)}", standby_ok=standby,
        )


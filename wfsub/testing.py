"""Helpers for testing code that uses wfsub: a clock moved by hand, a sink that captures events, and effects
whose outcomes are scripted.

    clock = VirtualClock()
    sink = CapturingSink()
    async with Substrate(clock=clock, sinks=[sink]) as sub:
        handle = await sub.new_case(workflow)
        await clock.advance(30)          # fires every timer due in the next 30 s; cases handle them
        await sink.wait_for("case_done", case_id=handle.case_id)

    charge = ScriptedEffect(ConnectionError("gateway down"), {"charged": True}, name="charge")
    workflow = effect(charge, retry=Retry(max_attempts=2))   # fails once, then succeeds; charge.calls records ctx
"""

from __future__ import annotations

from collections.abc import Mapping as _Mapping
from collections.abc import Sequence as _Sequence
from typing import Any as _Any

import anyio
import anyio.lowlevel

from ._runtime import VirtualClock as VirtualClock
from ._trace import MemorySink as _MemorySink
from ._trace import TraceEvent as _TraceEvent

__all__ = ["CapturingSink", "EventsDropped", "ScriptedEffect", "VirtualClock"]


class EventsDropped(RuntimeError):
    """`CapturingSink.wait_for` cannot be satisfied for sure: the sink lost events it was too slow to take."""


class CapturingSink(_MemorySink):
    """A `MemorySink` that a test can also wait on: `await sink.wait_for(kind, case_id=..., count=1)`.

    If events meant for it were dropped (its buffer was full), a `wait_for` not yet satisfied raises
    `EventsDropped` instead of waiting for an event that may never come; `dropped_events` counts them.
    """

    def __init__(self) -> None:
        super().__init__()
        self._changed = anyio.Event()
        self.dropped_events = 0

    async def write(self, events: _Sequence[_TraceEvent]) -> None:
        await super().write(events)
        self._wake()

    def dropped(self, count: int) -> None:
        """Called by the trace hub when `count` events meant for this sink were dropped."""
        self.dropped_events += count
        self._wake()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    def count(self, kind: str, case_id: str | None = None) -> int:
        """How many events of `kind` (of one case, or of all) were captured."""
        return sum(1 for e in self.events if e.kind == kind and (case_id is None or e.case_id == case_id))

    async def wait_for(self, kind: str, *, case_id: str | None = None, count: int = 1) -> list[_TraceEvent]:
        """Wait until `count` events of `kind` (of one case, or of any) were captured; return them."""
        while self.count(kind, case_id) < count:
            if self.dropped_events:
                raise EventsDropped(
                    f"waiting for {count} {kind!r} event(s) but {self.dropped_events} events were dropped before "
                    "this sink could take them: the awaited events may be among them (raise the Substrate's "
                    "trace_buffer, or keep the sink fast)"
                )
            await self._changed.wait()
        return [e for e in self.events if e.kind == kind and (case_id is None or e.case_id == case_id)]


class ScriptedEffect:
    """An effect function whose outcomes are scripted, for `effect(ScriptedEffect(...))`.

    Call i takes outcome i (the last outcome repeats): a Mapping or None is returned, an exception instance is
    raised. `calls` holds a copy of the ctx each call saw. Each call passes one checkpoint, as real I/O would.
    """

    def __init__(self, *outcomes: _Mapping[str, _Any] | BaseException | None, name: str = "scripted_effect") -> None:
        for outcome in outcomes:
            if outcome is not None and not isinstance(outcome, _Mapping | BaseException):
                raise TypeError(
                    f"ScriptedEffect outcomes are mappings (returned), exceptions (raised) or None, "
                    f"got {type(outcome).__name__}"
                )
        self.outcomes = list(outcomes) or [None]
        self.calls: list[dict[str, _Any]] = []
        self.__qualname__ = self.__name__ = name

    async def __call__(self, ctx: _Mapping[str, _Any]) -> _Mapping[str, _Any] | None:
        self.calls.append(dict(ctx))
        outcome = self.outcomes[min(len(self.calls), len(self.outcomes)) - 1]
        await anyio.lowlevel.checkpoint()
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    def __repr__(self) -> str:
        return f"ScriptedEffect({self.__qualname__!r}, calls={len(self.calls)})"

"""Trace sinks: where the trace-sink actor delivers events.

A sink is any object with `async def write(self, events: Sequence[TraceEvent]) -> None` (a batch, in order),
optionally `async def aclose(self) -> None` (called once when the Substrate closes) and optionally
`def dropped(self, count: int) -> None` (called, without awaiting, when events meant for it were dropped because
its buffer was full). Each sink is served by
its own worker with its own bounded buffer, so a slow sink only loses its own events (counted as drops) and a
sink that raises is counted and logged; neither ever blocks or kills a case.
"""

from __future__ import annotations

import inspect
import json
import os
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import IO, Any, Protocol, runtime_checkable

import anyio
import anyio.to_thread

from ._log import get_logger
from ._model import TraceEvent


@runtime_checkable
class TraceSink(Protocol):
    """What the trace-sink actor needs from a sink."""

    async def write(self, events: Sequence[TraceEvent]) -> None:
        """Take a batch of events (in order for each case)."""
        ...


class MemorySink:
    """Keeps every event in memory: `events`, `for_case(case_id)`, `kinds(case_id)`.

    Batches are stored as they come and turned into `TraceEvent` models when `events` is first read, so
    keeping a trace in memory costs the running cases next to nothing.
    """

    def __init__(self) -> None:
        self._events: list[TraceEvent] = []
        self._pending: list[Sequence[TraceEvent]] = []
        self._count = 0

    async def write(self, events: Sequence[TraceEvent]) -> None:
        self._pending.append(events)
        self._count += len(events)

    @property
    def events(self) -> list[TraceEvent]:
        """Every event received, in order."""
        if self._pending:
            pending, self._pending = self._pending, []
            for batch in pending:
                self._events.extend(batch)
        return self._events

    def for_case(self, case_id: str) -> list[TraceEvent]:
        """The events of one case, in order."""
        return [e for e in self.events if e.case_id == case_id]

    def kinds(self, case_id: str | None = None) -> list[str]:
        """The kinds of the events (of one case, or of all), in order."""
        return [e.kind for e in self.events if case_id is None or e.case_id == case_id]

    def clear(self) -> None:
        self._events.clear()
        self._pending.clear()
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def __repr__(self) -> str:
        return f"MemorySink({self._count} events)"


class JsonlSink:
    """Appends one JSON object per event to a file (`str` or path-like); the file opens on the first write.

    Each object is the event's fields with, beside the epoch `time`, `time_iso`: ISO 8601 in UTC with its zone
    (null for a virtual clock's own seconds), as `wfsub trace --json` writes them.

    File writes run in a worker thread, so a slow disk delays only this sink's worker, never the event loop.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        if not isinstance(path, str | os.PathLike):
            raise TypeError(f"JsonlSink takes a file path (str or path-like), got {type(path).__name__}")
        self.path = Path(path)
        self._file: IO[str] | None = None

    async def write(self, events: Sequence[TraceEvent]) -> None:
        text = "".join(f'{e.model_dump_json()[:-1]},"time_iso":{json.dumps(e.iso_time)}}}\n' for e in events)
        await anyio.to_thread.run_sync(self._write, text)

    def _write(self, text: str) -> None:
        if self._file is None:
            self._file = self.path.open("a", encoding="utf-8")
        self._file.write(text)
        self._file.flush()

    async def aclose(self) -> None:
        if self._file is not None:
            file, self._file = self._file, None
            await anyio.to_thread.run_sync(file.close)

    def __repr__(self) -> str:
        return f"JsonlSink({str(self.path)!r})"


class StructlogSink:
    """Logs each event through structlog (`event="trace"`, with kind, case_id, seq, path, detail, `time` in
    seconds since the epoch and `time_iso`, the same as ISO 8601 with its zone, or None for a virtual clock)."""

    def __init__(self, logger: Any = None, *, level: str = "info") -> None:
        self._log = logger if logger is not None else get_logger("wfsub.trace")
        self._level = level

    async def write(self, events: Sequence[TraceEvent]) -> None:
        emit = getattr(self._log, self._level)
        for e in events:
            emit("trace", kind=e.kind, case_id=e.case_id, seq=e.seq, path=e.path, detail=e.detail, time=e.time,
                 time_iso=e.iso_time)

    def __repr__(self) -> str:
        return f"StructlogSink(level={self._level!r})"


class CallbackSink:
    """Calls `fn(event)` for each event; `fn` may be a plain function or an async one."""

    def __init__(self, fn: Callable[[TraceEvent], None | Awaitable[None]]) -> None:
        if not callable(fn):
            raise TypeError(f"CallbackSink takes a callable, got {type(fn).__name__}")
        self._fn = fn

    async def write(self, events: Sequence[TraceEvent]) -> None:
        fn = self._fn
        for e in events:
            result = fn(e)
            if inspect.isawaitable(result):
                await result

    def __repr__(self) -> str:
        return f"CallbackSink({getattr(self._fn, '__qualname__', self._fn)!r})"


def check_sink(sink: object) -> TraceSink:
    """Raise a TypeError that explains what a sink is, unless `sink` is one."""
    if not isinstance(sink, TraceSink):
        raise TypeError(
            f"{sink!r} is not a trace sink: a sink needs `async def write(self, events)`; use MemorySink, "
            f"JsonlSink(path), StructlogSink() or CallbackSink(fn)"
        )
    return sink


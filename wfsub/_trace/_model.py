"""`TraceEvent`: one vm event stamped with its case and time, the unit every sink receives."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime
from typing import Any, overload

from pydantic import BaseModel, ConfigDict

from .._vm import VmEvent


class TraceEvent(BaseModel):
    """Something a case did: `seq` orders the events of one case; `path` is the node path (`seq[1].par[0]`)."""

    model_config = ConfigDict(frozen=True)

    case_id: str
    seq: int
    kind: str
    path: str
    detail: dict[str, Any]
    time: float

    @property
    def iso_time(self) -> str | None:
        """`time` as ISO 8601 in UTC with its zone (`2026-11-26T05:20:48.123+00:00`); None for a virtual clock's
        own seconds, which name no date."""
        if self.time < _WALL_CLOCK:
            return None
        return datetime.fromtimestamp(self.time, UTC).isoformat(timespec="milliseconds")

    def format(self, limit: int | None = 60) -> str:
        """One readable line: time, case, seq, kind, node path and detail.

        Wall-clock times show as ISO 8601 in UTC with its zone (`2026-11-26T05:20:48.123+00:00`); small times
        (a virtual clock) as seconds. Each detail value longer than `limit` characters is cut there, ending in
        `...` (a log line stays short); `limit=None` shows every value whole, as `wfsub trace` does.
        """
        detail = " ".join(f"{k}={_short(v, limit)}" for k, v in self.detail.items())
        when = self.iso_time or f"{self.time:10.3f}"
        return f"{when:>12}  {self.case_id}  #{self.seq:<4d} {self.kind:<18} {self.path}  {detail}".rstrip()


_WALL_CLOCK = 1e9  # seconds since the epoch (2001): below it, a time is read as a clock's own seconds


def _short(value: object, limit: int | None) -> str:
    try:
        text = json.dumps(value, default=repr)
    except (TypeError, ValueError):
        text = repr(value)
    return text if limit is None or len(text) <= limit else text[: max(limit - 3, 0)] + "..."


RawBatch = tuple[str, float, Sequence[VmEvent], Any]
"""(case_id, time, vm events, the case's own sinks): what a case actor hands to the trace-sink actor."""


class EventBatch(Sequence[TraceEvent]):
    """The events a sink receives in one `write`: a read-only sequence of `TraceEvent`, built lazily.

    The models are built on first access and then kept, so a batch shared by several sinks builds each event
    once, and a sink that only stores batches (MemorySink) costs the cases nothing per event.
    """

    __slots__ = ("_raw", "_len", "_models", "_redact")

    def __init__(self, raw: Sequence[RawBatch], redact: Callable[[Any], Any] | None = None) -> None:
        self._raw = raw
        self._len = sum(len(batch[2]) for batch in raw)
        self._models: list[TraceEvent] | None = None
        self._redact = redact  # applied to each event's detail (what people read), when the models are built

    def _build(self) -> list[TraceEvent]:
        models = self._models
        if models is None:
            # Validated construction: with these plain fields it is faster than model_construct (2 vs 3 us).
            redact = self._redact
            models = self._models = [
                TraceEvent(
                    case_id=case_id, seq=seq, kind=kind, path=path, detail=detail if redact is None else redact(detail),
                    time=time,
                )
                for case_id, time, events, _ in self._raw
                for seq, kind, path, detail in events
            ]
        return models

    def __len__(self) -> int:
        return self._len

    @overload
    def __getitem__(self, index: int) -> TraceEvent: ...
    @overload
    def __getitem__(self, index: slice) -> list[TraceEvent]: ...
    def __getitem__(self, index: int | slice) -> TraceEvent | list[TraceEvent]:
        return self._build()[index]

    def __iter__(self) -> Iterator[TraceEvent]:
        return iter(self._build())

    def __repr__(self) -> str:
        return f"<EventBatch of {self._len} events>"

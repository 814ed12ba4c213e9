"""Trace: levels, the `TraceEvent` model, the sinks and the trace-sink actor that feeds them."""

from __future__ import annotations

from ._events import FULL_KINDS as FULL_KINDS
from ._events import LEVELS as LEVELS
from ._events import MIN_KINDS as MIN_KINDS
from ._events import TraceLevel as TraceLevel
from ._events import VmEvent as VmEvent
from ._model import TraceEvent as TraceEvent
from ._sink_actor import TraceSinkActor as TraceSinkActor
from ._sink_actor import TraceStats as TraceStats
from ._sinks import CallbackSink as CallbackSink
from ._sinks import JsonlSink as JsonlSink
from ._sinks import MemorySink as MemorySink
from ._sinks import StructlogSink as StructlogSink
from ._sinks import TraceSink as TraceSink

__all__ = [
    "FULL_KINDS",
    "LEVELS",
    "MIN_KINDS",
    "CallbackSink",
    "JsonlSink",
    "MemorySink",
    "StructlogSink",
    "TraceEvent",
    "TraceLevel",
    "TraceSink",
    "TraceSinkActor",
    "TraceStats",
    "VmEvent",
]

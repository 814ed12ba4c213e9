"""Trace: the public `TraceEvent` model and the sinks. Sits above the vm (whose event kinds and levels it
re-exports) and below the runtime (whose trace hub actor feeds the sinks)."""

from __future__ import annotations

from .._vm import FULL_KINDS as FULL_KINDS
from .._vm import LEVELS as LEVELS
from .._vm import MIN_KINDS as MIN_KINDS
from .._vm import TraceLevel as TraceLevel
from ._log import get_logger as get_logger
from ._model import EventBatch as EventBatch
from ._model import TraceEvent as TraceEvent
from ._sinks import CallbackSink as CallbackSink
from ._sinks import JsonlSink as JsonlSink
from ._sinks import MemorySink as MemorySink
from ._sinks import StructlogSink as StructlogSink
from ._sinks import TraceSink as TraceSink
from ._sinks import check_sink as check_sink

"""Trace: levels, event kinds, the TraceEvent model and sinks."""

from ._events import FULL_KINDS as FULL_KINDS
from ._events import LEVELS as LEVELS
from ._events import MIN_KINDS as MIN_KINDS
from ._events import TraceLevel as TraceLevel
from ._events import VmEvent as VmEvent

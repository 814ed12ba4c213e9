"""The runtime: the Substrate supervisor, case actors, effects, timers and clocks. The only layer using anyio."""

from __future__ import annotations

from ._clock import Clock as Clock
from ._clock import RealClock as RealClock
from ._clock import VirtualClock as VirtualClock
from ._status import CaseState as CaseState
from ._status import CaseStatus as CaseStatus
from ._status import SubstrateStatistics as SubstrateStatistics
from ._substrate import CaseHandle as CaseHandle
from ._substrate import Substrate as Substrate

__all__ = [
    "CaseHandle",
    "CaseState",
    "CaseStatus",
    "Clock",
    "RealClock",
    "Substrate",
    "SubstrateStatistics",
    "VirtualClock",
]

"""The runtime: the Substrate supervisor, case actors, effects, timers and clocks.

Its modules import one way, each only the ones below it, also inside functions (`RUNTIME_LAYERS` in
tests/core/test_architecture.py); the case actor's helpers name `CaseActor` under `if TYPE_CHECKING:` only.
"""

from __future__ import annotations

from ._client import Client as Client
from ._clock import Clock as Clock
from ._clock import RealClock as RealClock
from ._clock import VirtualClock as VirtualClock
from ._effects import EffectInfo as EffectInfo
from ._effects import effect_info as effect_info
from ._effects import heartbeat as heartbeat
from ._handle import CaseHandle as CaseHandle
from ._journal import JournalRecord as JournalRecord
from ._queues import Queue as Queue
from ._registry import Workflow as Workflow
from ._replay import ReplayReport as ReplayReport
from ._replay import replay as replay
from ._schedules import Schedule as Schedule
from ._schedules import ScheduleStatus as ScheduleStatus
from ._status import CaseState as CaseState
from ._status import CaseStatus as CaseStatus
from ._status import EffectStatus as EffectStatus
from ._status import Failure as Failure
from ._status import Heartbeat as Heartbeat
from ._status import RefusedInput as RefusedInput
from ._status import SubstrateStatistics as SubstrateStatistics
from ._status import TimerStatus as TimerStatus
from ._substrate import Substrate as Substrate

__all__ = [
    "CaseHandle",
    "CaseState",
    "CaseStatus",
    "Client",
    "Clock",
    "EffectInfo",
    "EffectStatus",
    "Failure",
    "Heartbeat",
    "JournalRecord",
    "Queue",
    "RealClock",
    "RefusedInput",
    "ReplayReport",
    "Schedule",
    "ScheduleStatus",
    "Substrate",
    "SubstrateStatistics",
    "TimerStatus",
    "VirtualClock",
    "Workflow",
    "effect_info",
    "heartbeat",
    "replay",
]

"""The runtime (`wfsub.runtime`): the Substrate, case handles, status models and clocks; `wfsub` re-exports them."""

from ._runtime import CaseHandle as CaseHandle
from ._runtime import CaseState as CaseState
from ._runtime import CaseStatus as CaseStatus
from ._runtime import Client as Client
from ._runtime import Clock as Clock
from ._runtime import EffectInfo as EffectInfo
from ._runtime import EffectStatus as EffectStatus
from ._runtime import Failure as Failure
from ._runtime import Heartbeat as Heartbeat
from ._runtime import JournalRecord as JournalRecord
from ._runtime import Queue as Queue
from ._runtime import RealClock as RealClock
from ._runtime import RefusedInput as RefusedInput
from ._runtime import ReplayReport as ReplayReport
from ._runtime import Schedule as Schedule
from ._runtime import ScheduleStatus as ScheduleStatus
from ._runtime import Substrate as Substrate
from ._runtime import SubstrateStatistics as SubstrateStatistics
from ._runtime import TimerStatus as TimerStatus
from ._runtime import Workflow as Workflow
from ._runtime import effect_info as effect_info
from ._runtime import heartbeat as heartbeat
from ._runtime import replay as replay

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
    "Workflow",
    "effect_info",
    "heartbeat",
    "replay",
]

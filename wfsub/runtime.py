"""The runtime (`wfsub.runtime`): the Substrate, case handles, status models and clocks; `wfsub` re-exports them."""

from ._runtime import CaseHandle as CaseHandle
from ._runtime import CaseState as CaseState
from ._runtime import CaseStatus as CaseStatus
from ._runtime import Clock as Clock
from ._runtime import RealClock as RealClock
from ._runtime import Substrate as Substrate
from ._runtime import SubstrateStatistics as SubstrateStatistics

__all__ = [
    "CaseHandle",
    "CaseState",
    "CaseStatus",
    "Clock",
    "RealClock",
    "Substrate",
    "SubstrateStatistics",
]

"""The vm: per-case execution state and the run(quanta) hot loop. Pure and synchronous: no anyio here."""

from ._machine import EffectRequest as EffectRequest
from ._machine import Machine as Machine
from ._machine import MIStats as MIStats
from ._machine import RunResult as RunResult
from ._machine import TimerRequest as TimerRequest
from ._schedulers import Deterministic as Deterministic
from ._schedulers import Replay as Replay
from ._schedulers import Scheduler as Scheduler
from ._schedulers import Seeded as Seeded

__all__ = [
    "Deterministic",
    "EffectRequest",
    "MIStats",
    "Machine",
    "Replay",
    "RunResult",
    "Scheduler",
    "Seeded",
    "TimerRequest",
]

"""The vm tier: drive a compiled Program by hand, one explicit input at a time.

`Machine(program, data)` runs a case synchronously; every nondeterministic input (signal, effect result,
timer firing, cancel, scheduler choice) is a method call, so tests and tools can replay a case exactly.
"""

from ._compiler import Op as Op
from ._compiler import Program as Program
from ._compiler import compile_workflow as compile_workflow
from ._trace._events import VmEvent as VmEvent
from ._vm import Deterministic as Deterministic
from ._vm import EffectRequest as EffectRequest
from ._vm import Machine as Machine
from ._vm import MIStats as MIStats
from ._vm import Replay as Replay
from ._vm import RunResult as RunResult
from ._vm import Scheduler as Scheduler
from ._vm import Seeded as Seeded
from ._vm import TimerRequest as TimerRequest

__all__ = [
    "Deterministic",
    "EffectRequest",
    "MIStats",
    "Machine",
    "Op",
    "Program",
    "Replay",
    "RunResult",
    "Scheduler",
    "Seeded",
    "TimerRequest",
    "VmEvent",
    "compile_workflow",
]

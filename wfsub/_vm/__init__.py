"""The vm: per-case execution state and the run(quanta) hot loop.

Pure and synchronous: nothing here awaits, reads a clock, draws a random number, or imports anyio or structlog
(a test pins that). `Machine` is the driver's front; `_interp.py` holds the state and the hot loops; `_ops.py`
the opcode handlers and their table; `_withdraw.py` withdrawal, compensation and failures; `_net.py` the net
frames and handlers; `_records.py` the tokens and frames; `_events.py` the trace levels and event kinds the vm
emits. Each imports only the ones below it (`VM_LAYERS` in tests/core/test_architecture.py).
"""

from ._events import FULL_KINDS as FULL_KINDS
from ._events import LEVELS as LEVELS
from ._events import MIN_KINDS as MIN_KINDS
from ._events import TraceLevel as TraceLevel
from ._events import VmEvent as VmEvent
from ._machine import Machine as Machine
from ._records import InstanceFrame as InstanceFrame
from ._records import MIStats as MIStats
from ._requests import EffectRequest as EffectRequest
from ._requests import TimerRequest as TimerRequest
from ._result import RunResult as RunResult
from ._result import RunStatus as RunStatus
from ._schedulers import Deterministic as Deterministic
from ._schedulers import Replay as Replay
from ._schedulers import Scheduler as Scheduler
from ._schedulers import Seeded as Seeded
from ._snapshot import SNAPSHOT_FORMAT as SNAPSHOT_FORMAT


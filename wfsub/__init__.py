"""wfsub: a workflow-pattern substrate for async Python.

A workflow is a term of a small pattern algebra (`task`, `seq`, `par`, `mi`, ...), validated, compiled once
to flat bytecode and run by one actor coroutine per case. Layers, each importing only those above it here:

    _terms      the pattern algebra: immutable terms, constructors, tree helpers
    _validate   static checks of a term -> list of issues
    _program    the bytecode format: opcodes, operand specs, Program, dis
    _compiler   term -> Program (flat instructions, constant table, fingerprint)
    _vm         Machine: one case's execution state and the run(quanta) hot loop, and the event kinds it
                emits (pure and synchronous: no anyio, no structlog)
    _trace      the TraceEvent model, levels, sinks
    _runtime    Substrate (root supervisor), case actors, effects, timers, trace hub (the only anyio user)

`contrib` holds optional tools on top of the public API: diagrams (`to_mermaid`, `to_dot`, re-exported here)
and `wfsub.contrib.otel.OTelSink` (the `otel` extra; never imported by `import wfsub`).

`import wfsub` loads only the errors and the pattern algebra (pure Python, no dependency). Every other name
here is imported on first use (PEP 562 `__getattr__`): `wfsub.Substrate` loads the runtime (anyio, pydantic),
`wfsub.compile` the compiler, `wfsub.to_mermaid` the diagrams, and the `wfsub` command loads none of them to
print its help. Type checkers read the same names from the `TYPE_CHECKING` block.

This module is the curated public API; `wfsub.testing` and `wfsub.lowlevel` are the other public tiers, and
`wfsub.terms` and `wfsub.runtime` re-export the algebra and the runtime.
"""

import typing

from . import _deprecated
from ._errors import CaseCancelled as CaseCancelled
from ._errors import CaseExists as CaseExists
from ._errors import CaseFailed as CaseFailed
from ._errors import CaseNotFound as CaseNotFound
from ._errors import CompensationFailed as CompensationFailed
from ._errors import EffectResultError as EffectResultError
from ._errors import HeartbeatTimeout as HeartbeatTimeout
from ._errors import InvalidStartData as InvalidStartData
from ._errors import InvalidWorkflow as InvalidWorkflow
from ._errors import LimitExceeded as LimitExceeded
from ._errors import MachineStateError as MachineStateError
from ._errors import ReplayDivergence as ReplayDivergence
from ._errors import RestoredError as RestoredError
from ._errors import SignalRejected as SignalRejected
from ._errors import SnapshotMismatch as SnapshotMismatch
from ._errors import StepFailed as StepFailed
from ._errors import StoreConflict as StoreConflict
from ._errors import StoreError as StoreError
from ._errors import SubstrateClosed as SubstrateClosed
from ._errors import WaitTimeout as WaitTimeout
from ._errors import WfsubError as WfsubError
from ._errors import WorkflowNotRegistered as WorkflowNotRegistered
from ._terms import Retry as Retry
from ._terms import Term as Term
from ._terms import add_instances as add_instances
from ._terms import call as call
from ._terms import cancel_region as cancel_region
from ._terms import close_instances as close_instances
from ._terms import complete_region as complete_region
from ._terms import critical as critical
from ._terms import defer as defer
from ._terms import effect as effect
from ._terms import interleave as interleave
from ._terms import loop as loop
from ._terms import mi as mi
from ._terms import milestone as milestone
from ._terms import multi_choice as multi_choice
from ._terms import net as net
from ._terms import par as par
from ._terms import reply as reply
from ._terms import saga as saga
from ._terms import scope as scope
from ._terms import seq as seq
from ._terms import signal_case as signal_case
from ._terms import sleep as sleep
from ._terms import start_case as start_case
from ._terms import task as task
from ._terms import terminate as terminate
from ._terms import wait as wait
from ._terms import when_milestone as when_milestone
from ._terms import xor as xor

if typing.TYPE_CHECKING:
    from ._compiler import compile_workflow as compile
    from ._diagram import to_dot as to_dot
    from ._diagram import to_mermaid as to_mermaid
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
    from ._trace import CallbackSink as CallbackSink
    from ._trace import JsonlSink as JsonlSink
    from ._trace import MemorySink as MemorySink
    from ._trace import StructlogSink as StructlogSink
    from ._trace import TraceEvent as TraceEvent
    from ._trace import TraceLevel as TraceLevel
    from ._trace import TraceSink as TraceSink
    from ._validate import ValidationIssue as ValidationIssue
    from ._validate import validate as validate

__all__ = [
    "CallbackSink",
    "CaseCancelled",
    "CaseExists",
    "CaseFailed",
    "CaseHandle",
    "CaseNotFound",
    "CaseState",
    "CaseStatus",
    "Client",
    "Clock",
    "CompensationFailed",
    "EffectInfo",
    "EffectResultError",
    "EffectStatus",
    "Failure",
    "Heartbeat",
    "HeartbeatTimeout",
    "InvalidStartData",
    "InvalidWorkflow",
    "JournalRecord",
    "JsonlSink",
    "LimitExceeded",
    "MachineStateError",
    "MemorySink",
    "Queue",
    "RealClock",
    "RefusedInput",
    "ReplayDivergence",
    "ReplayReport",
    "RestoredError",
    "Retry",
    "Schedule",
    "ScheduleStatus",
    "SignalRejected",
    "SnapshotMismatch",
    "StepFailed",
    "StoreConflict",
    "StoreError",
    "StructlogSink",
    "Substrate",
    "SubstrateClosed",
    "SubstrateStatistics",
    "Term",
    "TimerStatus",
    "TraceEvent",
    "TraceLevel",
    "TraceSink",
    "ValidationIssue",
    "WaitTimeout",
    "WfsubError",
    "Workflow",
    "WorkflowNotRegistered",
    "add_instances",
    "call",
    "cancel_region",
    "close_instances",
    "compile",
    "complete_region",
    "critical",
    "defer",
    "effect",
    "effect_info",
    "heartbeat",
    "interleave",
    "loop",
    "mi",
    "milestone",
    "multi_choice",
    "net",
    "par",
    "replay",
    "reply",
    "saga",
    "scope",
    "seq",
    "signal_case",
    "sleep",
    "start_case",
    "task",
    "terminate",
    "to_dot",
    "to_mermaid",
    "validate",
    "wait",
    "when_milestone",
    "xor",
]


_old_names = _deprecated.module_getattr(
    "wfsub", {"Program": ("wfsub._program", "Program", "import it from wfsub.lowlevel")}
)
# The public submodules, loaded on first use: `import wfsub` then `wfsub.stores.SqliteStore(...)` works, and a
# program that never touches the command or the extras never loads them.
_SUBMODULES = frozenset({"stores", "testing", "lowlevel", "runtime", "terms", "contrib", "cli"})
# The names imported on first use: name -> (module, attribute). The TYPE_CHECKING block above lists the same
# imports for type checkers (tests/test_exports.py holds the two to each other).
_LAZY: dict[str, tuple[str, str]] = {
    "compile": ("._compiler", "compile_workflow"),
    "CaseHandle": ("._runtime", "CaseHandle"),
    "CaseState": ("._runtime", "CaseState"),
    "CaseStatus": ("._runtime", "CaseStatus"),
    "Client": ("._runtime", "Client"),
    "Clock": ("._runtime", "Clock"),
    "EffectInfo": ("._runtime", "EffectInfo"),
    "EffectStatus": ("._runtime", "EffectStatus"),
    "Failure": ("._runtime", "Failure"),
    "Heartbeat": ("._runtime", "Heartbeat"),
    "JournalRecord": ("._runtime", "JournalRecord"),
    "Queue": ("._runtime", "Queue"),
    "RealClock": ("._runtime", "RealClock"),
    "RefusedInput": ("._runtime", "RefusedInput"),
    "ReplayReport": ("._runtime", "ReplayReport"),
    "Schedule": ("._runtime", "Schedule"),
    "ScheduleStatus": ("._runtime", "ScheduleStatus"),
    "Substrate": ("._runtime", "Substrate"),
    "SubstrateStatistics": ("._runtime", "SubstrateStatistics"),
    "TimerStatus": ("._runtime", "TimerStatus"),
    "Workflow": ("._runtime", "Workflow"),
    "effect_info": ("._runtime", "effect_info"),
    "heartbeat": ("._runtime", "heartbeat"),
    "replay": ("._runtime", "replay"),
    "CallbackSink": ("._trace", "CallbackSink"),
    "JsonlSink": ("._trace", "JsonlSink"),
    "MemorySink": ("._trace", "MemorySink"),
    "StructlogSink": ("._trace", "StructlogSink"),
    "TraceEvent": ("._trace", "TraceEvent"),
    "TraceLevel": ("._trace", "TraceLevel"),
    "TraceSink": ("._trace", "TraceSink"),
    "ValidationIssue": ("._validate", "ValidationIssue"),
    "validate": ("._validate", "validate"),
    "to_dot": ("._diagram", "to_dot"),
    "to_mermaid": ("._diagram", "to_mermaid"),
}


def __getattr__(name: str) -> object:
    import importlib

    found = _LAZY.get(name)
    if found is not None:
        module, attribute = found
        value = getattr(importlib.import_module(module, __name__), attribute)
        globals()[name] = value  # the next lookup is a plain module attribute
        return value
    if name in _SUBMODULES:
        return importlib.import_module(f"wfsub.{name}")
    return _old_names(name)


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})

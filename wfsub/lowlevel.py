"""The vm tier: drive a compiled Program by hand, one explicit input at a time.

`Machine(program, data)` runs a case synchronously; every nondeterministic input (signal, effect result,
timer firing, cancel, scheduler choice) is a method call, so tests and tools can replay a case exactly.
Compile with `wfsub.compile(term)`.

For tools that work on a store beside the Substrate that owns it (the `wfsub` command is one):
`Workflows` (the registry of named workflows and their versions, as `Substrate(workflows=...)` builds it),
`check_version` (whether a case's journal replays on a program as a Substrate on that version would decide),
`workflow_entries` and `term_of` (the versions of one `workflows=` entry, and the term of each),
`status_of` (a case's status from its stored row), `check_input` (an input for a case, checked as its owner
will check it, before it is put in the store's inbox) and `check_case_input` (the same input checked against the
program summary of the case's recorded version, as the owner would refuse it, even while no owner runs),
`request_applied` (whether a case took the input of a kind with a request id: a retried call; SignalRejected
when an input of another kind used the id, since a request id names one input of one kind), `loads_input`
(the JSON text of an input's value read, refused with a message when it nests too deep), `check_case_id` (a
case id checked as every door checks it: a new case's, or one to look up), `cancel_queued` (a case that
waits in its queue cancelled there: it ends as any case, in one transaction; `cancel_in_queue` checks the reason
first, as every door does), `send_input` (an input sent to a case's owner through the store's inbox, checked as
the owner and every other door check it: what a `Client` sends with), `not_found_or_queued` (what an input for
a case with no row gets: SignalRejected while it waits in its queue, never started, else CaseNotFound),
`version_summary` (the program
summary of a version as a Substrate or a Client knows it: its signal and update names, its drawing),
`drawing_of` and `mark_drawing` (a version's drawing as a summary keeps it, and its Mermaid text with where a
case is marked, as `to_mermaid(term, highlight=)` gives it, without the term: what the web inspector draws
with), and `backfill_request` (a schedule's backfill checked against the schedule a store keeps: the slots' case
ids and the `backfill` inbox input an owner does it from).
"""

from __future__ import annotations

from . import _deprecated
from ._diagram import drawing_of as drawing_of
from ._diagram import mark_drawing as mark_drawing
from ._program import Op as Op
from ._program import Program as Program
from ._runtime._compact import request_ids_of as journaled_request_ids
from ._runtime._deliver import cancel_in_queue as cancel_in_queue
from ._runtime._deliver import send_input as send_input
from ._runtime._inputs import check_case_id as check_case_id
from ._runtime._inputs import check_input as check_input
from ._runtime._inputs import loads_input as loads_input
from ._runtime._lifecycle import delete_ended as delete_ended
from ._runtime._lifecycle import fork_records as fork_records
from ._runtime._lifecycle import retry_record as retry_record
from ._runtime._outside import applied as request_applied
from ._runtime._outside import check_case_input as check_case_input
from ._runtime._persist import check_version as check_version
from ._runtime._persist import status_of as status_of
from ._runtime._queues import cancel_queued as cancel_queued
from ._runtime._queues import not_found_or_queued as not_found_or_queued
from ._runtime._registry import Workflows as Workflows
from ._runtime._registry import entries as workflow_entries
from ._runtime._registry import term_of as term_of
from ._runtime._schedules import backfill_request as backfill_request
from ._runtime._versions import version_summary as version_summary
from ._vm import Deterministic as Deterministic
from ._vm import EffectRequest as EffectRequest
from ._vm import Machine as Machine
from ._vm import MIStats as MIStats
from ._vm import Replay as Replay
from ._vm import RunResult as RunResult
from ._vm import RunStatus as RunStatus
from ._vm import Scheduler as Scheduler
from ._vm import Seeded as Seeded
from ._vm import TimerRequest as TimerRequest
from ._vm import VmEvent as VmEvent

__all__ = [
    "Deterministic",
    "EffectRequest",
    "MIStats",
    "Machine",
    "Op",
    "Program",
    "Replay",
    "RunResult",
    "RunStatus",
    "Scheduler",
    "Seeded",
    "TimerRequest",
    "VmEvent",
    "Workflows",
    "backfill_request",
    "cancel_in_queue",
    "cancel_queued",
    "check_case_id",
    "check_case_input",
    "check_input",
    "check_version",
    "delete_ended",
    "drawing_of",
    "fork_records",
    "journaled_request_ids",
    "loads_input",
    "mark_drawing",
    "not_found_or_queued",
    "request_applied",
    "retry_record",
    "send_input",
    "status_of",
    "term_of",
    "version_summary",
    "workflow_entries",
]


__getattr__ = _deprecated.module_getattr(
    "wfsub.lowlevel",
    {"compile_workflow": ("wfsub._compiler", "compile_workflow", "use wfsub.compile (the same function)")},
)

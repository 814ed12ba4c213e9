"""A case queued from outside (a `Client`, a standby) gets the start data its owner would have given it.

A client checks start data against the JSON Schema of the workflow's input model (`Workflow(term, input=Model)`)
and queues it as given; an owner's own `new_case` stores the model's JSON dump (defaults filled in, values
coerced). So when an owner first brings back a case whose journal holds only its `start` record, it validates
the start data through the input model of the case's version:
- the dump differs from what was queued: the `start` record is replaced by one carrying the dump (and what was
  sent, as `sent`, so a client's retried start with the same data is still the same start); nothing else is in
  the journal yet, so nothing else changes;
- the model refuses the data: the case fails at once, before it runs, with a message naming the fields and what
  to do (`wfsub._errors.queued_start_refused`); `await_case` raises CaseFailed with it.
A case started by the owner itself passes unchanged (its data is the dump already).
"""

from __future__ import annotations

from typing import Any

from .._errors import InvalidStartData, queued_start_refused
from .._program import Program
from .._store import CaseRow, CaseWrite, Record, Store
from .._trace import get_logger
from . import _inputs as inputs
from ._control import StartRefused
from ._journal import end_record
from ._registry import Workflows
from ._status import CaseState

_log = get_logger("wfsub.runtime")


async def checked_start(
    store: Store, workflows: Workflows, row: CaseRow, start: Record, program: Program, now: float
) -> Record:
    """The `start` record of a case whose journal holds nothing else, as its input model gives it (see the
    module); raises StartRefused once the case is failed for data the model refuses."""
    model = workflows.input_of(program)
    if model is None:
        return start
    given = start.get("data")
    try:
        data = inputs.start_data(given, model, row.workflow, row.case_id)
    except InvalidStartData as exc:
        await _fail(store, row, program, queued_start_refused(exc), now)
        raise StartRefused(row.case_id) from exc
    if data == given:
        return start
    checked = {**start, "data": data, "sent": start.get("sent", given)}  # (what its caller sent, kept as it was)
    await store.replace_start(row.case_id, checked)
    return checked


async def _fail(store: Store, row: CaseRow, program: Program, message: str, now: float) -> None:
    path = program.term.kind
    record: dict[str, Any] = {"type": "InvalidStartData", "message": message, "path": path, "compensated": [],
                              "cause": None}
    error: dict[str, Any] = {"type": "InvalidStartData", "message": message, "path": path, "traceback": None,
                             "record": record}
    end = end_record(row.last_seq + 1, now, "failed", error=error)
    row.state = CaseState.FAILED.value
    row.ended_at = row.updated_at = now
    row.error = error
    row.at, row.signals, row.effects, row.timers, row.next_due = [], [], [], [], None
    row.last_seq += 1
    await store.write(CaseWrite(row.case_id, [end], row, epoch=row.epoch or None))
    _log.warning("a queued case's start data does not fit its input model; the case failed", case_id=row.case_id,
                 reason=message)

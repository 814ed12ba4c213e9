"""Whether a start asked for with the id of an existing case is the same start: then the call answers with that
case and writes nothing; otherwise `CaseExists` names what differs.

The same start is the same workflow and the same data. The same data: as its callers sent it (a start record keeps
that as `sent` where the input model's dump differs), whichever door took the first start (an owner, a standby, a
client), or, for a door with the workflow's input model, as the model reads it. What the start asked for is
compared with: the `start` record of a durable case (kept in a compaction's snapshot too), a start of this
Substrate still being written, the start a queue item keeps (queued, or claimed and not started yet), or the start
a case without a store keeps in memory.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel

from .._errors import CaseExists, InvalidStartData
from .._store import Store
from . import _inputs as inputs
from ._compact import start_of
from ._journal import as_journaled


def sent_of(start: Mapping[str, Any]) -> dict[str, Any]:
    """The data a start's caller sent: its `sent` where it keeps one, else its `data` (a start record, or the
    start a queue item keeps)."""
    return dict(start.get("sent", start.get("data")) or {})


def same_data(had: Mapping[str, Any], asked: Mapping[str, Any]) -> bool:
    """Whether two starts (start records, or the starts queue items keep) carry the same data: their callers sent
    equal data, or the cases start with equal data (the input model reads both the same). A start record written
    before `sent` was kept compares as its data alone."""
    if sent_of(had) == sent_of(asked):
        return True
    return dict(had.get("data") or {}) == dict(asked.get("data") or {})


def start_differs(
    case_id: str, had: Mapping[str, Any], workflow: str | None, asked: Mapping[str, Any],
    model: type[BaseModel] | None = None,
) -> None:
    """CaseExists naming what differs between an existing case's start (`had`: its start record, or a start in
    flight or queued: `workflow`, `data`, `sent`?) and a start asked for with its id (`same_data`). With the
    workflow's input `model` (a Substrate, not a client), data a client queued that its owner has not yet given
    the model's dump is read through the model too, so the answer does not depend on whether the owner has."""
    differs = []
    had_workflow = had.get("workflow")
    if had_workflow != workflow:
        differs.append(f"workflow {had_workflow!r} (this call: {workflow!r})")
    if not same_data(had, asked) and not _same_as_read(had, asked, model):
        before, now = sent_of(had), sent_of(asked)
        keys = sorted({k for k in (*before, *now) if before.get(k, _NONE) != now.get(k, _NONE)})
        differs.append(f"other start data (keys that differ: {', '.join(map(repr, keys))})")
    if differs:
        raise CaseExists(case_id, " and ".join(differs))


def _same_as_read(had: Mapping[str, Any], asked: Mapping[str, Any], model: type[BaseModel] | None) -> bool:
    """Whether `model` reads the data of a start no owner has given its dump yet as the data asked for."""
    if model is None or "sent" in had:
        return False
    try:
        read = inputs.start_data(dict(had.get("data") or {}), model)
    except InvalidStartData:  # the owner will fail that case; a start with data the model takes is another one
        return False
    return read == dict(asked.get("data") or {})


_NONE = object()


async def same_start(
    store: Store, case_id: str, workflow: str | None, asked: Mapping[str, Any], model: type[BaseModel] | None = None
) -> None:
    """Return if the existing case `case_id` is the start asked for again; CaseExists naming what differs if it
    is another. `asked`: the start asked for, as a start record has it (`data`, and `sent` where the caller sent
    other data); `model`: the workflow's input model where the caller has it (see `start_differs`). A case not in
    the store yet whose queue item waits (queued, or claimed and not started) is compared with what the item starts
    it with; one with neither is another caller's start in flight: equal."""
    loaded = await store.load(case_id)
    if loaded is not None:
        start = start_of(loaded.start)  # (kept in a compaction's snapshot record)
        start_differs(case_id, start, workflow, asked, model)
        return
    item = store.read_queue_item(case_id)  # (read on this thread, as cancel_queued reads it)
    if item is not None:
        start_differs(case_id, item.start, workflow, asked, model)


async def same_durable(
    store: Store, starting: Mapping[str, tuple[dict[str, Any], Any]], case_id: str, name: str | None,
    data: Mapping[str, Any] | None, sent: Mapping[str, Any] | None, model: type[BaseModel] | None, max_payload: int,
) -> None:
    """A start of a Substrate with a store repeated with the id of an existing case (`starting`: the starts this
    Substrate is writing now, by id, compared with first); `sent`: the data as the caller sent it, where the input
    `model` gave `data`."""
    journaled, _ = as_journaled(dict(data or {}), "data", max_payload)
    asked = {"data": journaled} if sent is None else {"data": journaled, "sent": dict(sent)}
    in_flight = starting.get(case_id)
    if in_flight is not None:  # another call is writing its start record now
        start_differs(case_id, in_flight[0], name, asked, model)
    else:
        await same_start(store, case_id, name, asked, model)


async def same_queued(store: Store, case_id: str, workflow: str, asked: Mapping[str, Any]) -> None:
    """A queued start repeated with the id of a queue item or a case (a Client's: `asked` as the item keeps it):
    return if it is the same start (its other options stand), else CaseExists naming what differs."""
    known = store.read_queue_item(case_id)
    if known is not None:
        start_differs(case_id, known.start, workflow, asked)
    else:
        await same_start(store, case_id, workflow, asked)

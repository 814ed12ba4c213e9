"""Request ids: what one names, where a case keeps them, and how a repeated one is told from a reused one.

A request id names one input of one kind on one case: a `signal`, an `update`, a `cancel`, or a region operation
(`cancel_region`, `complete_region`, `add_instances`, `close_instances`). A call repeated with the id of an input
the case took is that same call retried: it is not applied again and returns what the first call returned. A
call of another kind with that id is a different input that borrowed a key: it is refused (`SignalRejected`
naming the kind that used the id, and asking for a fresh id), whatever door it comes through, never taken for a
retry and dropped. Ids are per case: another case may use the same id.

So wherever ids are kept, their kind is kept with them, as {request id: kind}:

- a case of a Substrate without a store: its actor's own index (`CaseActor.request_ids`), filled as it applies
  its inputs, checked by the same `taken` as a durable case's (idempotent calls hold on every store, none
  included), and bounded as a compaction bounds a durable case's (`remember`);
- a durable case's journal index (`CaseJournal.request_ids`), filled from its records by replay (`input_kind`:
  an update is journaled as a `signal` record marked as an update, and its kind is `update`);
- a compaction's `snapshot` record and a stored snapshot (`state["request_ids"]`). Snapshots written before kinds
  were kept hold a plain list of ids: those ids are of unknown kind (None), which matches any kind, so a call
  retried with one is taken as a retry whatever its kind (as it was when the snapshot was written);
- the records read back from the store for a case no process here runs (`request_kinds_of`: a client, a standby
  and the `wfsub` command check an id there before writing an input to the inbox). An input whose id is
  journaled after that check (an inbox input or another process's call in between) is refused by the owner
  when it takes the inbox row: the row is marked refused, and `status().refused` lists it.

How long an id is remembered (a dedup window, as Temporal's or DBOS's): every id of the records the journal
keeps, and the ids of the latest `REQUEST_IDS_KEPT` inputs as of its compaction. A compaction's `snapshot` record
keeps only those (`window`), in the order they were taken, oldest first, and the owner then forgets the others
(`CaseJournal.request_ids`); a case that is never compacted (`compact_after=None`) keeps its whole journal and so
every id. So an endless case that takes an input with an id a minute for a year carries at most
`REQUEST_IDS_KEPT` ids in each snapshot, not half a million. A call retried with an id that left the window (more
than `REQUEST_IDS_KEPT` newer inputs with ids, and a compaction since) is a new input, through every door alike:
the owner's index, the store's unique index over the journal (which holds only the records kept) and
`Store.journaled_request` (the `snapshot` record and the record that carries the id) all forget it at the same
compaction. A snapshot written before the window (a sorted dict, or a bare list) loads as it is; the next
compaction keeps `REQUEST_IDS_KEPT` of its ids (the last ones in its order) and every id taken since.

An update's answer is kept on the case row under its id (`CaseRow.answers`); only updates are kept there, so an
answer found there is an update's, and an update whose id another kind used is refused before the row is read.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import islice
from typing import Any

from .._errors import SignalRejected
from .._store import Record, Store

SNAPSHOT_KIND = "snapshot"

RequestKinds = dict[str, str | None]
"""Request id -> the kind of the input that used it (None: unknown, from a snapshot written before kinds), in
the order the inputs were taken (oldest first)."""

REQUEST_IDS_KEPT = 10_000
"""Request ids a compaction keeps (those of the latest inputs that carried one): enough for any retry that comes
within a working day of a case taking an input with an id every few seconds, small enough that a snapshot record
stays well under a megabyte of ids (each at most 1,500 bytes, most a uuid of 36) however long the case lives."""


def input_kind(record: Mapping[str, Any]) -> str:
    """The input kind of a journal record that carries a request id (`update` for an update's `signal` record)."""
    kind = str(record.get("kind"))
    return "update" if kind == "signal" and record.get("update") else kind


def kept_kinds(state: Mapping[str, Any] | None) -> RequestKinds:
    """The request ids a snapshot state keeps, with their kinds (a list of ids, from before kinds were kept:
    each of unknown kind)."""
    kept = (state or {}).get("request_ids") or ()
    if isinstance(kept, Mapping):
        return {str(rid): (kind if isinstance(kind, str) else None) for rid, kind in kept.items()}
    return dict.fromkeys(map(str, kept))


def for_snapshot(kinds: Mapping[str, str | None]) -> dict[str, str | None]:
    """The ids as a snapshot state keeps them: in the order taken (so equal journals give equal snapshots, and a
    compaction knows which are the oldest; JSON text keeps the order of an object's keys)."""
    return dict(kinds)


def window(kinds: Mapping[str, str | None]) -> RequestKinds:
    """The ids a compaction keeps: the latest `REQUEST_IDS_KEPT` taken (see the module)."""
    drop = len(kinds) - REQUEST_IDS_KEPT
    return dict(islice(kinds.items(), drop, None) if drop > 0 else kinds)


def request_kinds_of(records: Sequence[Record]) -> RequestKinds:
    """The request ids a journal (or part of one: `Store.journaled_request`) holds, with their kinds: those of its
    records, and those its compaction's `snapshot` record keeps from the records it replaced."""
    found: RequestKinds = {}
    if records and records[0].get("kind") == SNAPSHOT_KIND:
        found.update(kept_kinds(records[0].get("state")))
    for record in records:
        rid = record.get("request_id")
        if isinstance(rid, str) and record.get("kind") != SNAPSHOT_KIND:
            found[rid] = input_kind(record)
    return found


def remember(kinds: RequestKinds, request_id: str, kind: str) -> None:
    """Note the id of an input a case without a journal (a Substrate without a store) took: it keeps the ids of its
    latest `REQUEST_IDS_KEPT` inputs, as a compaction keeps a durable case's (see the module)."""
    kinds[request_id] = kind
    if len(kinds) > REQUEST_IDS_KEPT:
        del kinds[next(iter(kinds))]


_UNUSED = object()


def taken(kinds: Mapping[str, str | None], request_id: str | None, kind: str, case_id: str, action: str) -> bool:
    """Whether `request_id` is that of an input of `kind` the case took (a retried call: True), or of none
    (False); SignalRejected when an input of another kind used it (see the module)."""
    if request_id is None:
        return False
    used = kinds.get(request_id, _UNUSED)
    if used is _UNUSED:
        return False
    if used is None or used == kind:
        return True
    raise SignalRejected.reused_request_id(case_id, action, request_id, str(used), kind)


async def journaled_kinds(store: Store, case_id: str, request_id: str) -> RequestKinds:
    """The kinds the store's journal of the case gives `request_id` (and the ids its snapshot record keeps)."""
    return request_kinds_of(await store.journaled_request(case_id, request_id))

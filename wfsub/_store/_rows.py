"""What every backend shares: JSON encoding of records and rows, the rules that classify a case row, and the
decoding of what reads return (`decode_start`, `decode_snapshot`, `decode_inbox`).

A store keeps records and row fields as JSON text, so every backend (memory included) accepts exactly the same
values: JSON types and finite floats (as in JSON, int dict keys come back as str: the runtime checks that
case data has str keys before it gets here). `encode_write` checks and encodes a `CaseWrite` before it is
queued, so a value that cannot be stored fails in the caller with a StoreError, before any transaction.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .._errors import StoreError, bad_input, too_deep
from .._json import MAX_DEPTH, decode, encode, json_problem
from ._base import CaseRow, CaseWrite, DamagedEntry, InboxRow, Record, Snapshot

LIVE_STATES = frozenset({"initializing", "running", "waiting_effect"})
"""A case in one of these states (or with an effect in flight) is resumed at once by recovery: `live()`."""

PARKED_STATES = frozenset({"waiting_signal", "waiting_timer"})
"""A case in one of these states with no effect in flight waits for an input or a timer: `due()`, `next_due()`."""

SNAPSHOTS_KEPT = 2
"""Snapshots kept per case: the newest, and one before it in case the newest cannot be used."""

NO_ORDER = 2**63 - 1
"""`before` of the first page of `cases()`: above every case_order."""

_DETAIL = ("at", "signals", "effects", "timers", "data", "error", "cancel_reason", "suspended_reason")
_LATER_DETAIL = ("digest", "migrated_from", "recovered", "parent")
"""Detail fields added after the first layout: a row written before them reads them as None."""


# msgspec's encoder and decoder where they answer exactly as the stdlib's (see `_json`): the text differs only in
# how some floats are spelt, which every decoder reads back the same; records already on disk decode as before.
dumps = encode
loads = decode


@dataclass(slots=True)
class EncodedRecord:
    seq: int
    kind: str
    request_id: str | None
    text: str


@dataclass(slots=True)
class EncodedRow:
    params: dict[str, Any]  # the columns of the row, by name (see `case_put` in queries.sql)


@dataclass(slots=True)
class EncodedSnapshot:
    params: dict[str, Any]


@dataclass(slots=True)
class EncodedWrite:
    case_id: str
    records: list[EncodedRecord]
    row: EncodedRow | None
    snapshot: EncodedSnapshot | None
    inbox_done: list[int]
    inbox_refused: list[tuple[int, str]]
    compact: int | None = None
    from_queue: bool = False  # see CaseWrite


def to_json(store: str, what: str, value: object) -> str:
    try:
        return dumps(value)
    except (TypeError, ValueError) as exc:
        raise StoreError(
            store,
            f"cannot store {what}: {exc}; a store keeps JSON (dict with str keys, list, str, int, finite float, "
            "bool, None): convert the value before it reaches the case data or the record",
        ) from exc


def inbox_text(store: str, case_id: object, kind: object, body: object, request_id: object) -> str:
    """The checked arguments of `inbox_put`, every backend's: the JSON text of `body`. TypeError naming the
    argument for a case id, kind or request id that is not a str, a body that is not a dict, or a key a JSON
    encoder would turn into a str without a word (the input's owner would take another payload than was given);
    StoreError for a value that is not JSON."""
    for name, value, fix in (
        ("case_id", case_id, "pass the id of the case the input is for, e.g. 'order-42'"),
        ("kind", kind, "pass one of signal, cancel, cancel_region, complete_region, add_instances, "
         "close_instances"),
        ("request_id", request_id, "pass None, or the same str each time the input is sent again (it applies "
         "once)"),
    ):
        if (value is not None or name != "request_id") and (type(value) is not str or not value):
            also = " (or None)" if name == "request_id" else ""
            raise bad_input(f"inbox_put: {name} must be a non-empty str{also}", value, fix=fix)
    what = f"the {kind} input for case {case_id!r}"
    if not isinstance(body, Mapping):
        raise bad_input(f"inbox_put: the body of {what} must be a dict of the input's fields", body,
                        fix="e.g. {'name': 'approve', 'payload': {...}} for a signal, {'reason': 'customer asked'} "
                        "for a cancel")
    fields = dict(body)
    try:
        text = to_json(store, what, fields)
    except RecursionError:  # (deeper than the encoder follows: far deeper than an input may nest)
        raise too_deep(f"inbox_put: {what}", MAX_DEPTH) from None
    if loads(text) != fields:  # (tuples read back as lists; a key that is not a str comes back changed)
        problem = json_problem(fields, "body")
        if problem is not None:
            raise TypeError(f"inbox_put: {what}: {problem}")
    return text


def encode_record(store: str, case_id: str, index: int, record: Record) -> EncodedRecord:
    if not isinstance(record, dict):
        raise StoreError(store, f"record {index} of case {case_id!r} is a {type(record).__name__}, not a dict")
    seq, kind, request_id = record.get("seq"), record.get("kind"), record.get("request_id")
    if isinstance(seq, bool) or not isinstance(seq, int) or seq < 0:
        raise StoreError(
            store, f"record {index} of case {case_id!r} has seq={seq!r}: every record needs an int seq >= 0"
        )
    if not isinstance(kind, str) or not kind:
        raise StoreError(store, f"record seq {seq} of case {case_id!r} has kind={kind!r}: it needs a str kind")
    if request_id is not None and not isinstance(request_id, str):
        raise StoreError(
            store, f"record seq {seq} of case {case_id!r} has request_id={request_id!r}: a str or no request_id"
        )
    return EncodedRecord(seq, kind, request_id, to_json(store, f"record seq {seq} of case {case_id!r}", record))


def row_flags(row: CaseRow) -> tuple[bool, bool]:
    """(live, parked) of a row: what recovery resumes at once, and what waits for `due()`."""
    live = row.state in LIVE_STATES or bool(row.effects)
    parked = not live and row.state in PARKED_STATES
    return live, parked


def encode_row(store: str, row: CaseRow) -> EncodedRow:
    live, parked = row_flags(row)
    detail = {name: getattr(row, name) for name in (*_DETAIL, *_LATER_DETAIL)}
    if row.answers:  # (only a case that took updates has any: the other rows keep their text)
        detail["answers"] = row.answers
    if row.owed is not None:  # (likewise: [] says "nothing owed", which a missing key does not)
        detail["owed"] = row.owed
    if row.taken_refused:
        detail["taken_refused"] = row.taken_refused
    if row.parent_step:  # (a child waited for with "cancel": the others keep their text)
        detail["parent_step"] = row.parent_step
    if row.suspended_from is not None:  # (a suspended case only)
        detail["suspended_from"] = row.suspended_from
    if row.waited:  # (a child its parent waits for only)
        detail["waited"] = True
    return EncodedRow(
        {
            "case_id": row.case_id,
            "workflow": row.workflow,
            "fingerprint": row.fingerprint,
            "state": row.state,
            "started_at": row.started_at,
            "updated_at": row.updated_at,
            "ended_at": row.ended_at,
            "last_seq": row.last_seq,
            "next_due": row.next_due,
            "live": int(live),
            "parked": int(parked),
            "detail": to_json(store, f"the row of case {row.case_id!r}", detail),
        }
    )


def decode_row(order: int, params: dict[str, Any] | tuple[Any, ...]) -> CaseRow:
    """A CaseRow from the columns of `case_row` (a tuple in query order: order first) or from encoded params."""
    tags_text = forked_from = None
    if isinstance(params, tuple):
        _, case_id, workflow, fingerprint, state, started_at, updated_at, ended_at, last_seq, next_due, detail = (
            params[:11]
        )
        if len(params) > 11:  # (the columns of layout 3: what the `start` record says, read only)
            tags_text, forked_from = params[11], params[12]
    else:
        case_id, workflow, fingerprint = params["case_id"], params["workflow"], params["fingerprint"]
        state, started_at, updated_at = params["state"], params["started_at"], params["updated_at"]
        ended_at, last_seq, next_due, detail = (
            params["ended_at"], params["last_seq"], params["next_due"], params["detail"]
        )
    try:
        extra = loads(detail)
        fields = {name: extra[name] for name in _DETAIL}
        fields.update({name: extra.get(name) for name in _LATER_DETAIL})
        if "answers" in extra:
            fields["answers"] = extra["answers"]
        if "owed" in extra:
            fields["owed"] = extra["owed"]
        if "taken_refused" in extra:
            fields["taken_refused"] = extra["taken_refused"]
        if "parent_step" in extra:
            fields["parent_step"] = extra["parent_step"]
        if "suspended_from" in extra:
            fields["suspended_from"] = extra["suspended_from"]
        if "waited" in extra:
            fields["waited"] = bool(extra["waited"])
    except (ValueError, TypeError, KeyError) as exc:  # edited or damaged: the case alone is shown suspended
        return _damaged_row(order, case_id, workflow, fingerprint, state, started_at, updated_at, ended_at, last_seq,
                            next_due, exc)
    return CaseRow(
        case_id=case_id,
        workflow=workflow,
        fingerprint=fingerprint,
        state=state,
        started_at=started_at,
        updated_at=updated_at,
        ended_at=ended_at,
        last_seq=last_seq,
        next_due=next_due,
        order=order,
        tags=decode_tags(tags_text),
        forked_from=forked_from,
        **fields,
    )


def decode_tags(text: str | None) -> dict[str, str]:
    """A row's `tags` column (JSON of the start record's tags; None: none) as a dict of str to str."""
    if not text:
        return {}
    try:
        found = loads(text)
    except ValueError:
        return {}
    if not isinstance(found, dict):
        return {}
    return {str(key): value for key, value in found.items() if isinstance(value, str)}


def start_meta(text: str) -> tuple[str | None, str | None]:
    """(tags as JSON text or None, forked_from) of the text of a journal's first record (its `start`, or the
    `snapshot` record that holds it: a fork of a compacted journal): what a row's read-only columns hold
    (MemoryStore derives them as the SQL stores' triggers do)."""
    try:
        start = loads(text)
    except ValueError:
        return None, None
    if isinstance(start, dict) and start.get("kind") == "snapshot":
        start = start.get("start")
    if not isinstance(start, dict):
        return None, None
    tags = start.get("tags")
    origin = start.get("forked_from")
    return (
        dumps(tags) if isinstance(tags, dict) else None,
        origin.get("case_id") if isinstance(origin, dict) else None,
    )


def _damaged_row(
    order: int, case_id: str, workflow: str, fingerprint: str, state: str, started_at: float, updated_at: float,
    ended_at: float | None, last_seq: int, next_due: float | None, exc: Exception,
) -> CaseRow:
    """The row of a case whose detail column cannot be read: suspended (unless it ended) with the reason; its
    journal, the source of truth, is untouched, and the case's next write of its row mends it."""
    why = f"its case row in the store is damaged (the detail column: {type(exc).__name__}: {exc})"
    ended = state in ("done", "failed", "cancelled")
    return CaseRow(
        case_id=case_id, workflow=workflow, fingerprint=fingerprint, state=state if ended else "suspended",
        started_at=started_at, updated_at=updated_at, ended_at=ended_at, last_seq=last_seq, next_due=next_due,
        order=order, suspended_reason=None if ended else f"{why}; restore the store from a backup, or cancel the case",
    )


def decode_record(store: str, case_id: str, text: str) -> Record:
    """One journal record as stored (a DamagedEntry when it is not a JSON object with `seq` and `kind`)."""
    try:
        record = loads(text)
    except ValueError as exc:
        raise DamagedEntry(store, case_id, f"a journal record is not valid JSON ({exc})") from exc
    if not isinstance(record, dict) or not isinstance(record.get("seq"), int) or not isinstance(
        record.get("kind"), str
    ):
        raise DamagedEntry(store, case_id, f"a journal record lacks its int `seq` or str `kind`: {text[:200]!r}")
    return record


def encode_snapshot(store: str, snapshot: Snapshot) -> EncodedSnapshot:
    return EncodedSnapshot(
        {
            "case_id": snapshot.case_id,
            "seq": snapshot.seq,
            "format": snapshot.format,
            "bytecode": snapshot.bytecode,
            "state": to_json(store, f"the snapshot of case {snapshot.case_id!r} at seq {snapshot.seq}", snapshot.state),
        }
    )


def encode_write(store: str, change: CaseWrite) -> EncodedWrite:
    """Check and encode a CaseWrite (a StoreError names what cannot be stored and why)."""
    if not isinstance(change, CaseWrite):
        raise TypeError(f"write() takes a CaseWrite, got {type(change).__name__}")
    case_id = change.case_id
    if not isinstance(case_id, str) or not case_id:
        raise StoreError(store, f"a CaseWrite has case_id={case_id!r}: it needs a non-empty str case id")
    for what, obj in (("row", change.row), ("snapshot", change.snapshot)):
        if obj is not None and obj.case_id != case_id:
            raise StoreError(
                store,
                f"a CaseWrite for case {case_id!r} carries the {what} of case {obj.case_id!r}: one case per write",
            )
    records = [encode_record(store, case_id, i, record) for i, record in enumerate(change.records)]
    return EncodedWrite(
        case_id=case_id,
        records=records,
        row=encode_row(store, change.row) if change.row is not None else None,
        snapshot=encode_snapshot(store, change.snapshot) if change.snapshot is not None else None,
        inbox_done=[int(i) for i in change.inbox_done],
        inbox_refused=[(int(i), str(reason)) for i, reason in change.inbox_refused],
        compact=_compact_seq(store, change, records),
        from_queue=bool(change.from_queue),
    )


def _compact_seq(store: str, change: CaseWrite, records: list[EncodedRecord]) -> int | None:
    """The seq a compaction keeps records from: the seq of the write's own `snapshot` record (StoreError else)."""
    seq = change.compact
    if seq is None:
        return None
    if not any(record.seq == seq and record.kind == "snapshot" for record in records):
        raise StoreError(
            store, f"a CaseWrite for case {change.case_id!r} compacts before seq {seq!r} without a `snapshot` record "
            "at that seq: a compaction writes the snapshot the journal then starts with, in the same write",
        )
    return int(seq)


def kept_snapshot(snapshot: Snapshot | None, first: Record) -> Snapshot | None:
    """The newest snapshot if it was taken at or after the first record kept (one from before a compaction,
    written late, is not used: the records after it are gone)."""
    if snapshot is None or snapshot.seq < int(first.get("seq", 0)):
        return None
    return snapshot


def second_end(case_id: str, seq: int) -> str:
    return (
        f"case {case_id!r} already has its `end` record: the `end` at seq {seq} was refused (a case ends once per "
        "run, and only its owner writes `end`). This write was not applied; the other writes committed with it were"
    )


def seq_taken(case_id: str, seq: int) -> str:
    return (
        f"case {case_id!r} already has a record at seq {seq}: a journal is append-only, each seq written once. "
        "This write was not applied (the other writes committed with it were); reload the case with load() and "
        "continue from its last seq"
    )


HEADS = ("start", "snapshot")
"""The kinds of record a journal can begin with: its `start`, or the `snapshot` a fork of a compacted journal
begins with (which holds the start)."""


def headless(change: EncodedWrite) -> bool:
    """Whether a write changes a case (its records or its row) without carrying the first record of its journal:
    such a write needs the case in the store. A case deleted (or pruned) while its owner wrote to it (a `retry`
    re-opening it, a refusal marked on its row) would otherwise come back as a row, or a journal without its
    start, that nothing can load."""
    if change.records:
        return change.records[0].kind not in HEADS
    return change.row is not None


def starts_case(change: EncodedWrite) -> bool:
    """Whether a write that is not its queue item's own (`CaseWrite.from_queue`) begins a journal: refused while a
    queue item of its id waits, where the store holds no case of that id."""
    return not change.from_queue and bool(change.records) and change.records[0].kind in HEADS


def waits_in_queue(case_id: str) -> str:
    return (
        f"case {case_id!r} waits in its queue (queued, or claimed and not started yet): its id is taken by that "
        "queued case, which starts from its queue. This write was not applied; use another case id, or read the "
        "queued case (status(), read_queue_item())"
    )


def case_gone(case_id: str) -> str:
    return (
        f"case {case_id!r} is not in the store (it was deleted or pruned meanwhile): a write of its records or its "
        "row needs the case, so this write was not applied (the other writes committed with it were)"
    )


def no_start(case_id: str) -> str:
    return (
        f"case {case_id!r} has a row but no `start` record (seq 0): a case's first write carries its `start` "
        "record with its row; the store holds a row written without it"
    )


# -- reads -------------------------------------------------------------------------------------------------------


def decode_start(store: str, case_id: str, text: str | None) -> Record:
    """The `start` record of a case whose row was found (a StoreError when the journal lacks it)."""
    if text is None:
        raise DamagedEntry(store, case_id, no_start(case_id))
    return decode_record(store, case_id, text)


def decode_snapshot(case_id: str, found: Any) -> Snapshot | None:
    """A Snapshot from the columns of `snapshot_newest` (seq, format, bytecode, state), or None."""
    if found is None:
        return None
    try:
        state = loads(found[3])
    except ValueError:  # damaged: as a snapshot of another version, it is not used (the whole journal is replayed)
        return None
    return Snapshot(case_id, found[0], found[1], found[2], state)


def decode_inbox(found: Any) -> InboxRow:
    """An InboxRow from the columns of `inbox_take` / `inbox_row` (id first)."""
    inbox_id, case_id, kind, body, request_id, created_at, refused = found
    try:
        fields = loads(body)
    except ValueError:  # edited or damaged: the text itself, which its case refuses (a body must be a dict)
        fields = body
    return InboxRow(int(inbox_id), case_id, kind, fields, request_id, float(created_at), refused)

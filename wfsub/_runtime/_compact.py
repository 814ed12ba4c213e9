"""Endless cases: compaction of a live case's journal into a `snapshot` record.

A case that serves signals for a year (a cart, an account, a device) would keep every input it ever took. With
`Substrate(compact_after=N)` (default 1000; None keeps every record), once a live case's journal holds N records
since its first kept one, its owner writes a `snapshot` record and removes the records before it, in ONE write
(one transaction on SQLite and Postgres, one step in memory): a crash, a lost commit answer or a refused write
leaves either the old journal whole or the new one, never a journal without its base. The journal then starts
with that record; seqs keep increasing (never renumbered). The write is fenced like any other: a node that lost
the case (its lease, a takeover) is refused and writes nothing.

    snapshot   {seq, kind: "snapshot", step, time, digest: None, start, fingerprint, format, bytecode, state}

`start` is the case's `start` record as it was (its workflow, data, scheduler, deadline and start time: what a
repeated `new_case` compares against); `state` is a snapshot as the store keeps them (`_durable.snapshot_of`:
the machine, the acceptance time of the last record applied, the due time of each armed timer, the request ids
of the latest `REQUEST_IDS_KEPT` inputs journaled with their kinds, so a retried call stays applied once within
that window: see `_request_ids`)
taken right after the record before it was applied, before the vm ran on: the records after it apply at their
own steps as they would have. Its `seq` is the snapshot record's own.

When it happens: after a commit of inputs, once they are applied, if the case has not ended. So a journal holds
at most `compact_after` records plus the inputs of one commit (at most `mailbox_size` external ones and what
the case's own effects and timers answered meanwhile) plus the snapshot record. A case whose data is not JSON
(a task put a datetime in it) cannot be snapshotted: it is not compacted, and a warning says why.

Everything that reads a journal starts from its first record: recovery, an eviction's reload, a takeover, the
version check, `wfsub.replay`, `wfsub replay`, `wfsub journal` and `wfsub trace`.

What a replay verifies across a snapshot. The records removed are not replayed again: the snapshot is trusted
as the state they led to (it was taken by the owner from its live machine). A replay restores it, then applies
each record after it with every check a replay makes (each record's step, effect and timer ids and node paths,
signals taken, the digest of the task outputs since the previous record, the outcome at `end`). So a task that
is not deterministic is still caught at the first record after it, if that record is kept; the trace of a
replay holds the events after the snapshot only; and `ReplayReport.data` is the data the case reached.

Versions. A snapshot is restored only on the program it was taken on (same fingerprint) and by a wfsub that
reads its snapshot and bytecode formats: a compacted case runs on its own registered version, and migrates to
no other (its prefix is gone, so there is nothing to replay on a new version); on another it is suspended with a
`ReplayDivergence` at its `snapshot` record saying so. Keep a version registered while compacted cases run on
it. Migrating before compaction works as ever (the `version` record; the next compaction snapshots the new
version).

`Store.first_seq(case_id)` says where a journal starts now (0 until the first compaction): a fork at an earlier
record is refused with it.
"""

from __future__ import annotations

from collections.abc import Mapping
from itertools import islice
from typing import TYPE_CHECKING, Any

import anyio

from .._errors import CommitUnknown, ReplayDivergence, StoreConflict, StoreError, bad_compact_after
from .._errors import compacted_divergence as compacted_divergence
from .._program import BYTECODE_VERSION, Program
from .._store import CaseWrite, Record
from .._trace import get_logger
from .._vm import SNAPSHOT_FORMAT
from ._durable import snapshot_of
from ._request_ids import request_kinds_of, window

if TYPE_CHECKING:
    from ._case import CaseActor

_log = get_logger("wfsub.runtime")

DEFAULT_COMPACT_AFTER = 1000
"""Journal records a live case keeps (since its first kept record) before it is compacted."""

SNAPSHOT = "snapshot"


def check_compact_after(value: object) -> int | None:
    """`Substrate(compact_after=...)` as given (ValueError naming the fix for anything but None or an int >= 2)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 2:
        raise bad_compact_after(value)
    return value


def is_snapshot(record: Mapping[str, Any]) -> bool:
    """Whether a record is a compaction's `snapshot` record (the first of a compacted journal)."""
    return record.get("kind") == SNAPSHOT


def start_of(first: Mapping[str, Any]) -> dict[str, Any]:
    """The `start` record of a case from the first record its journal keeps (the `start` itself, or the
    `snapshot` record that holds it)."""
    if is_snapshot(first):
        start: dict[str, Any] = dict(first.get("start") or {})
        return start
    return dict(first)


def request_ids_of(records: list[Record]) -> set[str]:
    """The request ids a journal has applied: those of its records, and those its `snapshot` record keeps from
    the records it replaced (their kinds: `_request_ids.request_kinds_of`)."""
    return set(request_kinds_of(records))


def base_state(first: Mapping[str, Any], program: Program) -> dict[str, Any]:
    """The snapshot state a replay of a compacted journal starts from (its `snapshot` record), checked to be
    restorable on `program`; a ReplayDivergence at that record otherwise."""
    seq = int(first.get("seq", -1))
    case_id = (first.get("start") or {}).get("case_id")
    state = first.get("state")
    taken_on = first.get("fingerprint")
    if first.get("format") != SNAPSHOT_FORMAT or first.get("bytecode") != BYTECODE_VERSION or not isinstance(
        state, Mapping
    ):
        raise compacted_divergence(
            case_id, seq, taken_on, program.fingerprint,
            f"its snapshot has format {first.get('format')!r} and bytecode {first.get('bytecode')!r}, and this wfsub "
            f"restores format {SNAPSHOT_FORMAT} and bytecode {BYTECODE_VERSION} only (the records before it were "
            "removed by compaction, so there is nothing else to replay): run the wfsub version that wrote it",
        )
    if taken_on != program.fingerprint:
        raise compacted_divergence(case_id, seq, taken_on, program.fingerprint)
    return dict(state)


def snapshot_record(actor: CaseActor) -> Record | None:
    """The `snapshot` record a compaction of the actor's case writes now (its seq: the journal's next), or None
    when its state is not JSON."""
    j = actor.journal
    m = actor.machine
    assert j is not None
    assert m is not None
    if j.start is None:
        return None
    timers = {tid: due for tid, (_, due) in actor.armed.items()}
    if actor.resume is not None:  # recovered, not restarted yet: these timers keep the due times they had
        timers.update({timer.timer_id: due for timer, due in actor.resume[1]})
    seq = j.seq + 1
    last, j.seq = j.seq, seq  # (the snapshot names the record it stands for: its own)
    try:
        snapshot = snapshot_of(m, j, timers, window(j.request_ids))
    finally:
        j.seq = last
    if snapshot is None:
        return None
    return {
        "seq": seq, "kind": SNAPSHOT, "step": m.steps, "time": j.time, "digest": None, "start": j.start,
        "fingerprint": j.fingerprint, "format": snapshot.format, "bytecode": snapshot.bytecode,
        "state": snapshot.state,
    }


def due(actor: CaseActor) -> bool:
    """Whether the actor's case should be compacted now (see the module)."""
    j = actor.journal
    limit = actor.shared.compact_after
    return (
        limit is not None and j is not None and j.seq - j.first_seq >= limit and actor.machine is not None
        and not actor.machine.ended and not j.uncompactable
    )


async def compact(actor: CaseActor) -> bool:
    """Write the case's `snapshot` record and remove the records before it, in one write. StoreConflict (fenced:
    another node has the case) and CommitUnknown (the journal decides) reach the caller, which sends the case
    back to its journal; any other StoreError leaves the journal as it was (tried again after the next input)."""
    j = actor.journal
    assert j is not None
    record = snapshot_record(actor)
    if record is None:
        j.uncompactable = True
        _log.warning(
            "case not compacted: its data is not JSON, so it cannot be snapshotted; its journal keeps every record",
            case_id=actor.case_id,
        )
        return False
    seq = int(record["seq"])
    dropped = list(islice(j.request_ids, max(len(j.request_ids) - len(record["state"]["request_ids"]), 0)))
    change = CaseWrite(actor.case_id, [record], epoch=j.epoch, compact=seq)
    try:
        with anyio.CancelScope(shield=True):  # (as an input's commit: the outcome is waited for)
            await j.store.write(change)
    except (StoreConflict, CommitUnknown):
        raise
    except StoreError as exc:
        _log.error("could not compact a case's journal; trying again later", case_id=actor.case_id, error=str(exc))
        return False
    j.seq = j.first_seq = seq
    for rid in dropped:  # the oldest, out of the window (`window`): forgotten as the store forgot their records
        j.request_ids.pop(rid, None)
    j.since_snapshot = 0
    j.compactions += 1
    return True


__all__ = [
    "DEFAULT_COMPACT_AFTER",
    "ReplayDivergence",
    "check_compact_after",
    "compact",
    "compacted_divergence",
    "due",
    "is_snapshot",
    "request_ids_of",
    "start_of",
]

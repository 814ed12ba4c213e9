"""Refused inputs are never silent. An input someone else wrote to the store's inbox (the `wfsub` command, a
`Client`, a standby) is checked again by the case's owner when it takes it; one the owner refuses stays in the
inbox marked with the reason (`wfsub signal --wait` reports it), is logged at WARNING (case, kind, name, reason),
and is listed in `status().refused`: the latest ten, newest first, read from the inbox's refused rows with the
case's row (`CaseRow.refused`). `time` is when the input was sent. A case in memory keeps the list its row
brought (`CaseJournal.refused`) and reads it again after its owner refused another.
"""

from __future__ import annotations

from typing import Any

from .._errors import StoreError
from .._store import InboxRow
from .._trace import get_logger
from ._durable import CaseJournal
from ._status import RefusedInput

_log = get_logger("wfsub.runtime")


def named(kind: str, body: Any) -> str | None:
    """The signal, update or region an inbox input names (None for a cancel)."""
    if not isinstance(body, dict):
        return None
    value = body.get("name") if kind in ("signal", "update") else body.get("region")
    return value if isinstance(value, str) else None


def refused_inputs(rows: list[InboxRow]) -> tuple[RefusedInput, ...]:
    return tuple(
        RefusedInput(kind=row.kind, name=named(row.kind, row.body), reason=row.refused or "", time=row.created_at,
                     request_id=row.request_id)
        for row in rows
    )


def log_refused(case_id: str, kind: str, name: str | None, reason: str, request_id: str | None) -> None:
    _log.warning("an input from the inbox was refused", case_id=case_id, kind=kind, name=name, reason=reason,
                 request_id=request_id)


def refused_now(journal: CaseJournal) -> tuple[RefusedInput, ...]:
    """The refused inputs of a case in memory (read again from its row after its owner refused another)."""
    rows = journal.refused
    if rows is None:
        try:
            row = journal.store.read_row(journal.case_id)
        except StoreError:
            return ()  # shown at the next status
        rows = journal.refused = [] if row is None else row.refused
    return refused_inputs(rows)


def durable_fields(journal: CaseJournal) -> dict[str, Any]:
    """The fields of `CaseStatus` a durable case in memory adds: its version, the one it migrated from, and the
    inputs refused."""
    return {"version": journal.fingerprint, "migrated_from": journal.migrated_from, "refused": refused_now(journal)}

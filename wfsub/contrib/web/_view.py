"""What the pages show, as plain values for the templates: times, waits, JSON text and the journal timeline."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from wfsub import CaseStatus, JournalRecord

TEXT_LIMIT = 20_000  # characters of one JSON value or traceback shown before it is cut
Redact = Callable[[Any], Any]


def when(t: float | None) -> str:
    """Seconds of the Substrate's clock as ISO 8601 in UTC, to the millisecond ('' for None)."""
    if t is None:
        return ""
    try:
        return datetime.fromtimestamp(t, UTC).isoformat(timespec="milliseconds")
    except (OverflowError, OSError, ValueError):
        return repr(t)


def json_text(value: Any) -> str:
    """A value as indented JSON (anything JSON cannot hold by its repr), cut at TEXT_LIMIT characters."""
    try:
        text = json.dumps(value, indent=2, ensure_ascii=False, default=repr)
    except (TypeError, ValueError):  # a container that holds itself, keys that are not str
        text = repr(value)
    return cut(text)


def cut(text: str) -> str:
    if len(text) <= TEXT_LIMIT:
        return text
    return f"{text[:TEXT_LIMIT]}\n... ({len(text) - TEXT_LIMIT:,} more characters)"


def tags_text(tags: dict[str, str]) -> str:
    """A case's tags in one short line: key=value, comma separated, in key order."""
    return ", ".join(f"{k}={v}" for k, v in sorted(tags.items()))


def waits_for(status: CaseStatus) -> str:
    """What a case waits for now: its signals, its effects in flight, its armed timers (with their due times)."""
    parts = [f"signal {name}" for name in status.signals]
    if status.effects:
        parts.extend(f"effect {e.name}" + (f" (attempt {e.attempt})" if e.attempt > 1 else "") for e in status.effects)
    elif status.effects_pending:
        parts.append(f"{status.effects_pending} effect{'s' if status.effects_pending > 1 else ''}")
    if status.timers:
        parts.extend(f"timer due {when(t.due)}" for t in status.timers)
    elif status.timers_armed:
        parts.append(f"{status.timers_armed} timer{'s' if status.timers_armed > 1 else ''}")
    return ", ".join(parts)


@dataclass(frozen=True, slots=True)
class Entry:
    """One line of the timeline: a journal record, or what the case is doing now (pending: an armed timer, an
    effect in flight)."""

    seq: str
    time: str
    kind: str  # the record kind; the CSS class of its mark
    title: str
    detail: str = ""  # JSON text: data, payload, result
    error: str = ""  # an error's type and message
    traceback: str = ""
    pending: bool = False


def refused(status: CaseStatus) -> list[Entry]:
    """The inputs the case's owner refused (the latest ten, newest first), as timeline entries."""
    return [
        Entry("", when(r.time), "refused", f"refused {r.kind}" + (f" {r.name}" if r.name else "")
              + (f" (request {r.request_id})" if r.request_id else ""), error=r.reason)
        for r in status.refused
    ]


def _redacted(redact: Redact, value: Any) -> Any:
    return value if value is None else redact(value)


def timeline(records: Sequence[JournalRecord], status: CaseStatus, redact: Redact) -> list[Entry]:
    """The journal as timeline entries, then what is still pending (effects in flight, armed timers)."""
    out = [_entry(r, redact) for r in records]
    for e in status.effects:
        retry = f", next attempt at {when(e.retry_at)}" if e.retry_at is not None else ""
        out.append(Entry("", when(e.started_at), "effect", f"effect {e.name} at {e.path}: attempt {e.attempt} "
                         f"in flight{retry}", pending=True))
    out.extend(Entry("", when(t.due), "timer", f"timer at {t.path} due {when(t.due)}", pending=True)
               for t in status.timers)
    return out


def _entry(r: JournalRecord, redact: Redact) -> Entry:
    x: dict[str, Any] = dict(r.model_extra or {})
    seq, time, kind = str(r.seq), when(r.time), r.kind
    if kind == "start":
        title = f"started {x.get('workflow') or 'a workflow'} (version {str(x.get('fingerprint', ''))[:12]})"
        if x.get("deadline") is not None:
            title += f", deadline {when(x['deadline'])}"
        forked = x.get("forked_from")
        if isinstance(forked, dict):
            title += f", forked from {forked.get('case_id')} at record {forked.get('seq')}"
        return Entry(seq, time, kind, title, json_text(_redacted(redact, x.get("data"))))
    if kind == "snapshot":  # a compaction: the records before it were replaced by the state they led to
        title = (f"compacted: the records before seq {seq} were replaced by a snapshot of the case (version "
                 f"{str(x.get('fingerprint', ''))[:12]})")
        return Entry(seq, time, kind, title, json_text(_redacted(redact, (x.get("start") or {}).get("data"))))
    if kind == "signal":
        payload = x.get("payload")
        return Entry(seq, time, kind, f"signal {x.get('name')}",
                     "" if payload is None else json_text(_redacted(redact, payload)))
    if kind == "effect":
        where = f"effect {x.get('name')} at {x.get('path')}"
        error = x.get("error")
        if isinstance(error, dict):
            return Entry(seq, time, kind, f"{where} failed",
                         error=f"{error.get('type')}: {_redacted(redact, error.get('message'))}",
                         traceback=cut(str(_redacted(redact, error.get("traceback")) or "")))
        return Entry(seq, time, kind, f"{where} returned", json_text(_redacted(redact, x.get("result"))))
    if kind == "timer":
        return Entry(seq, time, kind, f"timer at {x.get('path')} fired")
    if kind == "cancel":
        how = "with compensation" if x.get("compensate", True) else "without compensation"
        return Entry(seq, time, kind, f"cancel {how}: {_redacted(redact, x.get('reason'))}")
    if kind == "retry":
        title = f"retried (run {x.get('run')})"
        if x.get("ended") is not None:
            title += f": the end at record {x.get('ended')} is dropped"
        redo = x.get("redo") or []
        if redo:
            title += f"; the effect outcome{'s' if len(redo) > 1 else ''} at record{'s' if len(redo) > 1 else ''} " \
                     f"{', '.join(str(r) for r in redo)} run again"
        return Entry(seq, time, kind, title)
    if kind == "version":
        return Entry(seq, time, kind, f"migrated from version {str(x.get('from'))[:12]} to {str(x.get('to'))[:12]}")
    if kind == "end":
        outcome = x.get("outcome")
        error = x.get("error")
        if isinstance(error, dict):
            return Entry(seq, time, kind, f"ended {outcome} at {error.get('path')}",
                         error=f"{error.get('type')}: {_redacted(redact, error.get('message'))}",
                         traceback=cut(str(_redacted(redact, error.get("traceback")) or "")))
        if outcome == "done":
            return Entry(seq, time, kind, "ended done", json_text(_redacted(redact, x.get("result"))))
        reason = x.get("reason")
        return Entry(seq, time, kind, f"ended {outcome}" + (f": {_redacted(redact, reason)}" if reason else ""))
    region = x.pop("region", None)
    x.pop("request_id", None)
    title = f"{kind.replace('_', ' ')} {region}" if region is not None else kind.replace("_", " ")
    return Entry(seq, time, kind, title, json_text(_redacted(redact, x)) if x else "")

"""How the `wfsub` command shows things: Rich tables for people, JSON for scripts (`--json`)."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.segment import Segment, Segments
from rich.table import Table
from rich.text import Text

if TYPE_CHECKING:
    from .. import CaseStatus
    from ..stores import CaseRow

# On a terminal tables fit its width (columns fold, never cut with an ellipsis); piped into a file or another
# program they keep their natural width, so a case id is always whole. No Rich markup: what is printed is a
# store's text (node paths such as `seq[2].xor[default].wait`, case ids, reasons), shown exactly as written.
out = Console(highlight=False, markup=False, soft_wrap=False, width=None if sys.stdout.isatty() else 10_000)
err = Console(stderr=True, highlight=False, markup=False, soft_wrap=True)

_WALL_CLOCK = 1e9  # seconds since the epoch: below it, a time is a virtual clock's own seconds


def print_table(table: Table) -> None:
    """A table on stdout with each line ending at its last character: Rich pads every cell to its column's width,
    the last column's too, which would leave trailing spaces for a pipe, a file or a diff to carry."""
    for line in out.render_lines(table, out.options, pad=False, new_lines=False):
        while line and not line[-1].control and not line[-1].text.strip():
            line.pop()
        if line and not line[-1].control:
            last = line[-1]
            line[-1] = Segment(last.text.rstrip(), last.style)
        out.print(Segments([*line, Segment.line()]), crop=False, end="")


def iso(t: float | None) -> str | None:
    """A store time (seconds since the epoch) as ISO 8601 in UTC with its zone, `2026-11-26T05:20:48+00:00`;
    None for no time or a virtual clock's own seconds (they name no date)."""
    if t is None or t < _WALL_CLOCK:
        return None
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="seconds")


def when(t: float | None) -> str:
    """A store time for people: ISO 8601 with its zone (a virtual clock's seconds as they are)."""
    if t is None:
        return "-"
    return iso(t) or f"{t:g}s"


def with_iso(record: dict[str, Any], *keys: str) -> dict[str, Any]:
    """A JSON record for scripts with, beside each epoch time in `keys`, its ISO 8601 form (`<key>_iso`)."""
    out = dict(record)
    for key in keys:
        if key in out:
            out[f"{key}_iso"] = iso(out[key])
    return out


def waiting_for(row: CaseRow) -> str:
    """What a case waits for, in a few words: signals, effects in flight, timers. A suspended case waits first
    for a registered version of its workflow that can run it (and says why none can); what it waited for when
    it was suspended comes after."""
    parts = [f"signal {name}" for name in row.signals]
    parts += [f"effect {e['name']}" for e in row.effects]
    parts += [f"timer {when(t['due'])}" for t in row.timers]
    if row.state == "suspended":
        first = f"a workflow version that can run it ({row.suspended_reason or 'no reason recorded'})"
        return first + (f"; then {', '.join(parts)}" if parts else "")
    return ", ".join(parts)


def cases_table(rows: Sequence[CaseRow]) -> Table:
    table = Table(box=None, header_style="bold", pad_edge=False)
    for name in ("CASE", "WORKFLOW", "STATE", "STARTED", "ENDED", "WAITING FOR"):
        table.add_column(name, overflow="fold")
    for row in rows:
        table.add_row(
            row.case_id, row.workflow, Text(row.state, style=_STATE_STYLE.get(row.state, "")), when(row.started_at),
            when(row.ended_at), waiting_for(row),
        )
    return table


_STATE_STYLE = {"done": "green", "failed": "red", "cancelled": "yellow", "suspended": "magenta"}


def queued_table(rows: Sequence[dict[str, Any]]) -> Table:
    table = Table("CASE", "WORKFLOW", "STATE", "QUEUE", "PRIORITY", "DEDUP", "PARTITION", "ENQUEUED", box=None)
    for row in rows:
        table.add_row(row["case_id"], str(row["workflow"]), "queued", row["queue"], str(row["priority"]),
                      row["dedup"] or "-", row["partition"] or "-", when(row["enqueued_at"]))
    return table


def schedules_table(rows: Sequence[dict[str, Any]]) -> Table:
    table = Table("schedule", "workflow", "when", "paused", "last slot", "last case", "next slot")
    for row in rows:
        period = row["cron"] if row["cron"] is not None else f"every {row['every']}s"
        table.add_row(
            row["name"], str(row["workflow"]), f"{period} ({row['tz']})", "yes" if row["paused"] else "no",
            row["last_slot"] or "-", row["last_case"] or "-", row["next_slot"] or "-",
        )
    return table


def status_table(
    status: CaseStatus, row: CaseRow, compensations: Sequence[dict[str, Any]] = (), run_by: str | None = None,
) -> Table:
    """A case's status as two columns: what, and its value (`run_by`: who runs a case that has not ended)."""
    table = Table(box=None, show_header=False, pad_edge=False)
    table.add_column(style="bold", no_wrap=True)
    table.add_column(overflow="fold")
    state = status.state.value
    table.add_row("case", status.case_id)
    migrated = f", migrated from {status.migrated_from[:12]}" if status.migrated_from else ""
    table.add_row("workflow", f"{row.workflow} (version {row.fingerprint[:12]}{migrated})")
    table.add_row("state", Text(state, style=_STATE_STYLE.get(state, "")))
    if status.parent is not None:
        table.add_row("parent", status.parent)
    if status.suspended_reason is not None and status.suspended_reason.startswith("recovered "):  # a poison case
        table.add_row("suspended", Text(status.suspended_reason, style="magenta"))
    elif status.suspended_reason is not None:  # first: until a version can run it, it waits for nothing else
        table.add_row("suspended", Text(f"waits for a workflow version that can run it: {status.suspended_reason}",
                                        style="magenta"))
    if status.forked_from is not None:
        table.add_row("forked from", status.forked_from)
    if status.tags:
        table.add_row("tags", ", ".join(f"{key}={value}" for key, value in sorted(status.tags.items())))
    table.add_row("started", when(status.started_at))
    if status.ended_at is not None:
        table.add_row("ended", when(status.ended_at))
    table.add_row("recorded", f"{when(row.updated_at)} (journal record {row.last_seq})")
    if run_by is not None:
        table.add_row("run by", run_by)
    if status.at:
        table.add_row("at", "\n".join(status.at))
    if status.signals:
        label = "then waits for" if status.suspended_reason is not None else "waits for"
        table.add_row(label, "\n".join(f"signal {name!r}" for name in status.signals))
    for e in status.effects:
        table.add_row("effect", f"{e.name} #{e.effect_id} at {e.path}")
    for t in status.timers:
        table.add_row("timer", f"#{t.timer_id} at {t.path}, due {when(t.due)}")
    if status.failure is not None:
        f = status.failure
        table.add_row("error", Text(f"{f.type} at {f.path}: {f.message}", style="red"))
    if status.cancel_reason is not None and state == "failed":  # a cancel whose compensations failed
        table.add_row("cancel", f"{status.cancel_reason} (it ran the compensations below; the case failed "
                      "because one of them failed)")
    elif status.cancel_reason is not None:
        table.add_row("cancelled", status.cancel_reason)
    if status.children:
        table.add_row("children", "\n".join(status.children))
    if compensations:
        table.add_row("compensated", Text("\n").join(_compensation(c) for c in compensations))
    for r in status.refused:  # newest first
        what = r.kind if r.name is None else f"{r.kind} {r.name!r}"
        rid = "" if r.request_id is None else f" (request_id {r.request_id})"
        table.add_row("refused", Text(f"{what} sent {when(r.time)}{rid}: {r.reason}", style="yellow"))
    return table


def json_text(value: Any, indent: int | None = None) -> str:
    return json.dumps(value, indent=indent, sort_keys=indent is not None, ensure_ascii=False)


def print_json(value: Any, indent: int | None = None) -> None:
    """JSON on stdout as plain text (no markup, no wrapping), one value per line unless indented."""
    out.out(json_text(value, indent), highlight=False)


def _compensation(c: dict[str, Any]) -> Text:
    """One compensation a case's end ran: its name, where, and how it went."""
    where = f" at {c['path']}" if c["path"] else ""
    if c["outcome"] == "failed":
        return Text(f"{c['name']}{where}: failed ({c['error']})", style="red")
    return Text(f"{c['name']}{where}: done")

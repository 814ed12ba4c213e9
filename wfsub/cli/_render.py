"""How the `wfsub` command shows things: Rich tables for people, JSON for scripts (`--json`)."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

if TYPE_CHECKING:
    from .._runtime import CaseStatus
    from .._store import CaseRow

# On a terminal tables fit its width (columns fold, never cut with an ellipsis); piped into a file or another
# program they keep their natural width, so a case id is always whole.
out = Console(highlight=False, soft_wrap=False, width=None if sys.stdout.isatty() else 10_000)
err = Console(stderr=True, highlight=False, soft_wrap=True)

_WALL_CLOCK = 1e9  # seconds since the epoch: below it, a time is a virtual clock's own seconds


def when(t: float | None) -> str:
    """A store time for people: local date and time (a virtual clock's seconds as they are)."""
    if t is None:
        return "-"
    if t < _WALL_CLOCK:
        return f"{t:g}s"
    return datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M:%S")


def waiting_for(row: CaseRow) -> str:
    """What a case waits for, in a few words: signals, effects in flight, timers."""
    parts = [f"signal {name}" for name in row.signals]
    parts += [f"effect {e['name']}" for e in row.effects]
    parts += [f"timer {when(t['due'])}" for t in row.timers]
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


def status_table(status: CaseStatus, row: CaseRow) -> Table:
    """A case's status as two columns: what, and its value."""
    table = Table(box=None, show_header=False, pad_edge=False)
    table.add_column(style="bold", no_wrap=True)
    table.add_column(overflow="fold")
    state = status.state.value
    table.add_row("case", status.case_id)
    table.add_row("workflow", f"{row.workflow} (version {row.fingerprint[:12]})")
    table.add_row("state", Text(state, style=_STATE_STYLE.get(state, "")))
    table.add_row("started", when(status.started_at))
    if status.ended_at is not None:
        table.add_row("ended", when(status.ended_at))
    table.add_row("recorded", f"{when(row.updated_at)} (journal record {row.last_seq})")
    if status.at:
        table.add_row("at", "\n".join(status.at))
    if status.signals:
        table.add_row("waits for", "\n".join(f"signal {name!r}" for name in status.signals))
    for e in status.effects:
        table.add_row("effect", f"{e.name} #{e.effect_id} at {e.path}")
    for t in status.timers:
        table.add_row("timer", f"#{t.timer_id} at {t.path}, due {when(t.due)}")
    if status.failure is not None:
        f = status.failure
        table.add_row("error", Text(f"{f.type} at {f.path}: {f.message}", style="red"))
        if f.compensated:
            table.add_row("compensated", ", ".join(f.compensated))
    if status.cancel_reason is not None:
        table.add_row("cancelled", status.cancel_reason)
    if status.suspended_reason is not None:
        table.add_row("suspended", Text(status.suspended_reason, style="magenta"))
    return table


def json_text(value: Any, indent: int | None = None) -> str:
    return json.dumps(value, indent=indent, sort_keys=indent is not None, ensure_ascii=False)


def print_json(value: Any, indent: int | None = None) -> None:
    """JSON on stdout as plain text (no markup, no wrapping), one value per line unless indented."""
    out.out(json_text(value, indent), highlight=False)

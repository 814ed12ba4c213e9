"""`SqlStore`: the store methods SQLite and Postgres answer alike, written once over a small connection seam.

Most of the `Store` interface is one named query and a decoder: the row of a case, its journal, a page of due
cases, a schedule's registration. The SQL differs per database (each `sql/<database>/queries.sql` holds its own
text under the same name, with the same `:name` parameters) and so do the connections: SQLite's is synchronous,
used on a reader thread or on the writer thread; Postgres's is asyncpg's, on the driver loop. So each backend
implements a seam, and the methods here are written against it (as procrastinate's `manager.py` is written over
its connector, and DBOS's `SystemDatabase` over thin per-engine subclasses):

    Connection.one / all / value / execute    a named query with a mapping of named parameters: its first row
                                              (None: none), its rows, its first row's first column (None: no
                                              row), or how many rows it changed
    _read(action, fn, *, consistent)          fn(connection) on a read connection, with the backend's retries
                                              and errors; `consistent`: its queries see one committed state
    _read_sync(action, fn)                    the same, from the calling thread (the synchronous reads)
    _change(what, fn, *, doing)               fn(connection) as one write that is not a case write (SQLite: a
                                              job of its writer's group; Postgres: on a pooled connection)
    _decode_row(found)                        a `case_row` as a CaseRow (each database has its own columns)
    _listed(listing)                          a page of `cases()`, built by `Listing` in the database's own SQL

A method reads as one coroutine over a `Connection` whichever database runs it. On Postgres it runs on the driver
loop and each `await` is a round trip. On SQLite the connection's methods never suspend, so the backend runs
the coroutine to its end in one step, on the thread that holds the connection (`_sqlite.run_now`): a read stays
in one read transaction, a write in its writer's group.

What stays in a backend is what really differs: the case writes and their group commit, the inbox put, delete
and prune, the queues (Postgres locks across nodes, SQLite has one writer), ownership, leases and
notifications. A third backend implements the seam (a `Connection` over its driver, the runners, the decoders),
brings `sql/<database>/` with these queries under these names, and writes only the methods that are its own: not
the 44 of `Store` that each SQL backend wrote out before these 28 were shared.

Queries that answer for "this store's cases" (`live`, `due`, `next_due`, `inbox_take`) have two variants on a
shared store: `<query>_owned` for a node (given `:node`) and `<query>_all` for an opener without a lease; a
single-node store has the one, `<query>` (`_mine`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any, Generic, Protocol, TypeVar

from .._errors import StoreConflict
from ._base import REFUSED_KEPT, CaseRow, InboxRow, ProgramSummary, Record, ScheduleRow, StoreBase, StoredCase
from ._listing import Listing
from ._queueing import QueueItem, item_of
from ._rows import (
    decode_inbox,
    decode_record,
    decode_snapshot,
    decode_start,
    encode_record,
    kept_snapshot,
    loads,
    to_json,
)

Row = Any
"""One row: a tuple (SQLite) or an asyncpg Record, indexed by column position and unpacked in column order."""
Params = Mapping[str, Any]
NO_PARAMS: Params = {}  # (a dict: sqlite3 binds named parameters from a dict only; never changed)
T = TypeVar("T")


class Connection(Protocol):
    """The four things the shared methods ask of a database connection: run the query named `query` (in the
    backend's `queries.sql`) with named parameters `params` (a name the query does not take is ignored)."""

    async def one(self, query: str, params: Params = NO_PARAMS) -> Row | None:
        """The first row (None: no row)."""
        ...

    async def all(self, query: str, params: Params = NO_PARAMS) -> Sequence[Row]:
        """Every row, in order."""
        ...

    async def value(self, query: str, params: Params = NO_PARAMS) -> Any:
        """The first column of the first row (None: no row, or NULL)."""
        ...

    async def execute(self, query: str, params: Params = NO_PARAMS) -> int:
        """Run a statement; how many rows it inserted, updated or deleted."""
        ...


C = TypeVar("C", bound=Connection)
Step = Callable[[C], Coroutine[Any, Any, T]]  # what runs on one connection (a read, or a write outside the group)


class SqlStore(StoreBase, Generic[C]):
    """The one-query methods of `Store`, over the seam a SQL backend implements (see the module docstring)."""

    _name: str  # how messages name the store (its file, its URL without password)
    _node: str | None = None  # shared stores: the node id of an owner (None: a single-node store, or no lease)

    # -- the seam: each backend's own ------------------------------------------------------------------------

    async def _read(self, action: str, fn: Step[C, T], *, consistent: bool = False) -> T:
        """fn(connection) on a read connection; `consistent`: every query of fn sees one committed state."""
        raise NotImplementedError

    def _read_sync(self, action: str, fn: Step[C, T]) -> T:
        """fn(connection) from the calling thread, which waits for its answer (the synchronous reads)."""
        raise NotImplementedError

    async def _change(self, what: str, fn: Step[C, T], *, doing: str = "recording") -> T:
        """fn(connection) as one write (`doing what` names it in messages: "recording schedule 'nightly'")."""
        raise NotImplementedError

    def _decode_row(self, found: Row) -> CaseRow:
        """A `case_row` (or a listing's row) as a CaseRow."""
        raise NotImplementedError

    def _listed(self, listing: Listing) -> Step[C, list[CaseRow]]:
        """The read of one page of `cases()` (`Listing.sqlite()`, `Listing.postgres()`: the SQL is built)."""
        raise NotImplementedError

    def _mine(self, query: str, params: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """The variant of `query` that answers for the cases this store object runs, and its parameters."""
        if not self.shared:
            return query, params
        if self._node is None:
            return f"{query}_all", params
        return f"{query}_owned", {**params, "node": self._node}

    # -- cases -----------------------------------------------------------------------------------------------

    async def load(self, case_id: str) -> StoredCase | None:
        key = {"case_id": case_id}

        async def read(c: C) -> StoredCase | None:
            found = await c.one("case_row", key)
            if found is None:
                return None
            start = decode_start(self._name, case_id, await c.value("journal_first", key))
            snapshot = kept_snapshot(decode_snapshot(case_id, await c.one("snapshot_newest", key)), start)
            after = start["seq"] if snapshot is None else snapshot.seq
            found_records = await c.all("journal_after", {"case_id": case_id, "after": after})
            records = [decode_record(self._name, case_id, text) for (text,) in found_records]
            beats = await c.value("heartbeats_get", key)
            heartbeats = loads(beats) if beats is not None else {}
            row = await self._with_refused(c, self._decode_row(found))
            return StoredCase(row, start, snapshot, records, heartbeats)

        return await self._read(f"loading case {case_id!r}", read, consistent=True)

    async def row(self, case_id: str) -> CaseRow | None:
        return await self._read(f"reading the row of case {case_id!r}", self._row_reader(case_id))

    def read_row(self, case_id: str) -> CaseRow | None:
        action = f"reading the row of case {case_id!r}"
        self._check_open(action)
        return self._read_sync(action, self._row_reader(case_id))

    def _row_reader(self, case_id: str) -> Step[C, CaseRow | None]:
        async def read(c: C) -> CaseRow | None:
            found = await c.one("case_row", {"case_id": case_id})
            return None if found is None else await self._with_refused(c, self._decode_row(found))

        return read

    async def _with_refused(self, c: C, row: CaseRow) -> CaseRow:
        """The row with the latest inbox inputs refused for its case (`CaseRow.refused`)."""
        found = await c.all("inbox_refused", {"case_id": row.case_id, "limit": REFUSED_KEPT})
        if found:
            row.refused = [decode_inbox(one) for one in found]
        return row

    async def first_seq(self, case_id: str) -> int | None:
        async def read(c: C) -> int | None:
            found = await c.value("journal_first_seq", {"case_id": case_id})
            return None if found is None else int(found)

        return await self._read(f"reading the journal of case {case_id!r}", read)

    async def journal(self, case_id: str) -> list[Record]:
        return await self._read(f"reading the journal of case {case_id!r}",
                                self._records(case_id, "journal_after", {"case_id": case_id, "after": -1}))

    async def journaled_request(self, case_id: str, request_id: str) -> list[Record]:
        params = {"case_id": case_id, "request_id": request_id}
        return await self._read(f"reading the journal of case {case_id!r}",
                                self._records(case_id, "journal_request", params))

    def _records(self, case_id: str, query: str, params: Params) -> Step[C, list[Record]]:
        async def read(c: C) -> list[Record]:
            return [decode_record(self._name, case_id, text) for (text,) in await c.all(query, params)]

        return read

    async def cases(self, listing: Listing) -> list[CaseRow]:
        if listing.limit <= 0:
            self._check_open("list cases")
            return []
        return await self._read("listing cases", self._listed(listing))

    def read_cases(self, listing: Listing) -> list[CaseRow]:
        self._check_open("list cases")
        if listing.limit <= 0:
            return []
        return self._read_sync("listing cases", self._listed(listing))

    async def live(self) -> list[CaseRow]:
        return await self._read("listing live cases", self._rows(*self._mine("cases_live", {})))

    async def due(self, until: float, limit: int = 1000, after: tuple[float, int] | None = None) -> list[CaseRow]:
        if limit <= 0:
            self._check_open("list due cases")
            return []
        after_due, after_order = (-math.inf, 0) if after is None else (float(after[0]), int(after[1]))
        params = {"until": float(until), "limit": limit, "after_due": after_due, "after_order": after_order}
        return await self._read("listing due cases", self._rows(*self._mine("cases_due", params)))

    def _rows(self, query: str, params: Params) -> Step[C, list[CaseRow]]:
        async def read(c: C) -> list[CaseRow]:
            return [self._decode_row(found) for found in await c.all(query, params)]

        return read

    async def next_due(self, after: float | None = None) -> float | None:
        query, params = self._mine("cases_next_due", {"after": -math.inf if after is None else float(after)})

        async def read(c: C) -> float | None:
            value = await c.value(query, params)
            return None if value is None else float(value)

        return await self._read("reading the next due time", read)

    async def put_heartbeats(self, case_id: str, heartbeats: Mapping[str, Any], *, epoch: int | None = None) -> None:
        text = to_json(self._name, f"the heartbeats of case {case_id!r}", dict(heartbeats))
        params = {"case_id": case_id, "heartbeats": text, "node": self._node, "epoch": epoch}
        await self._change(f"the heartbeats of case {case_id!r}", lambda c: c.execute("heartbeats_put", params))

    async def replace_start(self, case_id: str, start: Record) -> None:
        params = {"case_id": case_id, "record": encode_record(self._name, case_id, 0, start).text}
        replaced = await self._change(f"the start record of case {case_id!r}",
                                      lambda c: c.execute("journal_start_replace", params), doing="replacing")
        if replaced != 1:
            raise StoreConflict(self._name, f"case {case_id!r}: its start record cannot be replaced: its journal "
                                "holds more than its start")

    # -- the inbox -------------------------------------------------------------------------------------------

    async def inbox_take(self, after: int = 0, limit: int = 1000) -> list[InboxRow]:
        if limit <= 0:
            self._check_open("read the inbox")
            return []
        query, params = self._mine("inbox_take", {"after": after, "limit": limit})
        return await self._read("reading the inbox", self._inbox(query, params))

    async def inbox_row(self, inbox_id: int) -> InboxRow | None:
        async def read(c: C) -> InboxRow | None:
            found = await c.one("inbox_row", {"id": inbox_id})
            return None if found is None else decode_inbox(found)

        return await self._read(f"reading inbox row {inbox_id}", read)

    async def inbox_pending(self, case_id: str, limit: int = 10, after: int = 0) -> list[InboxRow]:
        params = {"case_id": case_id, "limit": limit, "after": after}
        return await self._read(f"reading the inbox of case {case_id!r}", self._inbox("inbox_pending", params))

    def _inbox(self, query: str, params: Params) -> Step[C, list[InboxRow]]:
        async def read(c: C) -> list[InboxRow]:
            return [decode_inbox(found) for found in await c.all(query, params)]

        return read

    # -- programs and schedules ------------------------------------------------------------------------------

    async def put_program(self, summary: ProgramSummary) -> None:
        params = {
            "fingerprint": summary.fingerprint, "workflow": summary.workflow,
            "summary": to_json(self._name, f"the summary of {summary.workflow!r}", summary.summary),
            "now": time.time(),  # (SQLite's; Postgres records database time)
        }
        await self._change(f"the summary of workflow {summary.workflow!r}",
                           lambda c: c.execute("program_put", params))

    async def program(self, fingerprint: str) -> ProgramSummary | None:
        return await self._read("reading a program summary", self._program("program_get", {"fingerprint": fingerprint}))

    async def newest_program(self, workflow: str) -> ProgramSummary | None:
        return await self._read("reading a program summary", self._program("program_newest", {"workflow": workflow}))

    def _program(self, query: str, params: Params) -> Step[C, ProgramSummary | None]:
        async def read(c: C) -> ProgramSummary | None:
            found = await c.one(query, params)
            return None if found is None else ProgramSummary(str(found[0]), str(found[1]), loads(found[2]))

        return read

    async def schedule_register(self, name: str, spec: Mapping[str, Any], first_slot: float) -> ScheduleRow:
        params = {"name": name, "spec": to_json(self._name, f"schedule {name!r}", dict(spec)),
                  "first_slot": first_slot, "now": time.time()}

        async def register(c: C) -> ScheduleRow:
            return _schedule_row(await c.one("schedule_register", params))

        return await self._change(f"schedule {name!r}", register)

    async def schedule_advance(self, name: str, slot: float, case_id: str | None) -> bool:
        params = {"name": name, "slot": slot, "case_id": case_id, "now": time.time()}
        moved = await self._change(f"the slot of schedule {name!r}", lambda c: c.execute("schedule_advance", params))
        return moved > 0

    async def schedule_pause(self, name: str, paused: bool) -> bool:
        params = {"name": name, "paused": bool(paused), "now": time.time()}
        changed = await self._change(f"schedule {name!r}", lambda c: c.execute("schedule_pause", params),
                                     doing="pausing")
        return changed > 0

    async def schedules(self) -> list[ScheduleRow]:
        async def read(c: C) -> list[ScheduleRow]:
            return [_schedule_row(found) for found in await c.all("schedules_all")]

        return await self._read("listing schedules", read)

    # -- queues and children ---------------------------------------------------------------------------------

    def read_queue_items(
        self, *, state: str | None = None, queue: str | None = None, limit: int = 100, before: int | None = None
    ) -> list[QueueItem]:
        params = {"state": state, "queue": queue, "limit": limit, "before": before}
        return self._read_sync("listing queued cases", self._items("queue_list", params))

    def read_queue_item(self, case_id: str) -> QueueItem | None:
        found = self._read_sync(f"looking for case {case_id!r} among the queued cases",
                                self._items("queue_get", {"case_id": case_id}))
        return found[0] if found else None

    def _items(self, query: str, params: Params) -> Step[C, list[QueueItem]]:
        async def read(c: C) -> list[QueueItem]:
            return [item_of(found, loads(found[5])) for found in await c.all(query, params)]

        return read

    async def queue_specs(self) -> dict[str, dict[str, Any]]:
        async def read(c: C) -> dict[str, dict[str, Any]]:
            return {str(name): loads(spec) for name, spec in await c.all("queue_specs")}

        return await self._read("reading the queues", read)

    async def children_of_ended(self, limit: int = 1000) -> list[tuple[str, str]]:
        async def read(c: C) -> list[tuple[str, str]]:
            return [(str(child), str(parent)) for child, parent in await c.all("children_of_ended", {"limit": limit})]

        return await self._read("listing the children of ended cases", read)

    async def children_waited_for(
        self, owner: str | None, after: int = 0, limit: int = 1000
    ) -> list[tuple[int, str, str, dict[str, Any]]]:
        params = {"owner": owner, "after": after, "limit": limit}

        async def read(c: C) -> list[tuple[int, str, str, dict[str, Any]]]:
            found = await c.all("children_waited_for", params)
            return [(int(o), str(child), str(parent), step)
                    for o, child, parent, text in found if isinstance(step := loads(text), dict)]

        return await self._read("listing the children waited for by live cases", read)


def _schedule_row(found: Row) -> ScheduleRow:
    name, spec, last_slot, last_case, paused, updated_at = found
    return ScheduleRow(
        str(name), loads(spec), None if last_slot is None else float(last_slot),
        None if last_case is None else str(last_case), bool(paused), float(updated_at),
    )


__all__ = ["NO_PARAMS", "Connection", "Params", "Row", "SqlStore"]

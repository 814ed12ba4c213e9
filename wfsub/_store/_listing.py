"""What `cases()` filters by, and the one query each store builds from it.

A listing is newest first (by `CaseRow.order`), at most `limit` rows, those with `order` < `before`, and every
filter given holds at once: `state`, `workflow`, every `tags` pair (the case's `start` record has each key with
that value), `id_prefix` (its id starts with it), `started_after` < its start time <= `started_before`. The SQL
stores filter in SQL (tags through an index: SQLite's `case_tags`, Postgres's GIN index on `cases.tags`); the
statement is built here from fixed text, one condition per filter given, and every value is a bound parameter.

More filters (a case's queue, ...) plug in the same way: a field here, a condition in `where_sqlite` and
`where_postgres`, a test in `matches`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ._base import CaseRow
from ._rows import NO_ORDER, dumps


def after_prefix(prefix: str) -> str | None:
    """The least str above every str that starts with `prefix`, in code point order (SQLite's BINARY order of
    UTF-8): its last character incremented, dropping trailing U+10FFFF (an id may hold that character too, so
    the prefix and U+10FFFF is no bound); None when nothing is above them (a prefix of U+10FFFF only)."""
    chars = list(prefix)
    while chars:
        code = ord(chars.pop()) + 1
        if code <= 0x10FFFF:
            return "".join(chars) + chr(0xE000 if 0xD800 <= code <= 0xDFFF else code)  # (no surrogate: not text)
    return None


SQLITE_COLUMNS = (
    "case_order, case_id, workflow, fingerprint, state, started_at, updated_at, ended_at, last_seq, next_due, "
    "detail, tags, forked_from"
)
POSTGRES_COLUMNS = (
    "case_order, case_id, workflow, fingerprint, state, started_at, updated_at, ended_at, last_seq, next_due, "
    "detail, owner, epoch, tags::text, forked_from"
)


@dataclass(frozen=True, slots=True)
class Listing:
    """The filters of one page of `cases()` (checked by the runtime before they get here)."""

    state: str | None = None
    workflow: str | None = None
    limit: int = 100
    before: int | None = None
    tags: Mapping[str, str] = field(default_factory=dict)
    id_prefix: str | None = None
    started_after: float | None = None
    started_before: float | None = None
    parent: str | None = None  # the case that started them (`start_case`): its children only

    def matches(self, order: int, row: CaseRow) -> bool:
        """Whether a row is listed (MemoryStore's filter; the SQL stores say the same in SQL)."""
        return (
            (self.before is None or order < self.before)
            and (self.state is None or row.state == self.state)
            and (self.workflow is None or row.workflow == self.workflow)
            and all(row.tags.get(key) == value for key, value in self.tags.items())
            and (self.id_prefix is None or row.case_id.startswith(self.id_prefix))
            and (self.started_after is None or row.started_at > self.started_after)
            and (self.started_before is None or row.started_at <= self.started_before)
            and (self.parent is None or row.parent == self.parent)
        )

    def sqlite(self) -> tuple[str, dict[str, Any]]:
        """The SQLite statement and its named parameters."""
        params: dict[str, Any] = {"before": NO_ORDER if self.before is None else self.before, "limit": self.limit}
        where = ["case_order < :before"]
        if self.state is not None:
            where.append("state = :state")
            params["state"] = self.state
        if self.workflow is not None:
            where.append("workflow = :workflow")
            params["workflow"] = self.workflow
        for i, (key, value) in enumerate(sorted(self.tags.items())):
            where.append(
                f"case_id IN (SELECT case_id FROM case_tags WHERE key = :tag_key{i} AND value = :tag_value{i})"
            )
            params[f"tag_key{i}"], params[f"tag_value{i}"] = key, value
        if self.id_prefix is not None:
            end = after_prefix(self.id_prefix)  # (the range lets the index find them; substr decides)
            where.append("case_id >= :prefix" + ("" if end is None else " AND case_id < :prefix_end")
                         + " AND substr(case_id, 1, length(:prefix)) = :prefix")
            params["prefix"] = self.id_prefix
            if end is not None:
                params["prefix_end"] = end
        if self.started_after is not None:
            where.append("started_at > :started_after")
            params["started_after"] = self.started_after
        if self.started_before is not None:
            where.append("started_at <= :started_before")
            params["started_before"] = self.started_before
        if self.parent is not None:
            where.append("parent = :parent")
            params["parent"] = self.parent
        # state and workflow: the state's index, as the listing of both always took (a
        # state is the rarer filter in a busy store: most cases are done)
        hint = " INDEXED BY cases_by_state" if self.state is not None and self.workflow is not None else ""
        if self.parent is not None:  # the children of one case: few, through their own index
            hint = " INDEXED BY cases_by_parent"
        sql = (
            f"SELECT {SQLITE_COLUMNS} FROM cases{hint} WHERE {' AND '.join(where)} "
            "ORDER BY case_order DESC LIMIT :limit"
        )
        return sql, params

    def postgres(self) -> tuple[str, list[Any]]:
        """The Postgres statement and its positional parameters."""
        args: list[Any] = [NO_ORDER if self.before is None else self.before, self.limit]
        where = ["case_order < $1"]

        def bind(value: Any) -> str:
            args.append(value)
            return f"${len(args)}"

        if self.state is not None:
            where.append(f"state = {bind(self.state)}")
        if self.workflow is not None:
            where.append(f"workflow = {bind(self.workflow)}")
        if self.tags:
            where.append(f"tags @> {bind(dumps(dict(self.tags)))}::jsonb")
        if self.id_prefix is not None:
            escaped = self.id_prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
            where.append(f"case_id LIKE {bind(escaped + '%')} ESCAPE '\\'")
        if self.started_after is not None:
            where.append(f"started_at > {bind(self.started_after)}")
        if self.started_before is not None:
            where.append(f"started_at <= {bind(self.started_before)}")
        if self.parent is not None:
            where.append(f"parent = {bind(self.parent)}")
        sql = f"SELECT {POSTGRES_COLUMNS} FROM cases WHERE {' AND '.join(where)} ORDER BY case_order DESC LIMIT $2"
        return sql, args


__all__ = ["POSTGRES_COLUMNS", "SQLITE_COLUMNS", "Listing"]

"""The SQL text of the SQLite store, read once: named queries, the schema, and the numbered migrations.

    sql/queries.sql          every statement the store runs, each under a `-- name: NAME` line
    sql/schema.sql           the current layout: what a new file is built from
    sql/migrations/NNNN_*.sql  migration NNNN moves a file from layout NNNN-1 to layout NNNN

Keeping every statement in one file (as procrastinate does) lets a reader see everything the store asks of the
database in one place; a backend for another database brings its own `sql/` folder.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Mapping
from dataclasses import dataclass
from importlib.resources import files
from importlib.resources.abc import Traversable

from ._base import SCHEMA_VERSION

_NAME = re.compile(r"^-- name: ([a-z_][a-z0-9_]*)\s*$")
_MIGRATION = re.compile(r"^(\d{4})_[a-z0-9_]+\.sql$")


def parse_queries(text: str, source: str = "queries.sql") -> dict[str, str]:
    """Split a queries file into {name: statement}; each must be one complete SQL statement."""
    queries: dict[str, str] = {}
    name: str | None = None
    body: list[str] = []

    def close() -> None:
        if name is None:
            return
        sql = "\n".join(line for line in body if not line.lstrip().startswith("--")).strip()
        if not sqlite3.complete_statement(sql) or split_statements(sql) != [sql]:
            raise ValueError(f"{source}: query {name!r} must be exactly one SQL statement ending in ';'")
        queries[name] = sql

    for line in text.splitlines():
        match = _NAME.match(line)
        if match:
            close()
            name, body = match.group(1), []
            if name in queries:
                raise ValueError(f"{source}: query {name!r} is defined twice")
        elif name is not None:
            body.append(line)
    close()
    return queries


def split_statements(script: str) -> list[str]:
    """The complete statements of a script, in order (comment-only tails are dropped)."""
    statements: list[str] = []
    start = 0
    for index, char in enumerate(script):
        if char == ";" and sqlite3.complete_statement(script[start : index + 1]):
            statement = script[start : index + 1].strip()
            if _has_code(statement):
                statements.append(statement)
            start = index + 1
    if _has_code(script[start:]):
        raise ValueError(f"SQL script ends with an incomplete statement: {script[start:].strip()[:80]!r}")
    return statements


def _has_code(text: str) -> bool:
    return any(line.strip() and not line.strip().startswith("--") for line in text.splitlines())


@dataclass(frozen=True, slots=True)
class Migration:
    version: int  # the layout version this migration produces
    name: str  # its file name, for messages
    statements: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Layout:
    """A layout version, the statements that build it in a new file, and the migrations that reach it."""

    version: int
    schema: tuple[str, ...]
    migrations: Mapping[int, Migration]  # version -> the migration that produces it


def load_layout(folder: Traversable, version: int) -> Layout:
    """Read `schema.sql` and `migrations/` from `folder`; migrations must be numbered 1..version, no gaps."""
    schema = tuple(split_statements(folder.joinpath("schema.sql").read_text(encoding="utf-8")))
    migrations: dict[int, Migration] = {}
    for entry in folder.joinpath("migrations").iterdir():
        match = _MIGRATION.match(entry.name)
        if not match:
            continue
        number = int(match.group(1))
        if number in migrations:
            raise ValueError(f"two migrations numbered {number}: {migrations[number].name} and {entry.name}")
        statements = tuple(split_statements(entry.read_text(encoding="utf-8")))
        migrations[number] = Migration(number, entry.name, statements)
    if sorted(migrations) != list(range(1, version + 1)):
        raise ValueError(
            f"migrations in {folder} are numbered {sorted(migrations)}: expected 1..{version} (layout version "
            f"{version}), one file per version, named NNNN_what.sql"
        )
    return Layout(version, schema, migrations)


_FOLDER = files("wfsub._store").joinpath("sql")
QUERIES: Mapping[str, str] = parse_queries(_FOLDER.joinpath("queries.sql").read_text(encoding="utf-8"))
LAYOUT = load_layout(_FOLDER, SCHEMA_VERSION)

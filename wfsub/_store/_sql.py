"""The SQL text of the stores, read once per database: named queries and numbered migrations.

    sql/<database>/queries.sql               every statement the store runs, each under a `-- name: NAME` line
    sql/<database>/migrations/NNNN_*.sql     migration NNNN moves a store from layout NNNN-1 to layout NNNN

Each database has its folder side by side (`sql/sqlite/`, `sql/postgres/`). The migrations are the only
description of a layout: a new store runs them all in order, an older one the ones it lacks, so the layout is
written once and the path that builds it is the path that is tested. Keeping every statement in one file (as
procrastinate does) lets a reader see everything a store asks of its database in one place; a backend for
another database brings its own folder and loads it with `load_dialect`.

Parameters. A query takes named parameters (`:case_id`), so the methods of `_sql_store.py` bind one mapping on
every database. A driver that binds by position only (asyncpg: `$1`, `$2`, ...) loads its dialect with
`numbered=True`: each `:name` is rewritten to `$n` once, here, numbered in the order the names first appear, and
`Dialect.params` keeps those names in that order for the binding. A query of such a dialect may be written with
`$n` itself (its backend then passes the values by position), never with both kinds.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib.resources import files
from importlib.resources.abc import Traversable

from ._base import SCHEMA_VERSION

_NAME = re.compile(r"^-- name: ([a-z_][a-z0-9_]*)\s*$")
# A `:name` parameter (not a `::type` cast), or text in which a colon is not one: a quoted string or identifier,
# a comment.
_PARAM = re.compile(r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"|--[^\n]*|(?<![:\w]):([a-z_][a-z0-9_]*)")
_NUMBERED = re.compile(r"\$\d")
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


def number_params(name: str, sql: str, source: str = "queries.sql") -> tuple[str, tuple[str, ...]]:
    """`sql` with each `:name` parameter as `$n` (numbered in the order the names first appear), and the names in
    that order; a query that uses `$n` already is kept as it is, with no names."""
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        param = match.group(1)
        if param is None:
            return match.group(0)  # a string, a quoted identifier, a comment: kept as written
        if param not in names:
            names.append(param)
        return f"${names.index(param) + 1}"

    numbered = _PARAM.sub(number, sql)
    if names and _NUMBERED.search(_PARAM.sub(lambda m: "" if m.group(1) is None else m.group(0), sql)):
        raise ValueError(
            f"{source}: query {name!r} mixes :name and $n parameters: write it with one kind (:name binds by "
            "name on every database)"
        )
    return numbered, tuple(names)


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
    script: str  # the file's text (Postgres runs it whole)
    statements: tuple[str, ...]  # its statements, one by one (SQLite runs them so); () when not split


@dataclass(frozen=True, slots=True)
class Layout:
    """A layout version and the migrations that build it: a new store runs 1..version in order."""

    version: int
    migrations: Mapping[int, Migration]  # version -> the migration that produces it


def load_layout(folder: Traversable, version: int | None = None, *, split: bool = True) -> Layout:
    """Read `migrations/` from `folder`; they must be numbered 1..version (1..the last without `version`), no gaps.

    `split`: cut each script into its statements (SQLite's; a Postgres script, with its $$-quoted function
    bodies, runs whole)."""
    migrations: dict[int, Migration] = {}
    for entry in folder.joinpath("migrations").iterdir():
        match = _MIGRATION.match(entry.name)
        if not match:
            continue
        number = int(match.group(1))
        if number in migrations:
            raise ValueError(f"two migrations numbered {number}: {migrations[number].name} and {entry.name}")
        script = entry.read_text(encoding="utf-8")
        statements = tuple(split_statements(script)) if split else ()
        migrations[number] = Migration(number, entry.name, script, statements)
    last = version if version is not None else max(migrations, default=0)
    if sorted(migrations) != list(range(1, last + 1)) or last < 1:
        raise ValueError(
            f"migrations in {folder} are numbered {sorted(migrations)}: expected 1..{last} (layout version "
            f"{last}), one file per version, named NNNN_what.sql"
        )
    return Layout(last, dict(sorted(migrations.items())))  # in version order (the folder lists them in any)


@dataclass(frozen=True, slots=True)
class Dialect:
    """One database's SQL, read from `sql/<name>/`: its named queries and the migrations that build its layout;
    `params`, for a dialect loaded `numbered`: each query's parameter names in `$n` order (see the docstring)."""

    name: str
    queries: Mapping[str, str]
    layout: Layout
    params: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


def load_dialect(name: str, version: int | None = None, *, split: bool = True, numbered: bool = False) -> Dialect:
    """`sql/<name>/queries.sql` and `sql/<name>/migrations/` of this package (see the module docstring).

    `numbered`: rewrite each query's `:name` parameters to `$n`, for a driver that binds by position."""
    folder = files("wfsub._store").joinpath("sql").joinpath(name)
    source = f"sql/{name}/queries.sql"
    queries = parse_queries(folder.joinpath("queries.sql").read_text(encoding="utf-8"), source)
    params: dict[str, tuple[str, ...]] = {}
    if numbered:
        for query, sql in queries.items():
            queries[query], params[query] = number_params(query, sql, source)
    return Dialect(name, queries, load_layout(folder, version, split=split), params)


SQLITE = load_dialect("sqlite", SCHEMA_VERSION)
QUERIES: Mapping[str, str] = SQLITE.queries
LAYOUT = SQLITE.layout

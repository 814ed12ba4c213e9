"""The SQL stores' shared methods (`_sql_store.py`): their queries in both dialects, `:name` numbering for
Postgres, and the SQLite seam that runs a shared method in one step."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest

import wfsub
from wfsub._store._sql import QUERIES, load_dialect, number_params
from wfsub._store._sqlite import run_now

STORE = Path(wfsub.__file__).parent / "_store"
POSTGRES = load_dialect("postgres", split=False, numbered=True)


def test_named_parameters_are_numbered_in_the_order_they_first_appear() -> None:
    """`:name` becomes `$n` (a name used twice keeps its number); casts, strings and comments are left alone."""
    sql = "SELECT a::text, ':x', \"c:d\" FROM t WHERE a = :a AND b = :b::bigint OR a = :a -- :z\n;"
    assert number_params("q", sql) == (
        "SELECT a::text, ':x', \"c:d\" FROM t WHERE a = $1 AND b = $2::bigint OR a = $1 -- :z\n;", ("a", "b")
    )
    assert number_params("q", "UPDATE t SET a = $2 WHERE b = $1;") == ("UPDATE t SET a = $2 WHERE b = $1;", ())


def test_a_query_mixing_named_and_numbered_parameters_is_refused() -> None:
    """One query binds one way: `:name` beside `$n` is a ValueError naming the query and the fix."""
    with pytest.raises(ValueError, match=r"query 'both' mixes :name and \$n parameters: write it with one kind"):
        number_params("both", "SELECT 1 FROM t WHERE a = $1 AND b = :b;")


def test_every_query_of_the_shared_methods_is_in_both_dialects_with_named_parameters() -> None:
    """A query name `_sql_store.py` runs is in SQLite's and Postgres's queries.sql (or, for this node's cases, as
    Postgres's `_owned` and `_all` pair), and Postgres's takes `:name` parameters, so one mapping binds both."""
    source = (STORE / "_sql_store.py").read_text()
    shared = {name for name in re.findall(r'"([a-z_]+)"', source) if name in QUERIES}
    assert {"case_row", "journal_after", "schedule_register", "queue_list", "cases_due", "inbox_take"} <= shared
    for name in sorted(shared):
        variants = [name] if name in POSTGRES.queries else [f"{name}_owned", f"{name}_all"]
        for variant in variants:
            assert variant in POSTGRES.queries, f"Postgres has no query {variant!r}"
            assert "$" not in POSTGRES.queries[variant] or POSTGRES.params[variant], variant
    assert POSTGRES.params["cases_due_owned"] == ("until", "node", "after_due", "after_order", "limit")


def test_a_sqlite_step_that_would_suspend_is_refused() -> None:
    """`run_now` runs a step that awaits only its connection; one that suspends fails loudly, never half-runs."""

    async def suspends() -> int:
        await asyncio.sleep(0)
        return 1

    async def answers() -> int:
        return 7

    assert run_now(answers()) == 7
    with pytest.raises(RuntimeError, match="may await only its connection's methods"):
        run_now(suspends())

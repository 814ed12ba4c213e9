"""What the case lifecycle tests share: a store of each kind that a later Substrate re-opens, and workflows."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from wfsub.stores import MemoryStore, PostgresStore

from ..stores import _pg

KINDS = [
    "memory", "sqlite", pytest.param("postgres", marks=pytest.mark.skipif(not _pg.ENABLED, reason=_pg.SKIP_REASON)),
]
"""Every store a lifecycle feature is tested on."""


def store_maker(kind: str, tmp_path: Path) -> Callable[[], Any]:
    """Each call gives what the next Substrate opens: the same place each time (one MemoryStore object, one
    SQLite file, one Postgres schema)."""
    if kind == "memory":
        memory = MemoryStore()
        return lambda: memory
    if kind == "sqlite":
        path = str(tmp_path / "cases.db")
        return lambda: path
    schema = _pg.emptied_schema()
    dsn = _pg.database_dsn()
    return lambda: PostgresStore(dsn, schema=schema)


def node(kind: str) -> dict[str, Any]:
    """Substrate options so that a restarted Postgres node owns its cases at once."""
    return {"node_id": "n1"} if kind == "postgres" else {}

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ..stores import _pg


@pytest.fixture(scope="session", autouse=True)
def _postgres_database() -> Iterator[None]:
    """The session's own Postgres database (made on first use) is dropped when the session ends."""
    yield
    if _pg.ENABLED:
        _pg.drop_database()

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from wfsub._store import Store

from . import _pg
from ._helpers import STORE_PARAMS, make_store


@pytest.fixture(scope="session", autouse=True)
def _postgres_database() -> Iterator[None]:
    """The session's own Postgres database (made on first use) is dropped when the session ends."""
    yield
    _pg.drop_database()


@pytest.fixture(params=STORE_PARAMS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    """A new, unopened store of each kind (tests open it with `opened(store)` in their body)."""
    return make_store(request.param, tmp_path)

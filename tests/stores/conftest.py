from __future__ import annotations

from pathlib import Path

import pytest

from wfsub._store import Store

from ._helpers import STORE_PARAMS, make_store


@pytest.fixture(params=STORE_PARAMS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    """A new, unopened store of each kind (tests open it with `opened(store)` in their body)."""
    return make_store(request.param, tmp_path)

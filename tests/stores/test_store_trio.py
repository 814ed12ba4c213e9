"""The store-generic tests again, on the trio backend: the stores use anyio only, and the writer thread wakes
trio waiters through trio's own token."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio
import pytest

from wfsub._store import Store

from . import test_store_generic as generic
from ._helpers import STORE_PARAMS, make_store

GENERIC: dict[str, Callable[[Store], Awaitable[None]]] = {
    name: fn for name, fn in vars(generic).items() if name.startswith("test_") and inspect.iscoroutinefunction(fn)
}


@pytest.mark.parametrize("kind", STORE_PARAMS)
@pytest.mark.parametrize("name", sorted(GENERIC))
def test_generic_on_trio(name: str, kind: str, tmp_path: Path) -> None:
    """Each store-generic test passes unchanged when run by trio."""
    anyio.run(GENERIC[name], make_store(kind, tmp_path), backend="trio")


def test_every_generic_test_is_rerun_on_trio() -> None:
    """The trio rerun found the generic tests (a rename cannot silently drop them from it)."""
    assert len(GENERIC) >= 25

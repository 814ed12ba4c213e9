"""Fixtures for every test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import structlog

from .stores import _pg


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The slowest tests (marked `long`) first: the suite's wall time on two workers is then about half its total,
    rather than that plus the longest test started last."""
    items.sort(key=lambda item: item.get_closest_marker("long") is None)


@pytest.fixture(autouse=True)
def _structlog_unconfigured() -> Iterator[None]:
    """Each test starts with structlog as an app that never configured it has it (capture_logs configures it)."""
    structlog.reset_defaults()
    yield
    structlog.reset_defaults()


@pytest.fixture(scope="session", autouse=True)
def _postgres_database() -> Iterator[None]:
    """The session's own Postgres database (made on first use) is dropped when the session ends; under
    pytest-xdist each worker is a session of its own, with a database of its own."""
    yield
    _pg.drop_database()

"""Fixtures for every test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import structlog


@pytest.fixture(autouse=True)
def _structlog_unconfigured() -> Iterator[None]:
    """Each test starts with structlog as an app that never configured it has it (capture_logs configures it)."""
    structlog.reset_defaults()
    yield
    structlog.reset_defaults()

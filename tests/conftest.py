"""Fixtures for every test."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import pytest
import structlog

from .stores import _pg


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--shuffle", type=int, default=None, metavar="SEED",
        help="run the tests in an order drawn from SEED (the `long` ones still first): a test that passes only in "
             "the usual order is found on purpose (`make flake` draws a seed per run and prints it)",
    )


def pytest_report_header(config: pytest.Config) -> list[str]:
    seed = config.getoption("--shuffle")
    postgres = f"Postgres tests: {_pg.URL}" if _pg.ENABLED else "Postgres tests: skipped (no server)"
    return [postgres] + ([f"test order: shuffled with --shuffle={seed}"] if seed is not None else [])


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The slowest tests (marked `long`) first: the suite's wall time on two workers is then about half its total,
    rather than that plus the longest test started last. With --shuffle, each group in an order drawn from the seed
    (every xdist worker draws the same, as it must)."""
    seed = config.getoption("--shuffle")
    if seed is not None:
        random.Random(seed).shuffle(items)
    items.sort(key=lambda item: item.get_closest_marker("long") is None)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Say which of the skips are the Postgres tests, and how to run them, rather than a bare count."""
    skipped = terminalreporter.stats.get("skipped", [])
    postgres = sum(1 for report in skipped if _pg.SKIP_REASON in str(getattr(report, "longrepr", "")))
    if postgres:
        terminalreporter.write_line(f"{postgres} of the {len(skipped)} skipped are Postgres tests: {_pg.SKIP_REASON}",
                                    yellow=True)


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

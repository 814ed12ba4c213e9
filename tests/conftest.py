"""Fixtures for every test."""

from __future__ import annotations

import os
import random
import tempfile
from collections.abc import Iterator
from pathlib import Path
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


# A tmpfs, where the machine has one: an fsync there costs microseconds where a disk's costs milliseconds, and most
# of what a durable test waits for is its commits. Nothing the suite checks needs the data to reach a disk (a
# SIGKILLed process loses nothing its commits wrote either way; a power loss is beyond what a test can make);
# `make bench` measures the real disk. TMPDIR, when set, wins.
FAST_TMP = Path("/dev/shm")


def pytest_configure(config: pytest.Config) -> None:
    """Temporary files (tmp_path, tempfile) on FAST_TMP unless TMPDIR says where."""
    if "TMPDIR" not in os.environ and FAST_TMP.is_dir() and os.access(FAST_TMP, os.W_OK | os.X_OK):
        os.environ["TMPDIR"] = str(FAST_TMP)
        tempfile.tempdir = None  # (computed again from TMPDIR on next use)


def pytest_report_header(config: pytest.Config) -> list[str]:
    seed = config.getoption("--shuffle")
    postgres = f"Postgres tests: {_pg.URL}" if _pg.ENABLED else "Postgres tests: skipped (no server)"
    temp = f"temporary files: {tempfile.gettempdir()}"
    return [postgres, temp] + ([f"test order: shuffled with --shuffle={seed}"] if seed is not None else [])


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

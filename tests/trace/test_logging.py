"""Logging: silent by default below WARNING, governed by `logging`, and fed through the app's structlog setup."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap

import pytest
import structlog

from wfsub import CaseFailed, Substrate, task, wait

SCRIPT = textwrap.dedent(
    """
    import anyio, logging, sys
    from wfsub import CaseFailed, Substrate, task, wait

    async def main():
        async with Substrate() as sub:
            handle = await sub.new_case(task(lambda c: 1 / 0))
            try:
                await handle.result()
            except CaseFailed:
                pass
            await sub.new_case(wait("never"))   # cancelled when the Substrate closes

    anyio.run(main)
    """
)


def test_a_failing_case_prints_nothing_when_the_app_set_up_no_logging() -> None:
    """With no logging configured, a failed case and a shutdown write nothing to stdout or stderr."""
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, check=True)
    assert (done.stdout, done.stderr) == ("", "")


async def test_wfsub_loggers_are_governed_by_the_logging_module(caplog: pytest.LogCaptureFixture) -> None:
    """A case failure is an INFO record of logger wfsub.runtime; raising the wfsub logger's level hides it."""
    caplog.set_level(logging.INFO, logger="wfsub")
    async with Substrate() as sub:
        with pytest.raises(CaseFailed):
            await (await sub.new_case(task(lambda c: 1 / 0))).result()
    failed = [r for r in caplog.records if "case failed" in r.getMessage()]
    assert [(r.name, r.levelno) for r in failed] == [("wfsub.runtime", logging.INFO)]
    caplog.clear()
    logging.getLogger("wfsub").setLevel(logging.WARNING)
    try:
        async with Substrate() as sub:
            with pytest.raises(CaseFailed):
                await (await sub.new_case(task(lambda c: 1 / 0))).result()
    finally:
        logging.getLogger("wfsub").setLevel(logging.NOTSET)
    assert [r for r in caplog.records if r.name.startswith("wfsub")] == []


async def test_an_app_that_configures_structlog_gets_wfsubs_events_through_its_processors() -> None:
    """Events carry structured fields (case_id, path, error) into the app's structlog processors."""
    with structlog.testing.capture_logs() as logs:
        async with Substrate() as sub:
            handle = await sub.new_case(task(lambda c: 1 / 0))
            with pytest.raises(CaseFailed):
                await handle.result()
            await sub.new_case(wait("never"))
    failed = [e for e in logs if e["event"] == "case failed"]
    assert failed == [
        {
            "event": "case failed",
            "log_level": "info",
            "case_id": handle.case_id,
            "path": "task",
            "error": "task <lambda> raised ZeroDivisionError: division by zero",
        }
    ]

"""The store failing while cases come back: a case that could not be loaded is tried again in the background, and
version checks wait the failure out; no live case stays owned and not run."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio
import pytest

from wfsub import StoreError, Substrate, effect, seq, task
from wfsub.stores import CaseRow, Listing, SqliteStore, StoredCase

from ._util import wait_all_blocked

BOUND = 30.0  # seconds: a bound against a hang, not a latency requirement
hold = {"effects": True}  # while True, the effect waits forever (the Substrate closes with it in flight)


async def call_out(ctx: Mapping[str, Any]) -> dict[str, Any]:
    if hold["effects"]:
        await anyio.sleep_forever()
    return {"called": True}


def done(ctx: Mapping[str, Any]) -> dict[str, Any]:
    return {"done": True}


FLOWS = {"call": seq(effect(call_out), task(done))}


class LoadsFail(SqliteStore):
    """A SqliteStore whose first `failures` loads (and case listings) fail, as during a database outage."""

    def __init__(self, path: Path, failures: int, listings: int = 0) -> None:
        super().__init__(path)
        self.failures = failures
        self.listings = listings  # listings (`cases()`) that fail
        self.listed = 0  # listings that succeeded

    def _outage(self, what: str) -> None:
        if self.failures > 0:
            self.failures -= 1
            raise StoreError(self.url, f"{what} failed: the database could not be reached (a test's outage)")

    async def load(self, case_id: str) -> StoredCase | None:
        self._outage(f"loading case {case_id!r}")
        return await super().load(case_id)

    async def cases(self, listing: Listing) -> list[CaseRow]:
        if self.listings > 0:
            self.listings -= 1
            raise StoreError(self.url, "listing cases failed: the database could not be reached (a test's outage)")
        found = await super().cases(listing)
        self.listed += 1
        return found


@pytest.fixture
def held() -> Any:
    hold["effects"] = True
    yield hold
    hold["effects"] = True


async def test_live_cases_that_failed_to_come_back_at_recovery_are_tried_again_and_run(
    tmp_path: Path, held: dict[str, bool],
) -> None:
    """Recovery meeting a store outage: each case that could not be loaded is loaded again later and completes."""
    path = tmp_path / "cases.db"
    async with Substrate(store=str(path), workflows=FLOWS) as sub:
        for i in range(3):
            await sub.new_case("call", {}, case_id=f"c{i}")
        await wait_all_blocked()
    held["effects"] = False
    store = LoadsFail(path, failures=5)
    async with Substrate(store=store, workflows=FLOWS) as sub:
        with anyio.fail_after(BOUND):
            for i in range(3):
                assert await sub.await_case(f"c{i}") == {"called": True, "done": True}
        assert store.failures == 0


async def test_version_checks_at_start_wait_out_a_store_outage(tmp_path: Path, held: dict[str, bool]) -> None:
    """The version check of stored cases meeting a store outage tries again; the Substrate goes on meanwhile."""
    held["effects"] = False
    store = LoadsFail(tmp_path / "cases.db", failures=0, listings=2)
    async with Substrate(store=store, workflows=FLOWS) as sub:
        assert await (await sub.new_case("call", {})).result() == {"called": True, "done": True}
        with anyio.fail_after(BOUND):
            while store.listed < 3:  # noqa: ASYNC110 - the check's own retries, in the background
                await anyio.sleep(0.02)
        assert store.listings == 0

"""What the many-nodes primitives of the store interface are on a store that one Substrate owns alone.

MemoryStore and SqliteStore are single-node stores: one Substrate owns every case in them, so there is no lease
to renew, nothing to take over, no queue of cases for any node, and the local clock is the store's clock.
`wait_changed` polls a cheap check (`_poll_changed`: SQLite's data_version, a flag in memory), never sooner than
1 ms after its call (a busy store changes at every commit), then less often, doubling up to every `WAIT_POLL`
seconds: an input written by another process (the `wfsub` command, a client, a standby) is noticed within a few
ms, and an idle store costs a few us of checks 100 times a second. It keeps its own mark, so it never consumes
what `changed()` reports.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import anyio
import anyio.lowlevel

from .._errors import StoreError
from ._base import CaseRow, CaseWrite, Record, StoreBase

WAIT_FIRST = 0.001  # seconds from `wait_changed`'s first check to its second
WAIT_POLL = 0.01  # seconds between two checks in `wait_changed` at most


class SingleNode(StoreBase):
    """The many-nodes methods of the store interface, for a store that one Substrate owns."""

    shared = False
    lease_seconds = 0.0  # no lease: one Substrate owns the store until it closes it

    def _poll_changed(self) -> bool:
        """Whether another connection committed since the previous call (wait_changed's own mark)."""
        raise NotImplementedError

    async def wait_changed(self, timeout: float) -> None:  # noqa: ASYNC109 (a polling bound, not a deadline)
        deadline = time.monotonic() + timeout
        pause = WAIT_FIRST
        await anyio.sleep(min(WAIT_FIRST, timeout))  # a busy store changes at every commit: look at most every ms
        while not self._poll_changed():
            left = deadline - time.monotonic()
            if left <= 0:
                return
            await anyio.sleep(min(pause, left))
            pause = min(pause * 2, WAIT_POLL)
        await anyio.lowlevel.checkpoint()

    def drain_ended(self) -> set[str] | None:
        self._check_open("drain ended cases")
        return set()  # no other node ends a case here

    async def renew_lease(self) -> float:
        await anyio.lowlevel.checkpoint()
        return time.time()

    async def take_over(self, limit: int = 1000) -> list[CaseRow]:
        await anyio.lowlevel.checkpoint()
        return []

    async def take_ended(self, case_id: str) -> CaseRow | None:
        return await self.row(case_id)

    async def queue_case(self, change: CaseWrite) -> None:
        await anyio.lowlevel.checkpoint()
        raise StoreError(
            self._store_name(),
            f"cannot queue case {change.case_id!r} for any node: placement='any' needs a shared store, where "
            "several nodes own cases (store='postgresql://...'); on this store, start the case on this Substrate "
            "(the default placement)",
        )

    async def replace_start(self, case_id: str, start: Record) -> None:
        await anyio.lowlevel.checkpoint()
        raise StoreError(self._store_name(), f"case {case_id!r}: this store holds no queued cases")

    async def claim_queued(self, fingerprints: Sequence[str], limit: int) -> list[str]:
        await anyio.lowlevel.checkpoint()
        return []

    async def database_time(self) -> float:
        await anyio.lowlevel.checkpoint()
        return time.time()

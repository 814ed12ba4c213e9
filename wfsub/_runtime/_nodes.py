"""Many nodes on a shared store (Postgres): this node's lease, the cases it takes over or claims, and the time.

Each Substrate on a shared store is a node with an id (`Substrate(node_id=...)`, random by default). Its lease
(in database time) is renewed every third of the store's `lease_seconds`. A node that has not renewed for half
a lease, on its own monotonic clock (`Lease`: cut off from the store, or paused), stops journaling and starting
effects, retry attempts included, until it renews again: by then another node may take its cases over, and the
store's fencing (owner and epoch checked in every write) refuses whatever it would write; pausing first keeps it
from running effects it can no longer record. A renewal that comes back after the lease may have run out is not
taken as if nothing happened: the node first drops the actors of the cases it no longer holds at their epoch.

Every third of a lease the node also takes over the cases of nodes whose lease expired (the store bumps their
epochs and never gives one case to two nodes) and resumes those that were running or had effects in flight; the
parked ones come back through the due-time index and the inbox, like parked cases after a restart; an actor of
such a case still in memory (an older epoch) leaves first. A node that restarts with the same `node_id` finds its
own cases at once (the store gives a node id to a new process when its holder's lease ran out or its holder is
dead).

Time: acceptance times and due times are database time, so node clocks may drift: the node's clock is the local
clock plus the offset the last renewal measured.
"""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable, Callable

import anyio

from .._errors import StoreError
from .._store import CaseRow, Store
from .._trace import get_logger
from ._clock import RealClock
from ._status import CaseState

_log = get_logger("wfsub.runtime")

TAKEOVER_BATCH = 1000  # cases taken over per transaction (a dead node's cases are all taken in one pass)
LIVE = {CaseState.INITIALIZING.value, CaseState.RUNNING.value, CaseState.WAITING_EFFECT.value}


class DatabaseClock(RealClock):
    """The real clock, set to the shared store's time (`offset` follows each lease renewal)."""

    def __init__(self) -> None:
        self.offset = 0.0

    def now(self) -> float:
        return time.time() + self.offset


class Lease:
    """Whether this node may journal and start effects: `wait()` returns at once while its lease is fresh.

    Fresh means renewed less than half a lease ago on this process's own monotonic clock (`fresh_until`, set at
    each renewal from the time the renewal was sent): a node that cannot renew, or was paused, finds it stale the
    moment it looks, whatever its loops managed to do meanwhile. A store without leases never goes stale."""

    def __init__(self) -> None:
        self.fresh_until = math.inf
        self._ok = True
        self._back = anyio.Event()

    @property
    def ok(self) -> bool:
        if self._ok and time.monotonic() >= self.fresh_until:
            self.lost()
        return self._ok

    async def wait(self) -> None:
        while not self.ok:
            await self._back.wait()

    def lost(self) -> None:
        if self._ok:
            self._ok = False
            self._back = anyio.Event()

    def renewed(self, fresh_until: float) -> None:
        self.fresh_until = fresh_until
        if not self._ok and time.monotonic() < fresh_until:
            self._ok = True
            self._back.set()


class Node:
    """The loops of a node on a shared store (started by the Substrate beside its cases)."""

    def __init__(
        self,
        store: Store,
        lease: Lease,
        clock: DatabaseClock | None,
        taken: Callable[[CaseRow], Awaitable[None]],
        recheck: Callable[[], Awaitable[bool]],
        lease_seconds: float,
        *,
        took_over: Callable[[], object],
    ) -> None:
        self.store = store
        self.lease = lease
        self.clock = clock
        self.taken = taken  # a case this node took over: stale actors of it go, a live one is resumed
        self.recheck = recheck  # after a lapse: drop the actors of cases this node no longer holds at their epoch
        self.lease_seconds = lease_seconds
        self.took_over = took_over  # called after a takeover that took some cases
        self.renewed_at = time.monotonic()  # when the last renewal that succeeded was sent (the store just opened)
        lease.renewed(self.renewed_at + lease_seconds / 2)

    async def renew(self) -> None:
        """Renew the lease now (at start, and then every third of a lease).

        A renewal that comes back after the lease may have run out (a lease since the last renewal was sent, on
        this process's monotonic clock: the database's expiry is no earlier) is not taken as if nothing happened:
        other nodes may have taken this node's cases meanwhile, so the actors of cases it no longer holds at their
        epoch leave memory before the node journals or starts effects again."""
        sent = time.monotonic()
        try:
            database_now = await self.store.renew_lease()
        except StoreError as exc:
            _log.warning("could not renew this node's lease", store=self.store.url, error=str(exc))
            if time.monotonic() - self.renewed_at > self.lease_seconds / 2:
                if self.lease.ok:
                    _log.error(
                        "lease not renewed for half its length: no journaling and no new effects until it is",
                        store=self.store.url,
                    )
                self.lease.lost()
            return
        lapsed = time.monotonic() - self.renewed_at >= self.lease_seconds
        if self.clock is not None:
            self.clock.offset = database_now - time.time()
        if lapsed:
            self.lease.lost()  # (it may still look fresh to a caller that has not looked since)
            if not await self.recheck():
                return  # the check could not read the store: no renewal counts until one can
        self.renewed_at = sent
        self.lease.renewed(sent + self.lease_seconds / 2)

    async def lease_loop(self) -> None:
        while True:
            await anyio.sleep(self.lease_seconds / 3)  # leases are real time, whatever clock the cases run on
            await self.renew()

    async def takeover_loop(self) -> None:
        """Take over the cases of dead nodes (lease expired) and resume those that were running."""
        while True:
            await self.take_over()
            await anyio.sleep(self.lease_seconds / 3)

    async def take_over(self) -> None:
        """Take over every case of dead nodes now (in batches), resuming the live ones."""
        while self.lease.ok:
            try:
                rows = await self.store.take_over(TAKEOVER_BATCH)
            except StoreError as exc:
                _log.warning("could not take over the cases of dead nodes", store=self.store.url, error=str(exc))
                return
            if rows:
                _log.info("took over cases of nodes whose lease expired", count=len(rows))
            for row in rows:
                await self.taken(row)
            if rows:
                self.took_over()
            if len(rows) < TAKEOVER_BATCH:
                return

"""Clocks: where the runtime gets its time from.

Every timer of the runtime (a `sleep`, a deferred choice's timeout, an effect attempt's timeout, a retry
backoff, a case `timeout=`, an `await_case` timeout) goes through the Substrate's clock, so a test can swap in
`VirtualClock` and move time by hand instead of sleeping.

A clock has three operations:

- `now()`: the current time in seconds (timestamps of trace events and case status).
- `await sleep(seconds)`: park the calling task for `seconds` of this clock.
- `deadline_scope(seconds)`: a fresh `anyio.CancelScope` that this clock cancels once `seconds` have passed;
  after the `with` block, `scope.cancelled_caught` tells whether the deadline cut the work short.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections.abc import Callable
from typing import Protocol, runtime_checkable

import anyio
import anyio.lowlevel


@runtime_checkable
class Clock(Protocol):
    """What the runtime needs from a clock."""

    def now(self) -> float:
        """Current time in seconds."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Park the calling task for `seconds` of this clock."""
        ...

    def deadline_scope(self, seconds: float) -> anyio.CancelScope:
        """A new cancel scope that this clock cancels `seconds` from now."""
        ...


class RealClock:
    """Wall-clock timestamps (`time.time()`), timers on the event loop's monotonic clock."""

    __slots__ = ()

    def now(self) -> float:
        return time.time()

    async def sleep(self, seconds: float) -> None:
        await anyio.sleep(seconds)

    def deadline_scope(self, seconds: float) -> anyio.CancelScope:
        return anyio.CancelScope(deadline=anyio.current_time() + seconds)

    def __repr__(self) -> str:
        return "RealClock()"


IdleProbe = Callable[[], bool]


class VirtualClock:
    """A clock that moves only when a test says so.

    `await clock.advance(seconds)` first lets every attached Substrate settle (each case runs until it is
    parked on its mailbox), then fires the due timers in deadline order (timers due at the same instant fire
    together), letting the cases handle each firing before the next, and finally sets the time to
    `now + seconds`. Timers armed while handling a firing fire in the same call if they fall due within the
    window, so `sleep(1)` followed by `sleep(1)` completes with one `advance(2)`.

    "Settled" means: every attached Substrate reports no case actor running and no message waiting (and, on a
    store, the version check its opening started has made its first pass), for a few consecutive event-loop
    rounds. Effects that do real I/O are not waited for (use `await_case` for those);
    effects that only await this clock (retry backoff, attempt timeouts) are.
    """

    SETTLE_ROUNDS = 3  # consecutive idle rounds that count as settled
    MAX_ROUNDS = 200_000  # a case still busy after this many rounds and MAX_SECONDS never parks: settle() raises
    MAX_SECONDS = 60.0  # (a case waiting on its store is busy too: a loaded machine's commit can take seconds)

    def __init__(self, start: float = 0.0) -> None:
        self._now = float(start)
        self._heap: list[tuple[float, int, Callable[[], object]]] = []
        self._seq = itertools.count()
        self._probes: list[IdleProbe] = []
        self._fired = 0

    def now(self) -> float:
        return self._now

    @property
    def fired(self) -> int:
        """How many timers `advance` has fired so far: what advancing costs is proportional to it (every firing
        lets the cases settle), so a test can pin that a long span costs what falls due in it, not its length."""
        return self._fired

    @property
    def pending_timers(self) -> int:
        """How many timers are waiting to fire (including ones whose waiter has gone)."""
        return len(self._heap)

    def next_deadline(self) -> float | None:
        """When the earliest waiting timer falls due, or None."""
        return self._heap[0][0] if self._heap else None

    def call_at(self, deadline: float, callback: Callable[[], object]) -> None:
        """Run `callback()` (synchronously) when the clock reaches `deadline`."""
        heapq.heappush(self._heap, (deadline, next(self._seq), callback))

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await anyio.lowlevel.checkpoint()
            return
        event = anyio.Event()
        self.call_at(self._now + seconds, event.set)
        await event.wait()

    def deadline_scope(self, seconds: float) -> anyio.CancelScope:
        scope = anyio.CancelScope()
        if seconds <= 0:
            scope.cancel()
        else:
            self.call_at(self._now + seconds, scope.cancel)
        return scope

    def attach(self, probe: IdleProbe) -> Callable[[], None]:
        """Register an idle probe (a Substrate does this on entry); returns the function that detaches it."""
        self._probes.append(probe)

        def detach() -> None:
            if probe in self._probes:
                self._probes.remove(probe)

        return detach

    def _idle(self) -> bool:
        return all(probe() for probe in self._probes)

    async def settle(self) -> None:
        """Wait until every attached Substrate is idle (see the class docstring)."""
        idle_rounds = 0
        rounds = 0
        began = time.monotonic()
        while rounds < self.MAX_ROUNDS or time.monotonic() - began < self.MAX_SECONDS:
            if rounds < self.MAX_ROUNDS:
                await anyio.lowlevel.checkpoint()
            else:  # past the rounds a case's own work takes: a store's I/O, most likely; look every ms
                await anyio.sleep(0.001)
            rounds += 1
            if self._idle():
                idle_rounds += 1
                if idle_rounds >= self.SETTLE_ROUNDS:
                    return
            else:
                idle_rounds = 0
        raise RuntimeError(
            f"VirtualClock: the cases did not settle within {self.MAX_ROUNDS:,} event-loop rounds and "
            f"{self.MAX_SECONDS:g} s; some case "
            "never parks (a loop with no wait, sleep or effect?), so time cannot be advanced past it"
        )

    async def advance(self, seconds: float) -> None:
        """Move time forward by `seconds`, firing every timer that falls due and letting cases handle it."""
        if seconds < 0:
            raise ValueError(f"cannot move a clock backwards: advance({seconds!r}); pass seconds >= 0")
        target = self._now + seconds
        await self.settle()
        heap = self._heap
        while heap and heap[0][0] <= target:
            deadline = heap[0][0]
            self._now = max(self._now, deadline)
            while heap and heap[0][0] <= deadline:
                self._fired += 1
                heapq.heappop(heap)[2]()
            await self.settle()
        self._now = target

    def __repr__(self) -> str:
        return f"VirtualClock(now={self._now!r}, pending_timers={len(self._heap)})"

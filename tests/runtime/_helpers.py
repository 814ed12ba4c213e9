"""Shared helpers of the runtime tests: a Substrate on a virtual clock, and effects that record what they do."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any

import anyio

from wfsub import Substrate
from wfsub.testing import CapturingSink, VirtualClock


@asynccontextmanager
async def running(**options: Any) -> AsyncIterator[tuple[Substrate, VirtualClock, CapturingSink]]:
    """A Substrate on a fresh VirtualClock with a CapturingSink (opened in the test's own task)."""
    clock = VirtualClock()
    sink = CapturingSink()
    options.setdefault("sinks", [sink])
    async with Substrate(clock=clock, **options) as sub:
        yield sub, clock, sink


class Recorder:
    """Builds effects that log their calls, can wait on the clock, and count cancellations."""

    def __init__(self, clock: VirtualClock | None = None) -> None:
        self.clock = clock
        self.calls: list[str] = []
        self.cancelled: list[str] = []
        self.active = 0
        self.max_active = 0

    def effect(
        self, name: str, updates: Mapping[str, Any] | None = None, *, delay: float = 0.0, hang: bool = False
    ) -> Callable[[Mapping[str, Any]], Awaitable[Mapping[str, Any] | None]]:
        """An async effect fn: logs `name`, optionally waits `delay` on the clock (or forever), returns updates."""

        async def fn(ctx: Mapping[str, Any]) -> Mapping[str, Any] | None:
            self.calls.append(name)
            self.active += 1
            self.max_active = max(self.max_active, self.active)
            try:
                if hang:
                    await anyio.sleep_forever()
                if delay:
                    assert self.clock is not None
                    await self.clock.sleep(delay)
            except anyio.get_cancelled_exc_class():
                self.cancelled.append(name)
                raise
            finally:
                self.active -= 1
            return dict(updates) if updates is not None else {name: True}

        fn.__qualname__ = name
        return fn

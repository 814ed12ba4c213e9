"""Event-loop facts, asked fast: the one place where wfsub tells asyncio from trio.

wfsub runs on anyio, so on asyncio and on trio. anyio learns which library runs the current task from sniffio,
and asks it again on every `anyio.Event()` and `anyio.lowlevel.current_token()`. Both sit on hot paths: a case
actor makes an event each time it parks, and each write to a database store makes one for its waiter (the
group commit, `_store/_group.py`). Measured on asyncio: `anyio.Event()` takes about 1.4 us and
`current_token()` about 1.2 us, while asyncio's own `Event()` takes 0.17 us and the test `on_asyncio` makes takes
0.2 us. So these paths ask here whether the task is asyncio's and make asyncio's own objects if it is; anywhere
else (trio, or trio running as a guest on an asyncio loop) anyio answers as usual.

This module also says whether a cancellation came from a cancel scope around the task (`cancelled_by_runtime`),
which the runtime tells apart from a stray `CancelledError` an effect or a sink let out.

It sits below the stores and the runtime and imports neither: both use it.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any, Protocol

import anyio

asyncio_loop = asyncio._get_running_loop  # C, no sniffing: None outside an asyncio loop
try:  # anyio does without sniffio, and then runs on asyncio only (trio needs it)
    from sniffio import thread_local as _sniffed  # its `name` is set by a library that says which it is (trio)
except ImportError:  # pragma: no cover
    _sniffed = None  # type: ignore[assignment]


def on_asyncio(loop: object) -> bool:
    """Whether the task running now is asyncio's (`loop`, the running asyncio loop or None), without sniffio's
    six calls: a loop runs, and no other library (trio, as a guest on it) says it runs the task."""
    return loop is not None and (_sniffed is None or _sniffed.name is None)


class Wake(Protocol):
    """What a parked actor waits on: anyio's Event, or the backend's own (see `wake_event`)."""

    def set(self) -> None: ...

    async def wait(self) -> Any: ...


def wake_event() -> Wake:
    """A new Event for the running loop: asyncio's own on asyncio (`anyio.Event()` asks sniffio first, six calls
    for each park), anyio's elsewhere."""
    if on_asyncio(asyncio_loop()):  # (the test the store's group commit makes for its events)
        return asyncio.Event()
    return anyio.Event()


def cancelled_by_runtime() -> bool:
    """Whether the current task is being cancelled by a cancel scope around it (region, case, shutdown)."""
    return anyio.current_effective_deadline() == -math.inf


__all__ = ["Wake", "asyncio_loop", "cancelled_by_runtime", "on_asyncio", "wake_event"]

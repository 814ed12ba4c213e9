"""The Postgres store's plumbing: the driver (imported on demand), DSNs, errors, and the loop it runs on.

`PostgresStore` (`_postgres.py`, whose docstring has the measurements behind these choices) runs asyncpg on an
asyncio event loop in a thread of its own (`DriverLoop`), whatever the caller runs on; results come back to the
caller's loop through the `anyio.lowlevel.current_token()` it captured (`_group.call_soon_on`), never blocking
the driver thread. Driver errors are classified (`classify`) by what they say about a statement's outcome, which decides
whether a call may be retried, and turned into StoreErrors that say what was attempted and the fix (`fault`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

import anyio
import anyio.lowlevel

from .._errors import StoreError
from .._trace import get_logger
from ._group import call_soon_on

_log = get_logger("wfsub.store")

T = TypeVar("T")
STOP_GRACE = 1.0  # seconds the driver loop gives its cancelled work to end (close its connections) at close
OPTIONS = ("schema", "lease_seconds", "connect_timeout", "retry_for")
"""wfsub's own options, taken out of a DSN's query string before the driver sees it."""


def driver(store: str = "postgresql") -> Any:
    try:
        import asyncpg
    except ImportError as exc:
        raise StoreError(
            store,
            "the Postgres store needs the asyncpg driver, which is not installed: pip install 'wfsub[postgres]'",
        ) from exc
    return asyncpg


def redact_dsn(dsn: str) -> str:
    """The DSN without its password (for `url` and messages)."""
    parts = urlsplit(dsn)
    if parts.password is None:
        return dsn
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = quote(parts.username or "", safe="") + "@" + host + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def split_options(dsn: str) -> tuple[str, dict[str, str]]:
    """(the DSN for the driver, wfsub's own options taken out of its query string)."""
    parts = urlsplit(dsn)
    mine: dict[str, str] = {}
    theirs: list[tuple[str, str]] = []
    for key, value in parse_qsl(parts.query, keep_blank_values=True):
        if key in OPTIONS:
            mine[key] = value
        else:
            theirs.append((key, value))
    return urlunsplit((parts.scheme, parts.netloc, parts.path, urlencode(theirs), parts.fragment)), mine


# -- errors ----------------------------------------------------------------------------------------------------

FIXES = {
    "28P01": "check the user and password in the DSN (or PGPASSWORD, ~/.pgpass)",
    "28000": "check the user in the DSN and the server's pg_hba.conf",
    "3D000": "create the database first (createdb NAME), or name an existing one in the DSN",
    "42501": "grant the user CREATE on the database (for the schema) and use of the schema, or choose a schema "
    "it owns with ?schema=",
    "53300": "the server has no free connection slot: raise max_connections, or lower readers= on the stores",
}
UNREACHABLE = "check that the server is up and reachable at this address (pg_isready), then try again"


def sqlstate(exc: BaseException) -> str | None:
    state = getattr(exc, "sqlstate", None)
    return state if isinstance(state, str) else None


def classify(exc: BaseException) -> str:
    """'retry': nothing was committed and the connection is the problem (safe to try again);
    'unknown': the connection was lost after the statement was sent; 'fatal': anything else."""
    asyncpg = driver()
    if isinstance(exc, asyncpg.exceptions.ConnectionDoesNotExistError):
        return "unknown"  # lost with no answer (its SQLSTATE 08003 is the client's, not the server's)
    if isinstance(exc, asyncpg.exceptions.InternalClientError) and "cannot switch to state" in str(exc):
        return "retry"  # the connection was already broken: refused before anything was sent
    state = sqlstate(exc)
    if state is not None:
        if state.startswith("08") or state in ("57P01", "57P02", "57P03", "53300"):
            return "retry"  # the server answered with an error: the transaction did not commit
        return "fatal"
    if isinstance(exc, asyncpg.InterfaceError):
        text = str(exc)
        if "connection is closed" in text or "pool is closing" in text or "released" in text:
            return "retry"  # refused before anything was sent
        return "fatal"
    if isinstance(exc, (OSError, asyncio.TimeoutError, ConnectionError, EOFError)):
        return "unknown"
    return "fatal"


def fault(store: str, action: str, exc: BaseException) -> StoreError:
    state = sqlstate(exc)
    fix = FIXES.get(state or "")
    if fix is None:
        fix = UNREACHABLE if classify(exc) != "fatal" else "the driver's error is the cause below"
    detail = f"{type(exc).__name__}: {exc}" + (f" (SQLSTATE {state})" if state else "")
    error = StoreError(store, f"{action} failed: {detail}; {fix}")
    error.__cause__ = exc
    return error


def fenced(case_id: str, node: str | None, epoch: int | None, owner: str | None, now_epoch: int | None) -> str:
    mine = f"node {node!r}" if node else "a store opened without a lease (owner=False)"
    held = f" at epoch {epoch}" if epoch is not None else ""
    if owner is None:
        whose = "no node: it is queued for any node (placement='any') until one claims it"
    else:
        whose = f"node {owner!r} at epoch {now_epoch}"
    return (
        f"case {case_id!r} is owned by {whose}, not by {mine}{held}: this write was not applied (fencing). The "
        "case was taken over after this node's lease expired (or was never this node's): drop it from memory; "
        "its owner runs it now"
    )


# -- the driver loop -------------------------------------------------------------------------------------------


class DriverLoop:
    """An asyncio event loop in a thread of its own: where asyncpg runs, whatever the caller runs on."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._run, name=f"wfsub-postgres {name}", daemon=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
        finally:
            self.loop.close()

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        if self.thread.is_alive():
            # Work still running (a synchronous read its caller gave up on, a retry past an outage) is cancelled
            # and let finish, so its connection is closed rather than dropped with the loop.
            with contextlib.suppress(Exception):
                self.submit(self._cancel_pending()).result(STOP_GRACE + 1.0)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join()

    @staticmethod
    async def _cancel_pending() -> None:
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=STOP_GRACE)

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    async def call(self, coro: Coroutine[Any, Any, T], *, cancel: bool = True) -> T:
        """Run coro on the driver loop; wait for it on the caller's loop (asyncio or trio). A cancelled caller
        cancels the work too, unless cancel=False (a statement that changes something runs to its end)."""
        token = anyio.lowlevel.current_token()
        done = anyio.Event()
        future = self.submit(coro)
        future.add_done_callback(lambda _: call_soon_on(token, done.set))
        try:
            await done.wait()
        finally:
            if cancel and not future.done():
                future.cancel()
        return future.result()

    def call_sync(self, coro: Coroutine[Any, Any, T], timeout: float) -> T:
        if threading.current_thread() is self.thread:
            coro.close()
            raise RuntimeError("a synchronous store read from the driver thread itself would never finish")
        future = self.submit(coro)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise

"""The Postgres server the store tests use.

    WFSUB_TEST_POSTGRES=postgresql://postgres@127.0.0.1:5432/test python -m pytest tests/stores

Without the variable, the tests use that URL whenever a server answers at 127.0.0.1:5432; `WFSUB_TEST_POSTGRES=`
(empty) skips them. The URL names a database the tests may connect to; the test session creates a database of its
own beside it (`wfsub_test_<worker>_<pid>_<random>`: under pytest-xdist each worker, gw0, gw1, ..., is a session
with its own), gives each test an emptied schema in it (or a new one, for tests of the layout itself), and drops it
when the session ends (tests/conftest.py). Without a server, the Postgres tests are skipped with SKIP_REASON and the
run's summary counts them. Database work here runs on a thread of its own with asyncio.run, so it can be called
from sync code, async tests and trio alike.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import secrets
import socket
import subprocess
import sys
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

T = TypeVar("T")

DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/test"


def _server_answers(host: str = "127.0.0.1", port: int = 5432) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


# Unset: the default local server, whenever it answers (so a plain `pytest` runs the Postgres tests where a server
# is at hand); set to an empty string: none (they are skipped).
URL = os.environ["WFSUB_TEST_POSTGRES"] if "WFSUB_TEST_POSTGRES" in os.environ else (
    DEFAULT_URL if _server_answers() else "")
ENABLED = bool(URL)
SKIP_REASON = (
    "Postgres test: WFSUB_TEST_POSTGRES is set empty; unset it to use a server at 127.0.0.1:5432, or name one"
    if "WFSUB_TEST_POSTGRES" in os.environ else
    "Postgres test: no server answered at 127.0.0.1:5432 and WFSUB_TEST_POSTGRES names none; start one, or set "
    f"WFSUB_TEST_POSTGRES={DEFAULT_URL} (a database the tests may connect to and create databases beside)"
)

_lock = threading.Lock()
_database: str | None = None
_schemas = itertools.count(1)


class _Session:
    """A thread running an event loop, and on it one connection to this session's database: the statements tests
    run between their own calls (emptying the shared schema, peeking at tables) cost a round trip, not a new
    connection (tens of milliseconds on a loaded machine, paid by every Postgres test)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="wfsub-test-postgres", daemon=True)
        self.thread.start()
        self.conn: Any = None  # an asyncpg.Connection to _database, made on first use
        self.lock = threading.Lock()  # one statement at a time on the connection, whichever thread asks

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    async def fetchval(self, dsn: str, sql: str, *args: Any) -> Any:
        import asyncpg

        if self.conn is not None:
            if not self.conn.is_closed():
                try:
                    return await self.conn.fetchval(sql, *args)
                except (asyncpg.ConnectionDoesNotExistError, asyncpg.AdminShutdownError):
                    pass  # a test ended the database's backends (pg_terminate_backend): the statement never ran
            # Close its socket now: a connection dropped unclosed is reported (ResourceWarning) in whichever
            # test happens to collect it, and fails that test.
            self.conn.terminate()
        self.conn = await asyncpg.connect(dsn)
        return await self.conn.fetchval(sql, *args)

    async def close_connection(self) -> None:
        if self.conn is not None:
            await self.conn.close()
            self.conn = None

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()
        self.loop.close()


_session: _Session | None = None


def _run(coro: Coroutine[Any, Any, T]) -> T:
    global _session
    if _session is None:
        _session = _Session()
    return _session.run(coro)


def _with_database(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, "/" + name, parts.query, parts.fragment))


async def _execute(url: str, sql: str, *args: Any) -> Any:
    import asyncpg

    conn = await asyncpg.connect(url)
    try:
        return await conn.fetchval(sql, *args)
    finally:
        await conn.close()


def database_dsn() -> str:
    """The DSN of this session's own database (created on first use)."""
    global _database
    with _lock:
        if _database is None:
            worker = os.environ.get("PYTEST_XDIST_WORKER", "main")  # gw0, gw1, ... under pytest-xdist
            name = f"wfsub_test_{worker}_{os.getpid()}_{secrets.token_hex(4)}"
            drop_leftovers()
            _run(_execute(URL, f'CREATE DATABASE "{name}"'))
            # The server's own durability against its crash is not what the suite tests (the tests that crash a
            # server start one of their own, with its defaults): a commit here need not wait for the disk, which
            # on a slow one is most of the time a Postgres test takes.
            _run(_execute(URL, f'ALTER DATABASE "{name}" SET synchronous_commit = off'))
            _database = name
        return _with_database(URL, _database)


def new_schema() -> str:
    """A schema name no test used yet (the store builds the schema when it opens: about 0.1 s more)."""
    return f"t{next(_schemas)}_{secrets.token_hex(3)}"


SHARED = "t0_shared"


def emptied_schema() -> str:
    """The schema most tests share, emptied of every row (built by the first store that opens it). Emptying is
    a few milliseconds where building a schema takes a tenth of a second, and fewer schemas make the database
    quicker to drop; tests that change the layout itself take a new_schema()."""
    fetchval(_EMPTY)
    return SHARED


_EMPTY = f"""
DO $$
DECLARE
    t record;
BEGIN
    -- every table but `meta` (the layout version): cases, journals, the inbox, nodes, commits, programs, and the
    -- queue, queue-item and schedule rows (a queue registered or an item claimed by one test must not reach the next)
    FOR t IN SELECT tablename FROM pg_tables WHERE schemaname = '{SHARED}' AND tablename <> 'meta' LOOP
        EXECUTE format('DELETE FROM %I.%I', '{SHARED}', t.tablename);
    END LOOP;
END
$$
"""


def fetchval(sql: str, *args: Any) -> Any:
    """One value from this session's database (tests peek at tables with it), on the session's connection."""
    dsn = database_dsn()
    assert _session is not None  # started by database_dsn
    with _session.lock:
        return _run(_session.fetchval(dsn, sql, *args))


def drop_database() -> None:
    """Drop this session's database, if one was made (at the end of the session), in a process of its own that
    outlives the session: DROP DATABASE forces a checkpoint of the whole server, seconds on a slow disk, and the
    suite should not wait for it. The next session drops whatever a killed one left (`drop_leftovers`)."""
    global _database, _session
    with _lock:
        if _database is not None:
            assert _session is not None  # started by database_dsn
            _run(_session.close_connection())
            _session.stop()
            _session = None
            # (through a shell that puts it in the background and returns: nothing is left for this process to
            # wait for)
            subprocess.run(
                ["sh", "-c", '"$@" </dev/null >/dev/null 2>&1 &', "sh", sys.executable, "-c", _DROP, URL, _database],
                start_new_session=True, check=True,
            )
            _database = None


_DROP = """
import asyncio, sys
import asyncpg
async def drop(url, name):
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await conn.close()
asyncio.run(drop(*sys.argv[1:]))
"""


def drop_leftovers() -> None:
    """Drop the test databases of sessions whose process is gone (killed before its drop ran), made on this
    machine (their names hold the pid of the session that made them)."""
    found = _run(_execute(URL, "SELECT array_agg(datname) FROM pg_database WHERE datname LIKE 'wfsub\\_test\\_%'"))
    for name in found or ():
        try:
            pid = int(name.split("_")[-2])
        except (ValueError, IndexError):
            continue
        try:
            os.kill(pid, 0)
            continue  # its session is still running
        except ProcessLookupError:
            pass
        except PermissionError:
            continue
        # (another session may drop it first: then there is nothing left to do)
        with contextlib.suppress(Exception):
            _run(_execute(URL, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))



"""A TCP proxy between a node process and the Postgres server that a test can freeze: while frozen, nothing
passes either way and the connections stay open (a node cut off from its store without a word, as by a
partition), until the test thaws it."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from urllib.parse import urlsplit, urlunsplit


class Proxy:
    """Forwards 127.0.0.1:`port` to the server of `dsn`; `dsn_through()` names the store through it."""

    def __init__(self, dsn: str) -> None:
        parts = urlsplit(dsn)
        self._dsn = parts
        self._target = (parts.hostname or "127.0.0.1", parts.port or 5432)
        self._loop = asyncio.new_event_loop()
        self._open = asyncio.Event()
        self._ready = threading.Event()
        self.port = 0
        self._writers: list[asyncio.StreamWriter] = []
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        self._ready.wait()

    def dsn_through(self) -> str:
        """The DSN of the same database, through this proxy."""
        parts = self._dsn
        auth = parts.netloc.rpartition("@")[0]
        netloc = f"{auth}@127.0.0.1:{self.port}" if auth else f"127.0.0.1:{self.port}"
        return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))

    def freeze(self) -> None:
        self._loop.call_soon_threadsafe(self._open.clear)

    def thaw(self) -> None:
        self._loop.call_soon_threadsafe(self._open.set)

    def close(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._open.set()
        server = self._loop.run_until_complete(asyncio.start_server(self._serve, "127.0.0.1", 0))
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()
        server.close()
        for writer in self._writers:
            writer.transport.abort()
        tasks = asyncio.all_tasks(self._loop)
        for task in tasks:
            task.cancel()
        self._loop.run_until_complete(asyncio.gather(*tasks, server.wait_closed(), return_exceptions=True))
        self._loop.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self._target)
        except OSError:
            writer.close()
            return
        self._writers += [writer, up_writer]
        await asyncio.gather(self._pump(reader, up_writer), self._pump(up_reader, writer))

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError):
            while True:
                await self._open.wait()
                data = await reader.read(65536)
                await self._open.wait()  # read while open, held here if frozen meanwhile
                if not data:
                    break
                writer.write(data)
                await writer.drain()
        with contextlib.suppress(OSError):
            writer.close()

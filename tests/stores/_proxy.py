"""A TCP proxy on the loopback between a store and its Postgres server, that a test can cut and restore: an
outage as a store sees one (connections dropped, new ones refused), without touching the server itself."""

from __future__ import annotations

import contextlib
import socket
import threading
from urllib.parse import urlsplit, urlunsplit


class Proxy:
    def __init__(self, dsn: str) -> None:
        parts = urlsplit(dsn)
        self.upstream = (parts.hostname or "127.0.0.1", parts.port or 5432)
        self._listener: socket.socket | None = None
        self._sockets: set[socket.socket] = set()
        self._lock = threading.Lock()
        self.port = 0
        self.up()
        host = f"{parts.username}@127.0.0.1:{self.port}" if parts.username else f"127.0.0.1:{self.port}"
        self.dsn = urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment))

    def up(self) -> None:
        """Accept connections (again, on the same port)."""
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self.port = listener.getsockname()[1]
        with self._lock:
            self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def down(self) -> None:
        """Drop every connection and refuse new ones."""
        with self._lock:
            listener, self._listener = self._listener, None
            sockets, self._sockets = self._sockets, set()
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)  # wakes the accept() blocked on it, so the port is freed
            listener.close()
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # closed by down()
            try:
                server = socket.create_connection(self.upstream)
            except OSError:
                client.close()
                continue
            with self._lock:
                if self._listener is not listener:  # down() ran meanwhile: this connection is cut too
                    client.close()
                    server.close()
                    return
                self._sockets |= {client, server}
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                sink.shutdown(socket.SHUT_WR)

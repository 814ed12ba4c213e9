"""A TCP proxy on the loopback between a store and its Postgres server, that a test can cut and restore: an
outage as a store sees one (connections dropped, new ones refused), without touching the server itself.

It can also make the network misbehave without an outage (the chaos campaign uses these):

    proxy.delay = 0.5        every answer from the server waits that long before it is forwarded (0: none)
    proxy.drop_answers(2)    the next two answers from the server are swallowed, and each connection that lost
                             one is reset: the client sent its query (maybe a COMMIT), the server ran it, and the
                             client never hears how it went (a lost commit answer)
    proxy.drop_answers(1, after=400)   only an answer to a request of at least 400 bytes (a write carrying
                             records, rather than a lease renewal or a short read)
    proxy.cut()              down() then up(): every connection dropped, new ones accepted again at once
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time
from urllib.parse import urlsplit, urlunsplit

# The connect_timeout of a store behind the proxy. Down, the proxy refuses at once, so no test waits on this; up,
# a connection through it on a loaded machine can take seconds, and a tighter bound failed tests that were not
# about connecting at all.
PROXY_CONNECT = 10.0


class Proxy:
    def __init__(self, dsn: str) -> None:
        parts = urlsplit(dsn)
        self.upstream = (parts.hostname or "127.0.0.1", parts.port or 5432)
        self._listener: socket.socket | None = None
        self._sockets: set[socket.socket] = set()
        self._servers: set[socket.socket] = set()  # the upstream side of each connection
        self._lock = threading.Lock()
        self._to_drop = 0
        self._drop_after = 0
        self._sent: dict[socket.socket, int] = {}  # upstream socket -> size of the last request sent on it
        self.delay = 0.0
        self.dropped = 0  # answers swallowed so far
        self.port = 0
        self.up()
        host = f"{parts.username}@127.0.0.1:{self.port}" if parts.username else f"127.0.0.1:{self.port}"
        self.dsn = urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment))

    def up(self) -> None:
        """Accept connections (again, on the same port); nothing to do while it accepts them."""
        if self._listener is not None:
            return
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        for wait in (0.01, 0.05, 0.1, 0.2, 0.5, 1.0, 0.0):
            try:
                listener.bind(("127.0.0.1", self.port))
                break
            except OSError:  # the old listener's accept() is still returning: the port frees in a moment
                if not wait:
                    listener.close()
                    raise
                time.sleep(wait)
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
            self._servers = set()
            self._sent = {}
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)  # wakes the accept() blocked on it, so the port is freed
            listener.close()
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def cut(self) -> None:
        """Drop every connection now; new ones are accepted again at once."""
        self.down()
        self.up()

    def drop_answers(self, count: int = 1, *, after: int = 0) -> None:
        """Swallow the next `count` answers from the server (to requests of at least `after` bytes), resetting
        each connection that lost one."""
        with self._lock:
            self._to_drop += count
            self._drop_after = after

    def clear(self) -> None:
        """Forward everything again at once: no delay, no answers left to drop."""
        with self._lock:
            self._to_drop = 0
            self._drop_after = 0
        self.delay = 0.0

    def _take_drop(self, server: socket.socket) -> bool:
        with self._lock:
            if self._to_drop <= 0 or self._sent.get(server, 0) < self._drop_after:
                return False
            self._to_drop -= 1
            self.dropped += 1
            return True

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
                self._servers.add(server)
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        answers = source in self._servers  # this thread forwards the server's answers
        forwarded = 0
        try:
            while data := source.recv(65536):
                if answers:
                    if self.delay > 0:
                        time.sleep(self.delay)
                    if forwarded and self._take_drop(source):  # past the start-up answer: a query's answer is lost
                        _reset(source, sink)
                        return
                    forwarded += 1
                else:
                    self._sent[sink] = len(data)
                sink.sendall(data)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                sink.shutdown(socket.SHUT_WR)


def _reset(*socks: socket.socket) -> None:
    """Close sockets with a TCP reset (SO_LINGER 0), as a connection dropped by the network ends. The thread
    pumping the other way is blocked reading one of them: SHUT_RD wakes it (a socket closed under a blocked read
    stays open until the read returns), and the reset goes out when the last use ends."""
    for sock in socks:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RD)
    for sock in socks:
        with contextlib.suppress(OSError):
            sock.close()

"""Server-sent events: a page learns that what it shows changed, within a second, without a reload.

The public API has no change feed, so each view that clients watch (a feed: a filtered page of the list, or one
case) is read by one of its watchers on a fixed interval, for all of them. A read gives a signature (what the page
shows, in short); when it differs from the last, the view is rendered once and every watcher is woken. A watcher
sends the newest rendering only: one that is slow to read skips the versions it missed, so neither the rate of
changes nor the number of clients grows a backlog. Memory is one rendering per feed and a few objects per client;
the number of feeds is bounded (`max_feeds`: a stream beyond it is refused with 503, and its page still works
without live updates).

A read runs on the event loop the Substrate runs on, so a view that takes long to read (a case with a long
journal read whole with ?journal=all) is read less often, waiting twice as long as its last read took: the
inspector takes at most a third of the loop per watched view.

Polling is the watchers' own work: the first to arrive polls, and when it leaves another takes over, so the app
needs no background task of its own (an app mounted inside another gets no lifespan of its own in Starlette).
"""

from __future__ import annotations

import hashlib
import logging
import re
import time
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

import anyio
from starlette.types import Receive, Scope, Send

_log = logging.getLogger("wfsub.web")
_LINE_BREAK = re.compile(r"\r\n|\r|\n")  # the line ends of the event stream grammar (HTML standard 9.2.5)

# A view's reader: key -> (signature, render). The signature is compared between reads; `render` is called only
# when it changed, and gives the event's HTML.
Reader = Callable[[Any], Awaitable[tuple[Hashable, Callable[[], Awaitable[str]]]]]


def sig_hash(signature: Hashable) -> str:
    """A short stable name of a signature: the page carries it, so its stream knows what the page already shows."""
    return hashlib.blake2b(repr(signature).encode(), digest_size=8).hexdigest()


@dataclass(eq=False)
class _Feed:
    key: Hashable
    watchers: int = 0
    polling: bool = False
    sig: str = ""
    payload: bytes = b""
    failing: bool = False  # the last read failed (logged once per outage, not at every poll)
    changed: anyio.Event = field(default_factory=anyio.Event)
    vacated: anyio.Event = field(default_factory=anyio.Event)


class Live:
    """The feeds of one app, and the SSE response that watches one."""

    def __init__(self, read: Reader, *, interval: float = 0.25, heartbeat: float = 15.0, max_feeds: int = 256):
        self._read = read
        self.interval = interval
        self.heartbeat = heartbeat
        self.max_feeds = max_feeds
        self._feeds: dict[Hashable, _Feed] = {}

    @property
    def feeds(self) -> int:
        return len(self._feeds)

    def watchers(self) -> int:
        return sum(f.watchers for f in self._feeds.values())

    def full(self, key: Hashable) -> bool:
        return key not in self._feeds and len(self._feeds) >= self.max_feeds

    async def stream(self, key: Hashable, shown: str, scope: Scope, receive: Receive, send: Send) -> None:
        """Answer one EventSource: an `update` event (the view's HTML) whenever the view differs from what the
        client shows (`shown`: the signature hash its page was rendered with), a comment as a heartbeat."""
        feed = self._feeds.get(key)
        if feed is None:
            feed = self._feeds[key] = _Feed(key)
        feed.watchers += 1
        headers = [
            (b"content-type", b"text/event-stream; charset=utf-8"),
            (b"cache-control", b"no-store"),
            (b"x-accel-buffering", b"no"),  # a proxy (nginx) must pass each event on at once
        ]
        try:
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": b": live\n\n", "more_body": True})
            async with anyio.create_task_group() as tg:

                async def disconnected() -> None:
                    while (await receive())["type"] != "http.disconnect":
                        pass
                    tg.cancel_scope.cancel()

                tg.start_soon(disconnected)
                tg.start_soon(self._poll_while_needed, feed)
                await self._send_changes(feed, shown, send)
        except OSError:  # the client went away while an event was written
            pass
        finally:
            feed.watchers -= 1
            if feed.watchers == 0 and self._feeds.get(key) is feed:
                del self._feeds[key]

    async def _send_changes(self, feed: _Feed, shown: str, send: Send) -> None:
        while True:
            if feed.sig and feed.sig != shown:
                shown = feed.sig
                await send({"type": "http.response.body", "body": feed.payload, "more_body": True})
                continue
            changed = feed.changed
            with anyio.move_on_after(self.heartbeat) as idle:
                await changed.wait()
            if idle.cancelled_caught:
                await send({"type": "http.response.body", "body": b": ping\n\n", "more_body": True})

    async def _poll_while_needed(self, feed: _Feed) -> None:
        """Poll the feed while this watcher is its poller; wait to take over while another one is."""
        while True:
            if feed.polling:
                await feed.vacated.wait()
                continue
            feed.polling = True
            try:
                while True:
                    started = time.perf_counter()
                    await self._poll(feed)
                    # a view that is slow to read (a long journal) is read less often: at most a third of the time
                    await anyio.sleep(max(self.interval, 2 * (time.perf_counter() - started)))
            finally:
                feed.polling = False
                vacated, feed.vacated = feed.vacated, anyio.Event()
                vacated.set()

    async def _poll(self, feed: _Feed) -> None:
        try:
            signature, render = await self._read(feed.key)
            sig = sig_hash(signature)
            if sig == feed.sig:
                return
            html = await render()
        except Exception:  # a store error: try again at the next poll; the page keeps what it shows
            if not feed.failing:  # once per outage: a store away for an hour is one warning, not 14,400
                feed.failing = True
                _log.warning("reading a live view failed; trying again at each poll until it works", exc_info=True)
            return
        if feed.failing:
            feed.failing = False
            _log.warning("reading a live view works again")
        feed.sig = sig
        feed.payload = _event("update", html)
        changed, feed.changed = feed.changed, anyio.Event()
        changed.set()


def _event(name: str, data: str) -> bytes:
    """One server-sent event carrying `data`: a data line per line of it, broken where an EventSource breaks lines
    (CRLF, LF, CR) and nowhere else (`str.splitlines` also breaks at U+2028, U+0085, ..., which would turn case
    text into line breaks), so the browser joins them back into the same text."""
    lines = "".join(f"data: {line}\n" for line in _LINE_BREAK.split(data))
    return f"event: {name}\n{lines}\n".encode()

"""The trace hub: one actor per Substrate, between the case actors and the sinks.

Case actors hand it batches of vm events without waiting (`submit`). The hub itself never drops them: when
more than `buffer` batches wait for it (many cases ran before it could), it reports `backlogged`, and each case
actor waits for it to catch up before its next burst (`caught_up`). That wait is short, since all the hub
does is hand batches on, and it means events are lost only where a sink really is slower than the cases.

The hub wraps the raw vm events in lazy `EventBatch` sequences (the `TraceEvent` models are built once, when
a sink first reads them) and fans each batch out to one worker per sink through a bounded buffer with a
non-blocking send: a sink that cannot keep up loses only its own events, and is told how many (a sink with a
`dropped(count)` method gets that call), and a sink that raises is counted and logged, then keeps getting
events. Drops and sink errors are counted in `TraceStats` (visible through `Substrate.statistics()`) and
logged: the first of each, then every 1,000th, so a broken sink cannot flood the log.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.lowlevel
from anyio.abc import TaskGroup

from .._loops import cancelled_by_runtime
from .._trace import EventBatch, TraceSink, check_sink, get_logger
from .._vm import VmEvent

_log = get_logger("wfsub.trace")

Batch = tuple[str, float, Sequence[VmEvent], tuple[TraceSink, ...]]
"""(case_id, time, vm events, the case's own sinks): what a case actor hands over."""


@dataclass(slots=True)
class TraceStats:
    events: int = 0  # events accepted from cases
    dropped: int = 0  # events dropped at a full buffer (the actor's or a sink's)
    sink_errors: int = 0  # times a sink's write (or aclose) raised


def _log_every(count: int) -> bool:
    return count == 1 or count % 1000 == 0


def _passes(exc: BaseException) -> bool:
    """What a sink raises that is not the sink's own failure: KeyboardInterrupt, SystemExit, and a cancellation
    the runtime issued (shutdown).

    Anything else, a BaseException subclass, GeneratorExit or a stray CancelledError (an async sink that awaited
    a future something else cancelled) included, is that sink's error (counted and logged): a broken sink must
    not end the hub, and with it every sink's events, or tear down the Substrate.
    """
    if isinstance(exc, anyio.get_cancelled_exc_class()):
        return cancelled_by_runtime()
    return isinstance(exc, KeyboardInterrupt | SystemExit)


class _SinkWorker:
    """Feeds one sink from its own bounded buffer."""

    def __init__(self, sink: TraceSink, stats: TraceStats, buffer: int) -> None:
        self.sink = sink
        self.stats = stats
        self.send, self.receive = anyio.create_memory_object_stream[EventBatch](buffer)
        self.dropped = 0
        self.errors = 0

    def offer(self, events: EventBatch) -> None:
        try:
            self.send.send_nowait(events)
        except anyio.WouldBlock:
            self.stats.dropped += len(events)
            before, self.dropped = self.dropped, self.dropped + len(events)
            if before == 0 or before // 1000 != self.dropped // 1000:  # the first drop, then every 1,000 events
                _log.warning("trace sink is too slow; events dropped", sink=repr(self.sink), dropped=self.dropped)
            tell = getattr(self.sink, "dropped", None)
            if callable(tell):
                try:
                    tell(len(events))
                except BaseException as exc:
                    if _passes(exc):
                        raise
                    self._error(exc, "dropped")

    async def run(self) -> None:
        async with self.receive:
            async for events in self.receive:
                try:
                    await self.sink.write(events)
                except BaseException as exc:
                    if _passes(exc):
                        raise
                    self._error(exc, "write")
        close = getattr(self.sink, "aclose", None)
        if close is not None:
            try:
                await close()
            except BaseException as exc:
                if _passes(exc):
                    raise
                self._error(exc, "aclose")

    def _error(self, exc: BaseException, what: str) -> None:
        self.stats.sink_errors += 1
        self.errors += 1
        if _log_every(self.errors):
            _log.error(f"trace sink {what} raised", sink=repr(self.sink), errors=self.errors, error=repr(exc))


class TraceHub:
    """Receives event batches from the cases and fans them out to the sinks (see the module docstring)."""

    def __init__(
        self,
        sinks: Sequence[TraceSink],
        *,
        buffer: int = 10_000,
        sink_buffer: int = 10_000,
        redact: Callable[[Any], Any] | None = None,
    ) -> None:
        for sink in sinks:
            check_sink(sink)
        self.stats = TraceStats()
        self._redact = redact
        self._sinks = tuple(sinks)
        self._sink_buffer = sink_buffer
        self._buffer = buffer
        self._queue: list[Batch] = []  # a list swapped out whole on each wake-up: cheaper than a stream
        self._releases: list[TraceSink] = []  # per-case sinks whose case has ended (never dropped)
        self._refs: dict[int, int] = {}  # id(per-case sink) -> live cases using it
        self._wake: anyio.Event | None = None
        self._closed = False
        self._workers: dict[int, _SinkWorker] = {}
        self._global: list[_SinkWorker] = []
        self._tg: TaskGroup | None = None
        self._caught_up: anyio.Event | None = None  # set when the hub has taken the backlog
        self.backlogged = False  # more than `buffer` batches wait: producers should wait for `caught_up`
        self.finished = anyio.Event()

    def submit(self, case_id: str, time: float, events: Sequence[VmEvent], sinks: tuple[TraceSink, ...]) -> None:
        """Hand over a batch without waiting (see `backlogged` for the backpressure that bounds the queue)."""
        n = len(events)
        self.stats.events += n
        if self._closed:
            self._drop(n, "trace hub closed; events dropped")
            return
        queue = self._queue
        queue.append((case_id, time, events, sinks))
        if len(queue) >= self._buffer:
            self.backlogged = True
        self._wake_up()

    async def caught_up(self) -> None:
        """Wait until the hub has taken what is queued (producers call this while `backlogged`)."""
        while self.backlogged and not self._closed:
            if self._caught_up is None:
                self._caught_up = anyio.Event()
            await self._caught_up.wait()

    def retain(self, sink: TraceSink) -> None:
        """A case starts sending its events to `sink` as well (see `release`)."""
        self._refs[id(sink)] = self._refs.get(id(sink), 0) + 1

    def release(self, sinks: tuple[TraceSink, ...]) -> None:
        """A case that used these sinks has ended: once no live case uses a sink, its worker closes it."""
        self._releases.extend(sinks)
        self._wake_up()

    def _wake_up(self) -> None:
        wake = self._wake
        if wake is not None:
            self._wake = None
            wake.set()

    def _drop(self, n: int, message: str) -> None:
        before = self.stats.dropped
        self.stats.dropped += n
        if before == 0 or before // 1000 != self.stats.dropped // 1000:
            _log.warning(message, dropped=self.stats.dropped)

    def _release_producers(self) -> None:
        self.backlogged = False
        event, self._caught_up = self._caught_up, None
        if event is not None:
            event.set()

    def close(self) -> None:
        """No more batches: the actor delivers what it holds, closes the sinks and ends."""
        self._closed = True
        self._release_producers()
        self._wake_up()

    async def run(self) -> None:
        try:
            async with anyio.create_task_group() as tg:
                self._tg = tg
                for sink in self._sinks:
                    self._global.append(self._worker(sink))
                checkpoint = anyio.lowlevel.checkpoint
                while True:
                    if self._queue or self._releases:
                        batches, self._queue = self._queue, []
                        self._dispatch(batches)
                        self._release_producers()
                        if self._releases:  # after the round: a case's events are queued before its release
                            releases, self._releases = self._releases, []
                            self._release(releases)
                        await checkpoint()  # never starve the cases, however busy tracing is
                    elif self._closed:
                        break
                    else:
                        wake = self._wake = anyio.Event()
                        await wake.wait()
                for worker in self._workers.values():
                    worker.send.close()  # each worker delivers what it holds, closes its sink and ends
        finally:
            self._closed = True
            self._release_producers()
            for worker in self._workers.values():  # cancelled at shutdown: leave no stream open
                worker.send.close()
            self.finished.set()

    def _worker(self, sink: TraceSink) -> _SinkWorker:
        worker = self._workers.get(id(sink))
        if worker is None:
            assert self._tg is not None
            worker = self._workers[id(sink)] = _SinkWorker(sink, self.stats, self._sink_buffer)
            self._tg.start_soon(worker.run)
        return worker

    def _release(self, sinks: list[TraceSink]) -> None:
        refs = self._refs
        for sink in sinks:
            key = id(sink)
            left = refs.get(key, 1) - 1
            if left > 0:
                refs[key] = left
                continue
            refs.pop(key, None)
            if any(sink is g for g in self._sinks):
                continue
            worker = self._workers.pop(key, None)
            if worker is not None:
                worker.send.close()  # it delivers what it holds, closes the sink and ends

    def _dispatch(self, batches: list[Batch]) -> None:
        for batch in batches:
            sinks = batch[3]
            if sinks:
                own = EventBatch([batch], self._redact)
                for sink in sinks:
                    self._worker(sink).offer(own)
        if self._global:
            everything = EventBatch(batches, self._redact)
            for worker in self._global:
                worker.offer(everything)

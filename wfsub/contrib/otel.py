"""`OTelSink`: a trace sink that turns each case's trace events into OpenTelemetry spans.

    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(exporter))
    async with wfsub.Substrate(sinks=[OTelSink(provider)], trace_level="min") as sub:
        ...

Spans, all timed by the events' `time` (the Substrate's clock, in seconds, as nanoseconds since the epoch; the
runtime stamps each batch of events with one time, so what happens within one vm burst takes no time here):

- one span per case, `case` (or `case <workflow>` when the `case_started` event names it), from
  `case_started` to `case_done` / `case_failed` (status ERROR, an `exception` event) / `case_cancelled`;
- a child span per effect attempt, `effect <name>`, from `effect_requested` to `effect_completed` /
  `effect_failed` (ERROR) / `effect_cancelled` / `effect_discarded`; an `effect_retry` event ends the attempt
  as failed (ERROR, with the error) and starts the next attempt once its backoff delay has passed;
- a child span per wait, `wait <signal>` (a deferred choice: `defer <a|b>`), from `signal_waiting` to
  `signal_consumed` / `deferred_choice`, or to its end by timeout (a `wait` that times out is an ERROR, a
  `defer` that takes its timeout branch is not), withdrawal (a `withdrawn` or `region_cancelled` event at or
  above its node: the event names a node, not tokens, so it ends the waits of every mi instance at that node)
  or the end of the case. A signal taken from the buffer at once gives a zero-length span.

Attributes: `wfsub.case_id`, `wfsub.node_path`, `wfsub.outcome` on every span; `wfsub.workflow` on the case
span (when known), `wfsub.error_path` / `wfsub.cancel_reason` when it failed / was cancelled;
`wfsub.effect.name`, `wfsub.effect.id`, `wfsub.effect.attempt` on effect spans; `wfsub.signal` (and
`wfsub.signals` for a deferred choice, `wfsub.signal.chosen`, `wfsub.timeout_s`) on wait spans.

The sink works from `trace_level="min"` events (more are ignored). Spans still open when the sink is closed
(`aclose`, called by the Substrate as it closes: a case still running then is cancelled without a
`case_cancelled` event) are ended then with `wfsub.outcome="unfinished"`. A case whose first events this sink
did not see (`Substrate.trace(case_id, ...)` added it later, or events were dropped) gets a case span from the
first event seen, marked `wfsub.trace_partial`; cases open when the sink was told of dropped events are marked
`wfsub.trace_incomplete`. A durable case that leaves memory (`case_left`: evicted while parked, or taken over by
another node) ends its span there with `wfsub.outcome="evicted"` or `"fenced"`, so the sink holds nothing for
cases out of memory; when it comes back (`case_resumed`) a new span, marked `wfsub.resumed`, covers the rest.

Spans are ended inside `write`, on the event loop: give the provider a `BatchSpanProcessor` (it exports in its
own thread), not a `SimpleSpanProcessor` with a network exporter, which would export on the event loop.
The sink never shuts the provider down: that stays the application's to do.
"""

from __future__ import annotations

import ast
import collections
import dataclasses
import math
import re
import time
import typing

try:
    from opentelemetry import context as _otel_context
    from opentelemetry import trace as _otel_trace
except ImportError as _exc:  # pragma: no cover - exercised only without the extra installed
    raise ImportError(
        "wfsub.contrib.otel needs the OpenTelemetry API and SDK, which are not installed: "
        "pip install 'wfsub[otel]'"
    ) from _exc

if typing.TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from typing import Any

    from opentelemetry.trace import Span, Tracer, TracerProvider

    from .. import TraceEvent

__all__ = ["OTelSink"]

_WALL_CLOCK = 1e9  # event times at or above this are seconds since the epoch (the real clock)
_ENDED_KEPT = 10_000  # ids of ended cases remembered, so that a late event does not reopen its case


def _ns(seconds: float) -> int:
    return int(round(seconds * 1e9)) if math.isfinite(seconds) else 0


_REPR = re.compile(r"^([A-Za-z_][\w.]*)\((.*)\)$", re.DOTALL)


def _error_parts(text: str, default_type: str) -> tuple[str, str]:
    """(type, message) from an error as the events carry it: `repr(exc)` such as "ValueError('nope')"."""
    match = _REPR.match(text)
    if match is None:
        return default_type, text
    inner = match.group(2)
    try:
        value = ast.literal_eval(inner) if inner else ""
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return match.group(1), inner
    return match.group(1), value if isinstance(value, str) else inner


def _under(path: str, region: str) -> bool:
    """Is node `path` at or inside the node `region` (`par[1].seq[0].wait` is inside `par`)?"""
    return path == region or (path.startswith(region) and path[len(region)] in ".[")


def _kind_of(path: str) -> str:
    return path.rpartition(".")[2]


@dataclasses.dataclass(slots=True, eq=False)
class _Effect:
    span: Span
    start: int
    effect_id: object
    name: str
    path: str
    attempt: int


@dataclasses.dataclass(slots=True, eq=False)
class _Wait:
    span: Span
    start: int
    path: str
    token: object
    signals: list[str]
    timer_id: object = None


@dataclasses.dataclass(slots=True, eq=False)
class _Case:
    """One open case span and its open child spans, indexed so that a case with thousands of them stays fast."""

    case_id: str
    span: Span
    start: int
    last: float  # time of the latest event seen (seconds)
    effects: dict[object, _Effect] = dataclasses.field(default_factory=dict)  # effect id -> its open attempt
    waits: dict[str, list[_Wait]] = dataclasses.field(default_factory=dict)  # node path -> open waits, oldest first
    by_token: dict[tuple[str, object], _Wait] = dataclasses.field(default_factory=dict)  # (path, token) -> wait
    by_timer: dict[object, _Wait] = dataclasses.field(default_factory=dict)  # timer id -> wait it times out
    newest: _Wait | None = None  # the wait parked last (a timer armed right after it is its timeout)
    failure_type: str | None = None

    def open_waits(self) -> list[_Wait]:
        return [wait for waits in self.waits.values() for wait in waits]


class OTelSink:
    """A trace sink that turns each case's events into OpenTelemetry spans (see the module docstring).

    `tracer_provider`: the provider to get the tracer from (default: the global one, `opentelemetry.trace`).
    `tracer_name`: the instrumentation scope name of the spans.
    """

    def __init__(self, tracer_provider: TracerProvider | None = None, tracer_name: str = "wfsub") -> None:
        if not isinstance(tracer_name, str) or not tracer_name:
            raise TypeError(f"OTelSink(tracer_name=...) must be a non-empty str, got {tracer_name!r}")
        if tracer_provider is not None and not callable(getattr(tracer_provider, "get_tracer", None)):
            raise TypeError(
                f"OTelSink(tracer_provider=...) must be an OpenTelemetry TracerProvider (with get_tracer), got "
                f"{type(tracer_provider).__name__}: pass opentelemetry.sdk.trace.TracerProvider(), or None for "
                "the global provider"
            )
        self._tracer: Tracer = (
            tracer_provider.get_tracer(tracer_name)
            if tracer_provider is not None
            else _otel_trace.get_tracer(tracer_name)
        )
        self._cases: dict[str, _Case] = {}
        self._ended: collections.OrderedDict[str, None] = collections.OrderedDict()
        self.dropped_events = 0
        """Events the trace hub dropped before this sink could take them (see `dropped`)."""

    def __repr__(self) -> str:
        return f"OTelSink({len(self._cases)} cases open)"

    # -- the sink protocol ---------------------------------------------------------------------------------

    async def write(self, events: Sequence[TraceEvent]) -> None:
        """Turn a batch of events into span starts and ends (nothing here awaits)."""
        for event in events:
            if event.kind in ("case_started", "case_resumed"):
                self._case_started(event)
                continue
            if event.kind == "case_left":  # evicted or taken over: this process's span of it ends here
                left = self._cases.get(event.case_id)
                if left is not None:
                    why = str(event.detail.get("why", "left"))
                    self._end_case(left, _ns(event.time), why, children=why)
                continue
            handle = _HANDLERS.get(event.kind)
            if handle is None:
                continue
            case = self._case(event)
            if case is not None:
                case.last = max(case.last, event.time)
                handle(self, case, event)

    def dropped(self, count: int) -> None:
        """The trace hub dropped `count` events meant for this sink: the open cases' spans may be wrong."""
        self.dropped_events += count
        for case in self._cases.values():
            case.span.set_attribute("wfsub.trace_incomplete", True)

    async def aclose(self) -> None:
        """End every span still open, as `wfsub.outcome="unfinished"` (the Substrate calls this as it closes)."""
        now = time.time()
        for case in list(self._cases.values()):
            when = max(now, case.last) if case.last >= _WALL_CLOCK else case.last
            end = max(_ns(when), case.start)
            note = "the trace sink was closed before the case ended"
            for effect in list(case.effects.values()):
                self._end_effect(case, effect, end, "unfinished", note=note)
            for wait in case.open_waits():
                self._end_wait(case, wait, end, "unfinished")
            case.span.set_attribute("wfsub.unfinished", True)
            case.span.add_event("wfsub.unfinished", {"message": note}, timestamp=end)
            self._end_case(case, end, "unfinished")

    # -- cases ---------------------------------------------------------------------------------------------

    def _case(self, event: TraceEvent) -> _Case | None:
        case = self._cases.get(event.case_id)
        if case is None:
            if event.case_id in self._ended:
                return None  # a late event of an ended case (an effect result that arrived after it)
            case = self._open_case(event, partial=True)
        return case

    def _open_case(self, event: TraceEvent, *, partial: bool) -> _Case:
        workflow = event.detail.get("workflow") if event.kind in ("case_started", "case_resumed") else None
        attributes: dict[str, Any] = {"wfsub.case_id": event.case_id, "wfsub.node_path": event.path}
        if event.kind == "case_resumed":
            attributes["wfsub.resumed"] = True  # the case began in an earlier run: this span covers this run's part
        if isinstance(workflow, str) and workflow:
            attributes["wfsub.workflow"] = workflow
        if partial:
            attributes["wfsub.trace_partial"] = True
        start = _ns(event.time)
        name = f"case {workflow}" if isinstance(workflow, str) and workflow else "case"
        span = self._tracer.start_span(name, context=_otel_context.Context(), start_time=start, attributes=attributes)
        case = self._cases[event.case_id] = _Case(event.case_id, span, start, event.time)
        self._ended.pop(event.case_id, None)
        return case

    def _end_case(self, case: _Case, end: int, outcome: str, children: str = "case ended") -> None:
        for effect in list(case.effects.values()):
            self._end_effect(case, effect, end, children)
        for wait in case.open_waits():
            self._end_wait(case, wait, end, children)
        case.span.set_attribute("wfsub.outcome", outcome)
        case.span.end(end_time=max(end, case.start))
        self._cases.pop(case.case_id, None)
        self._ended[case.case_id] = None
        if len(self._ended) > _ENDED_KEPT:
            self._ended.popitem(last=False)

    def _case_started(self, event: TraceEvent) -> None:
        """`case_started`, or `case_resumed` (a durable case brought back into memory in this run)."""
        case = self._cases.get(event.case_id)
        if case is not None:
            if event.kind == "case_resumed":
                return  # brought back again (after an eviction) while its span is still open: it goes on
            self._end_case(case, _ns(event.time), "restarted")  # the same id started again
        self._open_case(event, partial=False)

    def _case_done(self, case: _Case, event: TraceEvent) -> None:
        self._end_case(case, _ns(event.time), "done")

    def _case_failed(self, case: _Case, event: TraceEvent) -> None:
        end = _ns(event.time)
        message = str(event.detail.get("error", "the case failed"))
        case.span.set_attribute("wfsub.error_path", str(event.detail.get("path", event.path)))
        _record_error(case.span, case.failure_type or "CaseFailed", message, end)
        self._end_case(case, end, "failed")

    def _case_cancelled(self, case: _Case, event: TraceEvent) -> None:
        case.span.set_attribute("wfsub.cancel_reason", str(event.detail.get("reason", "cancelled")))
        self._end_case(case, _ns(event.time), "cancelled")

    def _failure(self, case: _Case, event: TraceEvent) -> None:
        kind = event.detail.get("type")
        if isinstance(kind, str):
            case.failure_type = kind

    # -- effects -------------------------------------------------------------------------------------------

    def _start_effect(self, case: _Case, effect_id: object, name: str, path: str, attempt: int, start: int) -> None:
        attributes: dict[str, Any] = {
            "wfsub.case_id": case.case_id,
            "wfsub.node_path": path,
            "wfsub.effect.name": name,
            "wfsub.effect.attempt": attempt,
        }
        if isinstance(effect_id, int | str):
            attributes["wfsub.effect.id"] = effect_id
        span = self._tracer.start_span(
            f"effect {name}", context=_otel_trace.set_span_in_context(case.span), start_time=start,
            attributes=attributes,
        )
        case.effects[effect_id] = _Effect(span, start, effect_id, name, path, attempt)

    def _end_effect(
        self, case: _Case, effect: _Effect, end: int, outcome: str, *, error: str | None = None, note: str = "",
        kind: object = None,
    ) -> None:
        if error is not None:
            if isinstance(kind, str):  # the type and message apart (effect_failed)
                message = error
            else:  # repr(exc), as events of earlier versions carried it
                kind, message = _error_parts(error, "Exception")
            _record_error(effect.span, kind, message, end)
        effect.span.set_attribute("wfsub.outcome", outcome)
        if note:
            effect.span.add_event("wfsub.unfinished", {"message": note}, timestamp=max(end, effect.start))
        effect.span.end(end_time=max(end, effect.start))
        if case.effects.get(effect.effect_id) is effect:
            del case.effects[effect.effect_id]

    def _effect_requested(self, case: _Case, event: TraceEvent) -> None:
        effect_id = event.detail.get("effect_id")
        stale = case.effects.get(effect_id)
        if stale is not None:
            self._end_effect(case, stale, _ns(event.time), "superseded")
        name = event.detail.get("name")
        name = name if isinstance(name, str) and name else _kind_of(event.path)
        self._start_effect(case, effect_id, name, event.path, 1, _ns(event.time))

    def _effect_retry(self, case: _Case, event: TraceEvent) -> None:
        effect_id = event.detail.get("effect_id")
        effect = case.effects.get(effect_id)
        end = _ns(event.time)
        attempt = event.detail.get("attempt")
        if effect is None:  # its request was not seen: the attempt that failed is all there is to show
            name = event.detail.get("name")
            number = attempt if isinstance(attempt, int) else 1
            self._start_effect(case, effect_id, str(name or _kind_of(event.path)), event.path, number, end)
            effect = case.effects[effect_id]
        delay = event.detail.get("delay")
        self._end_effect(case, effect, end, "retried", error=str(event.detail.get("error", "the attempt failed")),
                         kind=event.detail.get("type"))
        number = (attempt if isinstance(attempt, int) else effect.attempt) + 1
        wait = float(delay) if isinstance(delay, int | float) and delay > 0 else 0.0
        self._start_effect(case, effect_id, effect.name, effect.path, number, end + _ns(wait))
        if wait:
            case.effects[effect_id].span.set_attribute("wfsub.effect.retry_delay_s", wait)

    def _effect_completed(self, case: _Case, event: TraceEvent) -> None:
        self._effect_ended(case, event, "completed")

    def _effect_failed(self, case: _Case, event: TraceEvent) -> None:
        detail = event.detail  # the effect's own error: its type and message
        self._effect_ended(case, event, "failed", str(detail.get("error", "the effect failed")), detail.get("type"))

    def _effect_cancelled(self, case: _Case, event: TraceEvent) -> None:
        self._effect_ended(case, event, "cancelled")

    def _effect_discarded(self, case: _Case, event: TraceEvent) -> None:
        self._effect_ended(case, event, "discarded")

    def _effect_ended(
        self, case: _Case, event: TraceEvent, outcome: str, error: str | None = None, kind: object = None
    ) -> None:
        effect = case.effects.get(event.detail.get("effect_id"))
        if effect is not None:
            self._end_effect(case, effect, _ns(event.time), outcome, error=error, kind=kind)

    # -- waits ---------------------------------------------------------------------------------------------

    def _start_wait(self, case: _Case, event: TraceEvent, signal: str, token: object, start: int) -> _Wait:
        attributes: dict[str, Any] = {
            "wfsub.case_id": case.case_id,
            "wfsub.node_path": event.path,
            "wfsub.signal": signal,
        }
        kind = "defer" if _kind_of(event.path) == "defer" else "wait"
        span = self._tracer.start_span(
            f"{kind} {signal}", context=_otel_trace.set_span_in_context(case.span), start_time=start,
            attributes=attributes,
        )
        wait = _Wait(span, start, event.path, token, [signal])
        case.waits.setdefault(event.path, []).append(wait)
        if token is not None:
            case.by_token[(event.path, token)] = wait
        case.newest = wait
        return wait

    def _end_wait(self, case: _Case, wait: _Wait, end: int, outcome: str) -> None:
        wait.span.set_attribute("wfsub.outcome", outcome)
        wait.span.end(end_time=max(end, wait.start))
        here = case.waits.get(wait.path)
        if here is not None:
            here.remove(wait)
            if not here:
                del case.waits[wait.path]
        if wait.token is not None and case.by_token.get((wait.path, wait.token)) is wait:
            del case.by_token[(wait.path, wait.token)]
        if wait.timer_id is not None and case.by_timer.get(wait.timer_id) is wait:
            del case.by_timer[wait.timer_id]
        if case.newest is wait:
            case.newest = None

    def _find_wait(self, case: _Case, path: str, signal: object) -> _Wait | None:
        for wait in case.waits.get(path, ()):  # the oldest first: signals wake waiters in the order they parked
            if signal in wait.signals:
                return wait
        return None

    def _signal_waiting(self, case: _Case, event: TraceEvent) -> None:
        signal = str(event.detail.get("signal"))
        token = event.detail.get("token")
        wait = case.by_token.get((event.path, token)) if token is not None else None
        if wait is not None:  # a deferred choice parks one token on several signals: one span for them all
            wait.signals.append(signal)
            wait.span.update_name(f"defer {'|'.join(wait.signals)}")
            wait.span.set_attribute("wfsub.signals", list(wait.signals))
            return
        self._start_wait(case, event, signal, token, _ns(event.time))

    def _timer_armed(self, case: _Case, event: TraceEvent) -> None:
        wait = case.newest
        if wait is not None and wait.path == event.path and wait.timer_id is None:
            wait.timer_id = event.detail.get("timer_id")  # the timeout of the wait that just parked here
            if wait.timer_id is not None:
                case.by_timer[wait.timer_id] = wait
            seconds = event.detail.get("seconds")
            if isinstance(seconds, int | float):
                wait.span.set_attribute("wfsub.timeout_s", float(seconds))

    def _timer_fired(self, case: _Case, event: TraceEvent) -> None:
        wait = case.by_timer.get(event.detail.get("timer_id"))
        if wait is None:
            return  # a sleep's timer, or an effect's: not a wait
        end = _ns(event.time)
        if _kind_of(wait.path) == "defer":
            wait.span.set_attribute("wfsub.signal.chosen", "timeout")
        else:
            names = ", ".join(repr(s) for s in wait.signals)
            _record_error(wait.span, "WaitTimeout", f"no signal {names} arrived within the timeout", end)
        self._end_wait(case, wait, end, "timeout")

    def _signal_consumed(self, case: _Case, event: TraceEvent) -> None:
        signal = event.detail.get("signal")
        end = _ns(event.time)
        wait = None if event.detail.get("buffered") else self._find_wait(case, event.path, signal)
        if wait is None:  # taken from the buffer at once (or its parking was not seen): a zero-length wait
            wait = self._zero_length_wait(case, event, str(signal), end)
        self._end_wait(case, wait, end, "consumed")

    def _zero_length_wait(self, case: _Case, event: TraceEvent, signal: str, at: int) -> _Wait:
        """The span of a wait whose parking this sink has no open span for: taken from the signal buffer at once
        (`buffered`), or one whose span was ended early by a withdrawal above it (see `_withdrawn`)."""
        wait = self._start_wait(case, event, signal, None, at)
        buffered = event.detail.get("buffered") is True
        wait.span.set_attribute("wfsub.signal.buffered" if buffered else "wfsub.trace_partial", True)
        return wait

    def _deferred_choice(self, case: _Case, event: TraceEvent) -> None:
        chosen = event.detail.get("chosen")
        end = _ns(event.time)
        if chosen == "timeout":  # timer_fired ended the span already, unless that event was not seen
            timed_out = [w for w in case.waits.get(event.path, ()) if w.timer_id is not None][:1]
            for wait in timed_out:
                wait.span.set_attribute("wfsub.signal.chosen", "timeout")
                self._end_wait(case, wait, end, "timeout")
            return
        found = None if event.detail.get("buffered") else self._find_wait(case, event.path, chosen)
        if found is None:
            found = self._zero_length_wait(case, event, str(chosen), end)
        found.span.set_attribute("wfsub.signal.chosen", str(chosen))
        self._end_wait(case, found, end, "consumed")

    def _withdrawn(self, case: _Case, event: TraceEvent) -> None:
        """Work at or under the event's node was withdrawn: end the wait spans there.

        The event names a node, not tokens, so where several activations share a node path (the instances of an
        mi), the waits of all of them end here, even those that go on; a signal that one of those later
        consumes gets a zero-length span marked `wfsub.trace_partial`.
        """
        end = _ns(event.time)
        for path in [p for p in case.waits if _under(p, event.path)]:
            for wait in list(case.waits.get(path, ())):
                self._end_wait(case, wait, end, "withdrawn")


def _record_error(span: Span, kind: str, message: str, when: int) -> None:
    span.set_status(_otel_trace.Status(_otel_trace.StatusCode.ERROR, f"{kind}: {message}"))
    span.add_event("exception", {"exception.type": kind, "exception.message": message}, timestamp=when)


_HANDLERS: dict[str, Callable[[OTelSink, _Case, TraceEvent], None]] = {
    "case_done": OTelSink._case_done,
    "case_failed": OTelSink._case_failed,
    "case_cancelled": OTelSink._case_cancelled,
    "failure": OTelSink._failure,
    "effect_requested": OTelSink._effect_requested,
    "effect_retry": OTelSink._effect_retry,
    "effect_completed": OTelSink._effect_completed,
    "effect_failed": OTelSink._effect_failed,
    "effect_cancelled": OTelSink._effect_cancelled,
    "effect_discarded": OTelSink._effect_discarded,
    "signal_waiting": OTelSink._signal_waiting,
    "signal_consumed": OTelSink._signal_consumed,
    "deferred_choice": OTelSink._deferred_choice,
    "timer_armed": OTelSink._timer_armed,
    "timer_fired": OTelSink._timer_fired,
    "withdrawn": OTelSink._withdrawn,
    "region_cancelled": OTelSink._withdrawn,
}
"""What each event kind does (`case_started` is handled in `write`); other kinds are ignored."""

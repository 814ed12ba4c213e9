"""`wfsub.contrib.otel.OTelSink`: trace events as OpenTelemetry spans, read back from the SDK's in-memory exporter.

The runtime tests run real cases on a VirtualClock (times are the clock's seconds, so durations are exact);
the unit tests feed `TraceEvent`s to the sink directly, for what a real run cannot produce on demand.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import anyio
import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from tests.harness import running
from wfsub import Retry, TraceEvent, defer, effect, par, scope, seq, task, wait
from wfsub.contrib.otel import OTelSink
from wfsub.testing import CapturingSink, ScriptedEffect

S = 1_000_000_000  # nanoseconds in a second


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    yield exporter
    exporter.clear()


@pytest.fixture
def sink(exporter: InMemorySpanExporter) -> OTelSink:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return OTelSink(provider)


def spans(exporter: InMemorySpanExporter, case_id: str | None = None) -> list[ReadableSpan]:
    found = exporter.get_finished_spans()
    return [s for s in found if case_id is None or (s.attributes or {}).get("wfsub.case_id") == case_id]


def only(found: list[ReadableSpan], name: str) -> ReadableSpan:
    matching = [s for s in found if s.name == name]
    assert len(matching) == 1, (name, [s.name for s in found])
    return matching[0]


def attrs(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def events(span: ReadableSpan) -> list[tuple[str, dict[str, Any]]]:
    return [(e.name, dict(e.attributes or {})) for e in span.events]


def assert_child_of(child: ReadableSpan, parent: ReadableSpan) -> None:
    assert child.parent is not None and parent.context is not None and child.context is not None
    assert child.parent.span_id == parent.context.span_id
    assert child.context.trace_id == parent.context.trace_id
    assert child.start_time is not None and child.end_time is not None
    assert parent.start_time is not None and parent.end_time is not None
    assert parent.start_time <= child.start_time <= child.end_time <= parent.end_time


def fail(ctx: Any) -> None:
    raise KeyError("missing")


# -- real cases ----------------------------------------------------------------------------------------------------


async def test_effects_become_one_span_per_attempt_under_the_case_span(
    sink: OTelSink, exporter: InMemorySpanExporter
) -> None:
    """Each effect attempt is a child span of the case; failed attempts and failed effects are ERRORs."""
    charge = ScriptedEffect(ConnectionError("gateway down"), {"charged": True}, name="charge")
    ship = ScriptedEffect(ValueError("no address"), name="ship")
    async with running(sinks=[sink]) as (sub, clock, _):
        case = await sub.new_case(seq(effect(charge, retry=Retry(max_attempts=3, initial=2)), effect(ship)))
        await clock.advance(2)
        with pytest.raises(Exception, match="no address"):
            await case.result()
    found = spans(exporter, case.case_id)
    assert sorted(s.name for s in found) == ["case", "effect charge", "effect charge", "effect ship"]
    root = only(found, "case")
    first, second = sorted((s for s in found if s.name == "effect charge"), key=lambda s: s.start_time or 0)
    shipped = only(found, "effect ship")
    for child in (first, second, shipped):
        assert_child_of(child, root)
    assert attrs(first) == {
        "wfsub.case_id": case.case_id, "wfsub.node_path": "seq[0].effect", "wfsub.effect.name": "charge",
        "wfsub.effect.id": 1, "wfsub.effect.attempt": 1, "wfsub.outcome": "retried",
    }
    assert first.status.status_code is StatusCode.ERROR
    assert events(first) == [("exception", {"exception.type": "ConnectionError", "exception.message": "gateway down"})]
    assert attrs(second)["wfsub.effect.attempt"] == 2 and attrs(second)["wfsub.outcome"] == "completed"
    assert attrs(second)["wfsub.effect.retry_delay_s"] == 2.0
    assert second.status.status_code is StatusCode.UNSET
    assert first.end_time is not None and second.start_time == first.end_time + 2 * S  # after the backoff
    assert attrs(shipped)["wfsub.outcome"] == "failed" and shipped.status.status_code is StatusCode.ERROR
    assert events(shipped) == [("exception", {"exception.type": "ValueError", "exception.message": "no address"})]
    assert root.status.status_code is StatusCode.ERROR
    assert attrs(root)["wfsub.outcome"] == "failed" and attrs(root)["wfsub.error_path"] == "seq[1].effect"
    message = "effect ship raised ValueError: no address"
    assert events(root) == [("exception", {"exception.type": "ValueError", "exception.message": message})]


async def test_a_case_span_runs_from_case_started_to_case_done_on_the_events_clock(
    sink: OTelSink, exporter: InMemorySpanExporter
) -> None:
    """The case span starts and ends at its events' times (seconds -> ns); a done case is OK, not an error."""
    async with running(sinks=[sink]) as (sub, clock, _):
        await clock.advance(10)
        case = await sub.new_case(seq(wait("go"), task(lambda c: None)))
        await clock.advance(5)
        await case.signal("go")
        await case.result()
    root = only(spans(exporter, case.case_id), "case")
    assert (root.start_time, root.end_time) == (10 * S, 15 * S)
    assert attrs(root) == {"wfsub.case_id": case.case_id, "wfsub.node_path": "seq", "wfsub.outcome": "done"}
    assert root.status.status_code is StatusCode.UNSET and root.parent is None


async def test_a_wait_is_a_span_from_parking_to_consuming_its_signal(
    sink: OTelSink, exporter: InMemorySpanExporter
) -> None:
    """A wait's span starts when the token parks and ends when the signal is consumed, with the signal name."""
    async with running(sinks=[sink]) as (sub, clock, _):
        case = await sub.new_case(seq(wait("approved", timeout=60), task(lambda c: None)))
        await clock.advance(3)
        await case.signal("approved", {"by": "ann"})
        await case.result()
    found = spans(exporter, case.case_id)
    span = only(found, "wait approved")
    assert_child_of(span, only(found, "case"))
    assert (span.start_time, span.end_time) == (0, 3 * S)
    assert attrs(span) == {
        "wfsub.case_id": case.case_id, "wfsub.node_path": "seq[0].wait", "wfsub.signal": "approved",
        "wfsub.timeout_s": 60.0, "wfsub.outcome": "consumed",
    }


async def test_a_wait_that_times_out_is_an_error_span_and_a_defer_timeout_is_not(
    sink: OTelSink, exporter: InMemorySpanExporter
) -> None:
    """A timed-out wait is an ERROR span (WaitTimeout); a defer's timeout branch ends its one span OK, as chosen."""
    noop = task(lambda c: None)
    async with running(sinks=[sink]) as (sub, clock, _):
        chose = await sub.new_case(defer({"yes": noop, "no": noop}, timeout=5, on_timeout=noop))
        timed = await sub.new_case(wait("never", timeout=7))
        await clock.advance(7)
        await chose.result()
        with pytest.raises(Exception, match="timeout"):
            await timed.result()
    choice = only(spans(exporter, chose.case_id), "defer yes|no")
    assert (choice.start_time, choice.end_time) == (0, 5 * S)
    assert attrs(choice)["wfsub.signals"] == ("yes", "no") and attrs(choice)["wfsub.signal.chosen"] == "timeout"
    assert attrs(choice)["wfsub.outcome"] == "timeout" and choice.status.status_code is StatusCode.UNSET
    waited = only(spans(exporter, timed.case_id), "wait never")
    assert (waited.start_time, waited.end_time) == (0, 7 * S)
    assert waited.status.status_code is StatusCode.ERROR and attrs(waited)["wfsub.outcome"] == "timeout"
    assert events(waited)[0][1]["exception.type"] == "WaitTimeout"
    root = only(spans(exporter, timed.case_id), "case")
    assert root.status.status_code is StatusCode.ERROR and events(root)[0][1]["exception.type"] == "WaitTimeout"


async def test_a_signal_taken_from_the_buffer_and_a_chosen_signal_give_their_spans(
    sink: OTelSink, exporter: InMemorySpanExporter
) -> None:
    """A buffered signal gives a zero-length wait span; a deferred choice records the signal that picked it."""
    noop = task(lambda c: None)
    async with running(sinks=[sink]) as (sub, clock, _):
        case = await sub.new_case(seq(wait("gate"), wait("early"), defer({"a": noop, "b": noop})))
        await case.signal("early")
        await clock.advance(1)
        await case.signal("gate")
        await clock.advance(1)
        await case.signal("b")
        await case.result()
    found = spans(exporter, case.case_id)
    early = only(found, "wait early")
    assert early.start_time == early.end_time == 1 * S and attrs(early)["wfsub.signal.buffered"] is True
    choice = only(found, "defer a|b")
    assert (choice.start_time, choice.end_time) == (1 * S, 2 * S)
    assert attrs(choice)["wfsub.signal.chosen"] == "b" and attrs(choice)["wfsub.outcome"] == "consumed"


async def test_a_failing_case_records_its_error_on_the_case_span(
    sink: OTelSink, exporter: InMemorySpanExporter
) -> None:
    """A case that fails at a task has status ERROR, an exception event with the type and message, its path."""
    async with running(sinks=[sink]) as (sub, _, _):
        case = await sub.new_case(seq(task(lambda c: None), task(fail, name="lookup")))
        with pytest.raises(Exception, match="missing"):
            await case.result()
    root = only(spans(exporter, case.case_id), "case")
    assert root.status.status_code is StatusCode.ERROR and "KeyError" in (root.status.description or "")
    ((name, detail),) = events(root)
    assert name == "exception" and detail["exception.type"] == "KeyError" and "missing" in detail["exception.message"]
    assert attrs(root)["wfsub.error_path"] == "seq[1].task" and attrs(root)["wfsub.outcome"] == "failed"


async def test_a_cancelled_case_ends_its_open_spans_and_is_not_an_error(
    sink: OTelSink, exporter: InMemorySpanExporter
) -> None:
    """Cancelling a case ends its span as cancelled with the reason, and its open wait and effect spans with it."""
    async def hang(ctx: Any) -> None:
        await anyio.sleep_forever()

    async with running(sinks=[sink]) as (sub, clock, _):
        case = await sub.new_case(par(wait("never"), effect(hang)))
        await clock.advance(4)
        await case.cancel()
        with pytest.raises(Exception, match="cancelled"):
            await case.result()
    found = spans(exporter, case.case_id)
    root = only(found, "case")
    assert attrs(root)["wfsub.outcome"] == "cancelled" and attrs(root)["wfsub.cancel_reason"] == "cancelled"
    assert root.status.status_code is StatusCode.UNSET and root.end_time == 4 * S
    hung, waited = only(found, "effect hang"), only(found, "wait never")
    assert attrs(hung)["wfsub.outcome"] == "cancelled" and hung.end_time == 4 * S
    assert attrs(waited)["wfsub.outcome"] in ("withdrawn", "case ended") and waited.end_time == 4 * S
    for child in (hung, waited):
        assert_child_of(child, root)


async def test_a_withdrawn_branch_ends_its_wait_span_as_withdrawn(
    sink: OTelSink, exporter: InMemorySpanExporter
) -> None:
    """When a join withdraws the branch a wait is in, the wait's span ends there, as withdrawn."""
    async with running(sinks=[sink]) as (sub, clock, _):
        case = await sub.new_case(
            seq(par(wait("slow"), seq(wait("fast"), task(lambda c: None)), join="first", cancel_remaining=True),
                wait("after"))
        )
        await clock.advance(2)
        await case.signal("fast")
        await clock.advance(1)
        await case.signal("after")
        await case.result()
    found = spans(exporter, case.case_id)
    slow = only(found, "wait slow")
    assert attrs(slow)["wfsub.outcome"] == "withdrawn" and (slow.start_time, slow.end_time) == (0, 2 * S)
    assert attrs(only(found, "wait after"))["wfsub.outcome"] == "consumed"


async def test_a_cancelled_region_ends_the_wait_spans_inside_it(sink: OTelSink, exporter: InMemorySpanExporter) -> None:
    """cancel_region withdraws a scope: the waits inside it end there as withdrawn, those outside go on."""
    async with running(sinks=[sink]) as (sub, clock, _):
        case = await sub.new_case(par(scope("r", seq(wait("inner"), task(lambda c: None))), wait("outer")))
        await clock.advance(2)
        await sub.cancel_region(case.case_id, "r")
        await clock.advance(1)
        await case.signal("outer")
        await case.result()
    found = spans(exporter, case.case_id)
    inner, outer = only(found, "wait inner"), only(found, "wait outer")
    assert attrs(inner)["wfsub.outcome"] == "withdrawn" and inner.end_time == 2 * S
    assert attrs(outer)["wfsub.outcome"] == "consumed" and outer.end_time == 3 * S


async def test_waits_parked_at_one_node_are_matched_to_signals_oldest_first(
    sink: OTelSink, exporter: InMemorySpanExporter
) -> None:
    """Many waits at one node (mi instances) end in the order they parked, as the vm wakes them, at any count."""
    n = 3000
    parked = [ev(i + 2, "signal_waiting", "mi.wait", i / n, signal="x", token=i + 10) for i in range(n)]
    consumed = [ev(n + i + 2, "signal_consumed", "mi.wait", 1.0 + i, signal="x") for i in range(n)]
    await sink.write([ev(1, "case_started", "mi"), *parked, *consumed, ev(2 * n + 2, "case_done", "mi", float(n))])
    waits = sorted((s for s in spans(exporter) if s.name == "wait x"), key=lambda s: s.start_time or 0)
    assert len(waits) == n and [s.end_time for s in waits] == [(1 + i) * S for i in range(n)]


async def test_a_case_left_running_is_ended_by_aclose_as_unfinished(
    sink: OTelSink, exporter: InMemorySpanExporter
) -> None:
    """A case still running when the Substrate (and so the sink) closes gets its spans ended, marked unfinished."""
    async with running(sinks=[sink]) as (sub, clock, _):
        case = await sub.new_case(wait("never"))
        await clock.advance(3)
        assert spans(exporter, case.case_id) == []  # nothing has ended yet
    found = spans(exporter, case.case_id)
    root, waited = only(found, "case"), only(found, "wait never")
    assert attrs(root)["wfsub.outcome"] == "unfinished" and attrs(root)["wfsub.unfinished"] is True
    assert events(root) == [("wfsub.unfinished", {"message": "the trace sink was closed before the case ended"})]
    assert attrs(waited)["wfsub.outcome"] == "unfinished"
    assert_child_of(waited, root)
    assert root.end_time == 0  # a virtual clock: the last time the case was seen, not the wall clock


async def test_span_times_are_ordered_and_nested(sink: OTelSink, exporter: InMemorySpanExporter) -> None:
    """Every span starts before it ends, children lie within their case span, and each case is its own trace."""
    flaky = ScriptedEffect(OSError("blip"), OSError("blip"), {"ok": True}, name="flaky")
    capture = CapturingSink()
    async with running(sinks=[sink, capture]) as (sub, clock, _):
        one = await sub.new_case(seq(effect(flaky, retry=Retry(max_attempts=3, initial=1)), wait("x")))
        two = await sub.new_case(wait("x"))
        await clock.advance(1)
        await clock.advance(2)
        await one.signal("x")
        await clock.advance(1)
        await two.signal("x")
        await one.result()
        await two.result()
    roots = {}
    for span in spans(exporter):
        assert span.start_time is not None and span.end_time is not None and span.start_time <= span.end_time
        if span.parent is None:
            roots[attrs(span)["wfsub.case_id"]] = span
    assert set(roots) == {one.case_id, two.case_id}
    assert roots[one.case_id].context.trace_id != roots[two.case_id].context.trace_id  # type: ignore[union-attr]
    for span in spans(exporter):
        if span.parent is not None:
            assert_child_of(span, roots[attrs(span)["wfsub.case_id"]])
    attempts = sorted(
        (s for s in spans(exporter, one.case_id) if s.name == "effect flaky"), key=lambda s: s.start_time or 0
    )
    assert [attrs(s)["wfsub.effect.attempt"] for s in attempts] == [1, 2, 3]
    assert [attrs(s)["wfsub.outcome"] for s in attempts] == ["retried", "retried", "completed"]
    for before, after in zip(attempts, attempts[1:]):
        assert before.end_time is not None and after.start_time is not None and before.end_time <= after.start_time
    times = [e.time for e in capture.for_case(one.case_id)]
    assert roots[one.case_id].start_time == int(times[0] * S) and roots[one.case_id].end_time == int(times[-1] * S)


# -- events fed by hand ------------------------------------------------------------------------------------------


def ev(seq: int, kind: str, path: str = "seq", time: float = 0.0, case_id: str = "c", **detail: Any) -> TraceEvent:
    return TraceEvent(case_id=case_id, seq=seq, kind=kind, path=path, detail=detail, time=time)


async def test_the_workflow_name_names_the_case_span_when_case_started_carries_it(
    sink: OTelSink, exporter: InMemorySpanExporter
) -> None:
    """A `workflow` in case_started's detail becomes the `wfsub.workflow` attribute and the span's name."""
    await sink.write([ev(1, "case_started", workflow="order"), ev(2, "case_done", time=1.5)])
    (root,) = spans(exporter)
    assert root.name == "case order" and attrs(root)["wfsub.workflow"] == "order"
    assert (root.start_time, root.end_time) == (0, int(1.5 * S))


async def test_events_of_a_case_first_seen_midway_open_a_partial_case_span(
    sink: OTelSink, exporter: InMemorySpanExporter
) -> None:
    """A case first seen midway gets a partial span from its first event; a late event after its end opens none."""
    await sink.write([
        ev(5, "effect_requested", "seq[1].effect", 2.0, effect_id=3, name="pay"),
        ev(6, "effect_completed", "seq[1].effect", 3.0, effect_id=3, name="pay"),
        ev(7, "case_done", time=3.0),
        ev(8, "effect_discarded", "", 4.0, effect_id=9),
    ])
    await sink.aclose()
    found = spans(exporter)
    root = only(found, "case")
    assert attrs(root)["wfsub.trace_partial"] is True and (root.start_time, root.end_time) == (2 * S, 3 * S)
    assert attrs(only(found, "effect pay"))["wfsub.outcome"] == "completed"
    assert len(found) == 2


async def test_dropped_events_mark_the_open_cases_incomplete(sink: OTelSink, exporter: InMemorySpanExporter) -> None:
    """When the hub drops events meant for the sink, the spans of cases open then are marked incomplete."""
    await sink.write([ev(1, "case_started", case_id="open"), ev(1, "case_started", case_id="later", time=1)])
    await sink.write([ev(2, "case_done", case_id="later", time=1)])
    sink.dropped(4)
    await sink.write([ev(9, "case_done", case_id="open", time=2)])
    assert sink.dropped_events == 4
    assert attrs(only(spans(exporter, "open"), "case"))["wfsub.trace_incomplete"] is True
    assert "wfsub.trace_incomplete" not in attrs(only(spans(exporter, "later"), "case"))


def test_bad_arguments_are_type_errors_saying_what_to_pass() -> None:
    """A provider without get_tracer, or an empty tracer name, is refused with the fix."""
    with pytest.raises(TypeError, match=r"TracerProvider.*pass opentelemetry\.sdk\.trace\.TracerProvider\(\)"):
        OTelSink(tracer_provider=object())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="non-empty str"):
        OTelSink(tracer_name="")
    assert "OTelSink" in repr(OTelSink())  # the global provider by default


def test_import_wfsub_never_imports_opentelemetry() -> None:
    """`import wfsub` (and wfsub.contrib, and the diagrams) loads no OpenTelemetry module."""
    code = (
        "import sys, wfsub, wfsub.contrib, wfsub.contrib.diagram\n"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_module_says_how_to_install_opentelemetry_when_it_is_missing() -> None:
    """Without OpenTelemetry installed, importing wfsub.contrib.otel raises ImportError naming the extra."""
    code = (
        "import sys\n"
        "sys.modules['opentelemetry'] = None\n"  # what an uninstalled package looks like to import
        "try:\n"
        "    import wfsub.contrib.otel\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "pip install 'wfsub[otel]'" in out


async def test_an_evicted_case_ends_its_span_and_a_new_one_covers_it_when_it_comes_back(
    exporter: InMemorySpanExporter, sink: OTelSink
) -> None:
    """Eviction ends the case's span (outcome evicted; the sink keeps nothing); the resumed case gets a new span."""
    from wfsub import Substrate
    from wfsub.stores import MemoryStore
    from wfsub.testing import VirtualClock

    clock = VirtualClock()
    flows = {"go": seq(wait("go"), task(lambda c: {"went": True}, name="went"))}
    async with Substrate(store=MemoryStore(), workflows=flows, clock=clock, evict_after=10, sinks=[sink],
                         trace_level="min") as sub:
        await sub.new_case("go", case_id="c")
        await clock.advance(11)
        with anyio.fail_after(5):
            while sub.statistics().cases_in_memory:  # noqa: ASYNC110 - eviction happens in the background
                await anyio.sleep(0.01)
            while repr(sink) != "OTelSink(0 cases open)":  # noqa: ASYNC110 - the hub delivers in the background
                await anyio.sleep(0.01)
        assert sorted(attrs(s)["wfsub.outcome"] for s in spans(exporter, "c")) == ["evicted", "evicted"]  # + wait
        await sub.signal("c", "go")
        assert (await sub.await_case("c"))["went"]
    cases = [s for s in spans(exporter, "c") if s.name == "case go"]
    assert [attrs(s)["wfsub.outcome"] for s in cases] == ["evicted", "done"]
    assert attrs(cases[1]).get("wfsub.resumed") is True

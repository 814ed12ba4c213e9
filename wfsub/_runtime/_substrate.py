"""`Substrate`: the root supervisor that an application enters with `async with`, and `CaseHandle`.

The Substrate owns a root task group holding the trace-sink actor and, nested in it, the task group of the case
actors; a registry of cases; and a cache of compiled programs (one per distinct workflow term). It is the
only way in: every method checks its arguments and says what was wrong and how to fix it.

Decisions written down here:
- `new_case` returns once the case is registered and its actor scheduled; it does not wait for the actor's
  first burst. Everything that can fail at start (validation, compilation, bad data) fails inside `new_case`,
  before anything is scheduled, so start-up errors still reach the caller.
- `signal` returns once the signal is queued in the case's mailbox, not when the case has consumed it; it waits
  only while the mailbox is full. A signal queued just before the case ends is discarded (and logged).
- `cancel_region`, `complete_region` and `add_instances` wait until the case has applied them, so that an
  operation the case cannot take raises `SignalRejected` in the caller.
- `cancel` of a case that has already ended does nothing.
- Ended cases keep their result for `await_case` and `status`, up to `retain_ended` of them (oldest dropped
  first; a dropped id raises `CaseNotFound`). A `CaseHandle` keeps its own case's outcome regardless.
- `await_case` returns (or raises) once the case has ended and its effects and timers have stopped; each
  caller gets its own shallow copy of the final data.
- Timeouts of `await_case` and `new_case(timeout=...)` run on the Substrate's clock, like every other timer.
- A case is traced only when some sink will see its events: with `trace_level="min"` and no sinks, cases run
  the vm's untraced loop until `trace(case_id, level, sink)` gives one of them a sink.
- Leaving the `async with` cancels every live case (their awaiters get `CaseCancelled` with reason
  "substrate closed"), waits for their effects and timers to stop, then lets the trace-sink actor deliver what
  it holds (at most `shutdown_timeout` seconds) and close the sinks.
"""

from __future__ import annotations

import itertools
import secrets
from collections import deque
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any

import anyio
from anyio.abc import TaskGroup

from .._compiler import compile_workflow
from .._errors import CaseExists, CaseNotFound, SubstrateClosed
from .._program import DEFAULT_MAX_INSTANCES, Program
from .._terms import MAX_SECONDS, Term
from .._trace import LEVELS, TraceLevel, TraceSink, check_sink, get_logger
from .._vm import Machine
from ._case import CaseActor, Shared
from ._clock import Clock, RealClock, VirtualClock
from ._hub import TraceHub
from ._mailbox import Cancel, RegionAction, RegionOp, Reply, Signal
from ._status import CaseStatus, SubstrateStatistics

_log = get_logger("wfsub.runtime")

PROGRAM_CACHE_SIZE = 1024


def _positive(value: object, name: str, *, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ValueError(f"{name} must be a positive number, got {value!r}")
    if value > MAX_SECONDS:
        fix = "pass None for no limit" if allow_none else "pass a number of seconds"
        raise ValueError(f"{name}={value!r} is more than {MAX_SECONDS:g} seconds (about 31 years): {fix}")


def _check_data(data: object) -> None:
    if data is None:
        return
    if not isinstance(data, Mapping):
        raise TypeError(
            f"case data must be a mapping (a dict with str keys), got {type(data).__name__}; "
            f"pass e.g. new_case(workflow, {{'order_id': 42}})"
        )
    for key in data:
        if not isinstance(key, str):
            raise TypeError(
                f"case data keys must be str (steps read them as ctx[key]), got {type(key).__name__} {key!r}"
            )


class Substrate:
    """The root supervisor of a set of cases. Use it as `async with Substrate(...) as sub:`.

    - `trace_level`: "none", "min" or "full", the default level of every case (`trace()` changes one case).
    - `sinks`: trace sinks that get the events of every case.
    - `quanta`: vm steps per burst before the case actor yields to the event loop.
    - `clock`: a `Clock`; the real clock by default, `wfsub.testing.VirtualClock()` in tests.
    - `library`: `{name: workflow}` that `call(name)` looks workflows up in.
    - `mailbox_size`: external inputs (signals, region operations) queued per case before senders wait.
    - `retain_ended`: how many ended cases keep their result for `await_case` / `status` (oldest dropped first).
    - `trace_buffer`: event batches buffered for the trace-sink actor, and per sink, before events are dropped.
    - `shutdown_timeout`: seconds the sinks get on exit to take the events still buffered; effects still
      running that long after the cases were cancelled are logged (a WARNING naming them) and waited for.
    - `max_instances`: the most instances one mi without `max=` may start; beyond it the case fails at the mi.
    """

    def __init__(
        self,
        *,
        trace_level: TraceLevel = "min",
        sinks: Sequence[TraceSink] = (),
        quanta: int = 100,
        clock: Clock | None = None,
        library: Mapping[str, Term] | None = None,
        mailbox_size: int = 1024,
        retain_ended: int = 10_000,
        trace_buffer: int = 10_000,
        shutdown_timeout: float = 5.0,
        max_instances: int = DEFAULT_MAX_INSTANCES,
    ) -> None:
        if trace_level not in LEVELS:
            raise ValueError(f"trace_level must be one of {', '.join(LEVELS)}, got {trace_level!r}")
        for value, name in ((quanta, "quanta"), (mailbox_size, "mailbox_size"), (trace_buffer, "trace_buffer")):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if isinstance(retain_ended, bool) or not isinstance(retain_ended, int) or retain_ended < 0:
            raise ValueError(f"retain_ended must be an int >= 0, got {retain_ended!r}")
        _positive(shutdown_timeout, "shutdown_timeout")
        if isinstance(max_instances, bool) or not isinstance(max_instances, int) or max_instances < 1:
            raise ValueError(f"max_instances must be an int >= 1, got {max_instances!r}")
        if library is not None and not isinstance(library, Mapping):
            raise TypeError(f"library must be a mapping of name -> workflow, got {type(library).__name__}")
        if isinstance(sinks, TraceSink) or not isinstance(sinks, Sequence):
            raise TypeError("sinks must be a sequence of sinks, e.g. sinks=[MemorySink()]")
        for sink in sinks:
            check_sink(sink)
        if clock is not None and not isinstance(clock, Clock):
            raise TypeError(f"clock must provide now(), sleep() and deadline_scope(); got {type(clock).__name__}")
        self._level = trace_level
        self._sinks = tuple(sinks)
        self._quanta = quanta
        self._clock: Clock = clock if clock is not None else RealClock()
        self._library = dict(library) if library is not None else None
        self._mailbox_size = mailbox_size
        self._retain = retain_ended
        self._trace_buffer = trace_buffer
        self._shutdown_timeout = shutdown_timeout
        self._max_instances = max_instances
        self._programs: dict[Term, Program] = {}
        self._cases: dict[str, CaseActor] = {}
        self._ended: deque[str] = deque()
        self._ids = itertools.count(1)
        self._prefix = secrets.token_hex(3)
        self._phase = "new"  # new -> open -> closed
        self._root: TaskGroup | None = None
        self._case_tg: TaskGroup | None = None
        self._hub: TraceHub | None = None
        self._shared: Shared | None = None
        self._detach_clock: Any = None
        self._counts = {"started": 0, "done": 0, "failed": 0, "cancelled": 0, "evicted": 0}

    # -- lifecycle ----------------------------------------------------------------------------------------

    async def __aenter__(self) -> Substrate:
        if self._phase != "new":
            raise RuntimeError("a Substrate can be entered only once; make a new Substrate instead")
        hub = self._hub = TraceHub(self._sinks, buffer=self._trace_buffer, sink_buffer=self._trace_buffer)
        self._shared = Shared(self._clock, hub, self._quanta, self._mailbox_size, self._on_end)
        root = self._root = anyio.create_task_group()
        await root.__aenter__()
        root.start_soon(hub.run)
        case_tg = self._case_tg = anyio.create_task_group()
        await case_tg.__aenter__()
        if isinstance(self._clock, VirtualClock):
            shared = self._shared
            self._detach_clock = self._clock.attach(lambda: shared.busy == 0)
        self._phase = "open"
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        self._phase = "closed"
        assert self._root is not None
        assert self._case_tg is not None
        assert self._hub is not None
        cancelled_before = self._counts["cancelled"]
        try:
            self._case_tg.cancel_scope.cancel()
            watchdog = anyio.CancelScope()
            self._root.start_soon(self._report_stragglers, watchdog)
            try:
                await self._case_tg.__aexit__(None, None, None)
            finally:
                watchdog.cancel()
        finally:
            self._hub.close()
            with anyio.move_on_after(self._shutdown_timeout, shield=True):
                await self._hub.finished.wait()
            self._root.cancel_scope.cancel()
            await self._root.__aexit__(None, None, None)
            if self._detach_clock is not None:
                self._detach_clock()
        if self._counts["cancelled"] > cancelled_before:
            cancelled = self._counts["cancelled"] - cancelled_before
            _log.info("substrate closed; live cases were cancelled", cancelled=cancelled)
        return None

    async def _report_stragglers(self, scope: anyio.CancelScope) -> None:
        """At shutdown: after `shutdown_timeout`, name the effects that ignore cancellation (we keep waiting)."""
        with scope:
            await anyio.sleep(self._shutdown_timeout)
            stragglers = [
                f"{actor.case_id}: effect {req.name!r} at {req.path}"
                for actor in self._cases.values()
                for req in actor.running_effects.values()
            ]
            if stragglers:
                _log.warning(
                    "substrate closing: effects still running after shutdown_timeout ignore cancellation; "
                    "waiting for them (leaving leaves no task behind)",
                    shutdown_timeout=self._shutdown_timeout,
                    effects=stragglers,
                )

    def _check_open(self, what: str) -> None:
        if self._phase != "open":
            raise SubstrateClosed(what)

    # -- starting cases ------------------------------------------------------------------------------------

    async def new_case(
        self,
        workflow: Term,
        data: Mapping[str, Any] | None = None,
        *,
        case_id: str | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 - the case's own deadline, not this call's
    ) -> CaseHandle:
        """Validate and compile `workflow` (once per term), register a case and start its actor."""
        self._check_open("start a case")
        _check_data(data)
        _positive(timeout, "timeout", allow_none=True)
        if case_id is None:
            case_id = f"case-{self._prefix}-{next(self._ids)}"
            while case_id in self._cases:
                case_id = f"case-{self._prefix}-{next(self._ids)}"
        elif not isinstance(case_id, str):
            raise TypeError(f"case_id must be a str, got {type(case_id).__name__} {case_id!r}")
        elif not case_id or case_id != case_id.strip():
            raise ValueError(
                f"case_id {case_id!r} is empty or has leading/trailing spaces: pass a visible id, or omit it "
                "to get a fresh one"
            )
        elif case_id in self._cases:
            raise CaseExists(case_id)
        program = self._program(workflow)
        level = self._level if self._sinks else "none"
        machine = Machine(program, data, trace_level=level, case_id=case_id, max_instances=self._max_instances)
        shared = self._shared
        assert shared is not None
        assert self._case_tg is not None
        actor = CaseActor(case_id, machine, shared, self._clock.now(), timeout, level)
        self._cases[case_id] = actor
        self._counts["started"] += 1
        shared.busy += 1
        self._case_tg.start_soon(actor.run)
        return CaseHandle(self, actor)

    def _program(self, workflow: Term) -> Program:
        if not isinstance(workflow, Term):
            raise TypeError(
                f"new_case takes a workflow term built with wfsub's constructors (seq, par, task, ...), "
                f"got {type(workflow).__name__}"
            )
        programs = self._programs
        program = programs.get(workflow)
        if program is None:
            program = compile_workflow(workflow, library=self._library)  # raises InvalidWorkflow
            if len(programs) >= PROGRAM_CACHE_SIZE:
                del programs[next(iter(programs))]
            programs[workflow] = program
        return program

    # -- inputs ------------------------------------------------------------------------------------------------

    def _get(self, case_id: str) -> CaseActor:
        if not isinstance(case_id, str):
            raise TypeError(f"case_id must be a str, got {type(case_id).__name__} {case_id!r}")
        actor = self._cases.get(case_id)
        if actor is None:
            raise CaseNotFound(case_id)
        return actor

    async def signal(self, case_id: str, name: str, payload: Any = None) -> None:
        """Send signal `name` (with `payload`) to a case; waits only while the case's mailbox is full."""
        self._check_open("send a signal")
        await self._signal(self._get(case_id), name, payload)

    async def _signal(self, actor: CaseActor, name: str, payload: Any) -> None:
        if self._phase != "open":
            raise SubstrateClosed("send a signal")
        msg = Signal(name, payload)
        machine = actor.machine
        if machine is None or actor.state.ended:
            if not isinstance(name, str):
                raise TypeError(f"signal names are str, got {type(name).__name__} {name!r}")
            raise actor.ended_error(msg.what)
        machine.check_signal(name)  # unknown names are refused here, before anything is queued
        await actor.send(msg)

    async def cancel(self, case_id: str, compensate: bool = True) -> None:
        """Cancel a case: its work is withdrawn and its awaiters get CaseCancelled. No-op once ended.

        With `compensate` (the default) the active sagas compensate and the active scopes run their on_cancel
        first (innermost first), then the case ends cancelled; `compensate=False`, or a second cancel while it
        compensates, ends it at once.
        """
        self._check_open("cancel a case")
        self._cancel(self._get(case_id), compensate)

    def _cancel(self, actor: CaseActor, compensate: bool) -> None:
        self._check_open("cancel a case")
        if not isinstance(compensate, bool):
            raise TypeError(f"compensate must be True or False, got {compensate!r}")
        if not actor.state.ended:
            actor.post(Cancel("cancelled", compensate))

    async def cancel_region(self, case_id: str, region: str) -> None:
        """Withdraw all work of the named region (a scope or a named mi) of a case."""
        await self._region(case_id, RegionAction.CANCEL, region, None)

    async def complete_region(self, case_id: str, region: str) -> None:
        """Close the named region now: an mi joins with the outputs so far; a scope continues after itself."""
        await self._region(case_id, RegionAction.COMPLETE, region, None)

    async def add_instances(self, case_id: str, region: str, items: Sequence[Any]) -> None:
        """Add one instance per item to the live dynamic mi `region` of a case."""
        if isinstance(items, str | bytes) or not isinstance(items, Sequence):
            raise TypeError(f"add_instances takes a sequence of items (e.g. a list), got {type(items).__name__}")
        await self._region(case_id, RegionAction.ADD_INSTANCES, region, list(items))

    async def close_instances(self, case_id: str, region: str) -> None:
        """Close the dynamic mi `region` of a case: it takes no more instances (its join fires once they end)."""
        await self._region(case_id, RegionAction.CLOSE_INSTANCES, region, None)

    async def _region(self, case_id: str, action: RegionAction, region: str, items: list[Any] | None) -> None:
        what = f"{action.value} {region!r}"
        self._check_open(what)
        actor = self._get(case_id)
        machine = actor.machine
        if machine is None or actor.state.ended:
            if not isinstance(region, str):
                raise TypeError(f"region names are str, got {type(region).__name__} {region!r}")
            raise actor.ended_error(what)
        machine.check_region(action.value, region)  # unknown regions are refused before anything is queued
        op = RegionOp(action, region, items, Reply())
        await actor.send(op)
        await op.reply.event.wait()
        if op.reply.error is not None:
            raise op.reply.error

    # -- outcomes -----------------------------------------------------------------------------------------------

    async def await_case(self, case_id: str, timeout: float | None = None) -> dict[str, Any]:  # noqa: ASYNC109
        """The case's final data; raises CaseFailed, CaseCancelled, or TimeoutError (the case goes on)."""
        return await self._await(self._get(case_id), timeout)

    async def _await(self, actor: CaseActor, timeout: float | None) -> dict[str, Any]:  # noqa: ASYNC109
        if not actor.exited:
            _positive(timeout, "timeout", allow_none=True)
            if actor.done is None:
                actor.done = anyio.Event()
            if timeout is None:
                await actor.done.wait()
            else:
                with self._clock.deadline_scope(timeout):
                    await actor.done.wait()
                if not actor.exited:
                    raise TimeoutError(
                        f"case {actor.case_id!r} did not end within {timeout:g}s; it goes on running "
                        f"(await it again, or cancel it)"
                    )
        return actor.outcome()

    def status(self, case_id: str) -> CaseStatus:
        """A snapshot of the case: state, steps, awaited signals, effects, timers, regions, times, error."""
        return self._get(case_id).status()

    def trace(self, case_id: str, level: TraceLevel, sink: TraceSink | None = None) -> None:
        """Set one case's trace level and, with `sink`, send that case's events to `sink` as well."""
        self._check_open("change a case's tracing")
        if level not in LEVELS:
            raise ValueError(f"trace level must be one of {', '.join(LEVELS)}, got {level!r}")
        actor = self._get(case_id)
        if sink is not None:
            check_sink(sink)
            already = any(s is sink for s in self._sinks) or any(s is sink for s in actor.sinks)
            if not already and not actor.exited:  # a sink that sees the case already is not given it twice
                actor.sinks = (*actor.sinks, sink)
                assert self._hub is not None
                self._hub.retain(sink)
        effective = level if (self._sinks or actor.sinks) else "none"
        actor.level = effective
        if actor.machine is not None:
            actor.machine.trace_level = effective

    def statistics(self) -> SubstrateStatistics:
        """Counters: cases started, live, ended by outcome, retained, evicted; trace events, drops, sink errors."""
        c = self._counts
        ended = c["done"] + c["failed"] + c["cancelled"]
        stats = self._hub.stats if self._hub is not None else None
        return SubstrateStatistics(
            cases_started=c["started"],
            cases_live=c["started"] - ended,
            cases_done=c["done"],
            cases_failed=c["failed"],
            cases_cancelled=c["cancelled"],
            cases_retained=len(self._ended),
            cases_evicted=c["evicted"],
            trace_events=stats.events if stats else 0,
            trace_dropped=stats.dropped if stats else 0,
            sink_errors=stats.sink_errors if stats else 0,
        )

    def _on_end(self, actor: CaseActor) -> None:
        self._counts[actor.state.value] += 1
        ended = self._ended
        ended.append(actor.case_id)
        cases = self._cases
        while len(ended) > self._retain:
            old = ended.popleft()
            if old in cases and cases[old].state.ended:
                del cases[old]
                self._counts["evicted"] += 1

    def __repr__(self) -> str:
        return f"<Substrate {self._phase} cases={len(self._cases)} trace_level={self._level!r}>"


class CaseHandle:
    """A started case: `case_id`, `await result()`, `status()`, `await signal(...)`, `await cancel()`.

    The handle keeps its case's outcome, so `result()` works even after the Substrate's retention bound has
    dropped the case from its registry.
    """

    __slots__ = ("_sub", "_actor", "case_id")

    def __init__(self, sub: Substrate, actor: CaseActor) -> None:
        self._sub = sub
        self._actor = actor
        self.case_id = actor.case_id

    async def result(self, timeout: float | None = None) -> dict[str, Any]:  # noqa: ASYNC109
        """The final data; raises CaseFailed, CaseCancelled, or TimeoutError (the case goes on)."""
        return await self._sub._await(self._actor, timeout)

    def status(self) -> CaseStatus:
        return self._actor.status()

    async def signal(self, name: str, payload: Any = None) -> None:
        await self._sub._signal(self._actor, name, payload)

    async def cancel(self, compensate: bool = True) -> None:
        self._sub._cancel(self._actor, compensate)

    def __repr__(self) -> str:
        return f"<CaseHandle {self.case_id!r} {self._actor.state.value}>"

"""The case actor: one long-lived coroutine per case that drives its Machine.

The actor runs vm bursts of `quanta` steps and yields to the event loop between bursts. Before every burst it
drains its mailbox: after one wake-up it takes every message that is waiting, so a burst of 100 signals costs
one wake-up and one burst, not 100. When the vm is blocked, the actor parks on the mailbox.

The mailbox is a list (swapped out whole on each drain) plus an `anyio.Event` created only while the actor is
parked, not an anyio memory object stream: a case that finishes in its first burst (the common short case)
allocates no mailbox machinery at all, an idle case holds one Event (`bench/runtime_bench.py` measures what an
idle case costs), and the two kinds of message get different treatment without two streams. Inputs from
outside the case (signals, region operations) are bounded by `mailbox_size`: a sender waits while that many
are queued (backpressure). Messages the case generates itself (effect results, timer
firings, cancels) are never refused: they are bounded by the work the case itself started.

The actor enters its own task group only when the vm first asks for an effect or a timer (or the case has a
`timeout=`). Effects and timers run there, each under its own cancel scope, so withdrawing one cancels it at
once; when the case ends the whole group is cancelled, and the actor returns only after every effect and
timer has finished, so an ended case leaves nothing running.

Supervision: an exception escaping a step fails the case in the vm; any other exception in the actor (a bug,
or a broken vm invariant) ends this case as failed and is logged. Cancellation is never caught: at shutdown it
unwinds the actor, which marks the case cancelled ("substrate closed") on its way out.
"""

from __future__ import annotations

import traceback as tb
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio
import anyio.lowlevel
from anyio.abc import TaskGroup

from .._errors import CaseCancelled, CaseFailed, MachineStateError, SignalRejected, WfsubError
from .._trace import TraceSink, get_logger
from ._clock import Clock
from ._effects import PASS_THROUGH, call_effect
from ._hub import TraceHub
from ._mailbox import Cancel, EffectDone, Message, RegionAction, RegionOp, Signal, TimerFired
from ._status import CaseState, CaseStatus

if TYPE_CHECKING:
    from .._vm import EffectRequest, Machine, RunResult

_log = get_logger("wfsub.runtime")

_ENDED = frozenset({"done", "failed", "cancelled"})


@dataclass(slots=True)
class Shared:
    """What every case actor of one Substrate shares."""

    clock: Clock
    hub: TraceHub
    quanta: int
    mailbox_size: int
    on_end: Callable[[CaseActor], None]
    busy: int = 0  # actors running or with messages waiting (VirtualClock settles on 0)


@dataclass(slots=True, eq=False)
class CaseActor:
    """One case: its machine, mailbox, outcome and the coroutine that drives it (`run`)."""

    case_id: str
    machine: Machine | None
    shared: Shared
    started_at: float
    timeout: float | None = None
    level: str = "none"
    sinks: tuple[TraceSink, ...] = ()
    state: CaseState = CaseState.INITIALIZING
    inbox: list[Message] = field(default_factory=list)
    external: int = 0  # external messages queued (bounded by mailbox_size)
    parked: bool = False
    wake: anyio.Event | None = None
    space: list[anyio.Event] | None = None  # senders waiting for room in the mailbox
    tg: TaskGroup | None = None
    scopes: dict[tuple[bool, int], anyio.CancelScope] | None = None  # (is_timer, id) -> its cancel scope
    running_effects: dict[int, EffectRequest] = field(default_factory=dict)  # effect id -> request, while it runs
    unstarted: int = 0  # effect and timer tasks started that have not run yet (see _starting)
    wakeups: int = 0
    steps: int = 0
    signals: tuple[str, ...] = ()
    cancel_reason: str | None = None
    result: dict[str, Any] | None = None
    cause: BaseException | None = None
    traceback: str | None = None  # failed: the cause's traceback, formatted (the frames themselves are dropped)
    record: dict[str, Any] | None = None  # failed at a node: the error record (type, message, path, compensated, cause)
    error_path: str = ""
    error_message: str = ""
    ended_at: float | None = None
    done: anyio.Event | None = None  # set once the actor has exited (created by the first awaiter)
    exited: bool = False

    # -- the actor coroutine ----------------------------------------------------------------------------

    async def run(self) -> None:
        try:  # one coroutine frame for the whole life of the case (an idle case pays for each frame)
            self.state = CaseState.RUNNING
            # The case starts before it takes any input, but a cancel already requested comes first: once
            # cancel() has returned, none of the case's work starts.
            r = self._burst(drain=any(type(msg) is Cancel for msg in self.inbox))
            if self.timeout is None:
                pending = await self._drive(r, None)
                if pending is None:
                    return
                r = pending
            async with anyio.create_task_group() as tg:
                self.tg = tg
                self.scopes = {}
                if self.timeout is not None:
                    self._starting(1)
                    tg.start_soon(self._case_timer, self.timeout)
                await self._drive(r, tg)
                tg.cancel_scope.cancel()  # whatever is left (timers, late effects) stops now
        except Exception as exc:  # a runtime or vm bug: it ends this case only
            _log.exception("case actor crashed; the case is failed", case_id=self.case_id)
            if not self.state.ended:
                message = f"internal error in the case actor: {type(exc).__name__}: {exc}"
                self._end_failed(exc, "case actor", message)
        finally:
            if not self.state.ended:  # unwinding on cancellation: the Substrate is closing
                self._end_cancelled("substrate closed")
            if not self.parked:
                self.shared.busy -= 1
            self._starting(-self.unstarted)  # tasks cancelled before they ever ran
            self.parked = False
            if self.sinks:
                self.shared.hub.release(self.sinks)
            # Awaiters are released only now, when the case's effects and timers have all stopped.
            self.exited = True
            if self.done is not None:
                self.done.set()
            self.shared.on_end(self)

    async def _drive(self, r: RunResult, tg: TaskGroup | None) -> RunResult | None:
        """Run bursts until the case ends (None) or, without a task group, until one is needed (the result)."""
        checkpoint = anyio.lowlevel.checkpoint
        hub = self.shared.hub
        while True:
            if hub.backlogged:  # tracing backpressure: let the hub catch up rather than drop events
                await hub.caught_up()
            status = r.status
            if status in _ENDED:
                self._end(r)
                return None
            if tg is None:
                if r.effects or r.timers:
                    return r
            elif r.effects or r.timers or r.cancelled_effects or r.cancelled_timers:
                self._io(r, tg)
            if status == "yielded":
                await checkpoint()
            elif not self.inbox:  # park on the mailbox (inlined: one coroutine frame less per idle case)
                self.signals = r.signals
                self._set_waiting_state()
                self.wake = wake = anyio.Event()
                self.parked = True
                self.shared.busy -= 1
                await wake.wait()  # post() clears `parked` and counts us busy again
                self.wake = None
                self.wakeups += 1
                self.state = CaseState.RUNNING
            r = self._burst()

    def _burst(self, drain: bool = True) -> RunResult:
        if drain and self.inbox:
            self._drain()
        m = self.machine
        assert m is not None
        r = m.run(self.shared.quanta)
        if self.level != "none":
            events = m.take_events()
            if events:
                self.shared.hub.submit(self.case_id, self.shared.clock.now(), events, self.sinks)
        return r

    def _set_waiting_state(self) -> None:
        m = self.machine
        assert m is not None
        if m.pending_effects:
            self.state = CaseState.WAITING_EFFECT
        elif self.signals or not m.armed_timers:
            self.state = CaseState.WAITING_SIGNAL
        else:
            self.state = CaseState.WAITING_TIMER

    # -- the mailbox ------------------------------------------------------------------------------------

    def post(self, msg: Message) -> None:
        """Queue a message and wake the actor (never waits; external senders use `send`)."""
        self.inbox.append(msg)
        if self.parked:
            self.parked = False
            self.shared.busy += 1
            assert self.wake is not None
            self.wake.set()

    async def send(self, msg: Signal | RegionOp) -> None:
        """Queue an external message, waiting while the mailbox holds `mailbox_size` of them."""
        limit = self.shared.mailbox_size
        while self.external >= limit and not self.state.ended:
            event = anyio.Event()
            if self.space is None:
                self.space = []
            self.space.append(event)
            await event.wait()
        if self.state.ended:
            raise self.ended_error(msg.what)
        self.external += 1
        self.post(msg)

    def _drain(self) -> None:
        apply = self._apply
        while self.inbox:  # messages posted while applying (none today) are taken in the same drain
            batch, self.inbox = self.inbox, []
            for i, msg in enumerate(batch):
                try:
                    apply(msg)
                except Exception:
                    self.inbox[:0] = batch[i + 1 :]  # not applied: _finish answers their senders
                    raise
        self.external = 0
        if self.space:
            waiting, self.space = self.space, None
            for event in waiting:
                event.set()

    def _apply(self, msg: Message) -> None:
        m = self.machine
        assert m is not None
        kind = type(msg)
        if kind is Signal:
            assert isinstance(msg, Signal)
            try:
                m.deliver_signal(msg.name, msg.payload)
            except SignalRejected as exc:  # the case ended while the signal was queued
                _log.info("signal discarded", case_id=self.case_id, signal=msg.name, reason=str(exc))
        elif kind is EffectDone:
            assert isinstance(msg, EffectDone)
            if self.scopes is not None:
                self.scopes.pop((False, msg.effect_id), None)
            try:
                m.complete_effect(msg.effect_id, msg.output, error=msg.error)
            except MachineStateError as exc:
                _log.error("effect result refused by the vm", case_id=self.case_id, error=str(exc))
        elif kind is TimerFired:
            assert isinstance(msg, TimerFired)
            if self.scopes is not None:
                self.scopes.pop((True, msg.timer_id), None)
            m.fire_timer(msg.timer_id)
        elif kind is Cancel:
            assert isinstance(msg, Cancel)
            if not m.ended:
                self.cancel_reason = msg.reason
                m.cancel(msg.reason, compensate=msg.compensate)
        else:
            assert isinstance(msg, RegionOp)
            self._region(m, msg)

    def _region(self, m: Machine, op: RegionOp) -> None:
        try:
            action = op.action
            if action is RegionAction.CANCEL:
                m.cancel_region(op.name)
            elif action is RegionAction.COMPLETE:
                m.complete_region(op.name)
            elif action is RegionAction.ADD_INSTANCES:
                assert op.items is not None
                m.add_instances(op.name, op.items)
            else:
                m.close_instances(op.name)
        except (WfsubError, TypeError) as exc:
            op.reply.error = exc
        except Exception as exc:  # a bug: the sender hears of it, and the actor fails the case
            op.reply.error = exc
            raise
        finally:
            op.reply.event.set()

    # -- effects and timers ---------------------------------------------------------------------------

    def _io(self, r: RunResult, tg: TaskGroup) -> None:
        scopes = self.scopes
        assert scopes is not None
        for eid in r.cancelled_effects:
            scope = scopes.pop((False, eid), None)
            if scope is not None:
                scope.cancel()
        for tid in r.cancelled_timers:
            scope = scopes.pop((True, tid), None)
            if scope is not None:
                scope.cancel()
        for req in r.effects:
            scope = scopes[(False, req.effect_id)] = anyio.CancelScope()
            self._starting(1)
            tg.start_soon(self._effect, req, scope)
        for timer in r.timers:
            scope = scopes[(True, timer.timer_id)] = anyio.CancelScope()
            self._starting(1)
            tg.start_soon(self._timer, timer.timer_id, timer.seconds, scope)

    def _retrying(self, req: EffectRequest, attempt: int, delay: float, exc: BaseException) -> None:
        """An effect attempt failed and will be retried: a trace event (level min) in the case's own sequence."""
        m = self.machine
        if m is None or self.level == "none":
            return
        detail = {"effect_id": req.effect_id, "name": req.name, "attempt": attempt, "delay": delay, "error": repr(exc)}
        m.note("effect_retry", req.path, detail)
        events = m.take_events()
        if events:
            self.shared.hub.submit(self.case_id, self.shared.clock.now(), events, self.sinks)

    def _starting(self, n: int) -> None:
        """Count tasks started but not yet running as busy: VirtualClock must not settle before a new effect
        or timer has run far enough to arm its clock timer (an event loop may run the settle check first)."""
        self.unstarted += n
        self.shared.busy += n

    async def _effect(self, req: EffectRequest, scope: anyio.CancelScope) -> None:
        self._starting(-1)
        running = self.running_effects
        running[req.effect_id] = req
        with scope:
            try:
                output = await call_effect(
                    req.fn,
                    req.ctx,
                    name=req.name,
                    path=req.path,
                    attempt_timeout=req.timeout,
                    retry=req.retry,
                    clock=self.shared.clock,
                    case_id=self.case_id,
                    on_retry=lambda attempt, delay, exc: self._retrying(req, attempt, delay, exc),
                )
            except PASS_THROUGH:
                raise
            except anyio.get_cancelled_exc_class():
                raise  # the runtime cancelled it (call_effect turned any other CancelledError into a failure)
            except BaseException as exc:  # the effect failed (after its retries): the case decides what follows
                self.post(EffectDone(req.effect_id, None, exc))
            else:
                self.post(EffectDone(req.effect_id, output, None))
            finally:
                running.pop(req.effect_id, None)

    async def _timer(self, timer_id: int, seconds: float, scope: anyio.CancelScope) -> None:
        self._starting(-1)
        with scope:
            await self.shared.clock.sleep(seconds)
            self.post(TimerFired(timer_id))

    async def _case_timer(self, seconds: float) -> None:
        self._starting(-1)
        await self.shared.clock.sleep(seconds)
        self.post(Cancel("timeout"))

    # -- ending -----------------------------------------------------------------------------------------

    def _end(self, r: RunResult) -> None:
        m = self.machine
        assert m is not None
        if r.status == "done":
            self.result = m.data
            self.state = CaseState.DONE
            self._finish()
        elif r.status == "failed":
            self.record = m.failure_record
            self._end_failed(r.error, r.error_path or "?", r.error_message or "the case failed")
        else:
            self._end_cancelled(self.cancel_reason or "the root thread was withdrawn")

    def _end_failed(self, cause: BaseException | None, path: str, message: str) -> None:
        if isinstance(cause, CaseFailed):  # a limit hit in the vm: keep its own cause, if any
            cause = cause.__cause__
        # Keep what a user needs (the exception, its type and message, a formatted traceback), not the frames:
        # a retained failure must not pin the failing step's locals for as long as the case is kept.
        self.traceback = "".join(tb.format_exception(cause)) if cause is not None else None
        _drop_frames(cause)
        self.cause = cause
        self.error_path = path
        self.error_message = message
        self.state = CaseState.FAILED
        _log.info("case failed", case_id=self.case_id, path=path, error=message)
        self._finish()

    def _end_cancelled(self, reason: str) -> None:
        self.cancel_reason = reason
        self.state = CaseState.CANCELLED
        self._finish()

    def _finish(self) -> None:
        m = self.machine
        if m is not None:
            self.steps = m.steps
            if self.level != "none":
                events = m.take_events()
                if events:
                    self.shared.hub.submit(self.case_id, self.shared.clock.now(), events, self.sinks)
        self.machine = None
        self.signals = ()
        self.ended_at = self.shared.clock.now()
        if self.tg is not None:
            self.tg.cancel_scope.cancel()
        for msg in self.inbox:  # region operations that will never run: answer them
            if type(msg) is RegionOp:
                msg.reply.error = self.ended_error(msg.what)
                msg.reply.event.set()
        self.inbox.clear()
        if self.space:
            for event in self.space:
                event.set()
            self.space = None

    # -- what the Substrate reads -----------------------------------------------------------------------

    def ended_error(self, action: str) -> SignalRejected:
        return SignalRejected.ended(self.case_id, action, self.state.value)

    def outcome(self) -> dict[str, Any]:
        """The final data, or raise the case's CaseFailed / CaseCancelled (a fresh exception per call)."""
        state = self.state
        if state is CaseState.DONE:
            assert self.result is not None
            return dict(self.result)  # each caller gets its own copy of the final data
        if state is CaseState.FAILED:
            failed = CaseFailed(self.case_id, self.error_path, self.error_message)
            failed.traceback = self.traceback
            failed.record = self.record
            raise failed from self.cause
        raise CaseCancelled(self.case_id, self.cancel_reason or "cancelled")

    def status(self) -> CaseStatus:
        m = self.machine
        if m is not None:
            steps, effects, timers, regions = m.steps, m.pending_effects, m.armed_timers, tuple(m.live_regions())
        else:
            steps, effects, timers, regions = self.steps, 0, 0, ()
        error = None
        if self.state is CaseState.FAILED:
            error = str(CaseFailed(self.case_id, self.error_path, self.error_message))
        return CaseStatus(
            case_id=self.case_id,
            state=self.state,
            steps=steps,
            signals=self.signals,
            effects_pending=effects,
            timers_armed=timers,
            regions=regions,
            wakeups=self.wakeups,
            started_at=self.started_at,
            ended_at=self.ended_at,
            error=error,
            cancel_reason=self.cancel_reason if self.state is CaseState.CANCELLED else None,
        )


def _drop_frames(exc: BaseException | None) -> None:
    """Clear the tracebacks of an exception, its causes, contexts and group members (iteratively)."""
    seen: set[int] = set()
    todo = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        e.__traceback__ = None
        todo.extend((e.__cause__, e.__context__))
        if isinstance(e, BaseExceptionGroup):
            todo.extend(e.exceptions)

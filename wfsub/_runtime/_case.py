"""The case actor: one long-lived coroutine per case that drives its Machine.

The actor runs vm bursts of `quanta` steps and yields to the event loop between bursts. Before every burst it
takes its mailbox: after one wake-up it takes every message that is waiting, so a burst of 100 signals costs
one wake-up and one burst, not 100. When the vm is blocked, the actor parks on the mailbox.

The mailbox is a list (swapped out whole on each drain) plus an `anyio.Event` created only while the actor is
parked, not an anyio memory object stream: a case that finishes in its first burst (the common short case)
allocates no mailbox machinery at all, an idle case holds one Event (`bench/runtime_bench.py` measures what an
idle case costs), and the kinds of message get different treatment without several streams. Inputs from
outside the case (signals, cancels, region operations) are bounded by `mailbox_size`: a sender waits while that
many are queued (backpressure). Messages the case generates itself (effect results, timer firings) are never
refused: they are bounded by the work the case itself started.

A durable case (one with a `CaseJournal`) journals every input before applying it, committed, then applied at
the step its record names; that part of the actor is `_case_journal.py` (appending and committing inputs, the
case row when it parks, eviction, the `end` record).

The actor enters its own task group only when the vm first asks for an effect or a timer (or the case has a
deadline). Effects and timers run there, each under its own cancel scope (`_case_io.py`), so withdrawing one
cancels it at once; when the case ends the whole group is cancelled, and the actor returns only after every
effect and timer has finished, so an ended case leaves nothing running.

Supervision: an exception escaping a step fails the case in the vm; any other exception in the actor (a bug,
or a broken vm invariant) ends this case as failed and is logged. Cancellation is never caught: at shutdown it
unwinds the actor. A memory-only case then ends cancelled ("substrate closed"); a durable one stays live in
the store, and its in-memory awaiters get SubstrateClosed.
"""

from __future__ import annotations

import traceback as tb
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio
import anyio.lowlevel
from anyio.abc import TaskGroup

from .._errors import (
    CaseCancelled,
    CaseFailed,
    MachineStateError,
    SignalRejected,
    StoreConflict,
    StoreError,
    SubstrateClosed,
    WfsubError,
    error_name,
)
from .._loops import Wake, wake_event
from .._trace import TraceSink, get_logger
from ._answers import Updates, with_taken
from ._answers import at_end as updates_at_end
from ._answers import dispatch as dispatch_answers
from ._answers import moved as updates_moved
from ._case_io import case_timer, restart, start_io
from ._case_journal import close_live, durable_burst, evict_now, parked_in_store, write_end
from ._clock import Clock
from ._control import CaseEvicted, Fenced
from ._durable import CaseJournal
from ._heartbeat import Beats, BeatWriter
from ._hub import TraceHub
from ._inputs import kind_of
from ._journal import copy_data
from ._mailbox import Cancel, EffectDone, External, Message, RegionAction, RegionOp, Signal, TimerFired
from ._refusals import durable_fields
from ._request_ids import RequestKinds, remember, taken
from ._status import FINAL, CaseState, CaseStatus, EffectStatus, Failure, Heartbeat, TimerStatus

if TYPE_CHECKING:
    from .._vm import EffectRequest, Machine, RunResult, TimerRequest
    from ._children import Steering
    from ._nodes import Lease

_log = get_logger("wfsub.runtime")

_ENDED = frozenset({"done", "failed", "cancelled"})


# The states as module constants: reading an enum member off its class costs ~90 ns, and the actor sets and
# tests them on every burst.
_RUNNING = CaseState.RUNNING
_DONE = CaseState.DONE
_FAILED = CaseState.FAILED
_CANCELLED = CaseState.CANCELLED
_WAITING_EFFECT = CaseState.WAITING_EFFECT
_WAITING_SIGNAL = CaseState.WAITING_SIGNAL
_WAITING_TIMER = CaseState.WAITING_TIMER


@dataclass(slots=True)
class Shared:
    """What every case actor of one Substrate shares, built with the hooks of its mode (see `_ownership`): without
    a store, or as a standby, the hooks that only a store's owner needs are `_ownership`'s explicit no-ops."""

    clock: Clock
    hub: TraceHub
    quanta: int
    mailbox_size: int
    on_end: Callable[[CaseActor], None]
    redact: Callable[[Any], Any]  # over what people read: logs, status, the case row
    start_soon: Callable[[Callable[[], Coroutine[Any, Any, None]]], object]  # a task beside the cases
    steering: Steering  # `start_case` and `signal_case` act on other cases through it
    on_park: Callable[[CaseActor], None]  # durable: the case parked (eviction may drop it later)
    on_evict: Callable[[CaseActor], None]  # durable: the case left memory (it stays in the store)
    on_effect_wait: Callable[[CaseActor], None]  # durable: the case waits for effects only
    max_payload_bytes: int | None  # durable: the largest JSON payload an input may carry
    lease: Lease | None  # durable: the node's Lease (wait() returns at once while this node may write)
    compact_after: int | None  # durable: compact a live case's journal at this many records (`_compact`)
    busy: int = 0  # actors running or with messages waiting (VirtualClock settles on 0)
    updates: dict[str, Updates] = field(default_factory=dict)  # live cases' update answers and callers (`_answers`)


def moved_away(store: str, case_id: str) -> StoreConflict:
    """What an input gets when its case left this node before applying it (another node owns the case now)."""
    return StoreConflict(
        store, f"case {case_id!r} left this node before this input was applied: another node owns it now "
        "(fencing). Nothing was recorded; send the input again (with the same request_id) and it goes to the owner"
    )


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
    wake: Wake | None = None
    space: list[anyio.Event] | None = None  # senders waiting for room in the mailbox
    tg: TaskGroup | None = None
    scopes: dict[tuple[bool, int], anyio.CancelScope] | None = None  # (is_timer, id) -> its cancel scope
    running_effects: dict[int, EffectRequest] = field(default_factory=dict)  # effect id -> request, while it runs
    attempts: dict[int, tuple[int, float | None]] = field(default_factory=dict)  # effect id -> (attempt, started at)
    retry_at: dict[int, float] = field(default_factory=dict)  # effect id -> when its next attempt starts (backoff)
    armed: dict[int, tuple[str, float]] = field(default_factory=dict)  # timer id -> (path, due)
    requested: dict[int, tuple[str, str]] = field(default_factory=dict)  # effect id -> (path, name), until answered
    beats: dict[int, Beats] = field(default_factory=dict)  # effect id -> its heartbeats, while it runs
    kept_beats: dict[str, Any] = field(default_factory=dict)  # recovered: the heartbeats the case row kept
    beat_writer: BeatWriter | None = None  # durable: the throttle of its heartbeat writes
    workflow: str | None = None  # the registered name the case started from
    final_data: dict[str, Any] | None = None  # the data when the case ended (any outcome)
    unstarted: int = 0  # effect and timer tasks started that have not run yet (see _starting)
    journal: CaseJournal | None = None  # durable cases only
    resume: tuple[list[EffectRequest], list[tuple[TimerRequest, float]]] | None = None  # recovered: restart these
    deadline: float | None = None  # the case's timeout as an absolute time of the clock
    wakeups: int = 0
    steps: int = 0
    signals: tuple[str, ...] = ()
    cancel_reason: str | None = None
    region_cancelled: str | None = None  # the last region cancelled by an input (it may take the case with it)
    compensated: tuple[str, ...] = ()  # cancelled: the steps the cancel's compensations undid (its `end` keeps them)
    result: dict[str, Any] | None = None
    cause: BaseException | None = None
    traceback: str | None = None  # failed: the cause's traceback, formatted (the frames themselves are dropped)
    record: dict[str, Any] | None = None  # failed at a node: the error record (type, message, path, compensated, cause)
    error_path: str = ""
    error_message: str = ""
    ended_at: float | None = None
    closed: bool = False  # durable: the Substrate closed before the case ended (it stays live in the store)
    evicting: bool = False  # durable: asked to leave memory while it waits (see `evict`)
    order: int = 0  # the paging key of `cases()` (durable cases: the store's, kept in the journal)
    evicted: bool = False  # durable: it left memory, parked, and comes back on its next input or due timer
    fenced: bool = False  # durable: it left memory because the store refused its journal (another owner has it)
    # durable: inputs acknowledged through the inbox may wait for the case (it was loaded from the store, or this
    # Substrate put one there): an input this Substrate sends it reads them first (`InboxRouter.ahead`)
    inbox_ahead: bool = False
    stale: StoreConflict | None = None  # durable: another node took the case over (see `fence`)
    end_digest: str | None = None  # durable: the digest of the task outputs up to the end
    recorded: bool = False  # ended, and (durable) its `end` record written: its outcome can be handed out
    end_unwritten: bool = False  # durable: its `end` record failed with a store fault (the store still has it live)
    on_recorded: anyio.Event | None = None  # set when `recorded` becomes true (created by the first who waits)
    done: anyio.Event | None = None  # set once the actor has exited (created by the first awaiter)
    exited: bool = False
    tags: dict[str, str] | None = None  # given at the start (durable cases: from the `start` record)
    forked_from: str | None = None  # durable: the case this one was forked from
    updates: Updates | None = None  # callers waiting for update answers, and the latest answers (`_answers`)
    parent: str | None = None  # a child case (`start_case`): the id of the case that started it
    waited: str | None = None  # no store: a child its parent waits for, and on_parent_cancel ("cancel", "abandon")
    start: dict[str, Any] | None = None  # without a store: its start as `start_differs` compares it (workflow, data)
    own_ids: RequestKinds | None = None  # without a store: the request ids it took (see `request_ids`)

    # -- the actor coroutine ----------------------------------------------------------------------------

    async def run(self) -> None:
        try:  # one coroutine frame for the whole life of the case (an idle case pays for each frame)
            self.state = _RUNNING
            # The case starts before it takes any input, but a cancel already requested comes first: once
            # cancel() has returned, none of the case's work starts.
            inbox = self.inbox
            first = bool(inbox) and (self.resume is not None or any(type(msg) is Cancel for msg in inbox))
            r = self._burst(drain=first) if self.journal is None else await durable_burst(self, drain=first)
            if self.deadline is None and self.resume is None:
                pending = await self._drive(r, None)
                if pending is None:
                    return
                r = pending
            fenced: Fenced | None = None
            async with anyio.create_task_group() as tg:
                self.tg = tg
                self.scopes = {}
                if self.deadline is not None:
                    self.starting(1)
                    tg.start_soon(case_timer, self, self.deadline)
                if self.resume is not None:
                    restart(self, tg)
                try:
                    await self._drive(r, tg)
                except Fenced as exc:  # raised through the task group it would come out as an ExceptionGroup
                    fenced = exc
                tg.cancel_scope.cancel()  # whatever is left (timers, late effects) stops now
            if fenced is not None:
                raise fenced
        except Fenced as fenced:  # leave memory without writing anything more: the store's owner carries on
            self._left_fenced(fenced)
        except Exception as exc:  # a runtime or vm bug: it ends this case only
            await self._crashed(exc)
        finally:
            self._exit()

    def _left_fenced(self, fenced: Fenced) -> None:
        """The store refused the case's journal (another owner has it): it leaves memory, and the inputs it holds
        are answered with where they must go now."""
        _log.warning("case left memory: the store refused its journal", case_id=self.case_id,
                     error=str(fenced.__cause__))
        self.evicted = self.fenced = True
        self.left("fenced")
        self.shared.on_evict(self)
        cause = fenced.__cause__
        refused = moved_away(cause.store if isinstance(cause, StoreError) else "?", self.case_id)
        waiting = self.updates or self.shared.updates.get(self.case_id)
        if waiting is not None:  # its update callers read their answers from the row from now on
            updates_moved(waiting)
        for msg in self.inbox:  # inputs that came while the refused append was in flight: never applied
            self.answer(msg, refused)
        self.inbox.clear()
        self.took_mailbox()  # and senders waiting for mailbox space find the actor gone (send raises)

    async def _crashed(self, exc: Exception) -> None:
        """A runtime or vm bug ended the actor: the case is failed with it (and its end written, with a store)."""
        while isinstance(exc, ExceptionGroup) and len(exc.exceptions) == 1:  # raised inside the task group
            exc = exc.exceptions[0]
        _log.exception("case actor crashed; the case is failed", case_id=self.case_id)
        if self.state not in FINAL:
            message = f"internal error in the case actor: {type(exc).__name__}: {exc}"
            self._end_failed(exc, "case actor", message)
            try:
                await write_end(self)
            except Fenced as fenced:  # another owner has the case: it ends it
                _log.warning("case end not recorded: the store refused its journal", case_id=self.case_id,
                             error=str(fenced.__cause__))

    def _exit(self) -> None:
        """The actor's last step, however it ended: its awaiters are released only now, when the case's effects
        and timers have all stopped."""
        if self.evicted:
            self.machine = None
        elif self.state not in FINAL:  # unwinding on cancellation: the Substrate is closing
            if self.journal is not None:
                close_live(self)
            else:
                self._end_cancelled("substrate closed")
        if not self.parked:
            self.shared.busy -= 1
        if self.unstarted:
            self.starting(-self.unstarted)  # tasks cancelled before they ever ran
        self.parked = False
        if self.sinks:
            self.shared.hub.release(self.sinks)
        self.exited = True
        if self.done is not None:
            self.done.set()
        self.shared.on_end(self)

    async def _drive(self, r: RunResult, tg: TaskGroup | None) -> RunResult | None:
        """Run bursts until the case ends (None) or, without a task group, until one is needed (the result)."""
        checkpoint = anyio.lowlevel.checkpoint
        hub = self.shared.hub
        durable = self.journal is not None
        while True:
            if hub.backlogged:  # tracing backpressure: let the hub catch up rather than drop events
                await hub.caught_up()
            status = r.status
            if status in _ENDED:
                self._end(r)
                if durable:
                    await write_end(self)
                return None
            if tg is None:
                if r.effects or r.timers:
                    return r
            elif r.effects or r.timers or r.cancelled_effects or r.cancelled_timers:
                start_io(self, r, tg)
            if status == "yielded":
                await checkpoint()
            elif not self.inbox:  # park on the mailbox (inlined: one coroutine frame less per idle case)
                self.signals = r.signals
                self._set_waiting_state()
                if durable:
                    parked_in_store(self)
                self.wake = wake = wake_event()
                self.parked = True
                self.shared.busy -= 1
                await wake.wait()  # post() clears `parked` and counts us busy again
                self.wake = None
                if self.stale is not None:
                    raise Fenced(self.stale) from self.stale
                if self.evicting and not self.inbox and await evict_now(self):
                    return None
                self.wakeups += 1
                self.state = _RUNNING
            r = self._burst() if not durable else await durable_burst(self)

    def _burst(self, drain: bool = True) -> RunResult:
        if drain and self.inbox:
            self._drain()
        return self.vm_burst()

    def vm_burst(self) -> RunResult:
        m = self.machine
        assert m is not None
        j = self.journal  # the time its timers are due from (`_case_io.start_io`): of the last record applied
        r = m.run(self.shared.quanta, time=j.time if j is not None else self.shared.clock.now())
        if self.level != "none":
            events = m.take_events()
            if events:
                self.shared.hub.submit(self.case_id, self.shared.clock.now(), events, self.sinks)
        answers = m.take_answers()
        if answers:
            dispatch_answers(self, answers)
        return r

    def _set_waiting_state(self) -> None:
        m = self.machine
        assert m is not None
        if m.pending_effects:
            self.state = _WAITING_EFFECT
        elif self.signals or not m.armed_timers:
            self.state = _WAITING_SIGNAL
        else:
            self.state = _WAITING_TIMER

    # -- the mailbox ------------------------------------------------------------------------------------

    def post(self, msg: Message) -> None:
        """Queue a message and wake the actor (never waits; external senders use `send`)."""
        self.inbox.append(msg)
        if self.parked:
            self.parked = False
            self.shared.busy += 1
            assert self.wake is not None
            self.wake.set()

    def evict(self) -> None:
        """Ask a parked durable case to leave memory (it checks again, then writes what a reload needs)."""
        if self.parked and self.wake is not None:
            self.evicting = True
            self.parked = False
            self.shared.busy += 1
            self.wake.set()

    def fence(self, cause: StoreConflict) -> None:
        """Another node took the case over while this node could not tell (paused, cut off from the store):
        leave memory without writing anything more, before the next write or effect attempt (a parked case
        wakes to leave now). `cause` is what inputs that reach it meanwhile are answered with."""
        self.stale = cause
        self.fenced = True
        if self.parked and self.wake is not None:
            self.parked = False
            self.shared.busy += 1
            self.wake.set()

    def left(self, why: str) -> None:
        """Tell the sinks the case left memory (a sink that keeps state per case, OTelSink's open span, lets it go;
        `case_resumed` follows if the case comes back)."""
        m = self.machine
        if m is None or self.level == "none":
            return
        m.note("case_left", m.program.root_path, {"why": why})
        events = m.take_events()
        if events:
            self.shared.hub.submit(self.case_id, self.shared.clock.now(), events, self.sinks)

    async def send(self, msg: External) -> None:
        """Queue an external message, waiting while the mailbox holds `mailbox_size` of them."""
        if self.evicted:
            raise CaseEvicted(self.case_id)
        limit = self.shared.mailbox_size
        while self.external >= limit and self.state not in FINAL:
            event = anyio.Event()
            if self.space is None:
                self.space = []
            self.space.append(event)
            await event.wait()
        if self.evicted:  # it left memory while we waited for space
            raise CaseEvicted(self.case_id)
        if self.state in FINAL:
            raise self.ended_error(msg.what)
        if self.closed:
            raise SubstrateClosed(msg.what)
        self.external += 1
        self.post(msg)

    def took_mailbox(self) -> None:
        self.external = 0
        if self.space:
            waiting, self.space = self.space, None
            for event in waiting:
                event.set()

    def _drain(self) -> None:
        apply = self.apply
        while self.inbox:  # messages posted while applying (none today) are taken in the same drain
            batch, self.inbox = self.inbox, []
            for i, msg in enumerate(batch):
                try:
                    apply(msg)
                except Exception:
                    self.inbox[:0] = batch[i + 1 :]  # not applied: _finish answers their senders
                    raise
        self.external = 0  # (_took_mailbox, inlined: once per drain)
        if self.space:
            self.took_mailbox()

    def apply(self, msg: Message) -> None:
        m = self.machine
        assert m is not None
        kind = type(msg)
        if kind is Signal:
            assert isinstance(msg, Signal)
            if msg.request_id is not None and self._repeated(msg):
                return
            try:
                if msg.update:
                    assert msg.request_id is not None
                    m.deliver_update(msg.name, msg.payload, msg.request_id, checked=True)
                else:
                    m.deliver_signal(msg.name, msg.payload, checked=True)  # checked at its door (`_inputs`)
            except SignalRejected as exc:  # the case ended while the signal was queued
                _log.info("signal discarded", case_id=self.case_id, signal=msg.name, reason=str(exc))
                if msg.reply is not None:
                    msg.reply.answer(exc)
                return
            self._took(msg)
            if msg.reply is not None:
                msg.reply.answer()
        elif kind is EffectDone:
            assert isinstance(msg, EffectDone)
            if self.scopes is not None:
                self.scopes.pop((False, msg.effect_id), None)
            self.requested.pop(msg.effect_id, None)
            try:
                m.complete_effect(msg.effect_id, msg.output, error=msg.error)
            except MachineStateError as exc:
                _log.error("effect result refused by the vm", case_id=self.case_id, error=str(exc))
        elif kind is TimerFired:
            assert isinstance(msg, TimerFired)
            if self.scopes is not None:
                self.scopes.pop((True, msg.timer_id), None)
            self.armed.pop(msg.timer_id, None)
            m.fire_timer(msg.timer_id)
        elif kind is Cancel:
            assert isinstance(msg, Cancel)
            if msg.request_id is not None and self._repeated(msg):
                return
            if not m.ended:
                self.cancel_reason = msg.reason
                m.cancel(msg.reason, compensate=msg.compensate)
            self._took(msg)
            if msg.reply is not None:
                msg.reply.answer()
        else:
            assert isinstance(msg, RegionOp)
            if msg.request_id is not None and self._repeated(msg):
                return
            self._region(m, msg)

    # -- request ids ------------------------------------------------------------------------------------

    @property
    def request_ids(self) -> RequestKinds:
        """The request ids of the inputs the case took, with their kinds (see `_request_ids`): its journal's for a
        durable case, else its own, filled as it applies inputs."""
        if self.journal is not None:
            return self.journal.request_ids
        if self.own_ids is None:
            self.own_ids = {}
        return self.own_ids

    def retried(self, request_id: str | None, kind: str, what: str) -> bool:
        """Whether a call with `request_id` repeats an input of `kind` the case took (it is not applied again);
        SignalRejected when an input of another kind took the id."""
        return request_id is not None and taken(self.request_ids, request_id, kind, self.case_id, what)

    def _repeated(self, msg: External) -> bool:
        """Without a store: whether an input taken from the mailbox repeats one the case took (two calls with one
        request id sent before either was applied): answered as that one was, not applied again. One whose id an
        input of another kind took is refused (its sender hears why, if it waits). A durable case's journal took
        its repeats out before they reached here (`_case_journal.journal_inbox`)."""
        if self.journal is not None:
            return False
        try:
            if not self.retried(msg.request_id, kind_of(msg), msg.what):
                return False
            self.answer(msg, None)
        except SignalRejected as exc:
            _log.info("input refused", case_id=self.case_id, reason=str(exc))
            self.answer(msg, exc)
        return True

    def _took(self, msg: External) -> None:
        """Without a store: keep the request id of an input the case applied (a refused one leaves its id free)."""
        if self.journal is None and msg.request_id is not None:
            remember(self.request_ids, msg.request_id, kind_of(msg))

    def _region(self, m: Machine, op: RegionOp) -> None:
        error: BaseException | None = None
        try:
            action = op.action
            if action is RegionAction.CANCEL:
                m.cancel_region(op.name)
                self.region_cancelled = op.name
            elif action is RegionAction.COMPLETE:
                m.complete_region(op.name)
            elif action is RegionAction.ADD_INSTANCES:
                assert op.items is not None
                m.add_instances(op.name, op.items)
            else:
                m.close_instances(op.name)
        except (WfsubError, TypeError) as exc:
            error = exc
        except Exception as exc:  # a bug: the sender hears of it, and the actor fails the case
            error = exc
            raise
        finally:
            if error is None:
                self._took(op)
            if op.reply is not None:
                op.reply.answer(error)

    # -- journaling (durable cases) ---------------------------------------------------------------------

    def answer(self, msg: Message, error: BaseException | None) -> None:
        reply = getattr(msg, "reply", None)
        if reply is not None:
            reply.answer(error)

    # -- effects and timers ---------------------------------------------------------------------------

    def starting(self, n: int) -> None:
        """Count tasks started but not yet running as busy: VirtualClock must not settle before a new effect
        or timer has run far enough to arm its clock timer (an event loop may run the settle check first)."""
        self.unstarted += n
        self.shared.busy += n

    # -- ending -----------------------------------------------------------------------------------------

    def _end(self, r: RunResult) -> None:
        m = self.machine
        assert m is not None
        if r.status == "done":
            self.result = m.data
            self.state = _DONE
            self._finish()
        elif r.status == "failed":
            self.record = m.failure_record
            self._end_failed(r.error, r.error_path or "?", r.error_message or "the case failed")
        else:
            self._end_cancelled(self.cancel_reason or withdrawn_reason(m, self.region_cancelled))

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
        self.state = _FAILED
        _log.info("case failed", case_id=self.case_id, path=path, error=self.shared.redact(message))
        self._finish()

    def _end_cancelled(self, reason: str) -> None:
        self.cancel_reason = reason
        self.state = _CANCELLED
        self._finish()

    def _finish(self) -> None:
        m = self.machine
        if m is not None:
            self.steps = m.steps
            self.final_data = m.data
            self.compensated = m.compensated
            if self.journal is not None:
                self.end_digest, _ = m.take_digest()  # the tasks run since the last input: `end` carries them
            if self.level != "none":
                events = m.take_events()
                if events:
                    self.shared.hub.submit(self.case_id, self.shared.clock.now(), events, self.sinks)
            answers = m.take_answers()
            if answers:
                dispatch_answers(self, answers)
        if self.updates is not None:
            updates_at_end(self)
        self.machine = None
        self.signals = ()
        if self.armed:
            self.armed.clear()
        if self.requested:
            self.requested.clear()
        self.ended_at = self.shared.clock.now()
        if self.journal is None:
            self.recorded = True  # (_recorded, inlined: once per case)
            if self.on_recorded is not None:
                self.on_recorded.set()
        if self.tg is not None:
            self.tg.cancel_scope.cancel()
        for msg in self.inbox:  # inputs that will never be applied: answer their senders
            self.answer(msg, self.ended_error(getattr(msg, "what", "apply an input")))
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
        if state is _DONE:
            assert self.result is not None
            return copy_data(self.result)  # each caller gets its own copy: nothing shared with the case
        if state is _FAILED:
            failed = CaseFailed(self.case_id, self.error_path, self.error_message)
            failed.traceback = self.traceback
            failed.record = self.record
            raise failed from self.cause
        if self.closed:
            raise SubstrateClosed(f"await case {self.case_id!r}: it stays live in the store; await it after re-opening")
        raise CaseCancelled(self.case_id, self.cancel_reason or "cancelled")

    def data(self) -> dict[str, Any]:
        """A copy of the case's data now (its final data once it has ended)."""
        m = self.machine
        return copy_data(m.data if m is not None else self.final_data or {})

    def status(self) -> CaseStatus:
        if self.state in FINAL and not self.recorded:
            # Ended in the vm, its `end` record not yet committed: shown as running until it is, as `done()` and
            # `await_case` do, so an ended state is never shown that a crash now would take back (and `delete`,
            # the journal and a Client agree with it).
            return self._status(_RUNNING, None)
        return self._status(self.state, self.ended_at)

    def _status(self, state: CaseState, ended_at: float | None) -> CaseStatus:
        m = self.machine
        at: tuple[str, ...] = ()
        if m is not None:
            steps, effects, timers, regions = m.steps, m.pending_effects, m.armed_timers, tuple(m.live_regions())
            at = tuple(m.threads_at())
        else:
            steps, effects, timers, regions = self.steps, 0, 0, ()
        error = failure = None
        if state is _FAILED:
            redact = self.shared.redact
            error = str(redact(str(CaseFailed(self.case_id, self.error_path, self.error_message))))
            failure = Failure(
                type=error_name(self.cause) if self.cause is not None else "StepFailed",
                message=str(redact(self.error_message)),
                path=self.error_path,
                traceback=redact(self.traceback),
                compensated=tuple((self.record or {}).get("compensated") or ()),
            )
        in_flight = tuple(
            EffectStatus(effect_id=eid, name=name, path=path, attempt=self.attempts.get(eid, (1, None))[0],
                         started_at=self.attempts.get(eid, (1, None))[1], retry_at=self.retry_at.get(eid),
                         last_heartbeat=_last_heartbeat(self, eid))
            for eid, (path, name) in sorted(self.requested.items())
        ) if self.requested else ()
        armed = tuple(
            TimerStatus(timer_id=tid, path=path, due=due) for tid, (path, due) in sorted(self.armed.items())
        ) if self.armed else ()
        return CaseStatus(
            case_id=self.case_id,
            state=state,
            steps=steps,
            signals=self.signals,
            effects_pending=effects,
            timers_armed=timers,
            regions=regions,
            wakeups=self.wakeups,
            started_at=self.started_at,
            ended_at=ended_at,
            error=error,
            cancel_reason=self.cancel_reason if state is _CANCELLED else None,
            workflow=self.workflow,
            parent=self.parent,
            at=at,
            effects=in_flight,
            timers=armed,
            failure=failure,
            order=(self.journal.order if self.journal is not None else self.order) or None,
            tags=dict(self.tags) if self.tags else {},
            forked_from=self.forked_from,
            **self._durable_fields(),
        )

    def _durable_fields(self) -> dict[str, Any]:
        found = {} if self.journal is None else durable_fields(self.journal)
        if self.updates is not None and self.updates.refused:  # inputs a check= refused as a wait took them
            found["refused"] = with_taken(found.get("refused", ()), self.updates.refused)
        return found


def _last_heartbeat(actor: CaseActor, eid: int) -> Heartbeat | None:
    beats = actor.beats.get(eid)
    if beats is None or beats.at is None:
        return None
    return Heartbeat(details=actor.shared.redact(beats.details), at=beats.at, attempt=beats.attempt)


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



def withdrawn_reason(m: Machine, region: str | None) -> str:
    """Why a case that nobody cancelled ended cancelled: every thread it had left was withdrawn with a region."""
    if region is None:
        return (
            "every thread it had left was withdrawn, so nothing was left to run: a region it was in was cancelled "
            "(a cancel_region step) or withdrawn (an mi whose join can no longer fire), and a region without "
            "on_cancel= takes its thread with it"
        )
    paths = " and ".join(m.program.region_paths.get(region, ()))
    if m.program.regions.get(region) == "mi":
        fix = "an mi takes its thread with it when cancelled; wrap it in scope(..., on_cancel=...) to go on after"
    else:
        fix = "a scope without on_cancel= takes its thread with it; give it on_cancel= to go on after"
    return (
        f"cancel_region({region!r}) ended it: region {region!r} (at {paths}) held every thread the case had left, "
        f"so they were withdrawn with it; {fix} a cancel, or cancel the whole case instead"
    )

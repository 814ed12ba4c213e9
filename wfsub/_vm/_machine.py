"""Machine: the execution state of one case and the `run(quanta)` hot loop.

The vm never awaits, never reads a clock and never draws a random number: signals, effect results, timer
firings, cancels and scheduler choices all come in through explicit methods, so a case is replayable from
the list of its inputs. Inputs only record; the next `run()` reports what follows from them (effects to
start, timers to arm, effects and timers to cancel).

The hot loop keeps the code, the current token, its instruction pointer and its data view in locals,
inlines TASK and JUMP, and dispatches every other opcode through a tuple of handlers indexed by opcode.
Two loops exist: `_run_fast` (level `none`, FIFO scheduler: nothing per step but the step) and
`_run_general` (tracing and/or a preemptive scheduler). The choice is made once per `run()`.
"""

from __future__ import annotations

import gc
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from types import MappingProxyType
from typing import Any, TypeVar

from .._compiler import (
    ALL,
    CallSpec,
    DeferSpec,
    EffectSpec,
    InterleaveSpec,
    LoopSpec,
    MISpec,
    NameSpec,
    Op,
    Program,
    ScopeSpec,
    SleepSpec,
    SplitSpec,
    WaitSpec,
    XorSpec,
)
from .._errors import CaseFailed, MachineStateError, SignalRejected
from .._terms import Retry
from .._trace._events import LEVELS, VmEvent
from ._records import (
    WK_EFFECT,
    WK_LOCK,
    WK_MILESTONE,
    WK_NONE,
    WK_SIGNAL,
    WK_TIMER,
    CallFrame,
    CriticalFrame,
    Fifo,
    Frame,
    InstanceFrame,
    InterleaveFrame,
    LoopFrame,
    MIFrame,
    MilestoneFrame,
    PassFrame,
    RootFrame,
    ScopeFrame,
    SplitFrame,
    Token,
    link,
    members,
    unlink,
)
from ._schedulers import Deterministic, Scheduler

_TASK = int(Op.TASK)
_JUMP = int(Op.JUMP)
_ARRIVE = int(Op.ARRIVE)

YIELDED = "yielded"
BLOCKED = "blocked"
DONE = "done"
CANCELLED = "cancelled"
FAILED = "failed"


@dataclass(slots=True)
class EffectRequest:
    """Start `fn(ctx)` for the runtime; report back with `complete_effect(effect_id, ...)`."""

    effect_id: int
    fn: Callable[..., Any]
    ctx: Mapping[str, Any]
    path: str
    name: str
    timeout: float | None
    retry: Retry | None


@dataclass(slots=True)
class TimerRequest:
    """Arm a timer; report back with `fire_timer(timer_id)` after `seconds`."""

    timer_id: int
    seconds: float
    path: str


_R = TypeVar("_R", EffectRequest, TimerRequest)
_EFFECT_ID: Callable[[EffectRequest], int] = attrgetter("effect_id")
_TIMER_ID: Callable[[TimerRequest], int] = attrgetter("timer_id")


@dataclass(slots=True)
class RunResult:
    """What one `run()` did and what the driver must do next."""

    status: str
    steps: int
    effects: list[EffectRequest] = field(default_factory=list)
    timers: list[TimerRequest] = field(default_factory=list)
    cancelled_effects: list[int] = field(default_factory=list)
    cancelled_timers: list[int] = field(default_factory=list)
    signals: tuple[str, ...] = ()
    error: BaseException | None = None
    error_path: str | None = None
    error_message: str | None = None


class Machine:
    """The execution state of one case of a Program."""

    __slots__ = (
        "_level_name",
        "buffered",
        "code",
        "data",
        "effects",
        "ended",
        "error",
        "error_message",
        "error_path",
        "event_seq",
        "events",
        "lock_waiters",
        "locks",
        "ms_active",
        "ms_waiters",
        "next_eid",
        "next_tid",
        "next_timer",
        "next_wid",
        "out_cancel_effects",
        "out_cancel_timers",
        "out_effects",
        "out_timers",
        "paths",
        "program",
        "ready",
        "regions",
        "root",
        "root_ended",
        "root_env",
        "scheduler",
        "signal_seq",
        "status",
        "steps",
        "timers",
        "tl",
        "waiters",
    )

    def __init__(
        self,
        program: Program,
        data: Mapping[str, Any] | None = None,
        *,
        scheduler: Scheduler | None = None,
        trace_level: str = "none",
    ) -> None:
        if data is not None and not isinstance(data, Mapping):
            raise TypeError(f"case data must be a mapping (a dict of str keys), got {type(data).__name__}")
        self._attach(program)
        self.data: dict[str, Any] = dict(data or {})
        self.root_env: Mapping[str, Any] = MappingProxyType(self.data)
        self.scheduler: Scheduler = scheduler if scheduler is not None else Deterministic()
        self.trace_level = trace_level
        self.status = "initial"
        self.ended = False
        self.root_ended = False
        self.steps = 0
        self.error: BaseException | None = None
        self.error_path: str | None = None
        self.error_message: str | None = None
        self.next_tid = 1
        self.next_eid = 1
        self.next_timer = 1
        self.next_wid = 1
        self.signal_seq = 0
        self.event_seq = 0
        self.events: list[VmEvent] = []
        self.ready: deque[Token] = deque()
        self.root = RootFrame(None, self.root_env, 0)
        self.effects: dict[int, Token] = {}
        self.timers: dict[int, Token] = {}
        self.waiters: dict[str, Fifo] = {}  # of (token, wait id)
        self.buffered: dict[str, Fifo] = {}  # of (arrival seq, payload)
        self.regions: dict[str, dict[Frame, None]] = {}
        self.locks: dict[str, CriticalFrame | None] = {}
        self.lock_waiters: dict[str, Fifo] = {}
        self.ms_active: dict[str, int] = {}
        self.ms_waiters: dict[str, Fifo] = {}
        self.out_effects: list[EffectRequest] = []
        self.out_timers: list[TimerRequest] = []
        self.out_cancel_effects: list[int] = []
        self.out_cancel_timers: list[int] = []
        self.spawn(self.root, 0, self.root_env)

    def _attach(self, program: Program) -> None:
        self.program = program
        self.code = program.code
        self.paths = program.paths

    # -- public surface ----------------------------------------------------------------------------

    @property
    def trace_level(self) -> str:
        return self._level_name

    @trace_level.setter
    def trace_level(self, level: str) -> None:
        if level not in LEVELS:
            raise ValueError(f"trace level must be one of {', '.join(LEVELS)}, got {level!r}")
        self._level_name = level
        self.tl = LEVELS[level]

    @property
    def pending_effects(self) -> int:
        return len(self.effects)

    @property
    def armed_timers(self) -> int:
        return len(self.timers)

    def live_regions(self) -> list[str]:
        return [name for name, acts in self.regions.items() if acts]

    def awaited_signals(self) -> tuple[str, ...]:
        names = []
        for name, queue in self.waiters.items():
            while queue:
                tok, wid = queue.peek()
                if tok.alive and tok.wk == WK_SIGNAL and tok.wid == wid:
                    names.append(name)
                    break
                queue.popleft()
        return tuple(names)

    def take_events(self) -> list[VmEvent]:
        events, self.events = self.events, []
        return events

    def run(self, quanta: int = 1000) -> RunResult:
        """Run up to `quanta` steps; report the outcome and what the driver must start or stop."""
        if not self.ended:
            if self.status == "initial":
                self.status = YIELDED
                self._case_event("case_started")
            if self.tl == 0 and not self.scheduler.preemptive:
                steps = self._run_fast(quanta)
            else:
                steps = self._run_general(quanta)
            self.steps += steps
        else:
            steps = 0
        signals: tuple[str, ...] = ()
        if not self.ended:
            self.status = YIELDED if self.ready else BLOCKED
            if self.status == BLOCKED:
                signals = self.awaited_signals()
                if not signals and not self.effects and not self.timers:
                    self._deadlocked()
        result = RunResult(self.status, steps)
        # Hand over the lists that hold something; the machine keeps its empty ones. A request withdrawn in
        # the burst that made it is neither started nor cancelled: the driver never hears of it.
        if self.out_effects:
            made, self.out_effects = self.out_effects, []
            cancels = self.out_cancel_effects
            result.effects, self.out_cancel_effects = _still_live(made, cancels, self.effects, _EFFECT_ID)
        if self.out_timers:
            armed, self.out_timers = self.out_timers, []
            cancels = self.out_cancel_timers
            result.timers, self.out_cancel_timers = _still_live(armed, cancels, self.timers, _TIMER_ID)
        if self.out_cancel_effects:
            result.cancelled_effects, self.out_cancel_effects = self.out_cancel_effects, []
        if self.out_cancel_timers:
            result.cancelled_timers, self.out_cancel_timers = self.out_cancel_timers, []
        if self.status == BLOCKED:
            result.signals = signals
        elif self.status == FAILED:
            result.error, result.error_path, result.error_message = self.error, self.error_path, self.error_message
        return result

    def _deadlocked(self) -> None:
        """Blocked with no effect, timer or signal to wait for: nothing can ever wake the case. Fail it.

        Only threads waiting for a critical section or a milestone remain, and what would release them is
        gone (a milestone whose branch was withdrawn, a section held by a thread that waits for the first).
        """
        waiting = []
        for what, queues in (("critical section", self.lock_waiters), ("milestone", self.ms_waiters)):
            for name, queue in queues.items():
                for entry in queue.items[queue.head :]:
                    tok, wid = entry
                    if tok.alive and tok.wid == wid and tok.wk in (WK_LOCK, WK_MILESTONE):
                        waiting.append((tok.ip, f"{what} {name!r} at {self.paths[tok.ip]}"))
        ip = waiting[0][0] if waiting else 0
        described = "; ".join(sorted({w for _, w in waiting})) or "nothing"
        self.limit_hit(
            ip,
            f"deadlock: no effect, timer or signal is pending and the remaining threads wait for {described}, "
            "which nothing left in the case can release",
        )

    # -- the hot loops -----------------------------------------------------------------------------

    def _run_fast(self, quanta: int) -> int:
        code = self.code
        handlers = _HANDLERS
        ready = self.ready
        popleft = ready.popleft
        root_env = self.root_env
        steps = 0
        tok: Token | None = None
        ip = 0
        env: Any = None
        while steps < quanta:
            if tok is None:
                if not ready:
                    break
                tok = popleft()
                if not tok.alive:
                    tok = None
                    continue
                ip = tok.ip
                env = tok.env
            op, arg = code[ip]
            steps += 1
            if op == _TASK:
                try:
                    res = arg(env)
                except Exception as exc:
                    tok.ip = ip
                    self.step_failed(ip, exc, f"task {self.program.labels[ip]} raised {type(exc).__name__}: {exc}")
                    tok = None
                    break
                if res is not None:
                    if env is root_env and type(res) is dict:
                        self.data.update(res)
                    elif not self.merge(tok, res, ip):
                        tok = None
                        break
                ip += 1
            elif op == _JUMP:
                ip = arg
            else:
                if op == _ARRIVE:
                    nip = tok.frame.arrive(self, tok)
                else:
                    nip = handlers[op](self, tok, ip, arg)
                if nip < 0:
                    tok = None
                    if self.ended:
                        break
                else:
                    ip = nip
                    env = tok.env
        if tok is not None:
            tok.ip = ip
            ready.appendleft(tok)
        return steps

    def _run_general(self, quanta: int) -> int:
        code = self.code
        handlers = _HANDLERS
        ready = self.ready
        sched = self.scheduler
        preemptive = sched.preemptive
        full = self.tl >= 2
        traced = self.tl >= 1
        paths = self.paths
        labels = self.program.labels
        root_env = self.root_env
        events = self.events
        steps = 0
        tok: Token | None = None
        ip = 0
        env: Any = None
        while steps < quanta:
            if tok is None:
                if not ready:
                    break
                if preemptive and len(ready) > 1:
                    choice = sched.pick(len(ready))
                    ready.rotate(-choice)
                    tok = ready.popleft()
                    ready.rotate(choice)
                    if full:
                        self.emit("schedule", paths[tok.ip], {"token": tok.tid, "choice": choice})
                else:
                    tok = ready.popleft()
                if not tok.alive:
                    tok = None
                    continue
                ip = tok.ip
                env = tok.env
            op, arg = code[ip]
            steps += 1
            if full:
                self.emit("step", paths[ip], {"token": tok.tid, "ip": ip, "op": Op(op).name})
            if op == _TASK:
                try:
                    res = arg(env)
                except Exception as exc:
                    tok.ip = ip
                    self.step_failed(ip, exc, f"task {labels[ip]} raised {type(exc).__name__}: {exc}")
                    tok = None
                    break
                if res is not None:
                    if env is root_env and type(res) is dict:
                        self.data.update(res)
                    elif not self.merge(tok, res, ip):
                        tok = None
                        break
                if traced:
                    self.event_seq += 1
                    events.append(VmEvent((self.event_seq, "task", paths[ip], {"name": labels[ip], "token": tok.tid})))
                ip += 1
            elif op == _JUMP:
                ip = arg
            else:
                nip = handlers[op](self, tok, ip, arg)
                if nip < 0:
                    tok = None
                    if self.ended:
                        break
                    continue
                ip = nip
                env = tok.env
            if preemptive:
                tok.ip = ip
                ready.append(tok)
                tok = None
        if tok is not None:
            tok.ip = ip
            ready.appendleft(tok)
        return steps

    # -- shared machinery ----------------------------------------------------------------------------

    def emit(self, kind: str, path: str, detail: dict[str, Any]) -> None:
        self.event_seq += 1
        self.events.append(VmEvent((self.event_seq, kind, path, detail)))

    def _case_event(self, kind: str, **detail: Any) -> None:
        if self.tl:
            self.emit(kind, self.program.term.kind, detail)

    def trace_node(self, kind: str, ip: int, **detail: Any) -> None:
        if self.tl:
            self.emit(kind, self.paths[ip], detail)

    def spawn(self, frame: Frame | None, ip: int, env: Mapping[str, Any]) -> Token:
        assert frame is not None
        tok = Token(self.next_tid, ip, frame, env)
        self.next_tid += 1
        link(frame, tok)
        self.ready.append(tok)
        return tok

    def move(self, tok: Token, frame: Frame) -> None:
        unlink(tok.frame, tok)
        link(frame, tok)
        tok.frame = frame

    def leave(self, tok: Token, frame: PassFrame, target: int) -> int:
        """The token leaves a pass-through frame normally and continues at `target`."""
        parent = frame.parent
        assert parent is not None
        unlink(frame, tok)
        link(parent, tok)
        tok.frame = parent
        frame.exited = True
        if frame.count == 0:
            self.close(frame, withdrawn=False)
        return target

    def close(self, frame: Frame, *, withdrawn: bool) -> None:
        """A frame has no children left: release it and tell its parent."""
        frame.alive = False
        frame.on_close(self)
        parent = frame.parent
        assert parent is not None
        unlink(parent, frame)
        if withdrawn:
            self.trace_node("withdrawn", frame.ip)
        parent.child_gone(self, frame, withdrawn)

    def detach(self, frame: Frame, *, withdrawn: bool) -> None:
        """Unlink a frame already killed by `kill_subtree` and tell its parent."""
        parent = frame.parent
        assert parent is not None
        unlink(parent, frame)
        parent.child_gone(self, frame, withdrawn)

    def drop(self, tok: Token) -> None:
        """A token is withdrawn: stop what it waits on (the caller unlinks or discards its frame)."""
        tok.alive = False
        wk = tok.wk
        if wk == WK_EFFECT:
            if self.effects.pop(tok.wid, None) is not None:
                self.out_cancel_effects.append(tok.wid)
                self.trace_node("effect_cancelled", tok.ip, effect_id=tok.wid)
        elif wk == WK_TIMER:
            self._cancel_timer(tok.wid, tok.ip)
        elif wk == WK_SIGNAL and tok.aux:
            self._cancel_timer(tok.aux, tok.ip)
        tok.wk = WK_NONE

    def _cancel_timer(self, timer_id: int, ip: int) -> None:
        if self.timers.pop(timer_id, None) is not None:
            self.out_cancel_timers.append(timer_id)
            self.trace_node("timer_cancelled", ip, timer_id=timer_id)

    def kill_subtree(self, frame: Frame) -> int:
        """Withdraw everything under `frame` and the frame itself; returns the tokens withdrawn.

        Two phases: first every token and frame of the subtree is marked dead, then the frames release what
        they hold. A released lock is handed to a waiter only once the whole subtree is dead, so a waiter
        inside the subtree is never woken and the tree is never changed while it is being walked.
        """
        dead: list[Frame] = []
        tokens = self._mark_dead(frame, dead)
        for f in dead:
            f.on_close(self)
        return tokens

    def _mark_dead(self, frame: Frame, dead: list[Frame]) -> int:
        tokens = 0
        for child in members(frame):
            if type(child) is Token:
                self.drop(child)
                tokens += 1
            else:
                tokens += self._mark_dead(child, dead)
        frame.head = None
        frame.count = 0
        if frame.alive:
            frame.alive = False
            dead.append(frame)
        return tokens

    def withdraw_children(self, frame: Frame, reason: str) -> int:
        """Withdraw every child of `frame` (the join fired, or the MI was completed); no notifications."""
        dead: list[Frame] = []
        withdrawn = 0
        for child in members(frame):
            withdrawn += 1
            if type(child) is Token:
                self.drop(child)
            else:
                self._mark_dead(child, dead)
        frame.head = None
        frame.count = 0
        for f in dead:
            f.on_close(self)
        self.trace_node("withdrawn", frame.ip, branches=withdrawn, reason=reason)
        return withdrawn

    def merge(self, tok: Token, res: Any, ip: int) -> bool:
        """Merge a step's updates into the data its token sees; a non-mapping fails the case."""
        if not isinstance(res, Mapping):
            self.step_failed(
                ip,
                TypeError(f"returned {type(res).__name__}"),
                f"{self.program.labels[ip] or 'step'} returned {res!r}: return a mapping of updates, or None",
            )
            return False
        env = tok.env
        if env is self.root_env:
            self.data.update(res)
        else:
            env.merge(res)  # type: ignore[attr-defined]
        return True

    def store(self, env: Mapping[str, Any], key: str, value: Any) -> None:
        if env is self.root_env:
            self.data[key] = value
        else:
            env.merge({key: value})  # type: ignore[attr-defined]

    def step_failed(self, ip: int, exc: BaseException, message: str) -> None:
        self._end(FAILED, ip, exc, message)

    def limit_hit(self, ip: int, message: str) -> None:
        path = self.paths[ip]
        self._end(FAILED, ip, CaseFailed(None, path, message), message)

    def _end(self, status: str, ip: int, exc: BaseException | None, message: str) -> None:
        if self.ended:
            return
        if status == FAILED:
            self.error, self.error_path, self.error_message = exc, self.paths[ip], message
            self.trace_node("case_failed", ip, error=message)
        self.kill_subtree(self.root)
        self._finish(status, message)

    def finish_root(self) -> None:
        """The root frame is empty: the case is done if the root thread ended, else it was withdrawn."""
        if not self.ended:
            self._finish(DONE if self.root_ended else CANCELLED, "the root thread was withdrawn")

    def _finish(self, status: str, reason: str) -> None:
        self.ended = True
        self.status = status
        if status == DONE:
            self._case_event("case_done")
        elif status == CANCELLED:
            self._case_event("case_cancelled", reason=reason)
        self.ready.clear()
        self.waiters.clear()
        self.lock_waiters.clear()
        self.ms_waiters.clear()
        self.effects.clear()
        self.timers.clear()

    def joined(self, frame: SplitFrame, first: bool) -> None:
        if self.tl and first:
            self.emit("join", self.paths[frame.ip], {"policy": frame.spec.policy, "arrived": frame.arrived})

    def unregister_region(self, name: str, frame: Frame) -> None:
        acts = self.regions.get(name)
        if acts is not None:
            acts.pop(frame, None)

    def release_lock(self, name: str) -> None:
        self.locks[name] = None
        queue = self.lock_waiters.get(name)
        while queue:
            tok, wid = queue.popleft()
            if tok.alive and tok.wk == WK_LOCK and tok.wid == wid:
                tok.wk = WK_NONE
                self._enter_critical(tok, tok.ip, name)
                tok.ip += 1
                self.ready.append(tok)
                return

    def _enter_critical(self, tok: Token, ip: int, name: str) -> None:
        frame = CriticalFrame(tok.frame, tok.env, ip, name)
        link(tok.frame, frame)
        self.move(tok, frame)
        self.locks[name] = frame

    def leave_milestone(self, name: str, ip: int) -> None:
        self.ms_active[name] -= 1
        self.trace_node("milestone", ip, name=name, event="left")

    def interleave_next(self, frame: InterleaveFrame, tok: Token) -> int:
        """Pick the next branch the order allows and send `tok` there; leave when every branch is done."""
        spec: InterleaveSpec = frame.spec
        done = frame.done
        eligible = [i for i in range(len(done)) if not done[i] and all(done[j] for j in spec.before[i])]
        if not eligible:
            return self.leave(tok, frame, spec.after)
        frame.current = eligible[self.scheduler.pick(len(eligible))]
        self.trace_node("choice", frame.ip, branch=frame.current)
        return spec.starts[frame.current]

    def mi_check(self, mi: MIFrame) -> None:
        """After an instance ended: fire the join if its policy (or `until`) is met; close when empty."""
        spec: MISpec = mi.spec
        if not mi.fired:
            need = spec.need
            fire = mi.count == 0 if need == ALL else mi.completed >= need or mi.count == 0
            if not fire and spec.until is not None:
                stats = MIStats(mi.started, mi.completed, mi.cancelled, mi.count)
                try:
                    fire = bool(spec.until(stats))
                except Exception as exc:
                    self.step_failed(mi.ip, exc, f"mi until() raised {type(exc).__name__}: {exc}")
                    return
            if fire:
                if mi.completed == 0 and mi.started > 0 and mi.count == 0:
                    self.close(mi, withdrawn=True)  # every instance was withdrawn
                    return
                self.mi_fire(mi)
        if mi.count == 0 and mi.alive:
            self.close(mi, withdrawn=False)

    def mi_fire(self, mi: MIFrame) -> None:
        spec: MISpec = mi.spec
        mi.fired = True
        mi.closed = True
        if spec.cancel_remaining and mi.count:
            mi.cancelled += self.withdraw_children(mi, "mi join fired")
        tok = self.spawn(mi.parent, spec.after, mi.env)
        if spec.collect is not None:
            self.store(mi.env, spec.collect, list(mi.outputs))
        self.trace_node("mi_joined", mi.ip, completed=mi.completed, cancelled=mi.cancelled, token=tok.tid)

    def spawn_instances(self, mi: MIFrame, items: Sequence[Any] | None, n: int) -> None:
        base = len(mi.outputs)
        mi.outputs.extend([None] * n)
        mi.started += n
        body = mi.spec.body
        ip = mi.ip
        append = self.ready.append
        tid = self.next_tid
        has_item = items is not None
        head = mi.head
        # A bulk spawn allocates two records per instance and frees none: the cyclic GC would walk the
        # growing heap again and again for nothing (a third of the time at 100,000 instances).
        pause_gc = n >= 512 and gc.isenabled()
        if pause_gc:
            gc.disable()
        try:
            for i in range(n):
                inst = InstanceFrame(mi, ip, base + i, items[i] if has_item else None, has_item)  # type: ignore[index]
                inst.next = head  # inlined link(mi, inst)
                if head is not None:
                    head.prev = inst
                head = inst
                tok = Token(tid, body, inst, inst)
                tid += 1
                inst.head = tok
                inst.count = 1
                append(tok)
        finally:
            if pause_gc:
                gc.enable()
        mi.head = head
        mi.count += n
        self.next_tid = tid

    # -- inputs ----------------------------------------------------------------------------------

    def _check_open(self, what: str) -> None:
        if self.ended:
            raise SignalRejected(f"cannot {what}: the case has already ended ({self.status})")

    def deliver_signal(self, name: str, payload: Any = None) -> None:
        """A signal arrives: wake the oldest waiter, else buffer it (persistent) or drop it (transient)."""
        if not isinstance(name, str):
            raise TypeError(f"signal names are str, got {type(name).__name__} {name!r}")
        self._check_open(f"deliver signal {name!r}")
        if name not in self.program.signals:
            known = ", ".join(sorted(self.program.signals)) or "none"
            raise SignalRejected(
                f"the workflow never waits for signal {name!r} (it waits for: {known}); check the name"
            )
        queue = self.waiters.get(name)
        while queue:
            tok, wid = queue.popleft()
            if tok.alive and tok.wk == WK_SIGNAL and tok.wid == wid:
                self._wake(tok, name, payload)
                return
        if name in self.program.persistent_signals:
            self.signal_seq += 1
            self.buffered.setdefault(name, Fifo()).append((self.signal_seq, payload))
            if self.tl:
                self.emit("signal_buffered", "", {"signal": name})
        elif self.tl:
            self.emit("signal_dropped", "", {"signal": name, "reason": "transient and nobody waits"})

    def _wake(self, tok: Token, name: str, payload: Any) -> None:
        op, spec = self.code[tok.ip]
        tok.wk = WK_NONE
        if op == Op.WAIT:
            self.store(tok.env, spec.into, payload)
            tok.ip += 1
            self.trace_node("signal_consumed", tok.ip - 1, signal=name)
        else:
            if tok.aux:
                self._cancel_timer(tok.aux, tok.ip)
                tok.aux = 0
            self.store(tok.env, name, payload)
            self.trace_node("deferred_choice", tok.ip, chosen=name)
            tok.ip = spec.targets[spec.signals.index(name)]
        self.ready.append(tok)

    def complete_effect(
        self, effect_id: int, output: Mapping[str, Any] | None = None, *, error: BaseException | None = None
    ) -> bool:
        """An effect finished. False: its token was withdrawn and the result is discarded."""
        if self.ended:
            if 0 < effect_id < self.next_eid:
                return False
            raise MachineStateError(f"unknown effect id {effect_id}: this machine never requested it")
        tok = self.effects.pop(effect_id, None)
        if tok is None:
            if 0 < effect_id < self.next_eid:
                if self.tl:
                    self.emit("effect_discarded", "", {"effect_id": effect_id})
                return False
            raise MachineStateError(f"unknown effect id {effect_id}: this machine never requested it")
        ip = tok.ip
        label = self.program.labels[ip]
        if error is not None:
            self.trace_node("effect_failed", ip, effect_id=effect_id, error=repr(error))
            self.step_failed(ip, error, f"effect {label} raised {type(error).__name__}: {error}")
            return True
        if output is not None and not self.merge(tok, output, ip):
            return True
        self.trace_node("effect_completed", ip, effect_id=effect_id, name=label)
        tok.wk = WK_NONE
        tok.ip = ip + 1
        self.ready.append(tok)
        return True

    def fire_timer(self, timer_id: int) -> bool:
        """A timer is due. False: it was cancelled or its token withdrawn (a stale firing)."""
        tok = self.timers.pop(timer_id, None)
        if tok is None:
            if 0 < timer_id < self.next_timer:
                if self.tl and not self.ended:
                    self.emit("timer_stale", "", {"timer_id": timer_id})
                return False
            raise MachineStateError(f"unknown timer id {timer_id}: this machine never armed it")
        self.trace_node("timer_fired", tok.ip, timer_id=timer_id)
        if tok.wk == WK_TIMER:
            tok.ip += 1
        else:  # a deferred choice timed out: the signal branches are withdrawn
            spec: DeferSpec = self.code[tok.ip][1]
            self.trace_node("deferred_choice", tok.ip, chosen="timeout")
            tok.aux = 0
            tok.ip = spec.timeout_target
        tok.wk = WK_NONE
        self.ready.append(tok)
        return True

    def cancel(self, reason: str = "cancelled") -> None:
        """Cancel the whole case: every token, effect and timer is withdrawn."""
        self._check_open("cancel")
        self.kill_subtree(self.root)
        self._finish(CANCELLED, reason)

    def _activations(self, name: str, what: str) -> list[Frame]:
        if not isinstance(name, str):
            raise TypeError(f"region names are str, got {type(name).__name__} {name!r}")
        self._check_open(f"{what} {name!r}")
        if name not in self.program.regions:
            known = ", ".join(sorted(self.program.regions)) or "none"
            raise SignalRejected(f"no region {name!r} in this workflow (regions: {known}); check the name")
        acts = [f for f in self.regions.get(name, {}) if f.alive]
        if not acts:
            raise SignalRejected(f"region {name!r} is not active now: it was not entered yet or has ended")
        return acts

    def cancel_region(self, name: str) -> None:
        """Withdraw all work of every live activation of region `name` (scope or named mi).

        An activation whose thread already went on (a scope the thread left while a discriminator's loser
        still runs inside, an mi whose join fired) only loses that leftover work: what follows it does
        not run again, and `on_cancel` does not run.
        """
        for frame in self._activations(name, "cancel region"):
            if not frame.alive:
                continue  # inside an activation cancelled a moment ago
            tokens = self.kill_subtree(frame)
            self.trace_node("region_cancelled", frame.ip, region=name, tokens=tokens)
            if self._went_on(frame):
                self.detach(frame, withdrawn=False)
            elif isinstance(frame, ScopeFrame) and frame.spec.on_cancel >= 0:
                self.spawn(frame.parent, frame.spec.on_cancel, frame.env)
                self.detach(frame, withdrawn=False)
            else:
                self.detach(frame, withdrawn=True)

    @staticmethod
    def _went_on(frame: Frame) -> bool:
        return frame.fired if isinstance(frame, MIFrame) else isinstance(frame, PassFrame) and frame.exited

    def complete_region(self, name: str) -> None:
        """Close region `name` now: an MI joins with the outputs so far; a scope continues after itself.

        Every live activation is checked before any is touched, so a refused call changes nothing.
        """
        acts = self._activations(name, "complete region")
        for frame in acts:
            if isinstance(frame, MIFrame) and frame.fired:
                what = "has no join (join=None)" if frame.spec.need == 0 else "has already joined"
                raise SignalRejected(
                    f"mi {name!r} {what}: there is nothing to complete; cancel_region withdraws its instances"
                )
        for frame in acts:
            if not frame.alive:
                continue  # inside an activation completed a moment ago
            if isinstance(frame, MIFrame):
                frame.cancelled += self.withdraw_children(frame, "region completed")
                self.trace_node("region_completed", frame.ip, region=name)
                self.mi_fire(frame)
                self.close(frame, withdrawn=False)
            else:
                assert isinstance(frame, ScopeFrame)
                self.kill_subtree(frame)
                self.trace_node("region_completed", frame.ip, region=name)
                if not frame.exited:  # else the thread already went on: only its leftover work is withdrawn
                    self.spawn(frame.parent, frame.spec.after, frame.env)
                self.detach(frame, withdrawn=False)

    def _dynamic_mi(self, name: str, what: str) -> MIFrame:
        acts = self._activations(name, what)
        frame = acts[0]
        if not isinstance(frame, MIFrame):
            raise SignalRejected(f"region {name!r} is a scope, not an mi: only a dynamic mi takes instances")
        if not frame.spec.dynamic:
            raise SignalRejected(f"mi {name!r} is not dynamic: build it with mi(..., dynamic=True) to add instances")
        if len(acts) > 1:
            raise SignalRejected(f"mi {name!r} has {len(acts)} live activations: it is ambiguous which one to extend")
        if frame.closed:
            raise SignalRejected(f"mi {name!r} is closed (its join fired or it was closed): no instances can be added")
        return frame

    def add_instances(self, name: str, items: Sequence[Any]) -> None:
        """Add one instance per item to the live dynamic MI `name` (WCP15)."""
        if isinstance(items, str | bytes) or not isinstance(items, Sequence):
            raise TypeError(f"add_instances takes a sequence of items, got {type(items).__name__}")
        frame = self._dynamic_mi(name, "add instances to")
        limit = frame.spec.max
        if limit is not None and frame.started + len(items) > limit:
            raise SignalRejected(
                f"mi {name!r} allows at most max={limit} instances; it has {frame.started}, "
                f"so {len(items)} more would exceed it"
            )
        self.spawn_instances(frame, list(items), len(items))
        self.trace_node("mi_instances_added", frame.ip, count=len(items))

    def close_instances(self, name: str) -> None:
        """No more instances may be added to the dynamic MI `name`."""
        frame = self._dynamic_mi(name, "close")
        frame.closed = True
        if frame.fired and frame.count == 0:
            self.close(frame, withdrawn=False)

    def pending_requests(self) -> tuple[list[EffectRequest], list[TimerRequest]]:
        """Every effect in flight and timer armed, as requests: what a driver restarts after `restore`.

        The vm keeps no clock, so a re-armed timer runs its full length again unless the driver keeps
        deadlines of its own.
        """
        effects = []
        for eid, tok in self.effects.items():
            effects.append(_effect_request(self, eid, tok, tok.ip, self.code[tok.ip][1]))
        timers = []
        for timer_id, tok in self.timers.items():
            spec_t = self.code[tok.ip][1]
            seconds = spec_t.seconds if isinstance(spec_t, SleepSpec) else spec_t.timeout
            timers.append(TimerRequest(timer_id, seconds, self.paths[tok.ip]))
        return effects, timers

    # -- snapshots ---------------------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """The whole state as plain data (JSON-able when the case data is)."""
        from ._snapshot import take

        return take(self)

    @classmethod
    def restore(cls, program: Program, snapshot: Mapping[str, Any]) -> Machine:
        """A machine that continues exactly where the snapshot's left off."""
        from ._snapshot import give

        machine = cls.__new__(cls)
        machine._attach(program)
        give(machine, program, snapshot)
        return machine


def _still_live(
    made: list[_R], cancels: list[int], live: Mapping[int, Token], key: Callable[[_R], int]
) -> tuple[list[_R], list[int]]:
    """Requests made this burst that are still live, and the cancels of requests made in earlier bursts."""
    if not cancels:
        return made, cancels
    ids = {key(r) for r in made}
    return [r for r in made if key(r) in live], [i for i in cancels if i not in ids]


@dataclass(frozen=True, slots=True)
class MIStats:
    """What an mi `until=` predicate sees."""

    started: int
    completed: int
    cancelled: int
    active: int


# -- opcode handlers: (machine, token, ip, operand) -> next ip, or -1 when the token stopped -------------


def _effect_request(m: Machine, eid: int, tok: Token, ip: int, spec: EffectSpec) -> EffectRequest:
    return EffectRequest(eid, spec.fn, tok.env, m.paths[ip], spec.name, spec.timeout, spec.retry)


def _op_effect(m: Machine, tok: Token, ip: int, spec: EffectSpec) -> int:
    eid = m.next_eid
    m.next_eid = eid + 1
    m.effects[eid] = tok
    tok.wk = WK_EFFECT
    tok.wid = eid
    tok.ip = ip
    m.out_effects.append(_effect_request(m, eid, tok, ip, spec))
    if m.tl:
        m.emit("effect_requested", m.paths[ip], {"effect_id": eid, "name": spec.name})
    return -1


def _op_end(m: Machine, tok: Token, ip: int, arg: Any) -> int:
    frame = tok.frame
    unlink(frame, tok)
    tok.alive = False
    m.root_ended = True
    frame.child_gone(m, tok, False)
    return -1


def _split(m: Machine, tok: Token, ip: int, spec: SplitSpec, starts: Sequence[int]) -> int:
    parent = tok.frame
    frame = SplitFrame(parent, tok.env, ip, spec)
    link(parent, frame)
    m.move(tok, frame)
    for start in starts[1:]:
        m.spawn(frame, start, tok.env)
    m.trace_node("split", ip, branches=len(starts))
    return starts[0]  # the splitting thread carries on into the first branch


def _op_par(m: Machine, tok: Token, ip: int, spec: SplitSpec) -> int:
    return _split(m, tok, ip, spec, spec.starts)


def _op_arrive(m: Machine, tok: Token, ip: int, arg: Any) -> int:
    return tok.frame.arrive(m, tok)


def _call_pred(m: Machine, ip: int, pred: Callable[..., Any], env: Any, what: str) -> bool | None:
    try:
        return bool(pred(env))
    except Exception as exc:
        name = getattr(pred, "__qualname__", "predicate")
        m.step_failed(ip, exc, f"{what} {name} raised {type(exc).__name__}: {exc}")
        return None


def _op_xor(m: Machine, tok: Token, ip: int, spec: XorSpec) -> int:
    for i, pred in enumerate(spec.preds):
        hit = _call_pred(m, ip, pred, tok.env, "xor predicate")
        if hit is None:
            return -1
        if hit:
            m.trace_node("choice", ip, branches=[i])
            return spec.targets[i]
    if spec.default >= 0:
        m.trace_node("choice", ip, branches=["default"])
        return spec.default
    m.limit_hit(ip, "no xor branch matched and there is no default: add default=... or cover every case")
    return -1


def _op_mc(m: Machine, tok: Token, ip: int, spec: SplitSpec) -> int:
    chosen = []
    for i, pred in enumerate(spec.preds):
        hit = _call_pred(m, ip, pred, tok.env, "multi_choice predicate")
        if hit is None:
            return -1
        if hit:
            chosen.append(spec.starts[i])
    if not chosen:
        if spec.default < 0:
            m.limit_hit(ip, "no multi_choice branch matched and there is no default: add default=...")
            return -1
        chosen.append(spec.default)
    m.trace_node("choice", ip, branches=len(chosen))
    return _split(m, tok, ip, spec, chosen)


def _iterate(m: Machine, frame: LoopFrame, ip: int) -> bool:
    frame.iteration += 1
    limit = frame.spec.max_iterations
    if limit is not None and frame.iteration > limit:
        m.limit_hit(ip, f"loop ran past max_iterations={limit}: raise the limit or fix the exit condition")
        return False
    m.trace_node("loop", ip, iteration=frame.iteration)
    return True


def _op_loop_enter(m: Machine, tok: Token, ip: int, spec: LoopSpec) -> int:
    if spec.mode == "times" and spec.times == 0:
        return spec.exit
    frame = LoopFrame(tok.frame, tok.env, ip, spec)
    link(tok.frame, frame)
    m.move(tok, frame)
    if spec.mode != "while" and not _iterate(m, frame, ip):
        return -1
    return ip + 1


def _op_loop_test(m: Machine, tok: Token, ip: int, spec: LoopSpec) -> int:
    frame: Any = tok.frame
    hit = _call_pred(m, ip, spec.pred, tok.env, "loop while_")  # type: ignore[arg-type]
    if hit is None:
        return -1
    if not hit:
        return m.leave(tok, frame, spec.exit)
    return ip + 1 if _iterate(m, frame, ip) else -1


def _op_loop_back(m: Machine, tok: Token, ip: int, spec: LoopSpec) -> int:
    frame: Any = tok.frame
    if spec.mode == "while":
        return spec.test
    if spec.mode == "until":
        hit = _call_pred(m, ip, spec.pred, tok.env, "loop until")  # type: ignore[arg-type]
        if hit is None:
            return -1
        if hit:
            return m.leave(tok, frame, spec.exit)
    elif frame.iteration >= spec.times:
        return m.leave(tok, frame, spec.exit)
    return spec.body if _iterate(m, frame, ip) else -1


def _park_signal(m: Machine, tok: Token, ip: int, names: Sequence[str]) -> None:
    wid = m.next_wid
    m.next_wid = wid + 1
    tok.ip = ip
    tok.wk = WK_SIGNAL
    tok.wid = wid
    for name in names:
        m.waiters.setdefault(name, Fifo()).append((tok, wid))
        if m.tl:
            m.emit("signal_waiting", m.paths[ip], {"signal": name, "token": tok.tid})


def _op_wait(m: Machine, tok: Token, ip: int, spec: WaitSpec) -> int:
    buffered = None if spec.transient else m.buffered.get(spec.signal)
    if buffered:
        _, payload = buffered.popleft()
        m.store(tok.env, spec.into, payload)
        m.trace_node("signal_consumed", ip, signal=spec.signal, buffered=True)
        return ip + 1
    _park_signal(m, tok, ip, (spec.signal,))
    return -1


def _arm(m: Machine, ip: int, seconds: float, tok: Token) -> int:
    timer_id = m.next_timer
    m.next_timer = timer_id + 1
    m.timers[timer_id] = tok
    m.out_timers.append(TimerRequest(timer_id, seconds, m.paths[ip]))
    m.trace_node("timer_armed", ip, timer_id=timer_id, seconds=seconds)
    return timer_id


def _op_defer(m: Machine, tok: Token, ip: int, spec: DeferSpec) -> int:
    best = None
    for i, name in enumerate(spec.signals):  # the earliest buffered signal among the names decides
        buffered = m.buffered.get(name)
        if buffered and (best is None or buffered.peek()[0] < best[0]):
            best = (buffered.peek()[0], i)
    if best is not None:
        name = spec.signals[best[1]]
        _, payload = m.buffered[name].popleft()
        m.store(tok.env, name, payload)
        m.trace_node("deferred_choice", ip, chosen=name, buffered=True)
        return spec.targets[best[1]]
    _park_signal(m, tok, ip, spec.signals)
    if spec.timeout is not None:
        tok.aux = _arm(m, ip, spec.timeout, tok)
    return -1


def _op_sleep(m: Machine, tok: Token, ip: int, spec: SleepSpec) -> int:
    tok.ip = ip
    tok.wk = WK_TIMER
    tok.wid = _arm(m, ip, spec.seconds, tok)
    return -1


def _op_scope(m: Machine, tok: Token, ip: int, spec: ScopeSpec) -> int:
    frame = ScopeFrame(tok.frame, tok.env, ip, spec)
    link(tok.frame, frame)
    m.move(tok, frame)
    m.regions.setdefault(spec.name, {})[frame] = None
    return ip + 1


def _op_leave(m: Machine, tok: Token, ip: int, target: int) -> int:
    frame: Any = tok.frame
    return m.leave(tok, frame, target)


def _op_mi(m: Machine, tok: Token, ip: int, spec: MISpec) -> int:
    env = tok.env
    items: list[Any] | None = None
    try:
        if spec.items_fn is not None:
            items = list(spec.items_fn(env))
            n = len(items)
        elif spec.count_fn is not None:
            n = spec.count_fn(env)
        else:
            n = spec.count or 0
    except Exception as exc:
        m.step_failed(ip, exc, f"mi count/items function raised {type(exc).__name__}: {exc}")
        return -1
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        m.limit_hit(ip, f"mi count function returned {n!r}: it must return an int >= 0")
        return -1
    if (spec.min is not None and n < spec.min) or (spec.max is not None and n > spec.max):
        m.limit_hit(ip, f"mi got {n} instances, outside min={spec.min} max={spec.max}")
        return -1
    m.trace_node("mi_started", ip, instances=n)
    if n == 0 and not spec.dynamic:  # zero instances: the join fires at once
        if spec.collect is not None:
            m.store(env, spec.collect, [])
        return spec.after
    parent = tok.frame
    frame = MIFrame(parent, env, ip, spec)
    link(parent, frame)
    if spec.name is not None:
        m.regions.setdefault(spec.name, {})[frame] = None
    m.spawn_instances(frame, items, n)
    if spec.need == 0:  # join=None: no synchronization, the thread goes on at once
        frame.fired = True
        if n == 0:  # nothing runs in it: it must not keep the case open
            m.close(frame, withdrawn=False)
        return spec.after
    unlink(parent, tok)
    tok.alive = False
    if n == 0:
        m.mi_check(frame)
    return -1


def _op_interleave(m: Machine, tok: Token, ip: int, spec: InterleaveSpec) -> int:
    frame = InterleaveFrame(tok.frame, tok.env, ip, spec)
    link(tok.frame, frame)
    m.move(tok, frame)
    return m.interleave_next(frame, tok)


def _op_critical(m: Machine, tok: Token, ip: int, spec: NameSpec) -> int:
    holder = m.locks.get(spec.name)
    if holder is not None:  # held: by an enclosing section of this very thread, it would wait forever
        frame: Frame | None = tok.frame
        while frame is not None:
            if frame is holder:
                m.limit_hit(ip, f"critical({spec.name!r}) entered again inside itself: sections are not reentrant")
                return -1
            frame = frame.parent
    if holder is None:
        m._enter_critical(tok, ip, spec.name)
        return ip + 1
    wid = m.next_wid
    m.next_wid = wid + 1
    tok.ip = ip
    tok.wk = WK_LOCK
    tok.wid = wid
    m.lock_waiters.setdefault(spec.name, Fifo()).append((tok, wid))
    m.trace_node("critical_wait", ip, name=spec.name)
    return -1


def _op_milestone(m: Machine, tok: Token, ip: int, spec: NameSpec) -> int:
    frame = MilestoneFrame(tok.frame, tok.env, ip, spec.name)
    link(tok.frame, frame)
    m.move(tok, frame)
    m.ms_active[spec.name] = m.ms_active.get(spec.name, 0) + 1
    m.trace_node("milestone", ip, name=spec.name, event="entered")
    queue = m.ms_waiters.get(spec.name)
    while queue:
        waiter, wid = queue.popleft()
        if waiter.alive and waiter.wk == WK_MILESTONE and waiter.wid == wid:
            waiter.wk = WK_NONE
            waiter.ip += 1
            m.ready.append(waiter)
    return ip + 1


def _op_when(m: Machine, tok: Token, ip: int, spec: NameSpec) -> int:
    active = m.ms_active.get(spec.name)
    if active:
        return ip + 1
    if active is None:  # never reached yet: wait for it
        wid = m.next_wid
        m.next_wid = wid + 1
        tok.ip = ip
        tok.wk = WK_MILESTONE
        tok.wid = wid
        m.ms_waiters.setdefault(spec.name, Fifo()).append((tok, wid))
        return -1
    frame = tok.frame  # reached and passed: this branch is withdrawn
    unlink(frame, tok)
    tok.alive = False
    m.trace_node("withdrawn", ip, reason=f"milestone {spec.name!r} has passed")
    frame.child_gone(m, tok, True)
    return -1


def _op_call(m: Machine, tok: Token, ip: int, spec: CallSpec) -> int:
    frame: Frame | None = tok.frame
    depth = 1
    while frame is not None:
        if isinstance(frame, CallFrame):
            depth = frame.depth + 1
            break
        frame = frame.parent
    if depth > m.program.max_call_depth:
        m.limit_hit(ip, f"call({spec.name!r}) exceeds the call depth limit {m.program.max_call_depth}")
        return -1
    call = CallFrame(tok.frame, tok.env, ip, ip + 1, depth)
    link(tok.frame, call)
    m.move(tok, call)
    m.trace_node("call", ip, name=spec.name, depth=depth)
    return spec.entry


def _op_ret(m: Machine, tok: Token, ip: int, arg: Any) -> int:
    frame: Any = tok.frame
    return m.leave(tok, frame, frame.ret)


def _op_terminate(m: Machine, tok: Token, ip: int, arg: Any) -> int:
    m.trace_node("terminated", ip)
    m.root_ended = True
    m.kill_subtree(m.root)
    m._finish(DONE, "terminated")
    return -1


def _unreachable(m: Machine, tok: Token, ip: int, arg: Any) -> int:  # TASK and JUMP are inlined
    raise AssertionError(f"opcode at {ip} is handled inline")


_TABLE: dict[Op, Callable[..., int]] = {
    Op.TASK: _unreachable,
    Op.JUMP: _unreachable,
    Op.EFFECT: _op_effect,
    Op.END: _op_end,
    Op.PAR_SPLIT: _op_par,
    Op.ARRIVE: _op_arrive,
    Op.XOR: _op_xor,
    Op.MC_SPLIT: _op_mc,
    Op.LOOP_ENTER: _op_loop_enter,
    Op.LOOP_TEST: _op_loop_test,
    Op.LOOP_BACK: _op_loop_back,
    Op.WAIT: _op_wait,
    Op.DEFER: _op_defer,
    Op.SLEEP: _op_sleep,
    Op.SCOPE_ENTER: _op_scope,
    Op.LEAVE: _op_leave,
    Op.MI_START: _op_mi,
    Op.ILV_START: _op_interleave,
    Op.CRIT_ENTER: _op_critical,
    Op.MS_ENTER: _op_milestone,
    Op.WHEN_MS: _op_when,
    Op.CALL: _op_call,
    Op.RET: _op_ret,
    Op.TERMINATE: _op_terminate,
}
_HANDLERS: tuple[Callable[..., int], ...] = tuple(_TABLE[Op(i)] for i in range(len(Op)))

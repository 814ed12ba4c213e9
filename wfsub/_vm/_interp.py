"""The interpreter: one case's execution state, the two hot loops, the internal operations, the handlers.

Everything here serves `Machine` (the front a driver sees, in `_machine.py`), the frames (`_records.py`) and
the opcode handlers below; a driver never touches it. Arguments are trusted: the front checks them.

The hot loop keeps the code, the current token, its instruction pointer and its data view in locals, inlines
TASK, JUMP and ARRIVE, and dispatches every other opcode through a tuple of handlers indexed by opcode. The tuple
is built from `Op` by name (`_op_<name>` for each opcode), so an opcode without a handler fails at import.
Two loops exist: `run_fast` (level `none`, FIFO scheduler: nothing per step but the step) and `run_general`
(tracing and/or a preemptive scheduler). The choice is made once per `run()`.

Handlers have the signature `(vm, token, ip, operand) -> next ip`, or -1 when the token stopped (parked,
ended, withdrawn, or the case ended).
"""

from __future__ import annotations

import gc
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

from .. import _program as bc
from .._errors import CaseFailed
from .._program import ALL, Op, Program
from ._events import LEVELS, VmEvent
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
    MIStats,
    PassFrame,
    RootFrame,
    ScopeFrame,
    SplitFrame,
    Token,
    link,
    members,
    unlink,
)
from ._requests import EffectRequest, TimerRequest
from ._result import RunStatus
from ._schedulers import Deterministic, Scheduler

# What a step (a task, a predicate, an items/count/until function) may raise without failing its case: only the
# interpreter's own exits. Everything else fails the case at the step, BaseExceptions included: the vm never
# awaits, so a CancelledError or GeneratorExit from a task is the task's own bug, not a cancellation.
_PASS_THROUGH = (KeyboardInterrupt, SystemExit)
_OPEN: Any = "open"  # mi(dynamic="open")

YIELDED = RunStatus.YIELDED
BLOCKED = RunStatus.BLOCKED
DONE = RunStatus.DONE
CANCELLED = RunStatus.CANCELLED
FAILED = RunStatus.FAILED

_TASK = int(Op.TASK)
_JUMP = int(Op.JUMP)
_ARRIVE = int(Op.ARRIVE)


class Interp:
    """The execution state of one case of a Program, and what runs it."""

    __slots__ = (
        "_level_name",
        "awaiting",
        "buffered",
        "closing",
        "code",
        "data",
        "effects",
        "ended",
        "error",
        "error_message",
        "error_path",
        "event_seq",
        "events",
        "gc_paused",
        "lock_waiters",
        "locks",
        "max_instances",
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
        "started",
        "status",
        "steps",
        "timers",
        "tl",
        "waiters",
    )

    def __init__(
        self,
        program: Program,
        data: Mapping[str, Any],
        scheduler: Scheduler | None,
        trace_level: str,
        max_instances: int = bc.DEFAULT_MAX_INSTANCES,
    ) -> None:
        self.attach(program)
        self.max_instances = max_instances
        self.gc_paused = False
        self.data: dict[str, Any] = dict(data)
        self.root_env: Mapping[str, Any] = MappingProxyType(self.data)
        self.scheduler: Scheduler = scheduler if scheduler is not None else Deterministic()
        self.trace_level = trace_level
        self.status = YIELDED  # a fresh machine has work to do
        self.started = False
        self.awaiting: tuple[str, ...] = ()
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
        self.closing: deque[tuple[Frame, bool]] = deque()  # closes queued while another runs (see close)
        self.clear_outputs()
        self.spawn(self.root, 0, self.root_env)

    def attach(self, program: Program) -> None:
        self.program = program
        self.code = program.code
        self.paths = program.paths

    def clear_outputs(self) -> None:
        self.out_effects: list[EffectRequest] = []
        self.out_timers: list[TimerRequest] = []
        self.out_cancel_effects: list[int] = []
        self.out_cancel_timers: list[int] = []

    @property
    def trace_level(self) -> str:
        return self._level_name

    @trace_level.setter
    def trace_level(self, level: str) -> None:
        self._level_name = level
        self.tl = LEVELS[level]

    # -- running ---------------------------------------------------------------------------------------

    def run(self, quanta: int) -> int:
        """Run up to `quanta` steps and settle `status` (and `awaiting` when blocked). Returns the steps."""
        if self.ended:
            return 0
        if not self.started:
            self.started = True
            self.case_event("case_started")
        try:
            if self.tl == 0 and not self.scheduler.preemptive:
                steps = self.run_fast(quanta)
            else:
                steps = self.run_general(quanta)
        finally:
            if self.gc_paused:
                self.gc_paused = False
                gc.enable()
        self.steps += steps
        if not self.ended:
            if self.ready:
                self.status = YIELDED
            else:
                self.status = BLOCKED
                self.awaiting = self.awaited_signals()
                if not self.awaiting and not self.effects and not self.timers and not self.open_instances():
                    self.deadlocked()
        return steps

    def awaited_signals(self) -> tuple[str, ...]:
        """The signal names some live token waits on (dropping stale queue heads on the way)."""
        names = []
        for name, queue in self.waiters.items():
            while queue:
                tok, wid = queue.peek()
                if tok.alive and tok.wk == WK_SIGNAL and tok.wid == wid:
                    names.append(name)
                    break
                queue.popleft()
        return tuple(names)

    def open_instances(self) -> bool:
        """Whether an mi(dynamic="open") is waiting for instances (the case waits for an input, not deadlocked)."""
        return any(
            isinstance(frame, MIFrame) and frame.alive and frame.spec.dynamic == _OPEN and not frame.closed
            for acts in self.regions.values()
            for frame in acts
        )

    def deadlocked(self) -> None:
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

    # -- the hot loops ---------------------------------------------------------------------------------

    def run_fast(self, quanta: int) -> int:
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
                except _PASS_THROUGH:
                    raise
                except BaseException as exc:  # see _PASS_THROUGH
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

    def run_general(self, quanta: int) -> int:
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
                except _PASS_THROUGH:
                    raise
                except BaseException as exc:  # see _PASS_THROUGH
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

    def case_event(self, kind: str, **detail: Any) -> None:
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
        else:
            self.detach_thread(frame)  # work the thread left behind runs on, detached
        return target

    def detach_thread(self, frame: Frame) -> None:
        """`frame`'s thread went on into its parent (a token there stands for it): what remains is detached."""
        if frame.attached:
            frame.attached = False
            parent = frame.parent
            assert parent is not None
            parent.live -= 1

    def end_thread(self, frame: Frame, *, withdrawn: bool) -> None:
        """`frame`'s thread ended (withdrawn, or every branch of it did): close it, or detach what remains."""
        if frame.count == 0:
            self.close(frame, withdrawn=withdrawn)
        elif frame.attached:
            frame.attached = False
            parent = frame.parent
            assert parent is not None
            parent.live -= 1
            if withdrawn:
                self.trace_node("withdrawn", frame.ip)
            parent.child_gone(self, frame, withdrawn)

    def close(self, frame: Frame, *, withdrawn: bool) -> None:
        """A frame has no children left: release it and tell its parent (which may close in turn).

        A close that a parent's `child_gone` asks for while another close runs is queued and run after it, so
        a chain of frames closing one after another (a deep recursion unwinding) is a loop, not a recursion.
        Every such nested close is the last thing its caller does, so running it a moment later is the same.
        """
        pending = self.closing
        pending.append((frame, withdrawn))
        if len(pending) > 1:
            return  # an outer close() is draining the queue
        try:
            while pending:
                frame, withdrawn = pending[0]
                if frame.alive:  # killed since it was queued (a region cancelled around it): nothing to do
                    frame.alive = False
                    frame.on_close(self)
                    parent = frame.parent
                    assert parent is not None
                    unlink(parent, frame)
                    if withdrawn:
                        self.trace_node("withdrawn", frame.ip)
                    parent.child_gone(self, frame, withdrawn)
                pending.popleft()
        except BaseException:
            pending.clear()
            raise

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
            self.cancel_timer(tok.wid, tok.ip)
        elif wk == WK_SIGNAL and tok.aux:
            self.cancel_timer(tok.aux, tok.ip)
        tok.wk = WK_NONE

    def cancel_timer(self, timer_id: int, ip: int) -> None:
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
        tokens = self.mark_dead(frame, dead)
        for f in dead:
            f.on_close(self)
        return tokens

    def mark_dead(self, frame: Frame, dead: list[Frame]) -> int:
        """Drop every token under `frame` and list its frames in `dead`, children first (an iterative walk)."""
        tokens = 0
        stack = [(frame, members(frame))]
        while stack:
            current, rest = stack[-1]
            for child in rest:
                if type(child) is Token:
                    self.drop(child)
                    tokens += 1
                else:
                    stack.append((child, members(child)))
                    break
            else:
                stack.pop()
                current.head = None
                current.count = 0
                if current.alive:
                    current.alive = False
                    dead.append(current)
        return tokens

    def withdraw_children(self, frame: Frame, reason: str) -> int:
        """Withdraw every child of `frame` (the join fired, or the MI was completed); no notifications.

        Returns how many of them were threads of the frame (running branches or instances).
        """
        dead: list[Frame] = []
        threads = 0
        for child in members(frame):
            threads += child.attached
            if type(child) is Token:
                self.drop(child)
            else:
                self.mark_dead(child, dead)
        frame.head = None
        frame.count = 0
        frame.live = 0
        for f in dead:
            f.on_close(self)
        self.trace_node("withdrawn", frame.ip, branches=threads, reason=reason)
        return threads

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
        self.end(FAILED, ip, exc, message)

    def limit_hit(self, ip: int, message: str) -> None:
        path = self.paths[ip]
        self.end(FAILED, ip, CaseFailed(None, path, message), message)

    def end(self, status: RunStatus, ip: int, exc: BaseException | None, message: str) -> None:
        if self.ended:
            return
        if status == FAILED:
            self.error, self.error_path, self.error_message = exc, self.paths[ip], message
            self.trace_node("case_failed", ip, error=message)
        self.kill_subtree(self.root)
        self.finish(status, message)

    def finish_root(self) -> None:
        """The root frame is empty: the case is done if the root thread ended, else it was withdrawn."""
        if not self.ended:
            self.finish(DONE if self.root_ended else CANCELLED, "the root thread was withdrawn")

    def finish(self, status: RunStatus, reason: str) -> None:
        self.ended = True
        self.status = status
        if status == DONE:
            self.case_event("case_done")
        elif status == CANCELLED:
            self.case_event("case_cancelled", reason=reason)
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
                self.enter_critical(tok, tok.ip, name)
                tok.ip += 1
                self.ready.append(tok)
                return

    def enter_critical(self, tok: Token, ip: int, name: str) -> None:
        frame = CriticalFrame(tok.frame, tok.env, ip, name)
        link(tok.frame, frame)
        self.move(tok, frame)
        self.locks[name] = frame

    def leave_milestone(self, name: str, ip: int) -> None:
        self.ms_active[name] -= 1
        self.trace_node("milestone", ip, name=name, event="left")

    def interleave_next(self, frame: InterleaveFrame, tok: Token) -> int:
        """Pick the next branch the order allows and send `tok` there; leave when every branch is done."""
        spec: bc.InterleaveSpec = frame.spec
        done = frame.done
        eligible = [i for i in range(len(done)) if not done[i] and all(done[j] for j in spec.before[i])]
        if not eligible:
            return self.leave(tok, frame, spec.after)
        frame.current = eligible[self.scheduler.pick(len(eligible))]
        self.trace_node("choice", frame.ip, branch=frame.current)
        return spec.starts[frame.current]

    def instance_ended(self, inst: InstanceFrame) -> None:
        """An mi instance's threads have all ended: it completed (a thread arrived) or was withdrawn."""
        mi: Any = inst.parent
        completed = inst.arrived > 0
        if completed:
            out = inst.out
            mi.outputs[inst.index] = out if out is not None else {}
            mi.completed += 1
            if self.tl:
                self.trace_node("mi_instance_done", mi.ip, index=inst.index)
        else:
            mi.cancelled += 1
        if inst.count == 0:  # nothing left inside: gone (an instance holds nothing to release)
            inst.alive = False
            unlink(mi, inst)
        else:  # work it left behind runs on, detached
            inst.attached = False
            mi.live -= 1
        self.mi_check(mi, completed=completed)

    def mi_check(self, mi: MIFrame, *, completed: bool = False) -> None:
        """After an instance ended (or the spawner finished, or the mi was closed): fire the join when its
        policy or `until` says so; withdraw the mi when nothing completed and nothing more can; close when empty.

        The n join (`first` is n = 1) fires at the n-th completion. When n can no longer be reached (no instance
        runs and none can be added) it fires once the running instances have ended, with what completed.
        """
        spec: bc.MISpec = mi.spec
        if mi.fired:
            if mi.count == 0 and mi.alive:
                self.close(mi, withdrawn=False)
            return
        spawning = mi.spawner is not None
        running = mi.live - spawning
        more = spawning or running > 0 or (spec.dynamic == _OPEN and not mi.closed)
        until = False
        if completed and spec.until is not None:
            stats = MIStats(mi.started, mi.completed, mi.cancelled, running)
            try:
                until = bool(spec.until(stats))
            except _PASS_THROUGH:
                raise
            except BaseException as exc:  # see _PASS_THROUGH
                self.step_failed(mi.ip, exc, f"mi until() raised {type(exc).__name__}: {exc}")
                return
        if until:
            fire = True
        elif spec.need == ALL:
            fire = not more
        else:
            fire = mi.completed >= spec.need or not more
        if not fire:
            return
        if not until and not more and mi.completed == 0 and (mi.started > 0 or spec.need != ALL):
            mi.fired = mi.closed = True  # nothing completed and nothing can: the mi's thread is withdrawn
            self.end_thread(mi, withdrawn=True)
            return
        self.mi_fire(mi)

    def mi_fire(self, mi: MIFrame) -> None:
        spec: bc.MISpec = mi.spec
        mi.fired = True
        mi.closed = True
        if spec.cancel_remaining and mi.count:
            mi.cancelled += self.withdraw_instances(mi, "mi join fired")
        tok = self.spawn(mi.parent, spec.after, mi.env)
        if spec.collect is not None:
            self.store(mi.env, spec.collect, list(mi.outputs))
        self.trace_node("mi_joined", mi.ip, completed=mi.completed, cancelled=mi.cancelled, token=tok.tid)
        if mi.count == 0:
            self.close(mi, withdrawn=False)
        else:
            self.detach_thread(mi)  # instances left running (no cancel_remaining) run on, detached

    def spawn_instances(self, mi: MIFrame, items: Sequence[Any] | None, start: int, stop: int, item_base: int) -> None:
        """Start the instances with indexes start..stop-1 (item i is items[i - item_base]); outputs are sized."""
        n = stop - start
        mi.started += n
        body = mi.spec.body
        ip = mi.ip
        append = self.ready.append
        tid = self.next_tid
        has_item = items is not None
        head = mi.head
        for index in range(start, stop):
            item = items[index - item_base] if has_item else None  # type: ignore[index]
            inst = InstanceFrame(mi, ip, index, item, has_item)
            inst.next = head  # inlined link(mi, inst)
            if head is not None:
                head.prev = inst
            head = inst
            tok = Token(tid, body, inst, inst)
            tid += 1
            inst.head = tok
            inst.count = inst.live = 1
            append(tok)
        mi.head = head
        mi.count += n
        mi.live += n
        self.next_tid = tid

    def pause_gc(self) -> None:
        """Pause the cyclic GC until this run() ends (a bulk spawn of instances is about to start).

        A bulk spawn allocates two records per instance and frees none: the GC would walk the growing heap
        again and again for nothing (a third of the time at 100,000 instances). The pause never outlives the
        run() that asked for it, so the event loop never runs with the GC paused.
        """
        if not self.gc_paused and gc.isenabled():
            gc.disable()
            self.gc_paused = True

    def withdraw_instances(self, mi: MIFrame, reason: str) -> int:
        """Withdraw every instance of `mi` (and stop its spawner); returns how many instances were withdrawn."""
        spawning = mi.spawner is not None
        withdrawn = self.withdraw_children(mi, reason)
        if spawning:
            mi.spawner = None
            mi.items = None
            mi.pending = 0
            withdrawn -= 1
        return withdrawn

    # -- inputs: applied as given; `Machine` has checked them ---------------------------------------

    def signal(self, name: str, payload: Any) -> None:
        """A signal arrives: wake the oldest waiter, else buffer it (persistent) or drop it (transient)."""
        queue = self.waiters.get(name)
        while queue:
            tok, wid = queue.popleft()
            if tok.alive and tok.wk == WK_SIGNAL and tok.wid == wid:
                self.wake(tok, name, payload)
                return
        if name in self.program.persistent_signals:
            self.signal_seq += 1
            self.buffered.setdefault(name, Fifo()).append((self.signal_seq, payload))
            if self.tl:
                self.emit("signal_buffered", "", {"signal": name})
        elif self.tl:
            self.emit("signal_dropped", "", {"signal": name, "reason": "transient and nobody waits"})

    def wake(self, tok: Token, name: str, payload: Any) -> None:
        op, spec = self.code[tok.ip]
        tok.wk = WK_NONE
        if op == Op.WAIT:
            self.store(tok.env, spec.into, payload)
            tok.ip += 1
            self.trace_node("signal_consumed", tok.ip - 1, signal=name)
        else:
            if tok.aux:
                self.cancel_timer(tok.aux, tok.ip)
                tok.aux = 0
            self.store(tok.env, name, payload)
            self.trace_node("deferred_choice", tok.ip, chosen=name)
            tok.ip = spec.targets[spec.signals.index(name)]
        self.ready.append(tok)

    def effect_done(self, effect_id: int, output: Mapping[str, Any] | None, error: BaseException | None) -> bool:
        """An effect finished. False: its token was withdrawn and the result is discarded."""
        tok = self.effects.pop(effect_id, None)
        if tok is None:
            if self.tl and not self.ended:
                self.emit("effect_discarded", "", {"effect_id": effect_id})
            return False
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

    def timer_fired(self, timer_id: int) -> bool:
        """A timer is due. False: it was cancelled or its token withdrawn (a stale firing)."""
        tok = self.timers.pop(timer_id, None)
        if tok is None:
            if self.tl and not self.ended:
                self.emit("timer_stale", "", {"timer_id": timer_id})
            return False
        self.trace_node("timer_fired", tok.ip, timer_id=timer_id)
        if tok.wk == WK_TIMER:
            tok.ip += 1
        else:  # a deferred choice timed out: the signal branches are withdrawn
            spec: bc.DeferSpec = self.code[tok.ip][1]
            self.trace_node("deferred_choice", tok.ip, chosen="timeout")
            tok.aux = 0
            tok.ip = spec.timeout_target
        tok.wk = WK_NONE
        self.ready.append(tok)
        return True

    def cancel_case(self, reason: str) -> None:
        """Cancel the whole case: every token, effect and timer is withdrawn."""
        self.kill_subtree(self.root)
        self.finish(CANCELLED, reason)

    def live_activations(self, name: str) -> list[Frame]:
        return [f for f in self.regions.get(name, {}) if f.alive]

    # -- refusals: the reasons a region operation cannot be applied now (None: it can) -------------------

    @staticmethod
    def complete_refusal(name: str, acts: Sequence[Frame]) -> tuple[Frame, str] | None:
        for frame in acts:
            if isinstance(frame, MIFrame) and frame.fired:
                what = "has no join (join=None)" if frame.spec.need == 0 else "has already joined"
                return frame, f"mi {name!r} {what}: there is nothing to complete; cancel_region withdraws its instances"
        return None

    @staticmethod
    def dynamic_mi_refusal(name: str, acts: Sequence[Frame]) -> str | None:
        frame = acts[0]
        if not isinstance(frame, MIFrame):
            return f"region {name!r} is a scope, not an mi: only a dynamic mi takes instances"
        if not frame.spec.dynamic:
            return f"mi {name!r} is not dynamic: build it with mi(..., dynamic=True) to add instances"
        if len(acts) > 1:
            return f"mi {name!r} has {len(acts)} live activations: it is ambiguous which one to extend"
        if frame.closed:
            return f"mi {name!r} is closed (its join fired or it was closed): no instances can be added"
        return None

    def add_refusal(self, name: str, frame: MIFrame, count: int) -> str | None:
        limit = frame.spec.max if frame.spec.max is not None else self.max_instances
        held = frame.started + frame.pending
        if held + count <= limit:
            return None
        bound = f"max={limit}" if frame.spec.max is not None else f"the limit of {limit:,} (max_instances)"
        return f"mi {name!r} allows at most {bound} instances; it has {held}, so {count} more would exceed it"

    def cancel_region(self, name: str, acts: Sequence[Frame]) -> None:
        """Withdraw all work of the given live activations of region `name`.

        An activation whose thread already went on (a scope the thread left while a discriminator's loser
        still runs inside, an mi whose join fired) only loses that leftover work: what follows it does
        not run again, and `on_cancel` does not run.
        """
        for frame in acts:
            if not frame.alive:
                continue  # inside an activation cancelled a moment ago
            tokens = self.kill_subtree(frame)
            self.trace_node("region_cancelled", frame.ip, region=name, tokens=tokens)
            if _went_on(frame):
                self.detach(frame, withdrawn=False)
            elif isinstance(frame, ScopeFrame) and frame.spec.on_cancel >= 0:
                self.spawn(frame.parent, frame.spec.on_cancel, frame.env)
                self.detach(frame, withdrawn=False)
            else:
                self.detach(frame, withdrawn=True)

    def complete_region(self, name: str, acts: Sequence[Frame]) -> None:
        """Close the given activations of region `name` now (they were checked: none refuses)."""
        for frame in acts:
            if not frame.alive:
                continue  # inside an activation completed a moment ago
            if isinstance(frame, MIFrame):
                frame.cancelled += self.withdraw_instances(frame, "region completed")
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

    def add_instances(self, frame: MIFrame, items: list[Any]) -> None:
        base = len(frame.outputs)
        frame.outputs.extend([None] * len(items))
        self.spawn_instances(frame, items, base, base + len(items), base)
        self.trace_node("mi_instances_added", frame.ip, count=len(items))

    def close_instances(self, frame: MIFrame) -> None:
        frame.closed = True
        self.mi_check(frame)

    def pending_requests(self) -> tuple[list[EffectRequest], list[TimerRequest]]:
        effects = []
        for eid, tok in self.effects.items():
            effects.append(_effect_request(self, eid, tok, tok.ip, self.code[tok.ip][1]))
        timers = []
        for timer_id, tok in self.timers.items():
            spec = self.code[tok.ip][1]
            seconds = spec.seconds if isinstance(spec, bc.SleepSpec) else spec.timeout
            timers.append(TimerRequest(timer_id, seconds, self.paths[tok.ip]))
        return effects, timers


def _went_on(frame: Frame) -> bool:
    """The activation's thread already continued after it (only leftover work is inside)."""
    return frame.fired if isinstance(frame, MIFrame) else isinstance(frame, PassFrame) and frame.exited


# -- opcode handlers: (vm, token, ip, operand) -> next ip, or -1 when the token stopped ---------------------


def _effect_request(m: Interp, eid: int, tok: Token, ip: int, spec: bc.EffectSpec) -> EffectRequest:
    return EffectRequest(eid, spec.fn, tok.env, m.paths[ip], spec.name, spec.timeout, spec.retry)


def _op_effect(m: Interp, tok: Token, ip: int, spec: bc.EffectSpec) -> int:
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


def _op_end(m: Interp, tok: Token, ip: int, arg: Any) -> int:
    frame = tok.frame
    unlink(frame, tok)
    tok.alive = False
    m.root_ended = True
    frame.child_gone(m, tok, False)
    return -1


def _split(m: Interp, tok: Token, ip: int, spec: bc.SplitSpec, starts: Sequence[int]) -> int:
    parent = tok.frame
    frame = SplitFrame(parent, tok.env, ip, spec)
    link(parent, frame)
    m.move(tok, frame)
    for start in starts[1:]:
        m.spawn(frame, start, tok.env)
    m.trace_node("split", ip, branches=len(starts))
    return starts[0]  # the splitting thread carries on into the first branch


def _op_par(m: Interp, tok: Token, ip: int, spec: bc.SplitSpec) -> int:
    return _split(m, tok, ip, spec, spec.starts)


def _op_arrive(m: Interp, tok: Token, ip: int, arg: Any) -> int:
    return tok.frame.arrive(m, tok)


def _call_pred(m: Interp, ip: int, pred: Callable[..., Any], env: Any, what: str) -> bool | None:
    try:
        return bool(pred(env))
    except _PASS_THROUGH:
        raise
    except BaseException as exc:  # see _PASS_THROUGH
        name = getattr(pred, "__qualname__", "predicate")
        m.step_failed(ip, exc, f"{what} {name} raised {type(exc).__name__}: {exc}")
        return None


def _op_xor(m: Interp, tok: Token, ip: int, spec: bc.XorSpec) -> int:
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


def _op_multi_choice(m: Interp, tok: Token, ip: int, spec: bc.SplitSpec) -> int:
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


def _iterate(m: Interp, frame: LoopFrame, ip: int) -> bool:
    frame.iteration += 1
    limit = frame.spec.max_iterations
    if limit is not None and frame.iteration > limit:
        m.limit_hit(ip, f"loop ran past max_iterations={limit}: raise the limit or fix the exit condition")
        return False
    m.trace_node("loop", ip, iteration=frame.iteration)
    return True


def _op_loop(m: Interp, tok: Token, ip: int, spec: bc.LoopSpec) -> int:
    if spec.mode == "times" and spec.times == 0:
        return spec.exit
    frame = LoopFrame(tok.frame, tok.env, ip, spec)
    link(tok.frame, frame)
    m.move(tok, frame)
    if spec.mode != "while" and not _iterate(m, frame, ip):
        return -1
    return ip + 1


def _op_loop_test(m: Interp, tok: Token, ip: int, spec: bc.LoopSpec) -> int:
    frame: Any = tok.frame
    hit = _call_pred(m, ip, spec.pred, tok.env, "loop while_")  # type: ignore[arg-type]
    if hit is None:
        return -1
    if not hit:
        return m.leave(tok, frame, spec.exit)
    return ip + 1 if _iterate(m, frame, ip) else -1


def _op_loop_back(m: Interp, tok: Token, ip: int, spec: bc.LoopSpec) -> int:
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


def _park_signal(m: Interp, tok: Token, ip: int, names: Sequence[str]) -> None:
    wid = m.next_wid
    m.next_wid = wid + 1
    tok.ip = ip
    tok.wk = WK_SIGNAL
    tok.wid = wid
    for name in names:
        m.waiters.setdefault(name, Fifo()).append((tok, wid))
        if m.tl:
            m.emit("signal_waiting", m.paths[ip], {"signal": name, "token": tok.tid})


def _op_wait(m: Interp, tok: Token, ip: int, spec: bc.WaitSpec) -> int:
    buffered = None if spec.transient else m.buffered.get(spec.signal)
    if buffered:
        _, payload = buffered.popleft()
        m.store(tok.env, spec.into, payload)
        m.trace_node("signal_consumed", ip, signal=spec.signal, buffered=True)
        return ip + 1
    _park_signal(m, tok, ip, (spec.signal,))
    return -1


def _arm(m: Interp, ip: int, seconds: float, tok: Token) -> int:
    timer_id = m.next_timer
    m.next_timer = timer_id + 1
    m.timers[timer_id] = tok
    m.out_timers.append(TimerRequest(timer_id, seconds, m.paths[ip]))
    m.trace_node("timer_armed", ip, timer_id=timer_id, seconds=seconds)
    return timer_id


def _op_defer(m: Interp, tok: Token, ip: int, spec: bc.DeferSpec) -> int:
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


def _op_sleep(m: Interp, tok: Token, ip: int, spec: bc.SleepSpec) -> int:
    tok.ip = ip
    tok.wk = WK_TIMER
    tok.wid = _arm(m, ip, spec.seconds, tok)
    return -1


def _op_scope(m: Interp, tok: Token, ip: int, spec: bc.ScopeSpec) -> int:
    frame = ScopeFrame(tok.frame, tok.env, ip, spec)
    link(tok.frame, frame)
    m.move(tok, frame)
    m.regions.setdefault(spec.name, {})[frame] = None
    return ip + 1


def _op_leave(m: Interp, tok: Token, ip: int, target: int) -> int:
    frame: Any = tok.frame
    return m.leave(tok, frame, target)


def _op_mi(m: Interp, tok: Token, ip: int, spec: bc.MISpec) -> int:
    env = tok.env
    items: list[Any] | None = None
    try:
        if spec.items_fn is not None:
            given = spec.items_fn(env)
            if isinstance(given, str | bytes | Mapping):
                m.limit_hit(
                    ip,
                    f"mi items function returned a {type(given).__name__}: return a list with one item per "
                    "instance (a str would start one instance per character)",
                )
                return -1
            items = list(given)
            n = len(items)
        elif spec.count_fn is not None:
            n = spec.count_fn(env)
        else:
            n = spec.count or 0
    except _PASS_THROUGH:
        raise
    except BaseException as exc:  # see _PASS_THROUGH
        m.step_failed(ip, exc, f"mi count/items function raised {type(exc).__name__}: {exc}")
        return -1
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        m.limit_hit(ip, f"mi count function returned {n!r}: it must return an int >= 0")
        return -1
    if (spec.min is not None and n < spec.min) or (spec.max is not None and n > spec.max):
        m.limit_hit(ip, f"mi got {n} instances, outside min={spec.min} max={spec.max}")
        return -1
    if spec.need > 0 and n < spec.need and spec.until is None and not spec.dynamic:
        m.limit_hit(
            ip,
            f"mi join={spec.need} needs at least {spec.need} instance{'s' if spec.need > 1 else ''}, but the count "
            f"is {n}: its join could never fire; give fewer for join=, an until= condition, or dynamic=True",
        )
        return -1
    if spec.max is None and n > m.max_instances:
        m.limit_hit(
            ip,
            f"mi would start {n:,} instances, more than the limit of {m.max_instances:,}: give the mi max=... "
            "(or the Substrate max_instances=...) if that many is meant",
        )
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
    frame.outputs = [None] * n
    first = min(n, bc.SPAWN_CHUNK)
    if first >= 128:
        m.pause_gc()
    m.spawn_instances(frame, items, 0, first, 0)
    if n > first:  # the rest start SPAWN_CHUNK per step, before any instance runs (under FIFO)
        frame.pending = n - first
        frame.items = items
        spawner = frame.spawner = Token(m.next_tid, ip + 1, frame, env)
        m.next_tid += 1
        link(frame, spawner)
        m.ready.appendleft(spawner)
    if spec.need == 0:  # join=None: no synchronization, the thread goes on at once; the mi is detached work
        frame.fired = True
        m.detach_thread(frame)
        if n == 0:  # nothing runs in it: it must not keep the case open
            m.close(frame, withdrawn=False)
        return spec.after
    unlink(parent, tok)
    tok.alive = False
    if n == 0:
        m.mi_check(frame)
    return -1


def _op_mi_spawn(m: Interp, tok: Token, ip: int, spec: bc.MISpec) -> int:
    """The spawner of a big mi: start the next chunk of instances; leave once all have started."""
    frame: Any = tok.frame
    m.pause_gc()
    start = frame.started
    stop = start + min(frame.pending, bc.SPAWN_CHUNK)
    m.spawn_instances(frame, frame.items, start, stop, 0)
    frame.pending -= stop - start
    if frame.pending:
        return ip  # next step: the next chunk
    frame.items = None
    frame.spawner = None
    unlink(frame, tok)
    tok.alive = False
    m.mi_check(frame)
    return -1


def _op_interleave(m: Interp, tok: Token, ip: int, spec: bc.InterleaveSpec) -> int:
    frame = InterleaveFrame(tok.frame, tok.env, ip, spec)
    link(tok.frame, frame)
    m.move(tok, frame)
    return m.interleave_next(frame, tok)


def _op_critical(m: Interp, tok: Token, ip: int, spec: bc.NameSpec) -> int:
    holder = m.locks.get(spec.name)
    if holder is not None:  # held: by an enclosing section of this very thread, it would wait forever
        frame: Frame | None = tok.frame
        while frame is not None:
            if frame is holder:
                m.limit_hit(ip, f"critical({spec.name!r}) entered again inside itself: sections are not reentrant")
                return -1
            frame = frame.parent
    if holder is None:
        m.enter_critical(tok, ip, spec.name)
        return ip + 1
    wid = m.next_wid
    m.next_wid = wid + 1
    tok.ip = ip
    tok.wk = WK_LOCK
    tok.wid = wid
    m.lock_waiters.setdefault(spec.name, Fifo()).append((tok, wid))
    m.trace_node("critical_wait", ip, name=spec.name)
    return -1


def _op_milestone(m: Interp, tok: Token, ip: int, spec: bc.NameSpec) -> int:
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


def _op_when_milestone(m: Interp, tok: Token, ip: int, spec: bc.NameSpec) -> int:
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


def _op_call(m: Interp, tok: Token, ip: int, spec: bc.CallSpec) -> int:
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


def _op_ret(m: Interp, tok: Token, ip: int, arg: Any) -> int:
    frame: Any = tok.frame
    return m.leave(tok, frame, frame.ret)


def _op_terminate(m: Interp, tok: Token, ip: int, arg: Any) -> int:
    m.trace_node("terminated", ip)
    m.root_ended = True
    m.kill_subtree(m.root)
    m.finish(DONE, "terminated")
    return -1


def _context(frame: Frame | None) -> Frame | None:
    """The innermost mi instance or call around `frame` (None: the case's root workflow)."""
    while frame is not None and not isinstance(frame, InstanceFrame | CallFrame):
        frame = frame.parent
    return frame


def _region_activations(m: Interp, tok: Token, spec: bc.RegionStepSpec) -> list[Frame]:
    acts = m.live_activations(spec.name)
    if spec.local and acts:  # only the activations in the step's own mi instance and call
        here = _context(tok.frame)
        acts = [frame for frame in acts if _context(frame.parent) is here]
    return acts


def _op_cancel_region(m: Interp, tok: Token, ip: int, spec: bc.RegionStepSpec) -> int:
    acts = _region_activations(m, tok, spec)
    if not acts:
        m.trace_node("region_inactive", ip, region=spec.name)
        return ip + 1
    tok.ip = ip + 1
    m.cancel_region(spec.name, acts)
    return ip + 1 if tok.alive else -1  # a step inside the region is withdrawn with it


def _op_complete_region(m: Interp, tok: Token, ip: int, spec: bc.RegionStepSpec) -> int:
    acts = _region_activations(m, tok, spec)
    if not acts:
        m.trace_node("region_inactive", ip, region=spec.name)
        return ip + 1
    refused = m.complete_refusal(spec.name, acts)
    if refused is not None:
        m.limit_hit(ip, f"complete_region({spec.name!r}) refused: {refused[1]}")
        return -1
    tok.ip = ip + 1
    m.complete_region(spec.name, acts)
    return ip + 1 if tok.alive else -1


def _dynamic_mi_at_step(m: Interp, tok: Token, ip: int, spec: bc.RegionStepSpec, what: str) -> MIFrame | None:
    acts = _region_activations(m, tok, spec)
    reason = f"region {spec.name!r} is not active now" if not acts else m.dynamic_mi_refusal(spec.name, acts)
    if reason is not None:
        m.limit_hit(ip, f"{what}({spec.name!r}) refused: {reason}")
        return None
    frame = acts[0]
    assert isinstance(frame, MIFrame)
    return frame


def _op_add_instances(m: Interp, tok: Token, ip: int, spec: bc.RegionStepSpec) -> int:
    assert spec.items is not None
    try:
        given = spec.items(tok.env)
    except _PASS_THROUGH:
        raise
    except BaseException as exc:  # see _PASS_THROUGH
        m.step_failed(ip, exc, f"add_instances items function raised {type(exc).__name__}: {exc}")
        return -1
    if isinstance(given, str | bytes | Mapping) or not isinstance(given, Sequence):
        m.limit_hit(ip, f"add_instances items function returned {type(given).__name__}: return a list of items")
        return -1
    frame = _dynamic_mi_at_step(m, tok, ip, spec, "add_instances")
    if frame is None:
        return -1
    reason = m.add_refusal(spec.name, frame, len(given))
    if reason is not None:
        m.limit_hit(ip, f"add_instances({spec.name!r}) refused: {reason}")
        return -1
    m.add_instances(frame, list(given))
    return ip + 1


def _op_close_instances(m: Interp, tok: Token, ip: int, spec: bc.RegionStepSpec) -> int:
    frame = _dynamic_mi_at_step(m, tok, ip, spec, "close_instances")
    if frame is None:
        return -1
    tok.ip = ip + 1
    m.close_instances(frame)
    return ip + 1 if tok.alive else -1


def _op_task(m: Interp, tok: Token, ip: int, fn: Callable[..., Any]) -> int:
    """Inlined in both loops; here for completeness (and for a driver stepping one instruction)."""
    try:
        res = fn(tok.env)
    except _PASS_THROUGH:
        raise
    except BaseException as exc:  # see _PASS_THROUGH
        m.step_failed(ip, exc, f"task {m.program.labels[ip]} raised {type(exc).__name__}: {exc}")
        return -1
    if res is not None and not m.merge(tok, res, ip):
        return -1
    return ip + 1


def _op_jump(m: Interp, tok: Token, ip: int, target: int) -> int:
    return target


def _handlers() -> tuple[Callable[..., int], ...]:
    """`_op_<name>` for every opcode, indexed by opcode: an opcode without a handler fails at import."""
    table = []
    for op in sorted(Op):
        handler = globals().get(f"_op_{op.name.lower()}")
        if handler is None:
            raise ImportError(f"the vm has no handler _op_{op.name.lower()} for opcode {op.name}")
        table.append(handler)
    return tuple(table)


_HANDLERS = _handlers()

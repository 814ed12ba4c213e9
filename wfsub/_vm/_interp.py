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
from collections.abc import Callable, Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from itertools import islice
from types import MappingProxyType
from typing import Any, cast

from .. import _program as bc
from .._errors import CompensationFailed, LimitExceeded, StepFailed, WaitTimeout, error_name, error_text
from .._json import output_problem
from .._program import ALL, Op, Program
from ._events import LEVELS, VmEvent
from ._net import NetFrame, _op_net, _op_net_exit, _op_net_node  # noqa: F401 - handlers, found by name
from ._records import (
    WK_BLOCKED,
    WK_EFFECT,
    WK_LOCK,
    WK_MILESTONE,
    WK_NONE,
    WK_SIGNAL,
    WK_TIMER,
    CallFrame,
    CompensationFrame,
    CriticalFrame,
    Fifo,
    Frame,
    HandlerFrame,
    InstanceFrame,
    InterleaveFrame,
    LoopFrame,
    MIFrame,
    MilestoneFrame,
    MIStats,
    PassFrame,
    RootFrame,
    SagaFrame,
    ScopeFrame,
    SplitFrame,
    Token,
    UndoFrame,
    link,
    members,
    unlink,
    unlink_thread,
)
from ._requests import EffectRequest, TimerRequest
from ._result import RunStatus
from ._schedulers import DETERMINISTIC, Scheduler

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


_NO_EVENTS = cast("list[VmEvent]", ())  # the events of every untraced machine: never appended to (see Interp)
NO_OUT = cast("list[Any]", ())  # no requests this burst: shared, never appended to (a list is made for the first)


class Interp:
    """The execution state of one case of a Program, and what runs it."""

    __slots__ = (
        "_level_name",
        "workflow",
        "awaiting",
        "blocking",
        "buffered",
        "cancelling",
        "closing",
        "code",
        "digest",
        "data",
        "effects",
        "ended",
        "error",
        "error_message",
        "error_path",
        "event_seq",
        "events",
        "failing",
        "failure_record",
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
        "outputs",
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
        self.program = program  # (attach and the trace_level setter inlined: once per case)
        self.code = program.code
        self.paths = program.paths
        self.max_instances = max_instances
        self.workflow: str | None = None  # the registered name, named by `case_started` (the runtime sets it)
        self.gc_paused = False
        self.data: dict[str, Any] = dict(data)
        self.root_env: Mapping[str, Any] = MappingProxyType(self.data)
        self.scheduler: Scheduler = scheduler if scheduler is not None else DETERMINISTIC
        self._level_name = trace_level
        self.tl = LEVELS[trace_level]
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
        # An untraced case records no events: it holds the shared empty tuple, not a list of its own (one object
        # fewer per case for the garbage collector); tracing switched on later gives it a list (trace_level).
        self.events: list[VmEvent] = [] if self.tl else _NO_EVENTS
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
        self.closing: deque[tuple[Frame, bool]] | None = None  # closes queued while another runs (see close)
        self.cancelling = False  # a case cancel is compensating: a second cancel ends the case at once
        self.failing: tuple[int, BaseException, str, dict[str, Any]] | None = None  # an uncaught failure, undoing
        self.failure_record: dict[str, Any] | None = None  # the error record of a failed case
        self.blocking: dict[tuple[Frame | None, int], SplitFrame] = {}  # (context, par ip) -> current activation
        self.outputs: list[tuple[int, Any]] | None = None  # digesting: (ip, output) of the tasks since the last take
        self.digest = ""  # the running digest of task outputs (see Machine.take_digest)
        # What the driver must start or stop after this burst. Most bursts have none: the lists are made when the
        # first request is and handed over by Machine.run, which puts NO_OUT back.
        self.out_effects: list[EffectRequest] = NO_OUT
        self.out_timers: list[TimerRequest] = NO_OUT
        self.out_cancel_effects: list[int] = NO_OUT
        self.out_cancel_timers: list[int] = NO_OUT
        self.spawn(self.root, 0, self.root_env)

    def attach(self, program: Program) -> None:
        self.program = program
        self.code = program.code
        self.paths = program.paths

    @property
    def trace_level(self) -> str:
        return self._level_name

    @trace_level.setter
    def trace_level(self, level: str) -> None:
        self._level_name = level
        self.tl = LEVELS[level]
        if self.tl and type(self.events) is not list:  # (the shared tuple, or one a snapshot gave back)
            self.events = list(self.events)

    # -- running ---------------------------------------------------------------------------------------

    def run(self, quanta: int) -> int:
        """Run up to `quanta` steps and settle `status` (and `awaiting` when blocked). Returns the steps."""
        if self.ended:
            return 0
        if not self.started:
            self.started = True
            if not self.tl:
                pass  # (untraced: no event, and no detail dict built for one)
            elif self.workflow is None:
                self.case_event("case_started")
            else:
                self.case_event("case_started", workflow=self.workflow)
        try:
            if self.tl == 0 and not self.scheduler.preemptive and self.outputs is None:
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

    def unblock(self, split: SplitFrame) -> None:
        """Every branch of a blocking par's activation has ended: the threads waiting to re-enter it go on."""
        waiting, split.blocked = split.blocked, []
        for tok in waiting:
            if tok.alive and tok.wk == WK_BLOCKED:
                tok.wk = WK_NONE
                self.ready.append(tok)

    def forget_blocking(self, split: SplitFrame) -> None:
        key = (_context(split.parent), split.ip)
        if self.blocking.get(key) is split:
            del self.blocking[key]

    def threads_at(self) -> list[str]:
        """The node paths where the case's threads are now (each once, in the order found), walking the frames."""
        seen: dict[str, None] = {}
        stack: list[Frame] = [self.root]
        while stack:
            frame = stack.pop()
            for child in members(frame):
                if type(child) is Token:
                    if child.alive:
                        seen.setdefault(self.paths[child.ip], None)
                else:
                    stack.append(child)
        return list(seen)

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
        for split in self.blocking.values():
            waiting.extend(
                (tok.ip, f"the blocking par at {self.paths[tok.ip]} to reset") for tok in split.blocked if tok.alive
            )
        ip = waiting[0][0] if waiting else 0
        described = "; ".join(sorted({w for _, w in waiting})) or "nothing"
        message = (
            f"deadlock: no effect, timer or signal is pending and the remaining threads wait for {described}, "
            "which nothing left in the case can release"
        )
        self.end(FAILED, ip, StepFailed(self.paths[ip], message), message)

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
                    label = self.program.labels[ip]
                    self.step_failed(tok.frame, ip, exc, f"task {label} raised {type(exc).__name__}: {exc}")
                    tok = None
                    continue
                if res is not None:
                    if env is root_env and type(res) is dict:
                        self.data.update(res)
                    elif not self.merge(tok, res, ip):
                        tok = None
                        continue
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
        code = (self.program.traced_code or self.code) if self.tl else self.code  # traced: net node starts recorded
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
        outputs = self.outputs
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
                    self.step_failed(tok.frame, ip, exc, f"task {labels[ip]} raised {type(exc).__name__}: {exc}")
                    tok = None
                    continue
                if outputs is not None:  # a durable case: its data is journaled and replayed, so it must be JSON
                    if res is not None and not self.json_output(tok, ip, res):
                        tok = None
                        continue
                    outputs.append((ip, res))
                if res is not None:
                    if env is root_env and type(res) is dict:
                        self.data.update(res)
                    elif not self.merge(tok, res, ip):
                        tok = None
                        continue
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
        unlink_thread(tok.frame, tok)
        link(frame, tok)
        tok.frame = frame

    def leave(self, tok: Token, frame: PassFrame, target: int) -> int:
        """The token leaves a pass-through frame normally and continues at `target`."""
        parent = frame.parent
        assert parent is not None
        unlink_thread(frame, tok)
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
        if pending is None:  # made at the first close: a case that closes no frame (a parked one) has none
            pending = self.closing = deque()
        pending.append((frame, withdrawn))
        if len(pending) > 1:
            return  # an outer close() is draining the queue
        try:
            while pending:
                frame, withdrawn = pending[0]
                if withdrawn and type(frame) is SagaFrame and frame.alive and self.compensate_withdrawn(frame):
                    pending.popleft()
                    continue
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

    def compensate_withdrawn(self, saga: SagaFrame) -> bool:
        """A saga whose own thread was withdrawn from inside (a region cancelled in it, a passed milestone) was
        withdrawn before it ended: its completed steps are compensated in its place before its parent hears of
        it. False when it has nothing to undo (it then closes as any frame does)."""
        undo = _undo_for(saga)
        if undo is None:
            return False
        saga.alive = False
        saga.on_close(self)
        parent = saga.parent
        assert parent is not None
        unlink(parent, saga)
        comp = CompensationFrame(parent, saga.env, saga.ip, ("withdrawn",))
        comp.attached = saga.attached
        link(parent, comp)
        self.start_undos(comp, [undo])
        return True

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
                if type(self.out_cancel_effects) is not list:
                    self.out_cancel_effects = []
                self.out_cancel_effects.append(tok.wid)
                self.trace_node("effect_cancelled", tok.ip, effect_id=tok.wid)
        elif wk == WK_TIMER:
            self.cancel_timer(tok.wid, tok.ip)
        elif wk == WK_SIGNAL and tok.aux:
            self.cancel_timer(tok.aux, tok.ip)
        tok.wk = WK_NONE

    def cancel_timer(self, timer_id: int, ip: int) -> None:
        if self.timers.pop(timer_id, None) is not None:
            if type(self.out_cancel_timers) is not list:
                self.out_cancel_timers = []
            self.out_cancel_timers.append(timer_id)
            self.trace_node("timer_cancelled", ip, timer_id=timer_id)

    def kill_subtree(self, frame: Frame) -> int:
        """Withdraw everything under `frame` and the frame itself, undoing nothing; returns the tokens withdrawn.

        Two phases: first every token and frame of the subtree is marked dead, then the frames release what
        they hold. A released lock is handed to a waiter only once the whole subtree is dead, so a waiter
        inside the subtree is never woken and the tree is never changed while it is being walked.
        """
        dead: list[Frame] = []
        tokens, _ = self.kill_tree(frame, False, dead)
        for f in dead:
            f.on_close(self)
        return tokens

    def kill_tree(
        self, top: Frame, compensate: bool, dead: list[Frame], keep_running: bool = False
    ) -> tuple[int, list[Frame]]:
        """Drop every token under `top` and list its frames (top included) in `dead`, children first.

        With `compensate`, what must be undone survives: each active saga with completed compensable steps, and
        each scope with on_cancel whose thread is inside (below `top`), becomes an UndoFrame, keeping how they
        nest; compensations already running are kept as they are (a cancel never stops one). `keep_running`
        alone keeps only the compensations already running (complete_region starts none, stops none). Returns
        the tokens withdrawn and the kept frames that have no kept frame above them. An iterative walk: any depth.
        """
        keep = compensate or keep_running
        tokens = 0
        top_kept: list[Frame] = []
        stack: list[tuple[Frame, Iterator[Any], UndoFrame | None]] = [(top, members(top), None)]
        while stack:
            current, rest, keeper = stack[-1]
            for child in rest:
                if type(child) is Token:
                    self.drop(child)
                    tokens += 1
                    continue
                undo: UndoFrame | None = None
                if keep:
                    kind = type(child)
                    if kind is UndoFrame or kind is CompensationFrame:
                        if kind is CompensationFrame:
                            child.action = _NESTED  # its region is withdrawn too: its own action is void
                        _adopt(keeper, top_kept, child)
                        continue
                    undo = _undo_for(child) if compensate else None
                    if undo is not None:
                        _adopt(keeper, top_kept, undo)
                grand = child.head
                while grand is not None and type(grand) is Token:
                    grand = grand.next
                if grand is None:  # a frame holding only threads (an mi instance, a branch): done here, no push
                    grand = child.head
                    while grand is not None:
                        self.drop(grand)
                        tokens += 1
                        grand = grand.next
                    child.head = None
                    child.count = child.live = 0
                    if child.alive:
                        child.alive = False
                        dead.append(child)
                    continue
                stack.append((child, members(child), undo if undo is not None else keeper))
                break
            else:
                stack.pop()
                current.head = None
                current.count = current.live = 0
                if current.alive:
                    current.alive = False
                    dead.append(current)
        return tokens, top_kept

    def withdraw(self, frame: Frame, compensate: bool, action: tuple[Any, ...]) -> int:
        """Withdraw `frame` and all its work; then `action` (see CompensationFrame), once what must be undone is.

        The withdrawn frame's place is taken by a CompensationFrame while compensations run (it stands for the
        frame's thread, if the frame was one), so whatever waited for the withdrawn work waits for them too.
        Returns the tokens withdrawn.
        """
        parent = frame.parent
        assert parent is not None
        dead: list[Frame] = []
        tokens, kept = self.kill_tree(frame, compensate, dead)
        for f in dead:
            f.on_close(self)
        attached = frame.attached
        unlink(parent, frame)
        if kept:
            comp = CompensationFrame(parent, frame.env, frame.ip, action)
            comp.attached = attached
            link(parent, comp)
            self.start_undos(comp, kept)
        else:
            self.act(parent, frame, attached, action, [])
        return tokens

    def withdraw_inside(
        self, frame: Frame, compensate: bool, action: tuple[Any, ...], keep_running: bool = False
    ) -> int:
        """Withdraw every child of `frame` (which stays); then `action`, once what must be undone is.

        Returns how many of the children were threads of the frame (running branches or instances). Without
        anything to undo, only the case-level actions are performed here; for the others the caller goes on.
        """
        threads = 0
        dead: list[Frame] = []
        kept: list[Frame] = []
        for child in members(frame):
            threads += child.attached
            if type(child) is Token:
                self.drop(child)
                continue
            kind = type(child)
            if (compensate or keep_running) and (kind is UndoFrame or kind is CompensationFrame):
                if kind is CompensationFrame:
                    child.action = _NESTED
                kept.append(child)
                continue
            undo = _undo_for(child) if compensate else None
            _, below = self.kill_tree(child, compensate, dead, keep_running)
            if undo is not None:
                for k in below:
                    _adopt(undo, kept, k)
                kept.append(undo)
            else:
                kept.extend(below)
        frame.head = None
        frame.count = frame.live = 0
        for f in dead:
            f.on_close(self)
        if kept:
            comp = CompensationFrame(frame, frame.env, frame.ip, action)
            comp.attached = False  # withdrawn work, not a thread of the frame
            link(frame, comp)
            self.start_undos(comp, kept)
        elif action[0] in ("case_cancelled", "case_failed"):
            self.act(frame, frame, False, action, [])
        return threads

    def withdraw_children(self, frame: Frame, reason: str, compensate: bool = True, keep_running: bool = False) -> int:
        """Withdraw every child of `frame` (a join fired with cancel_remaining, an mi was completed); what must
        be undone is, as detached work of the frame. Returns how many children were threads of the frame."""
        threads = self.withdraw_inside(frame, compensate, ("quiet",), keep_running)
        self.trace_node("withdrawn", frame.ip, branches=threads, reason=reason)
        return threads

    def start_undos(self, comp: CompensationFrame, kept: list[Frame]) -> None:
        """Link the kept frames under `comp` and start every UndoFrame that has nothing nested left to wait for."""
        todo: list[Frame] = []
        for frame in kept:
            frame.parent = comp
            link(comp, frame)
            todo.append(frame)
        while todo:
            frame = todo.pop()
            if type(frame) is UndoFrame and not frame.started:
                if frame.count == 0:
                    self.start_undo(frame)
                else:
                    todo.extend(child for child in members(frame) if type(child) is not Token)

    def start_undo(self, undo: UndoFrame) -> None:
        undo.started = True
        self.next_handler(undo)

    def next_handler(self, undo: UndoFrame) -> None:
        """Start the next compensation (or on_cancel) of `undo`, or close it when none is left."""
        if not undo.queue:
            undo.current = None
            self.close(undo, withdrawn=False)
            return
        undo.current = undo.queue.pop(0)
        start, name = undo.current
        self.trace_node("compensation", start, name=name, event="started")
        self.spawn(undo, start, undo.env)

    def handler_finished(self, undo: UndoFrame) -> None:
        """The running handler of `undo` reached its end: note it as compensated, go on with the next."""
        if undo.current is not None:
            start, name = undo.current
            self.trace_node("compensation", start, name=name, event="done")
            comp = _compensation_frame(undo)
            if comp is not None:
                comp.compensated.append(name)
        self.next_handler(undo)

    def undo_failed(self, undo: UndoFrame, record: dict[str, Any]) -> None:
        """A handler of `undo` failed: record it, stop that handler's work, and go on with the next one."""
        comp = _compensation_frame(undo)
        if comp is not None:
            comp.failures.append({"type": record["type"], "message": record["message"], "path": record["path"]})
        self.trace_node("compensation", undo.ip, event="failed", error=record["message"], at=record["path"])
        dead: list[Frame] = []
        for child in members(undo):
            if type(child) is Token:
                self.drop(child)
            else:
                self.kill_tree(child, False, dead)
        undo.head = None
        undo.count = undo.live = 0
        for f in dead:
            f.on_close(self)
        undo.current = None
        self.next_handler(undo)

    def compensation_done(self, comp: CompensationFrame) -> None:
        """Every undo under `comp` has finished: perform its action, or send the failures outward."""
        parent = comp.parent
        assert parent is not None
        comp.alive = False
        unlink(parent, comp)
        action = comp.action
        if not comp.failures:
            self.act(parent, comp, comp.attached, action, comp.compensated)
            return
        outer = _compensation_frame(parent)
        if action[0] == "nested" and outer is not None:
            outer.failures.extend(comp.failures)
            outer.compensated.extend(comp.compensated)
            parent.child_gone(self, comp, False)
            return
        exc = CompensationFailed(self.paths[comp.ip], comp.failures)
        message = exc.reason
        if action[0] in ("case_cancelled", "case_failed"):
            cause: dict[str, Any] | None = None
            if action[0] == "case_failed" and self.failing is not None:
                exc.__cause__ = self.failing[1]
                cause = self.failing[3]
                cause["compensated"] = list(comp.compensated)
            self.kill_subtree(self.root)
            record = _record(exc, message, self.paths[comp.ip], comp.compensated, cause)
            self.set_error(comp.ip, exc, message, record)
            self.finish(FAILED, message)
            return
        cause = action[4] if action[0] == "catch" else None
        self.fail(parent, comp.ip, exc, message, cause=cause, compensated=comp.compensated)

    def act(self, parent: Frame, gone: Frame, attached: bool, action: tuple[Any, ...], compensated: list[str]) -> None:
        """What follows a withdrawal once its undoing is done (see CompensationFrame for the actions)."""
        kind = action[0]
        if kind == "catch":
            _, on_error, after, error_into, record = action
            record["compensated"] = list(compensated)
            self.store(gone.env, error_into, record)
            self.run_handler(parent, gone, on_error, after, record)
        elif kind == "resume":
            self.run_handler(parent, gone, action[1], action[2], None)
        elif kind == "withdrawn":
            if attached:
                self.trace_node("withdrawn", gone.ip)
            parent.child_gone(self, gone, attached)
        elif kind in ("quiet", "nested"):
            parent.child_gone(self, gone, False)
        elif kind == "case_cancelled":
            self.kill_subtree(self.root)
            self.finish(CANCELLED, action[1])
        elif kind == "case_failed":
            assert self.failing is not None
            ip, exc, message, record = self.failing
            record["compensated"] = list(compensated)
            self.kill_subtree(self.root)
            self.set_error(ip, exc, message, record)
            self.finish(FAILED, message)

    def run_handler(self, parent: Frame, gone: Frame, start: int, then: int, record: dict[str, Any] | None) -> None:
        """Run an on_cancel / on_error branch where `gone` was; at its end the thread goes on at `then`."""
        handler = HandlerFrame(parent, gone.env, gone.ip, then, record)
        link(parent, handler)
        self.spawn(handler, start, gone.env)

    def json_output(self, tok: Token, ip: int, res: Any) -> bool:
        """A durable case's task output must be JSON (its data is journaled and replayed): else a failure here."""
        problem = output_problem(res, "output")
        if problem is None:
            return True
        label = self.program.labels[ip] or "task"
        self.step_failed(
            tok.frame, ip, TypeError(problem),
            f"task {label} returned data that is not JSON ({problem}): a durable case keeps its data as JSON",
        )
        return False

    def merge(self, tok: Token, res: Any, ip: int) -> bool:
        """Merge a step's updates into the data its token sees; a non-mapping fails the case."""
        if not isinstance(res, Mapping):
            self.step_failed(
                tok.frame,
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

    # -- failures: caught by the nearest enclosing on_error, else the case fails -------------------------

    def step_failed(self, where: Frame, ip: int, exc: BaseException, message: str) -> None:
        """A step at `ip` raised `exc` (or returned something invalid); `where` is the frame its thread is in."""
        self.fail(where, ip, exc, message)

    def refuse(self, where: Frame, ip: int, message: str, kind: type[StepFailed] = StepFailed) -> None:
        """The workflow cannot go on at `ip` (no branch matched, a limit was broken, a step was refused)."""
        self.fail(where, ip, kind(self.paths[ip], message), message)

    def fail(
        self,
        where: Frame,
        ip: int,
        exc: BaseException,
        message: str,
        *,
        cause: dict[str, Any] | None = None,
        compensated: Sequence[str] = (),
    ) -> None:
        """A failure at node `ip`: the nearest scope around `where` with an on_error whose thread is still inside
        catches it (its body is withdrawn, compensating, then on_error runs); uncaught, the case fails.

        A failure inside an on_error branch names the error that branch handles as its `cause`. A failure while
        work is being undone (a compensation, or an on_cancel run while withdrawing) does not stop the others: it
        is recorded, and once all are done the failure goes outward as CompensationFailed.
        """
        if self.ended:
            return
        record: dict[str, Any] = {
            "type": error_name(exc),
            "message": message,
            "path": self.paths[ip],
            "compensated": list(compensated),
            "cause": cause,
        }
        self.trace_node("failure", ip, type=record["type"], error=message)
        frame: Frame | None = where
        while frame is not None:
            kind = type(frame)
            if kind is UndoFrame:
                self.undo_failed(frame, record)  # type: ignore[arg-type]
                return
            if kind is HandlerFrame:
                if record["cause"] is None and frame.record is not None:  # type: ignore[attr-defined]
                    record["cause"] = frame.record  # type: ignore[attr-defined]
            elif kind is ScopeFrame and frame.attached and frame.alive:
                spec: bc.ScopeSpec = frame.spec  # type: ignore[attr-defined]
                if spec.on_error >= 0:
                    self.trace_node("error_caught", frame.ip, error=message, at=record["path"])
                    self.withdraw(frame, True, ("catch", spec.on_error, spec.after, spec.error_into, record))
                    return
            frame = frame.parent
        self.failing = (ip, exc, message, record)
        self.withdraw_inside(self.root, True, ("case_failed",))

    def end(self, status: RunStatus, ip: int, exc: BaseException | None, message: str) -> None:
        """End the case at once: no handler runs, nothing is compensated (a deadlock, an internal limit)."""
        if self.ended:
            return
        self.kill_subtree(self.root)
        if status == FAILED:
            self.set_error(ip, exc, message, None)
        self.finish(status, message)

    def set_error(self, ip: int, exc: BaseException | None, message: str, record: dict[str, Any] | None) -> None:
        self.error, self.error_path, self.error_message = exc, self.paths[ip], message
        self.failure_record = record
        self.trace_node("case_failed", ip, error=message)

    def finish_root(self) -> None:
        """The root frame is empty: the case is done if the root thread ended, else it was withdrawn."""
        if not self.ended:
            self.finish(DONE if self.root_ended else CANCELLED, "the root thread was withdrawn")

    def finish(self, status: RunStatus, reason: str) -> None:
        self.ended = True
        self.status = status
        if not self.tl:
            pass  # (untraced: no event, and no detail dict built for one)
        elif status == DONE:
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
        spec: bc.MISpec = mi.spec
        if spec.need == ALL and spec.until is None and not mi.fired and (mi.spawner is not None or mi.live):
            return  # the common case, without mi_check: an all join while instances still run or start
        self.mi_check(mi, completed=completed)

    def mi_check(self, mi: MIFrame, *, completed: bool = False) -> None:
        """After an instance ended (or the spawner finished, or the mi was closed): fire the join when its
        policy or `until` says so; withdraw the mi when nothing completed and nothing more can; close when empty.

        The n join (`first` is n = 1) fires at the n-th completion. When n can no longer be reached (no instance
        runs and none can be added) it fires once the running instances have ended, with what completed.
        """
        spec: bc.MISpec = mi.spec
        if mi.fired:  # (an open mi without synchronization fired at once: it stays until close_instances)
            if mi.count == 0 and mi.alive and (mi.closed or spec.dynamic != _OPEN):
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
                self.step_failed(mi, mi.ip, exc, f"mi until() raised {type(exc).__name__}: {exc}")
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

    def withdraw_instances(
        self, mi: MIFrame, reason: str, compensate: bool = True, keep_running: bool = False
    ) -> int:
        """Withdraw every instance of `mi` (and stop its spawner); returns how many instances were withdrawn."""
        spawning = mi.spawner is not None
        withdrawn = self.withdraw_children(mi, reason, compensate, keep_running)
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
        if tok.aux:  # a wait's timeout or a deferred choice's timer: the signal came first
            self.cancel_timer(tok.aux, tok.ip)
            tok.aux = 0
        if op == Op.WAIT:
            self.store(tok.env, spec.into, payload)
            tok.ip += 1
            self.trace_node("signal_consumed", tok.ip - 1, signal=name)
        else:
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
            message = f"effect {label} raised {error_name(error)}: {error_text(error)}"
            self.step_failed(tok.frame, ip, error, message)
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
        op, spec = self.code[tok.ip]
        if tok.wk == WK_TIMER:
            tok.ip += 1
        elif op == Op.WAIT:  # nothing arrived in time: a failure at the wait
            tok.wk = WK_NONE
            tok.aux = 0
            message = f"wait({spec.signal!r}) saw no signal within its timeout of {spec.timeout:g}s"
            self.refuse(tok.frame, tok.ip, message, WaitTimeout)
            return True
        else:  # a deferred choice timed out: the signal branches are withdrawn
            self.trace_node("deferred_choice", tok.ip, chosen="timeout")
            tok.aux = 0
            tok.ip = spec.timeout_target
        tok.wk = WK_NONE
        self.ready.append(tok)
        return True

    def cancel_case(self, reason: str, compensate: bool) -> None:
        """Cancel the whole case: every token, effect and timer is withdrawn. With `compensate`, the active
        sagas compensate and the active scopes run their on_cancel first (innermost first); a second cancel, or
        compensate=False, ends the case at once."""
        if compensate and not self.cancelling:
            self.cancelling = True
            self.trace_node("case_cancelling", 0, reason=reason)
            self.withdraw_inside(self.root, True, ("case_cancelled", reason))
        else:
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
        """Withdraw all work of the given live activations of region `name`, compensating what is inside.

        An activation whose thread already went on (a scope the thread left while a discriminator's loser
        still runs inside, an mi whose join fired) only loses that leftover work: what follows it does
        not run again, and `on_cancel` does not run.
        """
        for frame in acts:
            if not frame.alive:
                continue  # inside an activation cancelled a moment ago
            if not frame.attached:
                action: tuple[Any, ...] = ("quiet",)
            elif isinstance(frame, ScopeFrame) and frame.spec.on_cancel >= 0:
                action = ("resume", frame.spec.on_cancel, frame.spec.after)
            else:
                action = ("withdrawn",)
            tokens = self.withdraw(frame, True, action)
            self.trace_node("region_cancelled", frame.ip, region=name, tokens=tokens)

    def complete_region(self, name: str, acts: Sequence[Frame]) -> None:
        """Close the given activations of region `name` now (they were checked: none refuses)."""
        for frame in acts:
            if not frame.alive:
                continue  # inside an activation completed a moment ago
            # Completing starts no compensation, and stops none already running: those go on as detached work.
            if isinstance(frame, MIFrame):
                frame.cancelled += self.withdraw_instances(
                    frame, "region completed", compensate=False, keep_running=True
                )
                self.trace_node("region_completed", frame.ip, region=name)
                self.mi_fire(frame)  # closes the mi, or detaches it while kept compensations run
            else:
                assert isinstance(frame, ScopeFrame)
                dead: list[Frame] = []
                _, kept = self.kill_tree(frame, False, dead, keep_running=True)
                for f in dead:
                    f.on_close(self)
                self.trace_node("region_completed", frame.ip, region=name)
                parent = frame.parent
                assert parent is not None
                if not frame.exited:  # else the thread already went on: only its leftover work is withdrawn
                    self.spawn(parent, frame.spec.after, frame.env)
                if kept:
                    comp = CompensationFrame(parent, frame.env, frame.ip, ("quiet",))
                    comp.attached = False  # withdrawn work of the scope's parent, not a thread of it
                    link(parent, comp)
                    self.start_undos(comp, kept)
                self.detach(frame, withdrawn=False)

    def add_instances(self, frame: MIFrame, items: list[Any]) -> None:
        base = len(frame.outputs)
        frame.outputs.extend([None] * len(items))
        self.spawn_instances(frame, items, base, base + len(items), base)
        self.trace_node("mi_instances_added", frame.ip, count=len(items))

    def close_instances(self, frame: MIFrame) -> None:
        frame.closed = True
        self.trace_node("mi_closed", frame.ip)
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


_NESTED = ("nested",)  # the action of a compensation whose own region was withdrawn around it


def _adopt(keeper: Frame | None, top_kept: list[Frame], frame: Frame) -> None:
    """Hang a kept frame under the nearest kept frame above it, or list it as a top-level one."""
    if keeper is None:
        top_kept.append(frame)
    else:
        frame.parent = keeper
        link(keeper, frame)


def _undo_for(frame: Frame) -> UndoFrame | None:
    """The UndoFrame a withdrawn frame leaves behind, if it has something to undo (see Interp.kill_tree)."""
    if not frame.attached or not frame.alive:
        return None  # its thread left it (or it ended): an ended saga is never compensated
    if type(frame) is SagaFrame:
        done = [(start, name) for start, name in frame.done if start >= 0]
        if done:
            return UndoFrame(frame.env, frame.ip, done[::-1])
    elif type(frame) is ScopeFrame:
        spec: bc.ScopeSpec = frame.spec
        if spec.on_cancel >= 0:
            return UndoFrame(frame.env, frame.ip, [(spec.on_cancel, f"on_cancel of scope {spec.name!r}")])
    return None


def _compensation_frame(frame: Frame | None) -> CompensationFrame | None:
    while frame is not None and type(frame) is not CompensationFrame:
        frame = frame.parent
    return frame


def _record(
    exc: BaseException, message: str, path: str, compensated: list[str], cause: dict[str, Any] | None
) -> dict[str, Any]:
    return {"type": error_name(exc), "message": message, "path": path, "compensated": compensated, "cause": cause}


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
    if type(m.out_effects) is not list:
        m.out_effects = []
    m.out_effects.append(_effect_request(m, eid, tok, ip, spec))
    if m.tl:
        m.emit("effect_requested", m.paths[ip], {"effect_id": eid, "name": spec.name})
    return -1


def _op_end(m: Interp, tok: Token, ip: int, arg: Any) -> int:
    frame = tok.frame
    unlink_thread(frame, tok)
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
    if spec.blocking:
        m.blocking[(_context(parent), ip)] = frame
    return starts[0]  # the splitting thread carries on into the first branch


def _op_par(m: Interp, tok: Token, ip: int, spec: bc.SplitSpec) -> int:
    if spec.blocking:  # WCP28/31: no new activation until every branch of the current one has ended
        current = m.blocking.get((_context(tok.frame), ip))
        if current is not None and current.alive and current.live > 0:
            tok.ip = ip
            tok.wk = WK_BLOCKED
            tok.wid = 0
            current.blocked.append(tok)
            m.trace_node("par_blocked", ip, token=tok.tid)
            return -1
    return _split(m, tok, ip, spec, spec.starts)


def _op_arrive(m: Interp, tok: Token, ip: int, arg: Any) -> int:
    return tok.frame.arrive(m, tok)


def _call_pred(m: Interp, tok: Token, ip: int, pred: Callable[..., Any], what: str) -> bool | None:
    try:
        return bool(pred(tok.env))
    except _PASS_THROUGH:
        raise
    except BaseException as exc:  # see _PASS_THROUGH
        name = getattr(pred, "__qualname__", "predicate")
        m.step_failed(tok.frame, ip, exc, f"{what} {name} raised {type(exc).__name__}: {exc}")
        return None


def _op_xor(m: Interp, tok: Token, ip: int, spec: bc.XorSpec) -> int:
    for i, pred in enumerate(spec.preds):
        hit = _call_pred(m, tok, ip, pred, "xor predicate")
        if hit is None:
            return -1
        if hit:
            m.trace_node("choice", ip, branches=[i])
            return spec.targets[i]
    if spec.default >= 0:
        m.trace_node("choice", ip, branches=["default"])
        return spec.default
    m.refuse(tok.frame, ip, "no xor branch matched and there is no default: add default=... or cover every case")
    return -1


def _op_multi_choice(m: Interp, tok: Token, ip: int, spec: bc.SplitSpec) -> int:
    chosen = []
    for i, pred in enumerate(spec.preds):
        hit = _call_pred(m, tok, ip, pred, "multi_choice predicate")
        if hit is None:
            return -1
        if hit:
            chosen.append(spec.starts[i])
    if not chosen:
        if spec.default < 0:
            m.refuse(tok.frame, ip, "no multi_choice branch matched and there is no default: add default=...")
            return -1
        chosen.append(spec.default)
    m.trace_node("choice", ip, branches=len(chosen))
    return _split(m, tok, ip, spec, chosen)


def _iterate(m: Interp, frame: LoopFrame, ip: int) -> bool:
    frame.iteration += 1
    limit = frame.spec.max_iterations
    if limit is not None and frame.iteration > limit:
        message = f"loop ran past max_iterations={limit}: raise the limit or fix the exit condition"
        m.refuse(frame, ip, message, LimitExceeded)
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
    hit = _call_pred(m, tok, ip, spec.pred, "loop while_")  # type: ignore[arg-type]
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
        hit = _call_pred(m, tok, ip, spec.pred, "loop until")  # type: ignore[arg-type]
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
    if spec.timeout is not None:
        tok.aux = _arm(m, ip, spec.timeout, tok)
    return -1


def _arm(m: Interp, ip: int, seconds: float, tok: Token) -> int:
    timer_id = m.next_timer
    m.next_timer = timer_id + 1
    m.timers[timer_id] = tok
    if type(m.out_timers) is not list:
        m.out_timers = []
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
                m.refuse(
                    tok.frame,
                    ip,
                    f"mi items function returned a {type(given).__name__}: return a list with one item per "
                    "instance (a str would start one instance per character)",
                )
                return -1
            if isinstance(given, AbstractSet):  # its order changes between processes (str hashing): so would the
                m.refuse(  # instances' items, their collected outputs and a durable case's replay
                    tok.frame,
                    ip,
                    f"mi items function returned a {type(given).__name__}, which has no order: return a list "
                    "(e.g. sorted(...)) so each instance gets the same item on every run",
                )
                return -1
            # read one past the limit at most: an endless or huge iterable fails below without being allocated
            limit = spec.max if spec.max is not None else m.max_instances
            items = list(islice(given, limit + 1))
            n = len(items)
        elif spec.count_fn is not None:
            n = spec.count_fn(env)
        else:
            n = spec.count or 0
    except _PASS_THROUGH:
        raise
    except BaseException as exc:  # see _PASS_THROUGH
        m.step_failed(tok.frame, ip, exc, f"mi count/items function raised {type(exc).__name__}: {exc}")
        return -1
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        m.refuse(tok.frame, ip, f"mi count function returned {n!r}: it must return an int >= 0")
        return -1
    if (spec.min is not None and n < spec.min) or (spec.max is not None and n > spec.max):
        got = f"more than {spec.max}" if items is not None and n > (spec.max or 0) else n
        m.refuse(tok.frame, ip, f"mi got {got} instances, outside min={spec.min} max={spec.max}", LimitExceeded)
        return -1
    if spec.need > 0 and n < spec.need and spec.until is None and not spec.dynamic:
        m.refuse(
            tok.frame,
            ip,
            f"mi join={spec.need} needs at least {spec.need} instance{'s' if spec.need > 1 else ''}, but the count "
            f"is {n}: its join could never fire; give fewer for join=, an until= condition, or dynamic=True",
        )
        return -1
    if spec.max is None and n > m.max_instances:
        m.refuse(
            tok.frame,
            ip,
            f"mi would start {f'{n:,} instances, more' if items is None else 'more instances'} than the limit of "
            f"{m.max_instances:,}: give the mi max=... "
            "(or the Substrate max_instances=...) if that many is meant",
            LimitExceeded,
        )
        return -1
    m.trace_node("mi_started", ip, instances=n)
    if n == 0 and not spec.dynamic:
        if spec.need not in (ALL, 0):  # an n join that nothing can reach (until= allowed the count): withdrawn
            frame = tok.frame
            unlink_thread(frame, tok)
            tok.alive = False
            m.trace_node("withdrawn", ip, reason="mi with no instances: its join can never be reached")
            frame.child_gone(m, tok, True)
            return -1
        if spec.collect is not None:  # join "all" (or None) over no instances: done at once
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
        if n == 0 and spec.dynamic != _OPEN:  # nothing runs in it: it must not keep the case open
            m.close(frame, withdrawn=False)  # (an open mi stays, taking instances, until close_instances)
        return spec.after
    unlink_thread(parent, tok)
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
    unlink_thread(frame, tok)
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
                message = f"critical({spec.name!r}) entered again inside itself: sections are not reentrant"
                m.refuse(tok.frame, ip, message)
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
    unlink_thread(frame, tok)
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
        message = f"call({spec.name!r}) exceeds the call depth limit {m.program.max_call_depth}"
        m.refuse(tok.frame, ip, message, LimitExceeded)
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
    """The innermost mi instance, call or net activation around `frame` (None: the case's root workflow)."""
    while frame is not None and not isinstance(frame, InstanceFrame | CallFrame | NetFrame):
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
        m.refuse(tok.frame, ip, f"complete_region({spec.name!r}) refused: {refused[1]}")
        return -1
    tok.ip = ip + 1
    m.complete_region(spec.name, acts)
    return ip + 1 if tok.alive else -1


def _dynamic_mi_at_step(m: Interp, tok: Token, ip: int, spec: bc.RegionStepSpec, what: str) -> MIFrame | None:
    acts = _region_activations(m, tok, spec)
    reason = f"region {spec.name!r} is not active now" if not acts else m.dynamic_mi_refusal(spec.name, acts)
    if reason is not None:
        m.refuse(tok.frame, ip, f"{what}({spec.name!r}) refused: {reason}")
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
        m.step_failed(tok.frame, ip, exc, f"add_instances items function raised {type(exc).__name__}: {exc}")
        return -1
    if isinstance(given, str | bytes | Mapping) or not isinstance(given, Sequence):
        m.refuse(tok.frame, ip, f"add_instances items function returned {type(given).__name__}: return a list of items")
        return -1
    frame = _dynamic_mi_at_step(m, tok, ip, spec, "add_instances")
    if frame is None:
        return -1
    reason = m.add_refusal(spec.name, frame, len(given))
    if reason is not None:
        m.refuse(tok.frame, ip, f"add_instances({spec.name!r}) refused: {reason}", LimitExceeded)
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


def _op_saga(m: Interp, tok: Token, ip: int, spec: bc.SagaSpec) -> int:
    frame = SagaFrame(tok.frame, tok.env, ip, spec)
    link(tok.frame, frame)
    m.move(tok, frame)
    return ip + 1


def _op_saga_step(m: Interp, tok: Token, ip: int, spec: bc.SagaStepSpec) -> int:
    frame = tok.frame
    assert type(frame) is SagaFrame
    frame.done.append((spec.compensation, spec.name))
    return ip + 1


def _op_handler_done(m: Interp, tok: Token, ip: int, arg: Any) -> int:
    """The end of an on_cancel, on_error or compensation branch."""
    frame = tok.frame
    if type(frame) is UndoFrame:  # undoing withdrawn work: the next compensation, once this one's threads ended
        unlink_thread(frame, tok)
        tok.alive = False
        if frame.live == 0:
            m.handler_finished(frame)
        return -1
    assert type(frame) is HandlerFrame
    return m.leave(tok, frame, frame.then)


def _op_task(m: Interp, tok: Token, ip: int, fn: Callable[..., Any]) -> int:
    """Inlined in both loops; here for completeness (and for a driver stepping one instruction)."""
    try:
        res = fn(tok.env)
    except _PASS_THROUGH:
        raise
    except BaseException as exc:  # see _PASS_THROUGH
        m.step_failed(tok.frame, ip, exc, f"task {m.program.labels[ip]} raised {type(exc).__name__}: {exc}")
        return -1
    if m.outputs is not None:
        if res is not None and not m.json_output(tok, ip, res):
            return -1
        m.outputs.append((ip, res))
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

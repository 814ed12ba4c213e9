"""The interpreter: one case's execution state, and the two hot loops that run it.

Everything here serves `Machine` (the front a driver sees, in `_machine.py`), the frames (`_records.py`), the
opcode handlers (`_ops.py`, and the nets' in `_net.py`) and withdrawal (`_withdraw.py`); a driver never
touches it. Arguments are trusted: the front checks them. The public methods are what the front and the
snapshots use; the private ones are the machinery the frames and handlers call.

The hot loop keeps the code, the current token, its instruction pointer and its data view in locals, inlines
TASK, JUMP and ARRIVE, and dispatches every other opcode through `HANDLERS`, the tuple of handlers indexed by
opcode that `_ops.py` writes out (an opcode without a handler fails at import). Two loops exist: `_run_fast`
(level `none`, FIFO scheduler: nothing per step but the step) and `_run_general` (tracing and/or a preemptive
scheduler). The choice is made once per `run()`.
"""

from __future__ import annotations

import gc
from collections import deque
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any, cast

from .. import _program as bc
from .._errors import StepFailed, WaitTimeout, effect_failure_text, error_name, error_text
from .._json import output_problem
from .._program import ALL, Op, Program
from ._events import LEVELS, VmEvent
from ._ops import HANDLERS, OPEN, PASS_THROUGH, context, effect_request, time_text
from ._records import (
    WK_BLOCKED,
    WK_LOCK,
    WK_MILESTONE,
    WK_NONE,
    WK_SIGNAL,
    WK_TIMER,
    CriticalFrame,
    Fifo,
    Frame,
    InstanceFrame,
    InterleaveFrame,
    MIFrame,
    MIStats,
    NoItem,
    PassFrame,
    RootFrame,
    SagaFrame,
    ScopeFrame,
    SplitFrame,
    Token,
    link,
    members,
    unlink,
    unlink_thread,
)
from ._requests import EffectRequest, TimerRequest
from ._result import RunStatus
from ._schedulers import DETERMINISTIC, Scheduler
from ._updates import UpdateState, buffer_id, can_take, drop_passed, passed, settle, state, take_waiting
from ._withdraw import (
    cancel_case,
    cancel_region,
    cancel_timer,
    compensate_withdrawn,
    compensation_done,
    complete_region,
    end,
    refuse,
    start_undo,
    step_failed,
    withdraw_children,
    withdraw_instances,
)

YIELDED = RunStatus.YIELDED
BLOCKED = RunStatus.BLOCKED
DONE = RunStatus.DONE
CANCELLED = RunStatus.CANCELLED
FAILED = RunStatus.FAILED

_TASK = int(Op.TASK)
_JUMP = int(Op.JUMP)
_ARRIVE = int(Op.ARRIVE)


_NO_EVENTS = cast("list[VmEvent]", ())  # the events of every untraced machine: never appended to (see Interp)
# The output of an mi instance that completed without returning anything: one shared empty dict, never written
# (case data changes only by returned updates). A million fresh ones would be a million objects in the outputs
# list for every pass of the cyclic collector to walk: the event loop would wait for each.
_EMPTY_OUT: dict[str, Any] = {}
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
        "compensated",
        "digest",
        "digest_hasher",
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
        "time",
        "timer_values",
        "tl",
        "updates",
        "waiters",
        "withdrawing",
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
        # Timers whose length the data gave (sleep(fn), sleep(until=), timeout=fn): timer id -> (seconds, epoch due
        # or None), as computed when the step started; entries of timers no longer armed are pruned (see _ops._arm).
        self.timer_values: dict[int, tuple[float, float | None]] = {}
        # The time the driver's inputs have reached (epoch seconds, given with each run: the vm keeps no clock),
        # which a due time from the data may be at most MAX_SECONDS after; None: not checked.
        self.time: float | None = None
        self.waiters: dict[str, Fifo] = {}  # of (token, wait id)
        self.buffered: dict[str, Fifo] = {}  # of (arrival seq, payload)
        self.updates: UpdateState | None = None  # made by the first update or check= (see _updates)
        # why threads are being withdrawn now, while an update is owed (see `_withdraw.drop`); not state: reset
        # after each burst
        self.withdrawing: str | None = None
        self.regions: dict[str, dict[Frame, None]] = {}
        self.locks: dict[str, CriticalFrame | None] = {}
        self.lock_waiters: dict[str, Fifo] = {}
        self.ms_active: dict[str, int] = {}
        self.ms_waiters: dict[str, Fifo] = {}
        self.closing: deque[tuple[Frame, bool]] | None = None  # closes queued while another runs (see close)
        self.cancelling = False  # a case cancel is compensating: a second cancel ends the case at once
        self.failing: tuple[int, BaseException, str, dict[str, Any]] | None = None  # an uncaught failure, undoing
        self.failure_record: dict[str, Any] | None = None  # the error record of a failed case
        self.compensated: tuple[str, ...] = ()  # cancelled: the steps the cancel's compensations undid, in order
        self.blocking: dict[tuple[Frame | None, int], SplitFrame] = {}  # (context, par ip) -> current activation
        # digesting: (ip, output) of the tasks since the last take, after a FoldedOutputs once run() encoded some
        self.outputs: list[Any] | None = None
        self.digest = ""  # the running digest of task outputs (see Machine.take_digest)
        self.digest_hasher: Any = None  # (FoldedOutputs, blake2b fed its pieces, pieces fed): see Machine._hasher
        # What the driver must start or stop after this burst. Most bursts have none: the lists are made when the
        # first request is and handed over by Machine.run, which puts NO_OUT back.
        self.out_effects: list[EffectRequest] = NO_OUT
        self.out_timers: list[TimerRequest] = NO_OUT
        self.out_cancel_effects: list[int] = NO_OUT
        self.out_cancel_timers: list[int] = NO_OUT
        self._spawn(self.root, 0, self.root_env)

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
                self._case_event("case_started")
            else:
                self._case_event("case_started", workflow=self.workflow)
        try:
            if self.tl == 0 and not self.scheduler.preemptive and self.outputs is None:
                steps = self._run_fast(quanta)
            else:
                steps = self._run_general(quanta)
        finally:
            if self.gc_paused:
                self.gc_paused = False
                gc.enable()
        self.steps += steps
        if self.updates is not None:
            if self.updates.owing:
                settle(self)
            if self.updates.ids:
                drop_passed(self)
            self.withdrawing = None
        if not self.ended:
            if self.ready:
                self.status = YIELDED
            else:
                self.status = BLOCKED
                self.awaiting = self.awaited_signals()
                if not self.awaiting and not self.effects and not self.timers and not self._open_instances():
                    self._deadlocked()
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

    def _unblock(self, split: SplitFrame) -> None:
        """Every branch of a blocking par's activation has ended: the threads waiting to re-enter it go on."""
        waiting, split.blocked = split.blocked, []
        for tok in waiting:
            if tok.alive and tok.wk == WK_BLOCKED:
                tok.wk = WK_NONE
                self.ready.append(tok)

    def _forget_blocking(self, split: SplitFrame) -> None:
        key = (context(split.parent), split.ip)
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

    def _open_instances(self) -> bool:
        """Whether an mi(dynamic="open") is waiting for instances (the case waits for an input, not deadlocked)."""
        return any(
            isinstance(frame, MIFrame) and frame.alive and frame.spec.dynamic == OPEN and not frame.closed
            for acts in self.regions.values()
            for frame in acts
        )

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
        end(self, FAILED, ip, StepFailed(self.paths[ip], message), message)

    # -- the hot loops ---------------------------------------------------------------------------------

    def _run_fast(self, quanta: int) -> int:
        code = self.code
        handlers = HANDLERS
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
                except PASS_THROUGH:
                    raise
                except BaseException as exc:  # see PASS_THROUGH
                    tok.ip = ip
                    label = self.program.labels[ip]
                    step_failed(self, tok.frame, ip, exc, f"task {label} raised {type(exc).__name__}: {exc}")
                    tok = None
                    continue
                if res is not None:
                    if env is root_env and type(res) is dict:
                        self.data.update(res)
                    elif not self._merge(tok, res, ip):
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

    def _run_general(self, quanta: int) -> int:
        code = (self.program.traced_code or self.code) if self.tl else self.code  # traced: net node starts recorded
        handlers = HANDLERS
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
                except PASS_THROUGH:
                    raise
                except BaseException as exc:  # see PASS_THROUGH
                    tok.ip = ip
                    step_failed(self, tok.frame, ip, exc, f"task {labels[ip]} raised {type(exc).__name__}: {exc}")
                    tok = None
                    continue
                if outputs is not None:  # a durable case: its data is journaled and replayed, so it must be JSON
                    if res is not None and not self._json_output(tok, ip, res):
                        tok = None
                        continue
                    outputs.append((ip, res))
                if res is not None:
                    if env is root_env and type(res) is dict:
                        self.data.update(res)
                    elif not self._merge(tok, res, ip):
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

    def _case_event(self, kind: str, **detail: Any) -> None:
        if self.tl:
            self.emit(kind, self.program.term.kind, detail)

    def _trace_node(self, kind: str, ip: int, **detail: Any) -> None:
        if self.tl:
            self.emit(kind, self.paths[ip], detail)

    def _spawn(self, frame: Frame | None, ip: int, env: Mapping[str, Any]) -> Token:
        assert frame is not None
        tok = Token(self.next_tid, ip, frame, env)
        self.next_tid += 1
        link(frame, tok)
        self.ready.append(tok)
        return tok

    def _move(self, tok: Token, frame: Frame) -> None:
        unlink_thread(tok.frame, tok)
        link(frame, tok)
        tok.frame = frame

    def _leave(self, tok: Token, frame: PassFrame, target: int) -> int:
        """The token leaves a pass-through frame normally and continues at `target`."""
        parent = frame.parent
        assert parent is not None
        unlink_thread(frame, tok)
        link(parent, tok)
        tok.frame = parent
        frame.exited = True
        if frame.count == 0:
            self._close(frame, withdrawn=False)
        else:
            self._detach_thread(frame)  # work the thread left behind runs on, detached
        return target

    def _detach_thread(self, frame: Frame) -> None:
        """`frame`'s thread went on into its parent (a token there stands for it): what remains is detached."""
        if frame.attached:
            frame.attached = False
            parent = frame.parent
            assert parent is not None
            parent.live -= 1

    def _end_thread(self, frame: Frame, *, withdrawn: bool) -> None:
        """`frame`'s thread ended (withdrawn, or every branch of it did): close it, or detach what remains."""
        if frame.count == 0:
            self._close(frame, withdrawn=withdrawn)
        elif frame.attached:
            frame.attached = False
            parent = frame.parent
            assert parent is not None
            parent.live -= 1
            if withdrawn:
                self._trace_node("withdrawn", frame.ip)
            parent.child_gone(self, frame, withdrawn)

    def _close(self, frame: Frame, *, withdrawn: bool) -> None:
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
                if (
                    withdrawn
                    and (type(frame) is SagaFrame or type(frame) is ScopeFrame)
                    and frame.alive
                    and compensate_withdrawn(self, frame)
                ):
                    pending.popleft()
                    continue
                if frame.alive:  # killed since it was queued (a region cancelled around it): nothing to do
                    frame.alive = False
                    frame.on_close(self)
                    parent = frame.parent
                    assert parent is not None
                    unlink(parent, frame)
                    if withdrawn:
                        self._trace_node("withdrawn", frame.ip)
                    parent.child_gone(self, frame, withdrawn)
                pending.popleft()
        except BaseException:
            pending.clear()
            raise

    # Withdrawal and compensation (`_withdraw.py`) as methods, for the frames: they sit below it, so they reach
    # it through the interpreter they are given.
    _start_undo = start_undo
    _compensation_done = compensation_done
    _withdraw_children = withdraw_children

    def _json_output(self, tok: Token, ip: int, res: Any) -> bool:
        """A durable case's task output must be JSON (its data is journaled and replayed): else a failure here."""
        problem = output_problem(res, "output")
        if problem is None:
            return True
        label = self.program.labels[ip] or "task"
        step_failed(
            self, tok.frame, ip, TypeError(problem),
            f"task {label} returned data that is not JSON ({problem}): a durable case keeps its data as JSON",
        )
        return False

    def _merge(self, tok: Token, res: Any, ip: int) -> bool:
        """Merge a step's updates into the data its token sees; a non-mapping fails the case."""
        if not isinstance(res, Mapping):
            step_failed(
                self,
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

    def _store(self, env: Mapping[str, Any], key: str, value: Any) -> None:
        if env is self.root_env:
            self.data[key] = value
        else:
            env.merge({key: value})  # type: ignore[attr-defined]

    # -- the end of the case (a failure is caught, or fails the case, in `_withdraw.py`) ------------------

    def _set_error(self, ip: int, exc: BaseException | None, message: str, record: dict[str, Any] | None) -> None:
        self.error, self.error_path, self.error_message = exc, self.paths[ip], message
        self.failure_record = record
        self._trace_node("case_failed", ip, error=message)

    def _finish_root(self) -> None:
        """The root frame is empty: the case is done if the root thread ended, else it was withdrawn."""
        if not self.ended:
            self._finish(DONE if self.root_ended else CANCELLED, "the root thread was withdrawn")

    def _finish(self, status: RunStatus, reason: str) -> None:
        self.ended = True
        self.status = status
        if not self.tl:
            pass  # (untraced: no event, and no detail dict built for one)
        elif status == DONE:
            self._case_event("case_done")
        elif status == CANCELLED:
            self._case_event("case_cancelled", reason=reason)
        self.ready.clear()
        self.waiters.clear()
        self.lock_waiters.clear()
        self.ms_waiters.clear()
        self.effects.clear()
        self.timers.clear()
        self.timer_values.clear()

    def _joined(self, frame: SplitFrame, first: bool) -> None:
        if self.tl and first:
            self.emit("join", self.paths[frame.ip], {"policy": frame.spec.policy, "arrived": frame.arrived})

    def _unregister_region(self, name: str, frame: Frame) -> None:
        acts = self.regions.get(name)
        if acts is not None:
            acts.pop(frame, None)

    def _release_lock(self, name: str) -> None:
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
        self._move(tok, frame)
        self.locks[name] = frame

    def _leave_milestone(self, name: str, ip: int) -> None:
        self.ms_active[name] -= 1
        self._trace_node("milestone", ip, name=name, event="left")

    def _interleave_next(self, frame: InterleaveFrame, tok: Token) -> int:
        """Pick the next branch the order allows and send `tok` there; leave when every branch is done."""
        spec: bc.InterleaveSpec = frame.spec
        done = frame.done
        eligible = [i for i in range(len(done)) if not done[i] and all(done[j] for j in spec.before[i])]
        if not eligible:
            return self._leave(tok, frame, spec.after)
        frame.current = eligible[self.scheduler.pick(len(eligible))]
        self._trace_node("choice", frame.ip, branch=frame.current)
        return spec.starts[frame.current]

    def _instance_ended(self, inst: InstanceFrame) -> None:
        """An mi instance's threads have all ended: it completed (a thread arrived) or was withdrawn."""
        mi: Any = inst.parent
        completed = inst.arrived > 0
        if completed:
            outputs = mi.outputs
            if outputs:  # (an mi without collect= keeps none)
                out = inst.out
                if out is None:
                    out = _EMPTY_OUT
                elif inst.count:  # work it left behind writes on into inst.out: collect what it is now
                    out = dict(out)  # (a copy only then: nothing else writes to an ended instance's output)
                outputs[inst.index] = out
            mi.completed += 1
            if self.tl:
                self._trace_node("mi_instance_done", mi.ip, index=inst.index)
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
        self._mi_check(mi, completed=completed)

    def _mi_check(self, mi: MIFrame, *, completed: bool = False) -> None:
        """After an instance ended (or the spawner finished, or the mi was closed): fire the join when its
        policy or `until` says so; withdraw the mi when nothing completed and nothing more can; close when empty.

        The n join (`first` is n = 1) fires at the n-th completion. When n can no longer be reached (no instance
        runs and none can be added) it fires once the running instances have ended, with what completed.
        """
        spec: bc.MISpec = mi.spec
        if mi.fired:  # (an open mi without synchronization fired at once: it stays until close_instances)
            if mi.count == 0 and mi.alive and (mi.closed or spec.dynamic != OPEN):
                self._close(mi, withdrawn=False)
            return
        spawning = mi.spawner is not None
        running = mi.live - spawning
        more = spawning or running > 0 or (spec.dynamic == OPEN and not mi.closed)
        until = False
        if completed and spec.until is not None:
            stats = MIStats(mi.started, mi.completed, mi.cancelled, running)
            try:
                until = bool(spec.until(stats))
            except PASS_THROUGH:
                raise
            except BaseException as exc:  # see PASS_THROUGH
                step_failed(self, mi, mi.ip, exc, f"mi until() raised {type(exc).__name__}: {exc}")
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
            self._end_thread(mi, withdrawn=True)
            return
        self._mi_fire(mi)

    def _mi_fire(self, mi: MIFrame) -> None:
        spec: bc.MISpec = mi.spec
        mi.fired = True
        mi.closed = True
        if spec.cancel_remaining and mi.count:
            mi.cancelled += withdraw_instances(self, mi, "mi join fired")
        tok = self._spawn(mi.parent, spec.after, mi.env)
        if spec.collect is not None:  # the list itself when no instance is left to write into it (no O(n) copy)
            self._store(mi.env, spec.collect, list(mi.outputs) if mi.count else mi.outputs)
        self._trace_node("mi_joined", mi.ip, completed=mi.completed, cancelled=mi.cancelled, token=tok.tid)
        if mi.count == 0:
            self._close(mi, withdrawn=False)
        else:
            self._detach_thread(mi)  # instances left running (no cancel_remaining) run on, detached

    def _spawn_instances(self, mi: MIFrame, items: Sequence[Any] | None, start: int, stop: int, item_base: int) -> None:
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
            if has_item:
                item = items[index - item_base]  # type: ignore[index]
                if type(item) is NoItem:  # (a count= instance queued before added ones)
                    inst = InstanceFrame(mi, ip, index, None, False)
                else:
                    inst = InstanceFrame(mi, ip, index, item, True)
            else:
                inst = InstanceFrame(mi, ip, index, None, False)
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

    def _pause_gc(self) -> None:
        """Pause the cyclic GC until this run() ends (a bulk spawn of instances is about to start).

        A bulk spawn allocates two records per instance and frees none: the GC would walk the growing heap
        again and again for nothing (a third of the time at 100,000 instances). The pause never outlives the
        run() that asked for it, so the event loop never runs with the GC paused.
        """
        if not self.gc_paused and gc.isenabled():
            gc.disable()
            self.gc_paused = True

    # -- inputs: applied as given; `Machine` has checked them ---------------------------------------

    cancel_case = cancel_case  # (these three are `_withdraw.py`'s functions, as methods for `Machine`)
    cancel_region = cancel_region
    complete_region = complete_region

    def signal(self, name: str, payload: Any, uid: str | None = None) -> None:
        """A signal arrives: wake the oldest waiter, else buffer it (persistent) or drop it (transient).

        `uid`: it is an update with that id (see `_updates`)."""
        queue = self.waiters.get(name)
        while queue:
            tok, wid = queue.popleft()
            if tok.alive and tok.wk == WK_SIGNAL and tok.wid == wid:
                if uid is None and not self.program.guarded:
                    self._wake(tok, name, payload)
                else:
                    take_waiting(self, tok, wid, queue, name, payload, uid)
                return
        if name in self.program.persistent_signals:
            if uid is not None and not can_take(self, name):  # the case has passed every wait for it
                passed(self, name, uid)
                return
            self.signal_seq += 1
            self.buffered.setdefault(name, Fifo()).append((self.signal_seq, payload))
            if uid is not None:
                buffer_id(self, name, uid)
            if self.tl:
                self.emit("signal_buffered", "", {"signal": name})
        else:
            if uid is not None:  # an update no thread takes: answered None, as a thread that goes on without a reply
                state(self).answers.append((uid, "answer", name, None))
            if self.tl:
                self.emit("signal_dropped", "", {"signal": name, "reason": "transient and nobody waits"})

    def _wake(self, tok: Token, name: str, payload: Any) -> None:
        op, spec = self.code[tok.ip]
        tok.wk = WK_NONE
        if tok.aux:  # a wait's timeout or a deferred choice's timer: the signal came first
            cancel_timer(self, tok.aux, tok.ip)
            tok.aux = 0
        if op == Op.WAIT:
            self._store(tok.env, spec.into, payload)
            tok.ip += 1
            self._trace_node("signal_consumed", tok.ip - 1, signal=name)
        else:
            self._store(tok.env, name, payload)
            self._trace_node("deferred_choice", tok.ip, chosen=name)
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
            self._trace_node("effect_failed", ip, effect_id=effect_id, type=error_name(error),
                             error=error_text(error))
            message = effect_failure_text(label, error)
            step_failed(self, tok.frame, ip, error, message)
            return True
        if output is not None and not self._merge(tok, output, ip):
            return True
        self._trace_node("effect_completed", ip, effect_id=effect_id, name=label)
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
        self._trace_node("timer_fired", tok.ip, timer_id=timer_id)
        op, spec = self.code[tok.ip]
        computed = self.timer_values.pop(timer_id, None)
        if tok.wk == WK_TIMER:
            tok.ip += 1
        elif op == Op.WAIT:  # nothing arrived in time: a failure at the wait
            tok.wk = WK_NONE
            tok.aux = 0
            if computed is not None and computed[1] is not None:  # deadline=
                message = f"wait({spec.signal!r}) saw no signal by its deadline {time_text(computed[1])}"
            else:
                seconds = spec.timeout if computed is None else computed[0]
                message = f"wait({spec.signal!r}) saw no signal within its timeout of {seconds:g}s"
            refuse(self, tok.frame, tok.ip, message, WaitTimeout)
            return True
        else:  # a deferred choice timed out: the signal branches are withdrawn
            self._trace_node("deferred_choice", tok.ip, chosen="timeout")
            tok.aux = 0
            tok.ip = spec.timeout_target
        tok.wk = WK_NONE
        self.ready.append(tok)
        return True

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

    def add_instances(self, frame: MIFrame, items: list[Any]) -> None:
        """Start one instance per item: a chunk now, the rest by the mi's spawner (as an mi starts its own), and
        all of them after the mi's instances still waiting to start."""
        n = len(items)
        base = frame.started + frame.pending  # every index handed out so far
        if frame.outputs or frame.spec.collect is not None:
            frame.outputs.extend([None] * n)
        if frame.pending:
            if frame.items is None:  # count= instances still to start: they keep their place, without items
                frame.items = [NoItem()] * frame.pending
            frame.items.extend(items)
            frame.pending += n
        else:
            first = min(n, bc.SPAWN_CHUNK)
            self._spawn_instances(frame, items, base, base + first, base)
            if n > first:
                frame.pending = n - first
                frame.items = items
                spawner = frame.spawner = Token(self.next_tid, frame.ip + 1, frame, frame.env)
                self.next_tid += 1
                link(frame, spawner)
                self.ready.append(spawner)
        self._trace_node("mi_instances_added", frame.ip, count=n)

    def close_instances(self, frame: MIFrame) -> None:
        frame.closed = True
        self._trace_node("mi_closed", frame.ip)
        self._mi_check(frame)

    def pending_requests(self) -> tuple[list[EffectRequest], list[TimerRequest]]:
        effects = []
        for eid, tok in self.effects.items():
            effects.append(effect_request(self, eid, tok, tok.ip, self.code[tok.ip][1]))
        timers = []
        for timer_id, tok in self.timers.items():
            computed = self.timer_values.get(timer_id)
            if computed is not None:
                timers.append(TimerRequest(timer_id, computed[0], self.paths[tok.ip], computed[1]))
                continue
            spec = self.code[tok.ip][1]
            seconds = spec.seconds if isinstance(spec, bc.SleepSpec) else spec.timeout
            timers.append(TimerRequest(timer_id, seconds, self.paths[tok.ip]))
        return effects, timers

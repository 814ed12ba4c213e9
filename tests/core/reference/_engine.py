"""The reference engine: runs threads over the activation tree until nothing can move.

Scheduling (the documented `Deterministic` order): ready threads run first-in first-out, each until it parks or
ends; a split carries the splitting thread into its first branch and queues the others in order; the thread
whose arrival fires a par join carries on after it, while a join fired by a withdrawal (or an mi join) starts a
new thread at the back of the queue. Everything a step wakes (a signal's waiter, a released lock, a handler) is
queued at the back.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Mapping
from datetime import datetime
from types import MappingProxyType
from typing import Any, NamedTuple

from wfsub._program import SPAWN_CHUNK  # how many instances a step starts: part of the order threads run in
from wfsub._terms import (
    MAX_SECONDS,
    MI,
    AddInstances,
    Call,
    CancelRegion,
    CloseInstances,
    CompleteRegion,
    Critical,
    Defer,
    Effect,
    Interleave,
    Loop,
    Milestone,
    MultiChoice,
    Net,
    Par,
    Saga,
    Scope,
    Seq,
    Sleep,
    Task,
    Term,
    Terminate,
    Wait,
    WhenMilestone,
    Xor,
    branch_name,
    child_path,
)

from . import _updates
from ._blocks import Block, Compensation, Instance, MIBlock, Pass, Root, Split, Thread, Undo
from ._blocks import Interleave as InterleaveBlock

ALL = -1
NO_ITEM: Any = object()  # in MIBlock.items: a count= instance queued before added ones


class Stats(NamedTuple):
    """What an mi `until=` predicate sees."""

    started: int
    completed: int
    cancelled: int
    active: int


class Failure(Exception):
    """A failure at a node, raised inside a step and routed by `Engine.fail`."""

    def __init__(self, type_name: str, path: str, message: str = "") -> None:
        super().__init__(message)
        self.type_name, self.path, self.message = type_name, path, message


def _need(join: Any) -> int:
    if join == "all":
        return ALL
    if join in ("first", "each"):
        return 1
    if join is None:
        return 0
    return int(join)


class Engine:
    """One case: the tree, the ready queue, what threads wait for, and the case outcome."""

    def __init__(self, term: Term, data: Mapping[str, Any] | None, library: Mapping[str, Term] | None,
                 max_call_depth: int = 100) -> None:
        self.data: dict[str, Any] = dict(data or {})
        self.view = MappingProxyType(self.data)
        self.library = dict(library or {})
        self.max_call_depth = max_call_depth
        self.ready: deque[Thread] = deque()
        self.root = Root(None, self.data, term.kind)
        self.status = "running"  # running, done, failed, cancelled
        self.error: tuple[str, str] | None = None  # (type, path) of a failed case
        self.root_ended = False
        self.cancelling = False
        self.failing: dict[str, Any] | None = None
        self.next_effect = 1
        self.next_timer = 1
        self.next_wid = 1
        self.effects: dict[int, Thread] = {}
        self.timers: dict[int, Thread] = {}
        self.lengths: dict[int, tuple[float, float | None]] = {}  # timer id -> (seconds, epoch due or None)
        self.waiters: dict[str, deque[tuple[Thread, int]]] = {}
        self.buffered: dict[str, deque[tuple[int, Any]]] = {}
        self.arrivals = 0
        self.locks: dict[str, Block | None] = {}
        self.lock_waiters: dict[str, deque[tuple[Thread, int]]] = {}
        self.ms_active: dict[str, int] = {}
        self.ms_waiters: dict[str, deque[tuple[Thread, int]]] = {}
        self.regions: dict[str, list[Block]] = {}
        self.blocking: dict[tuple[Any, str], Split] = {}
        self.signals: set[str] = set()
        self.persistent: set[str] = set()
        self.updates: set[str] = set()  # names an update can be sent to (a wait with reply=, a reply step)
        self.replies: set[str] = set()  # names a reply step answers
        self.owing: list[list[Any]] = []  # [thread, name, update id] (see _updates)
        self.buffer_ids: dict[int, str] = {}  # arrival number of a buffered update -> its id
        self.answers: list[tuple[str | None, str, str, Any]] = []
        self.region_names: set[str] = set()
        self.region_contexts: dict[str, set[str]] = {}
        self._survey(term, term.kind, "root")
        for name, sub in self.library.items():
            self._survey(sub, f"library[{name!r}].{sub.kind}", f"library[{name!r}]")
        self.spawn(self.root, [(term, term.kind)], self.data)

    # -- what the program declares -------------------------------------------------------------------

    def _survey(self, term: Any, path: str, context: str) -> None:
        """Signals, persistent signals and regions (with the mi body or workflow each is written in)."""
        stack = [(term, path, context)]
        while stack:
            t, p, ctx = stack.pop()
            if isinstance(t, Wait):
                self.signals.add(t.signal)
                if not t.transient:
                    self.persistent.add(t.signal)
                if t.reply is not None:
                    self.updates.add(t.signal)
            elif t.kind == "reply":
                self.updates.add(t.name)
                self.replies.add(t.name)
            elif isinstance(t, Defer):
                for name, _ in t.branches:
                    self.signals.add(name)
                    self.persistent.add(name)
            elif isinstance(t, Scope) or (isinstance(t, MI) and t.name is not None):
                self.region_names.add(t.name)
                self.region_contexts.setdefault(t.name, set()).add(ctx)
            for selector, child in t._children():
                inner = p if isinstance(t, MI | Net) else ctx
                stack.append((child, child_path(p, selector, child), inner))

    # -- threads ---------------------------------------------------------------------------------------

    def spawn(self, block: Block, stack: list[Any], env: Any) -> Thread:
        th = Thread(block, stack, env)
        block.add(th)
        self.ready.append(th)
        return th

    def move(self, th: Thread, block: Block, stack: list[Any]) -> None:
        th.block.remove(th)
        block.add(th)
        th.block = block
        th.stack = stack

    def env_view(self, env: Any) -> Mapping[str, Any]:
        return self.view if env is self.data else env  # type: ignore[no-any-return]

    def store(self, env: Any, updates: Mapping[str, Any]) -> None:
        if env is self.data:
            self.data.update(updates)
        else:
            env.write(updates)

    def merge(self, th: Thread, res: Any, path: str) -> None:
        if res is None:
            return
        if not isinstance(res, Mapping):
            raise Failure("TypeError", path, f"returned {type(res).__name__}")
        self.store(th.env, res)

    def call(self, fn: Callable[..., Any], arg: Any, path: str) -> Any:
        try:
            return fn(arg)
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:  # a step's own error is a failure at its node
            raise Failure(type(exc).__name__, path, str(exc)) from exc

    def run(self) -> None:
        """Run until nothing is ready; then settle (a deadlock fails the case)."""
        while self.ready and self.status == "running":
            th = self.ready.popleft()
            while th.alive and not th.park and self.status == "running":
                try:
                    self.step(th)
                except Failure as f:
                    self.fail(th.block, f.type_name, f.path, f.message)
                    break
        idle = not self.awaited() and not self.effects and not self.timers and not self.open_mi()
        if self.status == "running" and idle:
            self.deadlock()
        if self.owing:
            _updates.settle(self)

    def awaited(self) -> list[str]:
        return sorted({name for name, q in self.waiters.items() for th, wid in q if self.waiting(th, "signal", wid)})

    @staticmethod
    def waiting(th: Thread, park: str, wid: int) -> bool:
        return th.alive and th.park == park and th.wid == wid

    def open_mi(self) -> bool:
        return any(
            isinstance(b, MIBlock) and b.alive and b.term.dynamic == "open" and not b.closed
            for acts in self.regions.values() for b in acts
        )

    def deadlock(self) -> None:
        stuck: list[str] = []
        for queues, park in ((self.lock_waiters, "lock"), (self.ms_waiters, "milestone")):
            for q in queues.values():
                stuck.extend(th.at[1] for th, wid in q if self.waiting(th, park, wid))
        for split in self.blocking.values():
            stuck.extend(th.at[1] for th in split.blocked if th.alive)
        self.end("failed", ("StepFailed", stuck[0] if stuck else self.root.path))

    def end(self, status: str, error: tuple[str, str] | None = None) -> None:
        if self.status != "running":
            return
        self.kill_all()
        self.status = status
        self.error = error

    def kill_all(self) -> None:
        dead: list[Block] = []
        self.kill_tree(self.root, False, dead)
        for b in dead:
            self.on_close(b)
        self.ready.clear()

    # -- one step of a thread ----------------------------------------------------------------------------

    def step(self, th: Thread) -> None:
        if not th.stack:
            self.block_end(th)
            return
        item = th.stack.pop()
        if isinstance(item[0], str):
            self.marker(th, item)
            return
        t, path = item
        handler = getattr(self, "do_" + t.kind)
        handler(th, t, path)

    def push(self, th: Thread, t: Any, path: str, selector: str) -> None:
        th.stack.append((t, child_path(path, selector, t)))

    def marker(self, th: Thread, item: tuple[Any, ...]) -> None:
        kind = item[0]
        if kind == "saga_step":  # a saga's action completed: its compensation is now due on withdrawal
            block = th.block
            assert isinstance(block, Pass)
            block.done.append(item[1])
        elif kind == "finally":  # the scope's thread goes on after it: finally_ first, as a handler
            t, path = item[1], item[2]
            handler = Pass(th.block, th.env, path, [], "handler")
            handler.then = th.stack
            th.block.add(handler)
            self.move(th, handler, [(t.finally_, child_path(path, "finally", t.finally_))])
        elif kind == "loop_test":
            self.loop_test(th, item[1], item[2])
        elif kind == "mi_spawn":
            self.mi_spawn(th, item[1])
        else:
            raise AssertionError(kind)

    def do_task(self, th: Thread, t: Task, path: str) -> None:
        self.merge(th, self.call(t.fn, self.env_view(th.env), path), path)

    def do_seq(self, th: Thread, t: Seq, path: str) -> None:
        for i in reversed(range(len(t.steps))):
            self.push(th, t.steps[i], path, str(i))

    def do_xor(self, th: Thread, t: Xor, path: str) -> None:
        for i, (pred, branch) in enumerate(t.cases):
            if self.call(pred, self.env_view(th.env), path):
                self.push(th, branch, path, str(i))
                return
        if t.default is None:
            raise Failure("StepFailed", path, "no xor branch matched")
        self.push(th, t.default, path, "default")

    def do_par(self, th: Thread, t: Par, path: str) -> None:
        if t.blocking:
            current = self.blocking.get((self.context(th.block), path))
            if current is not None and current.alive and current.threads > 0:
                th.park, th.wid, th.at = "blocked", 0, (t, path)
                current.blocked.append(th)
                return
        branches = [(b, child_path(path, str(i), b)) for i, b in enumerate(t.branches)]
        self.split(th, t, path, branches, _need(t.join), t.join == "each", t.cancel_remaining, t.blocking)

    def do_multi_choice(self, th: Thread, t: MultiChoice, path: str) -> None:
        chosen = []
        for i, (pred, branch) in enumerate(t.cases):
            if self.call(pred, self.env_view(th.env), path):
                chosen.append((branch, child_path(path, str(i), branch)))
        if not chosen:
            if t.default is None:
                raise Failure("StepFailed", path, "no multi_choice branch matched")
            chosen.append((t.default, child_path(path, "default", t.default)))
        self.split(th, t, path, chosen, ALL, False, False, False)

    def split(self, th: Thread, t: Any, path: str, branches: list[tuple[Any, str]], need: int, each: bool,
              cancel_remaining: bool, blocking: bool) -> None:
        parent = th.block
        block = Split(parent, th.env, path, th.stack, need, each, cancel_remaining, blocking)
        parent.add(block)
        self.move(th, block, [branches[0]])
        for b in branches[1:]:
            self.spawn(block, [b], th.env)
        if blocking:
            self.blocking[(self.context(parent), path)] = block

    def do_loop(self, th: Thread, t: Loop, path: str) -> None:
        if t.times is not None and t.times == 0:
            return
        block = self.open_pass(th, path, "loop", t)
        if t.while_ is not None:
            th.stack.append(("loop_test", t, path))
            return
        self.iterate(block, t, path)
        self.push(th, t.body, path, "")

    def iterate(self, block: Pass, t: Loop, path: str) -> None:
        block.iteration += 1
        if t.max_iterations is not None and block.iteration > t.max_iterations:
            raise Failure("LimitExceeded", path, "max_iterations")

    def loop_test(self, th: Thread, t: Loop, path: str) -> None:
        block = th.block
        assert isinstance(block, Pass)
        if not self.call(t.while_, self.env_view(th.env), path):
            self.leave(th, block)
            return
        self.iterate(block, t, path)
        th.stack.append(("loop_test", t, path))
        self.push(th, t.body, path, "")

    def loop_end(self, th: Thread, block: Pass) -> None:
        t: Loop = block.term
        path = block.path
        if t.while_ is not None:
            self.loop_test(th, t, path)
            return
        if t.until is not None:
            if self.call(t.until, self.env_view(th.env), path):
                self.leave(th, block)
                return
        elif block.iteration >= t.times:
            self.leave(th, block)
            return
        self.iterate(block, t, path)
        self.push(th, t.body, path, "")

    def open_pass(self, th: Thread, path: str, role: str, term: Any) -> Pass:
        parent = th.block
        block = Pass(parent, th.env, path, th.stack, role, term)
        parent.add(block)
        self.move(th, block, [])
        return block

    def do_scope(self, th: Thread, t: Scope, path: str) -> None:
        block = self.open_pass(th, path, "scope", t)
        if t.finally_ is not None:  # every way on after the scope runs finally_ first
            block.k = [*block.k, ("finally", t, path)]
        self.regions.setdefault(t.name, []).append(block)
        self.push(th, t.body, path, "")

    def do_saga(self, th: Thread, t: Saga, path: str) -> None:
        self.open_pass(th, path, "saga", t)
        for i in reversed(range(len(t.steps))):
            step = t.steps[i]
            action, comp = step if isinstance(step, tuple) else (step, None)
            if comp is not None:
                where = f"{i}.compensation"
                name = branch_name(comp) or child_path(path, where, comp)
                th.stack.append(("saga_step", (comp, child_path(path, where, comp), name)))
            self.push(th, action, path, str(i))

    def do_critical(self, th: Thread, t: Critical, path: str) -> None:
        holder = self.locks.get(t.name)
        if holder is not None:
            b: Block | None = th.block
            while b is not None:
                if b is holder:
                    raise Failure("StepFailed", path, "critical section entered again inside itself")
                b = b.parent
            wid = self.next_wid
            self.next_wid += 1
            th.park, th.wid, th.at = "lock", wid, (t, path)
            self.lock_waiters.setdefault(t.name, deque()).append((th, wid))
            return
        self.enter_critical(th, t, path)

    def enter_critical(self, th: Thread, t: Critical, path: str) -> None:
        self.locks[t.name] = self.open_pass(th, path, "critical", t)
        self.push(th, t.body, path, "")

    def do_milestone(self, th: Thread, t: Milestone, path: str) -> None:
        self.open_pass(th, path, "milestone", t)
        self.ms_active[t.name] = self.ms_active.get(t.name, 0) + 1
        q = self.ms_waiters.get(t.name)
        while q:
            waiter, wid = q.popleft()
            if self.waiting(waiter, "milestone", wid):
                waiter.park = ""
                wt, wpath = waiter.at
                self.push(waiter, wt.branch, wpath, "")
                self.ready.append(waiter)
        self.push(th, t.body, path, "")

    def do_when_milestone(self, th: Thread, t: WhenMilestone, path: str) -> None:
        active = self.ms_active.get(t.name)
        if active:
            self.push(th, t.branch, path, "")
        elif active is None:  # never reached yet: wait for it
            wid = self.next_wid
            self.next_wid += 1
            th.park, th.wid, th.at = "milestone", wid, (t, path)
            self.ms_waiters.setdefault(t.name, deque()).append((th, wid))
        else:  # reached and passed: this thread is withdrawn
            self.thread_withdrawn(th)

    def thread_withdrawn(self, th: Thread) -> None:
        block = th.block
        block.remove(th)
        th.alive = False
        self.child_gone(block, th, True)

    def do_call(self, th: Thread, t: Call, path: str) -> None:
        depth = 1
        b: Block | None = th.block
        while b is not None:
            if isinstance(b, Pass) and b.role == "call":
                depth = b.iteration + 1
                break
            b = b.parent
        if depth > self.max_call_depth:
            raise Failure("LimitExceeded", path, "call depth")
        block = self.open_pass(th, path, "call", t)
        block.iteration = depth
        sub = self.library[t.name]
        th.stack.append((sub, f"library[{t.name!r}].{sub.kind}"))

    def do_terminate(self, th: Thread, t: Terminate, path: str) -> None:
        self.root_ended = True
        self.end("done")

    def do_interleave(self, th: Thread, t: Interleave, path: str) -> None:
        names: dict[str, int] = {}
        for i, b in enumerate(t.branches):
            n = branch_name(b)
            if n is not None:
                names.setdefault(n, i)
        before: list[set[int]] = [set() for _ in t.branches]
        for a, b in t.order:
            before[b if isinstance(b, int) else names[b]].add(a if isinstance(a, int) else names[a])
        parent = th.block
        block = InterleaveBlock(parent, th.env, path, th.stack, t, before)
        parent.add(block)
        self.move(th, block, [])
        self.interleave_next(th, block)

    def interleave_next(self, th: Thread, block: InterleaveBlock) -> None:
        done = block.done
        eligible = [i for i in range(len(done)) if not done[i] and all(done[j] for j in block.before[i])]
        if not eligible:
            self.leave(th, block)
            return
        block.current = eligible[0]
        b = block.term.branches[block.current]
        th.stack = [(b, child_path(block.path, str(block.current), b))]

    def do_mi(self, th: Thread, t: MI, path: str) -> None:
        env = self.env_view(th.env)
        items: list[Any] | None = None
        if t.items is not None:
            given = self.call(t.items, env, path)
            if isinstance(given, str | bytes | Mapping):
                raise Failure("StepFailed", path, "items returned a str or mapping")
            items = list(given)
            n = len(items)
        elif callable(t.count):
            n = self.call(t.count, env, path)
        else:
            n = t.count or 0
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise Failure("StepFailed", path, "count must be an int >= 0")
        if (t.min is not None and n < t.min) or (t.max is not None and n > t.max):
            raise Failure("LimitExceeded", path, "count outside min/max")
        need = _need(t.join)
        if need > 0 and n < need and t.until is None and not t.dynamic:
            raise Failure("StepFailed", path, "count below the join's n")
        if n == 0 and not t.dynamic:
            if need not in (ALL, 0):  # an n join nothing can reach (until= allowed it): withdrawn
                self.thread_withdrawn(th)
                return
            if t.collect is not None:
                self.store(th.env, {t.collect: []})
            return
        parent = th.block
        block = MIBlock(parent, th.env, path, th.stack, t, need)
        parent.add(block)
        if t.name is not None:
            self.regions.setdefault(t.name, []).append(block)
        block.outputs = [None] * n
        first = min(n, SPAWN_CHUNK)
        self.start_instances(block, items, 0, first)
        if n > first:  # the rest start a chunk at a time, each chunk queued behind the one before
            block.pending, block.items = n - first, items
            block.spawner = self.spawn(block, [("mi_spawn", block)], th.env)
        if need == 0:  # no synchronization: the thread goes on; the mi is detached work
            block.fired = True
            self.detach(block)
            if n == 0 and t.dynamic != "open":
                self.close(block, False)
            return
        parent.remove(th)
        th.alive = False
        if n == 0:
            self.mi_check(block)

    def start_instances(self, block: MIBlock, items: list[Any] | None, start: int, stop: int, base: int = 0) -> None:
        """Start instances start..stop-1; instance i gets items[i - base] (none without items, or for NO_ITEM)."""
        body = block.term.body
        for index in range(start, stop):
            item = items[index - base] if items is not None else NO_ITEM
            inst = Instance(block, index, None if item is NO_ITEM else item, item is not NO_ITEM)
            block.add(inst)
            self.spawn(inst, [(body, child_path(block.path, "", body))], inst)
        block.started += stop - start

    def do_effect(self, th: Thread, t: Effect, path: str) -> None:
        eid = self.next_effect
        self.next_effect += 1
        self.effects[eid] = th
        th.park, th.wid, th.at = "effect", eid, (t, path)

    # start_case and signal_case act on other cases, which is the runtime's: to a case they are effects at their
    # node (the driver answers them with the child's result or id, or the signal's acceptance, or an error).
    def do_start_case(self, th: Thread, t: Any, path: str) -> None:
        self.do_effect(th, t, path)

    def do_signal_case(self, th: Thread, t: Any, path: str) -> None:
        self.do_effect(th, t, path)

    def do_sleep(self, th: Thread, t: Sleep, path: str) -> None:
        if t.until is not None:
            length: tuple[float, float | None] = (0.0, self.epoch(th, t.until, path))
        else:
            length = (self.seconds(th, t.seconds, path, positive=False), None)
        th.park, th.wid, th.at = "timer", self.arm(th, length), (t, path)

    def arm(self, th: Thread, length: tuple[float, float | None]) -> int:
        tid = self.next_timer
        self.next_timer += 1
        self.timers[tid] = th
        self.lengths[tid] = length
        return tid

    # Timers from data, written from the contract, not from the vm: a number of seconds (finite, >= 0, > 0 for a
    # wait's timeout, at most MAX_SECONDS); a point in time as epoch seconds or an ISO 8601 string with a timezone.

    def seconds(self, th: Thread, value: Any, path: str, *, positive: bool) -> float:
        if not callable(value):
            return float(value)
        got = self.call(value, self.env_view(th.env), path)
        number = isinstance(got, int | float) and not isinstance(got, bool) and math.isfinite(got)
        if not number or got < 0 or (positive and got == 0) or got > MAX_SECONDS:
            raise Failure("StepFailed", path, f"timer length {got!r}")
        return float(got)

    def epoch(self, th: Thread, fn: Any, path: str) -> float:
        got = self.call(fn, self.env_view(th.env), path)
        if isinstance(got, int | float) and not isinstance(got, bool) and math.isfinite(got):
            return float(got)
        when = None
        if isinstance(got, str):
            try:
                when = datetime.fromisoformat(got)
            except ValueError:
                when = None
        elif isinstance(got, datetime):
            when = got
        if when is None or when.utcoffset() is None:
            raise Failure("StepFailed", path, f"timer time {got!r}")
        return when.timestamp()

    @staticmethod
    def check(t: Any, name: str, env: Any, payload: Any) -> str | None:
        """The check= of a wait (or of a defer's branch `name`) on the thread's data and the payload: a refusal or
        None. A check that raises or returns something else than None or a str refuses too."""
        fn = t.check if isinstance(t, Wait) else dict(t.check or ()).get(name)
        if fn is None:
            return None
        try:
            said = fn(env, payload)
        except Exception as exc:
            return f"check raised {exc!r}"
        return said if said is None or isinstance(said, str) else f"check returned {said!r}"

    def do_wait(self, th: Thread, t: Wait, path: str) -> None:
        q = None if t.transient else self.buffered.get(t.signal)
        while q:  # the oldest buffered signal its check takes; refused ones are dropped
            seq, payload = q.popleft()
            uid = self.buffer_ids.pop(seq, None)
            if self.check(t, t.signal, th.env, payload) is None:
                self.store(th.env, {t.into or t.signal: payload})
                if uid is not None:
                    _updates.took(self, th, t, path, t.signal, uid)
                return
            if uid is not None:
                self.answers.append((uid, "refused", t.signal, None))
        timeout = None if t.timeout is None else self.seconds(th, t.timeout, path, positive=True)  # only to park
        self.park_signal(th, t, path, [t.signal])
        if timeout is not None:
            th.timeout = self.arm(th, (timeout, None))

    def do_defer(self, th: Thread, t: Defer, path: str) -> None:
        while True:
            best: tuple[int, int] | None = None
            for i, (name, _) in enumerate(t.branches):
                q = self.buffered.get(name)
                if q and (best is None or q[0][0] < best[0]):
                    best = (q[0][0], i)
            if best is None:
                break
            name, branch = t.branches[best[1]]
            seq, payload = self.buffered[name].popleft()
            uid = self.buffer_ids.pop(seq, None)
            if self.check(t, name, th.env, payload) is not None:
                if uid is not None:
                    self.answers.append((uid, "refused", name, None))
                continue  # refused: dropped, the earliest of the rest decides
            self.store(th.env, {name: payload})
            self.push(th, branch, path, name)
            if uid is not None:
                _updates.took(self, th, t, path, name, uid)
            return
        timeout = None if t.timeout is None else self.seconds(th, t.timeout, path, positive=False)  # only to park
        self.park_signal(th, t, path, [name for name, _ in t.branches])
        if timeout is not None:
            th.timeout = self.arm(th, (timeout, None))

    def do_reply(self, th: Thread, t: Any, path: str) -> None:
        """A reply step answers the update the thread owes under its name (see _updates); else it passes by."""
        _updates.do_reply(self, th, t, path)

    def park_signal(self, th: Thread, t: Any, path: str, names: list[str]) -> None:
        wid = self.next_wid
        self.next_wid += 1
        th.park, th.wid, th.at = "signal", wid, (t, path)
        for name in names:
            self.waiters.setdefault(name, deque()).append((th, wid))

    def context(self, block: Block | None) -> Block | None:
        """The innermost mi instance or call around `block` (None: the root workflow)."""
        while block is not None and not isinstance(block, Instance) and not (
            isinstance(block, Pass) and block.role == "call"
        ):
            block = block.parent
        return block

    def step_regions(self, th: Thread, name: str, path: str) -> list[Block]:
        """The activation the step runs in, if it runs inside one (within its own workflow); else those in its own
        mi instance and call when the region is written in the step's mi body or workflow; else all."""
        acts = [b for b in self.regions.get(name, []) if b.alive]
        block: Block | None = th.block
        while acts and block is not None and not (isinstance(block, Pass) and block.role == "call"):
            if any(b is block for b in acts):
                return [block]
            block = block.parent
        here_ctx = self.term_context(path)
        if acts and self.region_contexts.get(name, set()) == {here_ctx}:
            here = self.context(th.block)
            acts = [b for b in acts if self.context(b.parent) is here]
        return acts

    @staticmethod
    def term_context(path: str) -> str:
        """The mi body or workflow a node path is written in (the innermost `.mi.` or `library[...]` prefix)."""
        best = "root"
        parts = path.split(".")
        for i in range(len(parts)):
            prefix = ".".join(parts[: i + 1])
            if parts[i].startswith("mi") and (parts[i] == "mi" or parts[i].startswith("mi[")) and i + 1 < len(parts):
                best = prefix
            elif i == 0 and prefix.startswith("library["):
                best = prefix.split(".")[0]
        return best

    def do_cancel_region(self, th: Thread, t: CancelRegion, path: str) -> None:
        acts = self.step_regions(th, t.name, path)
        if acts:
            self.cancel_region(acts)

    def do_complete_region(self, th: Thread, t: CompleteRegion, path: str) -> None:
        acts = self.step_regions(th, t.name, path)
        if not acts:
            return
        if self.complete_refused(acts):
            raise Failure("StepFailed", path, "complete_region refused")
        self.complete_region(acts)

    def do_add_instances(self, th: Thread, t: AddInstances, path: str) -> None:
        given = self.call(t.items, self.env_view(th.env), path)
        if isinstance(given, str | bytes | Mapping) or not isinstance(given, list | tuple):
            raise Failure("StepFailed", path, "items must be a list")
        block = self.dynamic_at_step(th, t.name, path)
        if block.term.max is not None and block.started + len(given) > block.term.max:
            raise Failure("LimitExceeded", path, "add_instances past max")
        self.add_instances(block, list(given))

    def do_close_instances(self, th: Thread, t: CloseInstances, path: str) -> None:
        self.close_instances(self.dynamic_at_step(th, t.name, path))

    def dynamic_at_step(self, th: Thread, name: str, path: str) -> MIBlock:
        acts = self.step_regions(th, name, path)
        if not acts or self.dynamic_refused(acts):
            raise Failure("StepFailed", path, "refused")
        block = acts[0]
        assert isinstance(block, MIBlock)
        return block

    @staticmethod
    def complete_refused(acts: list[Block]) -> bool:
        return any(isinstance(b, MIBlock) and b.fired for b in acts)

    @staticmethod
    def dynamic_refused(acts: list[Block]) -> bool:
        b = acts[0]
        return not isinstance(b, MIBlock) or not b.term.dynamic or len(acts) > 1 or b.closed

    def do_net(self, th: Thread, t: Net, path: str) -> None:
        raise NotImplementedError("the reference does not cover net")

    # -- the end of a thread's code in its block -----------------------------------------------------------

    def block_end(self, th: Thread) -> None:
        block = th.block
        if isinstance(block, Root):
            block.remove(th)
            th.alive = False
            self.root_ended = True
            self.child_gone(block, th, False)
        elif isinstance(block, Split):
            self.arrive(th, block)
        elif isinstance(block, Instance):
            block.remove(th)
            th.alive = False
            block.arrived += 1
            if block.threads == 0:
                self.instance_ended(block)
        elif isinstance(block, InterleaveBlock):
            block.done[block.current] = True
            block.arrived += 1
            if len(block.kids) > 1:  # work this branch left behind still runs: wait for it
                th.park = "interleave"
                block.parked = th
                return
            self.interleave_next(th, block)
        elif isinstance(block, Undo):
            block.remove(th)
            th.alive = False
            if block.threads == 0:
                self.handler_finished(block)
        elif isinstance(block, Pass):
            if block.role == "loop":
                self.loop_end(th, block)
            else:
                self.leave(th, block)
        else:
            raise AssertionError(block)

    def leave(self, th: Thread, block: Pass | InterleaveBlock) -> None:
        """The thread leaves a block it passed through and resumes what it had outside."""
        parent = block.parent
        assert parent is not None
        k = block.then if isinstance(block, Pass) and block.role == "handler" else block.k
        self.move(th, parent, list(k))  # a copy: each thread leaving (a multi-merge's) pops its own
        block.exited = True
        if not block.kids:
            self.close(block, False)
        else:
            self.detach(block)

    def arrive(self, th: Thread, block: Split) -> None:
        block.remove(th)
        block.arrived += 1
        if block.each or (
            not block.fired
            and (block.threads == 0 if block.need == ALL else (block.arrived >= block.need or block.threads == 0))
        ):
            parent = block.parent
            assert parent is not None
            block.fired = True
            parent.add(th)  # the arriving thread carries on after the join
            th.block = parent
            th.stack = list(block.k)
            if block.cancel_remaining and block.kids:
                self.withdraw_inside(block, True, ("quiet",))
            self.settle(block, replaced=True)
            return
        th.alive = False
        self.settle(block, replaced=False)

    def settle(self, block: Split, *, replaced: bool) -> None:
        if block.blocked and block.threads == 0:
            self.unblock(block)
        if not block.kids:
            self.close(block, False)
        elif block.attached and block.fired and (not block.each or block.threads == 0):
            if replaced:
                self.detach(block)
            else:
                self.end_thread(block, False)

    def unblock(self, block: Split) -> None:
        waiting, block.blocked = block.blocked, []
        for th in waiting:
            if th.alive and th.park == "blocked":
                th.park = ""
                th.stack.append(th.at)
                self.ready.append(th)

    def instance_ended(self, inst: Instance) -> None:
        mi = inst.parent
        assert isinstance(mi, MIBlock)
        completed = inst.arrived > 0
        if completed:
            # a copy as the thread ends: work the instance left behind may write on into inst.out
            mi.outputs[inst.index] = dict(inst.out) if inst.out is not None else {}
            mi.completed += 1
        else:
            mi.cancelled += 1
        if not inst.kids:
            inst.alive = False
            mi.remove(inst)
        else:  # work it left behind runs on, detached
            inst.attached = False
            mi.threads -= 1
        self.mi_check(mi, completed=completed)

    def mi_spawn(self, th: Thread, mi: MIBlock) -> None:
        """A big mi's spawner: start the next chunk; queue again behind it while instances are left to start."""
        start = mi.started
        stop = start + min(mi.pending, SPAWN_CHUNK)
        items = mi.items  # the items of the last len(items) indexes handed out
        self.start_instances(mi, items, start, stop, len(mi.outputs) - len(items) if items is not None else 0)
        mi.pending -= stop - start
        mi.remove(th)
        th.alive = False
        if mi.pending:
            mi.spawner = self.spawn(mi, [("mi_spawn", mi)], th.env)
            return
        mi.spawner, mi.items = None, None
        self.mi_check(mi)

    def mi_check(self, mi: MIBlock, *, completed: bool = False) -> None:
        t: MI = mi.term
        if mi.fired:
            if not mi.kids and mi.alive and (mi.closed or t.dynamic != "open"):
                self.close(mi, False)
            return
        spawning = mi.spawner is not None
        running = mi.threads - spawning
        more = spawning or running > 0 or (t.dynamic == "open" and not mi.closed)
        until = False
        if completed and t.until is not None:
            try:
                until = bool(self.call(t.until, Stats(mi.started, mi.completed, mi.cancelled, running), mi.path))
            except Failure as f:
                self.fail(mi, f.type_name, f.path, f.message)
                return
        fire = until or (not more if mi.need == ALL else (mi.completed >= mi.need or not more))
        if not fire:
            return
        if not until and not more and mi.completed == 0 and (mi.started > 0 or mi.need != ALL):
            mi.fired = mi.closed = True  # nothing completed and nothing can: the mi's thread is withdrawn
            self.end_thread(mi, True)
            return
        self.mi_fire(mi)

    def mi_fire(self, mi: MIBlock, compensate: bool = True) -> None:
        mi.fired = mi.closed = True
        if (mi.term.cancel_remaining or not compensate) and mi.kids:
            spawning = mi.spawner is not None
            mi.spawner, mi.items, mi.pending = None, None, 0
            mi.cancelled += self.withdraw_inside(mi, compensate, ("quiet",), keep_running=not compensate) - spawning
        parent = mi.parent
        assert parent is not None
        self.spawn(parent, list(mi.k), mi.env)
        if mi.term.collect is not None:
            self.store(mi.env, {mi.term.collect: list(mi.outputs)})
        if not mi.kids:
            self.close(mi, False)
        else:
            self.detach(mi)

    def add_instances(self, mi: MIBlock, items: list[Any]) -> None:
        """A chunk starts now, the rest by the mi's spawner; all after the instances still waiting to start."""
        base = len(mi.outputs)
        mi.outputs.extend([None] * len(items))
        if mi.pending:
            mi.items = [*(mi.items if mi.items is not None else [NO_ITEM] * mi.pending), *items]
            mi.pending += len(items)
            return
        first = min(len(items), SPAWN_CHUNK)
        self.start_instances(mi, items, base, base + first, base)
        if len(items) > first:
            mi.pending, mi.items = len(items) - first, items
            mi.spawner = self.spawn(mi, [("mi_spawn", mi)], mi.env)

    def close_instances(self, mi: MIBlock) -> None:
        mi.closed = True
        self.mi_check(mi)

    # -- blocks closing, threads ending (see the module docstring of _blocks) ------------------------------

    def detach(self, block: Block) -> None:
        """`block`'s thread went on outside it: what remains inside is detached work."""
        if block.attached:
            block.attached = False
            assert block.parent is not None
            block.parent.threads -= 1

    def end_thread(self, block: Block, withdrawn: bool) -> None:
        if not block.kids:
            self.close(block, withdrawn)
        elif block.attached:
            self.detach(block)
            assert block.parent is not None
            self.child_gone(block.parent, block, withdrawn)

    def close(self, block: Block, withdrawn: bool) -> None:
        if withdrawn and isinstance(block, Pass) and block.role in ("saga", "scope") and block.alive:
            undo = self.undo_for(block, block.role == "saga")  # a scope: only its finally_
            if undo is not None:  # withdrawn from inside before it ended: compensate in its place
                block.alive = False
                parent = block.parent
                assert parent is not None
                parent.remove(block)
                comp = Compensation(parent, block.env, block.path, ("withdrawn",))
                comp.attached = block.attached
                parent.add(comp)
                self.start_undos(comp, [undo])
                return
        if not block.alive:
            return
        block.alive = False
        self.on_close(block)
        parent = block.parent
        assert parent is not None
        parent.remove(block)
        self.child_gone(parent, block, withdrawn)

    def on_close(self, block: Block) -> None:
        """Release what a block holds: a lock, a milestone count, a region registration, a blocking slot."""
        if isinstance(block, Pass):
            if block.role == "critical":
                self.release_lock(block.term.name)
            elif block.role == "milestone":
                self.ms_active[block.term.name] -= 1
            elif block.role == "scope":
                self.regions[block.term.name].remove(block)
        elif isinstance(block, MIBlock) and block.term.name is not None:
            self.regions[block.term.name].remove(block)
        elif isinstance(block, Split) and block.blocking:
            key = (self.context(block.parent), block.path)
            if self.blocking.get(key) is block:
                del self.blocking[key]

    def release_lock(self, name: str) -> None:
        self.locks[name] = None
        q = self.lock_waiters.get(name)
        while q:
            th, wid = q.popleft()
            if self.waiting(th, "lock", wid):
                th.park = ""
                t, path = th.at
                self.enter_critical(th, t, path)
                self.ready.append(th)
                return

    def child_gone(self, block: Block, child: Any, withdrawn: bool) -> None:
        """A child of `block` is gone (or stopped being one of its threads)."""
        if isinstance(block, Root):
            if not block.kids and self.status == "running":
                self.status = "done" if self.root_ended else "cancelled"
        elif isinstance(block, Split):
            self.split_child_gone(block)
        elif isinstance(block, MIBlock):
            self.mi_check(block)
        elif isinstance(block, Instance):
            if block.attached:
                if block.threads == 0:
                    self.instance_ended(block)
            elif not block.kids:
                self.close(block, False)
        elif isinstance(block, InterleaveBlock):
            self.interleave_child_gone(block)
        elif isinstance(block, Undo):
            if not block.kids:
                if not block.started:
                    self.start_undo(block)
                else:
                    self.close(block, False)
        elif isinstance(block, Compensation):
            if not block.kids:
                self.compensation_done(block)
        elif block.attached and block.threads == 0:
            self.end_thread(block, True)
        elif not block.kids:
            self.close(block, False)

    def split_child_gone(self, block: Split) -> None:
        if block.blocked and block.threads == 0:
            self.unblock(block)
        if block.attached and not block.fired and block.threads == 0:
            if not block.arrived:  # every branch was withdrawn: so is the split
                self.end_thread(block, True)
                return
            block.fired = True  # the rest were withdrawn: what arrived is all there will be
            assert block.parent is not None
            self.spawn(block.parent, list(block.k), block.env)
            self.settle(block, replaced=True)
            return
        self.settle(block, replaced=False)

    def interleave_child_gone(self, block: InterleaveBlock) -> None:
        th = block.parked
        if th is not None:
            if len(block.kids) == 1:  # only the waiting thread is left: the branch is over
                block.parked = None
                th.park = ""
                self.interleave_next(th, block)
                self.ready.append(th)
            return
        if block.kids:
            return
        block.done[block.current] = True  # the running branch was withdrawn: go on with the others
        if block.arrived == 0 and all(block.done):
            self.end_thread(block, True)
            return
        th = self.spawn(block, [], block.env)
        self.interleave_next(th, block)

    # -- withdrawal and compensation (see _undo) -----------------------------------------------------------
    from ._undo import (  # noqa: E402 - methods, kept in their own module
        act,
        cancel_case,
        cancel_region,
        compensation_done,
        complete_region,
        drop,
        fail,
        handler_finished,
        kill_tree,
        next_handler,
        run_handler,
        start_undo,
        start_undos,
        undo_for,
        withdraw,
        withdraw_inside,
    )

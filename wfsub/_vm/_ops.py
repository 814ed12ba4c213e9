"""The opcode handlers, and the table the hot loops dispatch through.

A handler has the signature `(vm, token, ip, operand) -> next ip`, or -1 when the token stopped (parked,
ended, withdrawn, or the case ended). `HANDLERS` holds one per opcode, indexed by opcode, written out at the
end of this module: an opcode without one fails at import. The loops in `_interp.py` inline TASK, JUMP and
ARRIVE; their handlers here serve a driver stepping one instruction and the traced net-node wrapper.

A handler changes the interpreter state it is given through its methods and fields; withdrawal, compensation
and failures are the functions of `_withdraw.py`; the nets' handlers live with the net frames in `_net.py`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from datetime import UTC, datetime
from itertools import islice
from typing import TYPE_CHECKING, Any

from .. import _program as bc
from .._errors import LimitExceeded
from .._program import ALL, Op
from .._terms import MAX_SECONDS
from ._net import NetFrame, _op_net, _op_net_exit
from ._records import (
    WK_BLOCKED,
    WK_EFFECT,
    WK_LOCK,
    WK_MILESTONE,
    WK_NONE,
    WK_SIGNAL,
    WK_TIMER,
    CallFrame,
    Fifo,
    Frame,
    HandlerFrame,
    InstanceFrame,
    InterleaveFrame,
    LoopFrame,
    MIFrame,
    MilestoneFrame,
    SagaFrame,
    ScopeFrame,
    SplitFrame,
    Token,
    UndoFrame,
    link,
    unlink_thread,
)
from ._requests import EffectRequest, TimerRequest
from ._result import RunStatus
from ._updates import _op_reply, take_buffered, take_head, took
from ._withdraw import cancel_region, complete_region, handler_finished, kill_subtree, refuse, step_failed

if TYPE_CHECKING:
    from ._interp import Interp

Handler = Callable[..., int]

# What a step (a task, a predicate, an items/count/until function) may raise without failing its case: only the
# interpreter's own exits. Everything else fails the case at the step, BaseExceptions included: the vm never
# awaits, so a CancelledError or GeneratorExit from a task is the task's own bug, not a cancellation.
PASS_THROUGH = (KeyboardInterrupt, SystemExit)
OPEN: Any = "open"  # mi(dynamic="open")

DONE = RunStatus.DONE
_TASK = int(Op.TASK)
_PAR = int(Op.PAR)


def effect_request(m: Interp, eid: int, tok: Token, ip: int, spec: bc.EffectSpec) -> EffectRequest:
    """What the driver is asked to start for effect `eid` (made again for each effect in flight after a restore)."""
    return EffectRequest(
        eid, spec.fn, tok.env, m.paths[ip], spec.name, spec.timeout, spec.retry, spec.heartbeat_timeout
    )


def _op_effect(m: Interp, tok: Token, ip: int, spec: bc.EffectSpec) -> int:
    eid = m.next_eid
    m.next_eid = eid + 1
    m.effects[eid] = tok
    tok.wk = WK_EFFECT
    tok.wid = eid
    tok.ip = ip
    if type(m.out_effects) is not list:
        m.out_effects = []
    m.out_effects.append(effect_request(m, eid, tok, ip, spec))
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
    m._move(tok, frame)
    for start in starts[1:]:
        m._spawn(frame, start, tok.env)
    m._trace_node("split", ip, branches=len(starts))
    if spec.blocking:
        m.blocking[(context(parent), ip)] = frame
    return starts[0]  # the splitting thread carries on into the first branch


def _op_par(m: Interp, tok: Token, ip: int, spec: bc.SplitSpec) -> int:
    if spec.blocking:  # WCP28/31: no new activation until every branch of the current one has ended
        current = m.blocking.get((context(tok.frame), ip))
        if current is not None and current.alive and current.live > 0:
            tok.ip = ip
            tok.wk = WK_BLOCKED
            tok.wid = 0
            current.blocked.append(tok)
            m._trace_node("par_blocked", ip, token=tok.tid)
            return -1
    return _split(m, tok, ip, spec, spec.starts)


def _op_arrive(m: Interp, tok: Token, ip: int, arg: Any) -> int:
    return tok.frame.arrive(m, tok)


def _call_pred(m: Interp, tok: Token, ip: int, pred: Callable[..., Any], what: str) -> bool | None:
    try:
        return bool(pred(tok.env))
    except PASS_THROUGH:
        raise
    except BaseException as exc:  # see PASS_THROUGH
        name = getattr(pred, "__qualname__", "predicate")
        step_failed(m, tok.frame, ip, exc, f"{what} {name} raised {type(exc).__name__}: {exc}")
        return None


def _op_xor(m: Interp, tok: Token, ip: int, spec: bc.XorSpec) -> int:
    for i, pred in enumerate(spec.preds):
        hit = _call_pred(m, tok, ip, pred, "xor predicate")
        if hit is None:
            return -1
        if hit:
            m._trace_node("choice", ip, branches=[i])
            return spec.targets[i]
    if spec.default >= 0:
        m._trace_node("choice", ip, branches=["default"])
        return spec.default
    refuse(m, tok.frame, ip, "no xor branch matched and there is no default: add default=... or cover every case")
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
            refuse(m, tok.frame, ip, "no multi_choice branch matched and there is no default: add default=...")
            return -1
        chosen.append(spec.default)
    m._trace_node("choice", ip, branches=len(chosen))
    return _split(m, tok, ip, spec, chosen)


def _iterate(m: Interp, frame: LoopFrame, ip: int) -> bool:
    frame.iteration += 1
    limit = frame.spec.max_iterations
    if limit is not None and frame.iteration > limit:
        message = f"loop ran past max_iterations={limit}: raise the limit or fix the exit condition"
        refuse(m, frame, ip, message, LimitExceeded)
        return False
    m._trace_node("loop", ip, iteration=frame.iteration)
    return True


def _op_loop(m: Interp, tok: Token, ip: int, spec: bc.LoopSpec) -> int:
    if spec.mode == "times" and spec.times == 0:
        return spec.exit
    frame = LoopFrame(tok.frame, tok.env, ip, spec)
    link(tok.frame, frame)
    m._move(tok, frame)
    if spec.mode != "while" and not _iterate(m, frame, ip):
        return -1
    return ip + 1


def _op_loop_test(m: Interp, tok: Token, ip: int, spec: bc.LoopSpec) -> int:
    frame: Any = tok.frame
    hit = _call_pred(m, tok, ip, spec.pred, "loop while_")  # type: ignore[arg-type]
    if hit is None:
        return -1
    if not hit:
        return m._leave(tok, frame, spec.exit)
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
            return m._leave(tok, frame, spec.exit)
    elif frame.iteration >= spec.times:
        return m._leave(tok, frame, spec.exit)
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
    if not spec.transient and spec.signal in m.buffered:
        queue = m.buffered[spec.signal]
        if queue and spec.check is None and m.updates is None:  # the common case: no check, no update
            _, payload = queue.popleft()
            m._store(tok.env, spec.into, payload)
            m._trace_node("signal_consumed", ip, signal=spec.signal, buffered=True)
            return ip + 1
        taken = take_buffered(m, tok, ip, spec.signal, spec.check) if queue else None
        if taken is not None:
            payload, uid = taken
            m._store(tok.env, spec.into, payload)
            m._trace_node("signal_consumed", ip, signal=spec.signal, buffered=True)
            if uid is not None:
                took(m, tok, ip, spec.signal, uid)
                if not tok.alive or m.ended:  # its reply function failed the step
                    return -1
            return ip + 1
    timeout = spec.timeout
    computed = False
    if spec.deadline is not None:  # deadline=fn: the time, computed as the wait parks, arming it
        at = _time_from_data(m, tok, ip, spec.deadline, "wait deadline")
        if at is None:
            return -1
        _park_signal(m, tok, ip, (spec.signal,))
        tok.aux = _arm(m, ip, 0.0, tok, True, at)
        return -1
    if timeout is not None and not isinstance(timeout, float):  # timeout=fn: computed as the wait parks, arming it
        timeout = _seconds_from_data(m, tok, ip, timeout, "wait timeout", positive=True)
        if timeout is None:
            return -1
        computed = True
    _park_signal(m, tok, ip, (spec.signal,))
    if timeout is not None:
        tok.aux = _arm(m, ip, timeout, tok, computed)
    return -1


def _arm(m: Interp, ip: int, seconds: float, tok: Token, computed: bool = False, at: float | None = None) -> int:
    timer_id = m.next_timer
    m.next_timer = timer_id + 1
    m.timers[timer_id] = tok
    if type(m.out_timers) is not list:
        m.out_timers = []
    m.out_timers.append(TimerRequest(timer_id, seconds, m.paths[ip], at))
    if computed:  # kept for pending_requests and messages; pruned of withdrawn timers as it grows (amortised O(1))
        values = m.timer_values
        values[timer_id] = (seconds, at)
        if len(values) > 2 * len(m.timers) + 16:
            m.timer_values = {tid: v for tid, v in values.items() if tid in m.timers}
    if at is None:
        m._trace_node("timer_armed", ip, timer_id=timer_id, seconds=seconds)
    else:
        m._trace_node("timer_armed", ip, timer_id=timer_id, at=at)
    return timer_id


def _op_defer(m: Interp, tok: Token, ip: int, spec: bc.DeferSpec) -> int:
    while True:
        best = None
        for i, name in enumerate(spec.signals):  # the earliest buffered signal among the names decides
            buffered = m.buffered.get(name)
            if buffered and (best is None or buffered.peek()[0] < best[0]):
                best = (buffered.peek()[0], i)
        if best is None:
            break
        name = spec.signals[best[1]]
        if spec.checks is None and m.updates is None:  # the common case: no check, no update
            _, payload = m.buffered[name].popleft()
            uid = None
        else:
            check = None if spec.checks is None else spec.checks[best[1]]
            taken = take_head(m, tok, ip, name, check)
            if taken is None:
                continue  # refused (dropped): the earliest of the rest decides
            payload, uid = taken
        m._store(tok.env, name, payload)
        m._trace_node("deferred_choice", ip, chosen=name, buffered=True)
        if uid is not None:
            took(m, tok, ip, name, uid)  # (a defer has no reply=: the thread owes it)
        return spec.targets[best[1]]
    timeout = spec.timeout
    computed = False
    if spec.deadline is not None:  # deadline=fn: the time, computed as the choice parks, arming it
        at = _time_from_data(m, tok, ip, spec.deadline, "defer deadline")
        if at is None:
            return -1
        _park_signal(m, tok, ip, spec.signals)
        tok.aux = _arm(m, ip, 0.0, tok, True, at)
        return -1
    if timeout is not None and not isinstance(timeout, float):  # timeout=fn: computed as the choice parks, arming it
        timeout = _seconds_from_data(m, tok, ip, timeout, "defer timeout", positive=False)
        if timeout is None:
            return -1
        computed = True
    _park_signal(m, tok, ip, spec.signals)
    if timeout is not None:
        tok.aux = _arm(m, ip, timeout, tok, computed)
    return -1


def _op_sleep(m: Interp, tok: Token, ip: int, spec: bc.SleepSpec) -> int:
    tok.ip = ip
    fn = spec.fn
    if fn is None:
        tok.wk = WK_TIMER
        tok.wid = _arm(m, ip, spec.seconds, tok)
        return -1
    if spec.until:
        at = _time_from_data(m, tok, ip, fn, "sleep until")
        if at is None:
            return -1
        tok.wk = WK_TIMER
        tok.wid = _arm(m, ip, 0.0, tok, True, at)
        return -1
    seconds = _seconds_from_data(m, tok, ip, fn, "sleep seconds", positive=False)
    if seconds is None:
        return -1
    tok.wk = WK_TIMER
    tok.wid = _arm(m, ip, seconds, tok, True)
    return -1


# -- timers from the case data: computed when the step starts (replay computes the same), checked here -------------


def _fn_label(fn: Callable[..., Any]) -> str:
    return getattr(fn, "__qualname__", None) or type(fn).__name__


def _call_timer_fn(m: Interp, tok: Token, ip: int, fn: Callable[..., Any], what: str) -> tuple[bool, Any]:
    try:
        return True, fn(tok.env)
    except PASS_THROUGH:
        raise
    except BaseException as exc:  # see PASS_THROUGH: the function's failure is a failure at the step
        step_failed(m, tok.frame, ip, exc, f"{what} function {_fn_label(fn)} raised {type(exc).__name__}: {exc}")
        return False, None


def _seconds_from_data(
    m: Interp, tok: Token, ip: int, fn: Callable[..., Any], what: str, *, positive: bool
) -> float | None:
    """fn(ctx) as a timer's length in seconds, or None after failing the step with what was wrong and the fix."""
    ok, value = _call_timer_fn(m, tok, ip, fn, what)
    if not ok:
        return None
    bound = "> 0" if positive else ">= 0"
    if type(value) not in (int, float) or not math.isfinite(value):
        problem = f"returned {value!r} ({type(value).__name__}), not a finite number of seconds"
    elif value < 0 or (positive and value == 0):
        problem = f"returned {value!r}: the seconds must be {bound}"
    elif value > MAX_SECONDS:
        problem = f"returned {value!r}: more than the longest timer wfsub arms ({MAX_SECONDS:g} s, about 31 years)"
    else:
        return float(value)
    refuse(m, tok.frame, ip, f"{what} function {_fn_label(fn)} {problem}; return an int or float {bound}")
    return None


def _time_from_data(m: Interp, tok: Token, ip: int, fn: Callable[..., Any], what: str) -> float | None:
    """fn(ctx) as epoch seconds (`sleep(until=)`, `deadline=`), or None after failing the step. Epoch seconds, an
    ISO 8601 string with a timezone or an aware datetime; a naive time is refused (its meaning would depend on the
    machine's zone), and so is one more than MAX_SECONDS after the time the run was given (`Machine.run`): the
    bound a timer's length has."""
    ok, value = _call_timer_fn(m, tok, ip, fn, what)
    if not ok:
        return None
    fix = "return epoch seconds or an ISO 8601 time with a timezone, such as '2027-01-01T09:00:00+00:00'"
    at, problem = _as_time(value)
    if at is not None:
        if m.time is None or at - m.time <= MAX_SECONDS:
            return at
        problem = (f"returned {value!r}, {at - m.time:.4g} s after the step started: more than the longest timer "
                   f"wfsub arms ({MAX_SECONDS:g} s, about 31 years)")
        fix = "return a time at most that far ahead"
    refuse(m, tok.frame, ip, f"{what} function {_fn_label(fn)} {problem}; {fix}")
    return None


def time_text(at: float) -> str:
    """A due time as people read it: ISO 8601 in UTC (the epoch seconds, where no date has it)."""
    try:
        return datetime.fromtimestamp(at, UTC).isoformat().replace("+00:00", "Z")
    except (OverflowError, ValueError, OSError):
        return f"{at!r} (epoch seconds)"


def _as_time(value: Any) -> tuple[float | None, str]:
    """A value a function of the data gave as a point in time: (epoch seconds, "") or (None, what is wrong)."""
    if type(value) in (int, float):
        if math.isfinite(value):
            return float(value), ""
        return None, f"returned {value!r}, not a finite number of epoch seconds"
    if isinstance(value, str):
        try:
            when = datetime.fromisoformat(value)
        except ValueError:
            return None, f"returned {value!r}, which is not an ISO 8601 time"
        if when.tzinfo is None or when.utcoffset() is None:
            return None, f"returned {value!r}, a time without a timezone (add 'Z' or an offset such as '+00:00')"
        return when.timestamp(), ""
    if isinstance(value, datetime):
        if value.tzinfo is not None and value.utcoffset() is not None:
            return value.timestamp(), ""
        return None, f"returned {value!r}, a datetime without a timezone"
    return None, f"returned {value!r} ({type(value).__name__}), not a time"


def _op_scope(m: Interp, tok: Token, ip: int, spec: bc.ScopeSpec) -> int:
    frame = ScopeFrame(tok.frame, tok.env, ip, spec)
    link(tok.frame, frame)
    m._move(tok, frame)
    m.regions.setdefault(spec.name, {})[frame] = None
    return ip + 1


def _op_leave(m: Interp, tok: Token, ip: int, target: int) -> int:
    frame: Any = tok.frame
    return m._leave(tok, frame, target)


def _op_mi(m: Interp, tok: Token, ip: int, spec: bc.MISpec) -> int:
    env = tok.env
    items: list[Any] | None = None
    try:
        if spec.items_fn is not None:
            given = spec.items_fn(env)
            if isinstance(given, str | bytes | Mapping):
                refuse(
                    m,
                    tok.frame,
                    ip,
                    f"mi items function returned a {type(given).__name__}: return a list with one item per "
                    "instance (a str would start one instance per character)",
                )
                return -1
            if isinstance(given, AbstractSet):  # its order changes between processes (str hashing): so would the
                refuse(  # instances' items, their collected outputs and a durable case's replay
                    m,
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
    except PASS_THROUGH:
        raise
    except BaseException as exc:  # see PASS_THROUGH
        step_failed(m, tok.frame, ip, exc, f"mi count/items function raised {type(exc).__name__}: {exc}")
        return -1
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        refuse(m, tok.frame, ip, f"mi count function returned {n!r}: it must return an int >= 0")
        return -1
    if (spec.min is not None and n < spec.min) or (spec.max is not None and n > spec.max):
        got = f"more than {spec.max}" if items is not None and n > (spec.max or 0) else n
        refuse(m, tok.frame, ip, f"mi got {got} instances, outside min={spec.min} max={spec.max}", LimitExceeded)
        return -1
    if spec.need > 0 and n < spec.need and spec.until is None and not spec.dynamic:
        refuse(
            m,
            tok.frame,
            ip,
            f"mi join={spec.need} needs at least {spec.need} instance{'s' if spec.need > 1 else ''}, but the count "
            f"is {n}: its join could never fire; give fewer for join=, an until= condition, or dynamic=True",
        )
        return -1
    if spec.max is None and n > m.max_instances:
        refuse(
            m,
            tok.frame,
            ip,
            f"mi would start {f'{n:,} instances, more' if items is None else 'more instances'} than the limit of "
            f"{m.max_instances:,}: give the mi max=... "
            "(or the Substrate max_instances=...) if that many is meant",
            LimitExceeded,
        )
        return -1
    m._trace_node("mi_started", ip, instances=n)
    if n == 0 and not spec.dynamic:
        if spec.need not in (ALL, 0):  # an n join that nothing can reach (until= allowed the count): withdrawn
            frame = tok.frame
            unlink_thread(frame, tok)
            tok.alive = False
            m._trace_node("withdrawn", ip, reason="mi with no instances: its join can never be reached")
            frame.child_gone(m, tok, True)
            return -1
        if spec.collect is not None:  # join "all" (or None) over no instances: done at once
            m._store(env, spec.collect, [])
        return spec.after
    parent = tok.frame
    frame = MIFrame(parent, env, ip, spec)
    link(parent, frame)
    if spec.name is not None:
        m.regions.setdefault(spec.name, {})[frame] = None
    if spec.collect is not None:  # (without collect= the outputs are never read: none is kept)
        frame.outputs = [None] * n
    first = min(n, bc.SPAWN_CHUNK)
    if first >= 128:
        m._pause_gc()
    m._spawn_instances(frame, items, 0, first, 0)
    if n > first:  # the rest start SPAWN_CHUNK per step, each chunk queued behind the one before (see below)
        frame.pending = n - first
        frame.items = items
        spawner = frame.spawner = Token(m.next_tid, ip + 1, frame, env)
        m.next_tid += 1
        link(frame, spawner)
        m.ready.append(spawner)
    if spec.need == 0:  # join=None: no synchronization, the thread goes on at once; the mi is detached work
        frame.fired = True
        m._detach_thread(frame)
        if n == 0 and spec.dynamic != OPEN:  # nothing runs in it: it must not keep the case open
            m._close(frame, withdrawn=False)  # (an open mi stays, taking instances, until close_instances)
        return spec.after
    unlink_thread(parent, tok)
    tok.alive = False
    if n == 0:
        m._mi_check(frame)
    return -1


def _op_mi_spawn(m: Interp, tok: Token, ip: int, spec: bc.MISpec) -> int:
    """The spawner of a big mi: start the next chunk of instances; leave once all have started.

    The spawner queues itself behind the chunk it started, so under FIFO the instances run in index order as
    before, while only about a chunk of them is alive at a time (a million-instance mi of short bodies never
    holds a million records: the collector's passes, which walk every live record, stay short).
    """
    frame: Any = tok.frame
    m._pause_gc()
    start = frame.started
    stop = start + min(frame.pending, bc.SPAWN_CHUNK)
    items = frame.items
    m._spawn_instances(frame, items, start, stop, start + frame.pending - len(items) if items is not None else 0)
    frame.pending -= stop - start
    if frame.pending:  # the next chunk once this one has had its turn
        tok.ip = ip
        m.ready.append(tok)
        return -1
    frame.items = None
    frame.spawner = None
    unlink_thread(frame, tok)
    tok.alive = False
    m._mi_check(frame)
    return -1


def _op_interleave(m: Interp, tok: Token, ip: int, spec: bc.InterleaveSpec) -> int:
    frame = InterleaveFrame(tok.frame, tok.env, ip, spec)
    link(tok.frame, frame)
    m._move(tok, frame)
    return m._interleave_next(frame, tok)


def _op_critical(m: Interp, tok: Token, ip: int, spec: bc.NameSpec) -> int:
    holder = m.locks.get(spec.name)
    if holder is not None:  # held: by an enclosing section of this very thread, it would wait forever
        frame: Frame | None = tok.frame
        while frame is not None:
            if frame is holder:
                message = f"critical({spec.name!r}) entered again inside itself: sections are not reentrant"
                refuse(m, tok.frame, ip, message)
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
    m._trace_node("critical_wait", ip, name=spec.name)
    return -1


def _op_milestone(m: Interp, tok: Token, ip: int, spec: bc.NameSpec) -> int:
    frame = MilestoneFrame(tok.frame, tok.env, ip, spec.name)
    link(tok.frame, frame)
    m._move(tok, frame)
    m.ms_active[spec.name] = m.ms_active.get(spec.name, 0) + 1
    m._trace_node("milestone", ip, name=spec.name, event="entered")
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
    m._trace_node("withdrawn", ip, reason=f"milestone {spec.name!r} has passed")
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
        refuse(m, tok.frame, ip, message, LimitExceeded)
        return -1
    call = CallFrame(tok.frame, tok.env, ip, ip + 1, depth)
    link(tok.frame, call)
    m._move(tok, call)
    m._trace_node("call", ip, name=spec.name, depth=depth)
    return spec.entry


def _op_ret(m: Interp, tok: Token, ip: int, arg: Any) -> int:
    frame: Any = tok.frame
    return m._leave(tok, frame, frame.ret)


def _op_terminate(m: Interp, tok: Token, ip: int, arg: Any) -> int:
    m._trace_node("terminated", ip)
    m.root_ended = True
    kill_subtree(m, m.root)
    m._finish(DONE, "terminated")
    return -1


def context(frame: Frame | None) -> Frame | None:
    """The innermost mi instance, call or net activation around `frame` (None: the case's root workflow)."""
    while frame is not None and not isinstance(frame, InstanceFrame | CallFrame | NetFrame):
        frame = frame.parent
    return frame


def _region_activations(m: Interp, tok: Token, spec: bc.RegionStepSpec) -> list[Frame]:
    """The activations a region step addresses: the one its thread runs in, when the step is written inside the
    region (a scope's body, or a named mi's body, in the same workflow: a sliding window's instance adding the next
    one); else, when the region is written in the same mi body or workflow as the step, those in the step's own mi
    instance and call; else every live activation."""
    acts = m.live_activations(spec.name)
    if not acts:
        return acts
    mine = m.regions[spec.name]
    frame: Frame | None = tok.frame
    while frame is not None and type(frame) is not CallFrame:  # (a call's workflow is written elsewhere)
        if frame.alive and frame in mine:
            return [frame]
        frame = frame.parent
    if spec.local:  # only the activations in the step's own mi instance and call
        here = context(tok.frame)
        acts = [frame for frame in acts if context(frame.parent) is here]
    return acts


def _op_cancel_region(m: Interp, tok: Token, ip: int, spec: bc.RegionStepSpec) -> int:
    acts = _region_activations(m, tok, spec)
    if not acts:
        m._trace_node("region_inactive", ip, region=spec.name)
        return ip + 1
    tok.ip = ip + 1
    cancel_region(m, spec.name, acts)
    return ip + 1 if tok.alive else -1  # a step inside the region is withdrawn with it


def _op_complete_region(m: Interp, tok: Token, ip: int, spec: bc.RegionStepSpec) -> int:
    acts = _region_activations(m, tok, spec)
    if not acts:
        m._trace_node("region_inactive", ip, region=spec.name)
        return ip + 1
    refused = m.complete_refusal(spec.name, acts)
    if refused is not None:
        refuse(m, tok.frame, ip, f"complete_region({spec.name!r}) refused: {refused[1]}")
        return -1
    tok.ip = ip + 1
    complete_region(m, spec.name, acts)
    return ip + 1 if tok.alive else -1


def _dynamic_mi_at_step(m: Interp, tok: Token, ip: int, spec: bc.RegionStepSpec, what: str) -> MIFrame | None:
    acts = _region_activations(m, tok, spec)
    reason = f"region {spec.name!r} is not active now" if not acts else m.dynamic_mi_refusal(spec.name, acts)
    if reason is not None:
        refuse(m, tok.frame, ip, f"{what}({spec.name!r}) refused: {reason}")
        return None
    frame = acts[0]
    assert isinstance(frame, MIFrame)
    return frame


def _op_add_instances(m: Interp, tok: Token, ip: int, spec: bc.RegionStepSpec) -> int:
    assert spec.items is not None
    try:
        given = spec.items(tok.env)
    except PASS_THROUGH:
        raise
    except BaseException as exc:  # see PASS_THROUGH
        step_failed(m, tok.frame, ip, exc, f"add_instances items function raised {type(exc).__name__}: {exc}")
        return -1
    if isinstance(given, str | bytes | Mapping) or not isinstance(given, Sequence):
        what = type(given).__name__
        refuse(m, tok.frame, ip, f"add_instances items function returned {what}: return a list of items")
        return -1
    frame = _dynamic_mi_at_step(m, tok, ip, spec, "add_instances")
    if frame is None:
        return -1
    reason = m.add_refusal(spec.name, frame, len(given))
    if reason is not None:
        refuse(m, tok.frame, ip, f"add_instances({spec.name!r}) refused: {reason}", LimitExceeded)
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
    m._move(tok, frame)
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
            handler_finished(m, frame)
        return -1
    assert type(frame) is HandlerFrame
    return m._leave(tok, frame, frame.then)


def _op_finally(m: Interp, tok: Token, ip: int, after: int) -> int:
    """A scope's thread goes on after it (its body ended, or on_error / on_cancel did): run finally_ first, as a
    handler in the enclosing region, then go on at `after`."""
    handler = HandlerFrame(tok.frame, tok.env, ip, after, None)
    link(tok.frame, handler)
    m._move(tok, handler)
    return ip + 1


def _op_task(m: Interp, tok: Token, ip: int, fn: Callable[..., Any]) -> int:
    """Inlined in both loops; here for completeness (and for a driver stepping one instruction)."""
    try:
        res = fn(tok.env)
    except PASS_THROUGH:
        raise
    except BaseException as exc:  # see PASS_THROUGH
        step_failed(m, tok.frame, ip, exc, f"task {m.program.labels[ip]} raised {type(exc).__name__}: {exc}")
        return -1
    if m.outputs is not None:
        if res is not None and not m._json_output(tok, ip, res):
            return -1
        m.outputs.append((ip, res))
    if res is not None and not m._merge(tok, res, ip):
        return -1
    return ip + 1


def _op_jump(m: Interp, tok: Token, ip: int, target: int) -> int:
    return target


def _op_net_node(m: Interp, tok: Token, ip: int, spec: bc.NetNodeSpec) -> int:
    """Traced code only: node `spec.name` starts (recorded), then the instruction it wraps runs."""
    op, arg = spec.op, spec.arg
    if op == _PAR and arg.blocking:  # a blocked thread comes back to this instruction: record the start once
        current = m.blocking.get((context(tok.frame), ip))
        if current is not None and current.alive and current.live > 0:
            return _op_par(m, tok, ip, arg)
    m.emit("net_node", spec.path, {"node": spec.name, "token": tok.tid})
    if op == _TASK:
        nip = _op_task(m, tok, ip, arg)
        if nip >= 0:
            m.emit("task", m.paths[ip], {"name": m.program.labels[ip], "token": tok.tid})
        return nip
    handler: Handler = HANDLERS[op]
    return handler(m, tok, ip, arg)


def _table(handlers: Mapping[Op, Handler]) -> tuple[Handler, ...]:
    """The handlers as a tuple indexed by opcode: an opcode the table leaves out fails at import."""
    missing = [op.name for op in Op if op not in handlers]
    if missing:
        raise ImportError(f"the vm has no handler for opcode {', '.join(missing)}: add it to HANDLERS in {__name__}")
    return tuple(handlers[op] for op in sorted(Op))


# Every opcode's handler, by opcode. A new opcode gets its `_op_<opname>` above (or in its family's module, as the
# nets' in `_net.py`) and its line here.
HANDLERS: tuple[Handler, ...] = _table(
    {
        Op.TASK: _op_task,
        Op.JUMP: _op_jump,
        Op.EFFECT: _op_effect,
        Op.END: _op_end,
        Op.PAR: _op_par,
        Op.ARRIVE: _op_arrive,
        Op.XOR: _op_xor,
        Op.MULTI_CHOICE: _op_multi_choice,
        Op.LOOP: _op_loop,
        Op.LOOP_TEST: _op_loop_test,
        Op.LOOP_BACK: _op_loop_back,
        Op.WAIT: _op_wait,
        Op.DEFER: _op_defer,
        Op.REPLY: _op_reply,
        Op.SLEEP: _op_sleep,
        Op.SCOPE: _op_scope,
        Op.LEAVE: _op_leave,
        Op.MI: _op_mi,
        Op.INTERLEAVE: _op_interleave,
        Op.CRITICAL: _op_critical,
        Op.MILESTONE: _op_milestone,
        Op.WHEN_MILESTONE: _op_when_milestone,
        Op.CALL: _op_call,
        Op.RET: _op_ret,
        Op.TERMINATE: _op_terminate,
        Op.MI_SPAWN: _op_mi_spawn,
        Op.CANCEL_REGION: _op_cancel_region,
        Op.COMPLETE_REGION: _op_complete_region,
        Op.ADD_INSTANCES: _op_add_instances,
        Op.CLOSE_INSTANCES: _op_close_instances,
        Op.SAGA: _op_saga,
        Op.SAGA_STEP: _op_saga_step,
        Op.HANDLER_DONE: _op_handler_done,
        Op.NET: _op_net,
        Op.NET_EXIT: _op_net_exit,
        Op.NET_NODE: _op_net_node,
        Op.FINALLY: _op_finally,
    }
)

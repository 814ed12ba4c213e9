"""The effects and timers of a case actor: starting, withdrawing and restarting them, each in the actor's task
group under its own cancel scope, and posting their outcome to the case's mailbox.

These are functions over the actor (`_case.CaseActor`), which calls them where its coroutine reaches them.
"""

from __future__ import annotations

import traceback as tb
from typing import TYPE_CHECKING

import anyio
from anyio.abc import TaskGroup

from ._children import outbound
from ._effects import PASS_THROUGH, EffectInfo, call_effect, current_effect
from ._heartbeat import Beats, note_beat
from ._mailbox import Cancel, EffectDone, TimerFired

if TYPE_CHECKING:
    from .._vm import EffectRequest, RunResult
    from ._case import CaseActor


def start_io(actor: CaseActor, r: RunResult, tg: TaskGroup) -> None:
    scopes = actor.scopes
    assert scopes is not None
    j = actor.journal
    base = j.time if j is not None else actor.shared.clock.now()  # timers are due from the last record applied
    for tid in r.cancelled_timers:
        actor.armed.pop(tid, None)
        scope = scopes.pop((True, tid), None)
        if scope is not None:
            scope.cancel()
    for eid in r.cancelled_effects:
        actor.requested.pop(eid, None)
        scope = scopes.pop((False, eid), None)
        if scope is not None:
            scope.cancel()
    for req in r.effects:
        _start_effect(actor, req, tg)
    for timer in r.timers:
        _arm(actor, timer.timer_id, timer.path, timer.due(base), tg)


def _start_effect(actor: CaseActor, req: EffectRequest, tg: TaskGroup) -> None:
    assert actor.scopes is not None
    actor.requested[req.effect_id] = (req.path, req.name)
    scope = actor.scopes[(False, req.effect_id)] = anyio.CancelScope()
    actor.starting(1)
    tg.start_soon(run_effect, actor, req, scope)


def _arm(actor: CaseActor, timer_id: int, path: str, due: float, tg: TaskGroup) -> None:
    assert actor.scopes is not None
    actor.armed[timer_id] = (path, due)
    scope = actor.scopes[(True, timer_id)] = anyio.CancelScope()
    actor.starting(1)
    tg.start_soon(run_timer, actor, timer_id, due, scope)


def restart(actor: CaseActor, tg: TaskGroup) -> None:
    """A recovered case: start again the effects that were in flight and re-arm its timers at their due time."""
    assert actor.resume is not None
    effects, timers = actor.resume
    actor.resume = None
    for req in effects:
        _start_effect(actor, req, tg)
    for timer, due in timers:
        _arm(actor, timer.timer_id, timer.path, due, tg)


def _retrying(
    actor: CaseActor, req: EffectRequest, info: EffectInfo, attempt: int, delay: float, exc: BaseException
) -> None:
    """An effect attempt failed and will be retried: a trace event (level min) in the case's own sequence."""
    actor.attempts[req.effect_id] = (attempt, actor.attempts.get(req.effect_id, (attempt, None))[1])
    actor.retry_at[req.effect_id] = actor.shared.clock.now() + delay
    info.attempt = attempt + 1
    m = actor.machine
    if m is None or actor.level == "none":
        return
    detail = {"effect_id": req.effect_id, "name": req.name, "attempt": attempt, "delay": delay,
              "type": type(exc).__name__, "error": str(exc)}  # the attempt's own error, as effect_failed shows one
    m.note("effect_retry", req.path, detail)
    events = m.take_events()
    if events:
        actor.shared.hub.submit(actor.case_id, actor.shared.clock.now(), events, actor.sinks)


def _attempting(actor: CaseActor, info: EffectInfo, beats: Beats, attempt: int) -> None:
    """An attempt of an effect starts now (its status shows it; a retry's backoff is over; its heartbeat timeout
    counts from now, and it sees the newest heartbeat sent before it)."""
    actor.attempts[info.effect_id] = (attempt, actor.shared.clock.now())
    actor.retry_at.pop(info.effect_id, None)
    info.heartbeat = beats.start_attempt(attempt)


async def _may_attempt(actor: CaseActor) -> None:
    """Return when an attempt of an effect may start: no attempt starts while this node's lease is in doubt (it
    may have lost its cases), none once the case is known to be another node's (it is leaving memory: its task
    group cancels the effect)."""
    lease = actor.shared.lease
    if lease is not None and not lease.ok:
        await lease.wait()
    if actor.stale is not None:
        await anyio.sleep_forever()


async def run_effect(actor: CaseActor, req: EffectRequest, scope: anyio.CancelScope) -> None:
    actor.starting(-1)
    lease = actor.shared.lease
    if (lease is not None and not lease.ok) or actor.stale is not None:  # no new effect while the case may be lost
        with scope:
            await _may_attempt(actor)
        if scope.cancel_called:
            return
    running = actor.running_effects
    running[req.effect_id] = req  # (its attempt and start time: `_attempting`, as `call_effect` starts it)
    beats = actor.beats[req.effect_id] = Beats.recovered(
        actor.shared.clock, actor.kept_beats.pop(str(req.effect_id), None)
    )
    if actor.journal is not None:  # kept beside its row: bounded as every payload it keeps
        beats.on_beat = lambda: note_beat(actor)
        beats.limit = actor.shared.max_payload_bytes
    info = EffectInfo(actor.case_id, req.effect_id, req.name, req.path, 1, None, beats)
    token = current_effect.set(info)
    with scope:
        try:
            output = await call_effect(
                outbound(actor, req),
                req.ctx,
                name=req.name,
                path=req.path,
                attempt_timeout=req.timeout,
                retry=req.retry,
                clock=actor.shared.clock,
                case_id=actor.case_id,
                on_retry=lambda attempt, delay, exc: _retrying(actor, req, info, attempt, delay, exc),
                on_attempt=lambda attempt: _attempting(actor, info, beats, attempt),
                may_attempt=None if lease is None else lambda: _may_attempt(actor),
                beats=beats,
                heartbeat_timeout=req.heartbeat_timeout,
                starting=actor.starting,
            )
        except PASS_THROUGH:
            raise
        except anyio.get_cancelled_exc_class():
            raise  # the runtime cancelled it (call_effect turned any other CancelledError into a failure)
        except BaseException as exc:  # the effect failed (after its retries): the case decides what follows
            text = "".join(tb.format_exception(exc)) if actor.journal is not None else None
            actor.post(EffectDone(req.effect_id, None, exc, text))
        else:
            actor.post(EffectDone(req.effect_id, output, None))
        finally:
            running.pop(req.effect_id, None)
            actor.beats.pop(req.effect_id, None)
            actor.attempts.pop(req.effect_id, None)
            actor.retry_at.pop(req.effect_id, None)
            current_effect.reset(token)


async def run_timer(actor: CaseActor, timer_id: int, due: float, scope: anyio.CancelScope) -> None:
    actor.starting(-1)
    with scope:
        await actor.shared.clock.sleep(max(0.0, due - actor.shared.clock.now()))
        actor.post(TimerFired(timer_id))


async def case_timer(actor: CaseActor, deadline: float) -> None:
    actor.starting(-1)
    await actor.shared.clock.sleep(max(0.0, deadline - actor.shared.clock.now()))
    actor.post(Cancel("timeout"))

"""Running one effect: call `fn(ctx)`, bound each attempt by `timeout`, retry with `Retry` backoff.

Both the attempt timeout and the backoff are timed by the Substrate's clock, so a test drives them with
`VirtualClock.advance`. What counts as failure is anything the effect raises, including the `TimeoutError`
raised when an attempt runs out of time, with three exceptions:
- a cancellation the runtime itself issued (the effect's region or case was cancelled, the Substrate is
  closing) propagates: it is a cancellation, not a failure;
- a `CancelledError` that nothing in the runtime issued (the effect awaited a future or task that something
  else cancelled) is a failure like any other, so the retry policy applies and other effects are untouched;
- `KeyboardInterrupt` and `SystemExit` propagate: they stop the program, not the case.
An effect that returns something other than a Mapping or None is a programming error, not a transient one: it
fails at once, without retries. Exceptions listed in `Retry.non_retryable` also fail at once. An attempt of an
effect with `heartbeat_timeout=` runs under a watchdog (`_heartbeat.watched`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import anyio

from .._errors import EffectResultError, heartbeat_outside_effect
from .._loops import cancelled_by_runtime
from .._terms import Retry
from .._trace import get_logger
from ._clock import Clock
from ._heartbeat import Beats, watched

_log = get_logger("wfsub.runtime")

PASS_THROUGH = (KeyboardInterrupt, SystemExit)
"""What a step may raise and have it propagate out of wfsub: the program is stopping."""


@dataclass(slots=True)
class EffectInfo:
    """What an effect can learn about itself through `wfsub.effect_info()` while it runs.

    `idempotency_key` is the same for every attempt, after a recovery and in a replay (the case id, the effect
    id and the node path), so an effect can make its side effect idempotent: pass it to the payment provider,
    or record it with what the effect did and skip work already done.

    `heartbeat` is the details of the newest `wfsub.heartbeat()` sent before this attempt started (by an earlier
    attempt, also before a restart of a durable case), or None: a long job can resume where it got to.
    """

    case_id: str
    effect_id: int
    name: str
    path: str
    attempt: int
    heartbeat: Any = None
    _beats: Beats | None = field(default=None, repr=False, compare=False)

    @property
    def idempotency_key(self) -> str:
        return f"{self.case_id}:{self.effect_id}:{self.path}"


current_effect: ContextVar[EffectInfo | None] = ContextVar("wfsub_effect", default=None)


def effect_info() -> EffectInfo:
    """The effect running in this task: case id, effect id, name, node path, attempt, idempotency key."""
    info = current_effect.get()
    if info is None:
        raise RuntimeError(
            "effect_info() is called outside an effect: call it from the async function given to effect()"
        )
    return info


def heartbeat(details: Any = None) -> None:
    """Tell the runtime the effect running in this task is still working; `details` (JSON, or None) are kept as its
    newest heartbeat: a later attempt reads them as `effect_info().heartbeat`, and `status()` shows them. With
    `effect(..., heartbeat_timeout=)`, an attempt that goes that long without calling this fails with
    `HeartbeatTimeout`. Outside an effect it raises RuntimeError; details that are not JSON, TypeError."""
    info = current_effect.get()
    beats = None if info is None else info._beats
    if info is None or beats is None:
        raise heartbeat_outside_effect()
    beats.beat(info.name, info.path, details)


class StrayCancellation(Exception):
    """An effect raised CancelledError although nothing in the runtime cancelled it."""


async def call_effect(
    fn: Callable[[Mapping[str, Any]], Awaitable[Any]],
    ctx: Mapping[str, Any],
    *,
    name: str,
    path: str,
    attempt_timeout: float | None,
    retry: Retry | None,
    clock: Clock,
    case_id: str,
    on_retry: Callable[[int, float, BaseException], None] | None = None,
    on_attempt: Callable[[int], None] | None = None,
    may_attempt: Callable[[], Awaitable[None]] | None = None,
    beats: Beats | None = None,
    heartbeat_timeout: float | None = None,
    starting: Callable[[int], None] | None = None,
) -> Mapping[str, Any] | None:
    """Run the effect to completion (with its retries) and return its output; raise its last exception.

    `on_retry(attempt, delay, error)` is called before each backoff (the case traces it), `on_attempt(attempt)`
    as each attempt starts (the case's status shows it). `may_attempt()` is awaited before each retry: a durable
    case's node holds its retries there while its lease is in doubt. With `heartbeat_timeout` (and the effect's
    `beats`), each attempt is watched: `starting(n)` counts the watchdog busy until it runs.
    """
    attempts = retry.max_attempts if retry is not None else 1
    attempt = 0
    first_start = clock.now()
    while True:
        attempt += 1
        if on_attempt is not None:
            on_attempt(attempt)
        try:
            if heartbeat_timeout is None or beats is None:
                return await _attempt(fn, ctx, name=name, path=path, attempt_timeout=attempt_timeout, clock=clock)
            return await watched(  # type: ignore[no-any-return]
                lambda: _attempt(fn, ctx, name=name, path=path, attempt_timeout=attempt_timeout, clock=clock),
                beats, heartbeat_timeout, name=name, path=path, starting=starting,
            )
        except (EffectResultError, *PASS_THROUGH, anyio.get_cancelled_exc_class()):
            raise  # (a cancellation: _attempt let through only one the runtime issued)
        except BaseException as exc:  # a failed attempt (see the module docstring)
            if retry is None or isinstance(exc, retry.non_retryable):
                raise
            delay = retry.delay(attempt)
            if retry.gives_up(attempt, clock.now() - first_start, delay):
                raise
            if on_retry is not None:
                on_retry(attempt, delay, exc)
            _log.info("effect attempt failed; retrying", case_id=case_id, effect=name, path=path, attempt=attempt,
                      of=attempts, delay=delay, error_type=type(exc).__name__, error=str(exc))
            await clock.sleep(delay)
            if may_attempt is not None:
                await may_attempt()


async def _attempt(
    fn: Callable[[Mapping[str, Any]], Awaitable[Any]],
    ctx: Mapping[str, Any],
    *,
    name: str,
    path: str,
    attempt_timeout: float | None,
    clock: Clock,
) -> Mapping[str, Any] | None:
    try:
        if attempt_timeout is None:
            output = await fn(ctx)
        else:
            output = None
            finished = False
            with clock.deadline_scope(attempt_timeout) as scope:
                output = await fn(ctx)
                finished = True
            if not finished and scope.cancelled_caught:
                raise TimeoutError(
                    f"effect {name!r} at {path} did not finish within its timeout of {attempt_timeout:g}s"
                )
    except anyio.get_cancelled_exc_class() as exc:
        if cancelled_by_runtime():
            raise
        raise StrayCancellation(
            f"effect {name!r} at {path} raised {type(exc).__name__} although nothing cancelled it (it awaited a "
            "future or task that something else cancelled); it counts as a failed attempt"
        ) from exc
    if output is not None and not isinstance(output, Mapping):
        raise EffectResultError.not_mapping(name, path, output)
    return output

"""Running one effect: call `fn(ctx)`, bound each attempt by `timeout`, retry with `Retry` backoff.

Both the attempt timeout and the backoff are timed by the Substrate's clock, so a test drives them with
`VirtualClock.advance`. What counts as failure is any `Exception` from the effect, including the `TimeoutError`
raised when an attempt runs out of time; cancellation is never caught here (it propagates to the caller's
cancel scope). An effect that returns something other than a Mapping or None is a programming error, not a
transient one: it fails at once, without retries.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import structlog

from .._terms import Retry
from ._clock import Clock

_log = structlog.get_logger("wfsub.runtime")


class EffectResultError(TypeError):
    """An effect returned something other than a Mapping or None."""


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
) -> Mapping[str, Any] | None:
    """Run the effect to completion (with its retries) and return its output; raise its last exception."""
    attempts = retry.max_attempts if retry is not None else 1
    attempt = 0
    while True:
        attempt += 1
        try:
            return await _attempt(fn, ctx, name=name, path=path, attempt_timeout=attempt_timeout, clock=clock)
        except EffectResultError:
            raise
        except Exception as exc:
            if retry is None or attempt >= attempts:
                raise
            delay = retry.delay(attempt)
            _log.info(
                "effect attempt failed; retrying",
                case_id=case_id,
                effect=name,
                path=path,
                attempt=attempt,
                of=attempts,
                delay=delay,
                error=repr(exc),
            )
            await clock.sleep(delay)


async def _attempt(
    fn: Callable[[Mapping[str, Any]], Awaitable[Any]],
    ctx: Mapping[str, Any],
    *,
    name: str,
    path: str,
    attempt_timeout: float | None,
    clock: Clock,
) -> Mapping[str, Any] | None:
    if attempt_timeout is None:
        output = await fn(ctx)
    else:
        output = None
        finished = False
        with clock.deadline_scope(attempt_timeout) as scope:
            output = await fn(ctx)
            finished = True
        if not finished and scope.cancelled_caught:
            raise TimeoutError(f"effect {name!r} at {path} did not finish within its timeout of {attempt_timeout:g}s")
    if output is not None and not isinstance(output, Mapping):
        raise EffectResultError(
            f"effect {name!r} at {path} returned {type(output).__name__}; an effect must return a Mapping of "
            f"updates to the case data, or None"
        )
    return output

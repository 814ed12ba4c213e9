"""Compensation and error handling through the Substrate: a refund after a failed reservation, retries that
give up, non-retryable errors, cancel with and without compensation, retry trace events."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from wfsub import CaseCancelled, CaseFailed, Retry, effect, saga, scope, seq, task, wait

from ..harness import Recorder, running, trace_of


class OutOfStock(Exception):
    """The warehouse has none left."""


async def test_an_order_refunds_the_charge_when_the_reservation_fails() -> None:
    """reserve fails for good (tried once): the charge is refunded, on_error records it and the case goes on."""
    async with running() as (sub, clock, sink):
        rec = Recorder(clock)
        tries: list[int] = []

        async def reserve(ctx: Mapping[str, Any]) -> None:
            tries.append(1)
            raise OutOfStock("none left")

        order = seq(
            scope(
                "order",
                saga(
                    (rec.effect("charge"), rec.effect("refund")),
                    effect(reserve, retry=Retry(3, initial=1, non_retryable=(OutOfStock,))),
                ),
                on_error=task(lambda c: {"status": "cancelled: " + c["error"]["type"]}),
            ),
            task(lambda c: {"closed": True}),
        )
        handle = await sub.new_case(order)
        result = await handle.result()
    assert rec.calls == ["charge", "refund"] and len(tries) == 1
    assert result["status"] == "cancelled: OutOfStock" and result["closed"]
    assert result["error"]["compensated"] == ["refund"]


async def test_an_effect_that_exhausts_its_retries_is_caught_by_on_error_and_each_retry_is_traced() -> None:
    """Retries back off on the clock, each one a trace event (min) with attempt, delay and error; then on_error."""
    async with running() as (sub, clock, sink):
        calls: list[int] = []

        async def flaky(ctx: Mapping[str, Any]) -> None:
            calls.append(1)
            raise ConnectionError("down")

        wf = scope("s", effect(flaky, retry=Retry(3, initial=2, multiplier=3)), on_error=task(lambda c: {"h": 1}))
        handle = await sub.new_case(wf)
        await clock.advance(2)
        await clock.advance(6)
        assert (await handle.result())["h"] == 1
        retries = trace_of(sink.for_case(handle.case_id), "effect_retry")
    assert len(calls) == 3
    assert [(d["attempt"], d["delay"]) for _, _, d in retries] == [(1, 2.0), (2, 6.0)]
    assert all((d["type"], d["error"]) == ("ConnectionError", "down") for _, _, d in retries)


async def test_cancel_runs_compensations_before_the_case_ends_cancelled() -> None:
    """cancel(): the refund effect runs, then awaiters get CaseCancelled; the case was compensating meanwhile."""
    async with running() as (sub, clock, sink):
        rec = Recorder(clock)
        handle = await sub.new_case(saga((rec.effect("charge"), rec.effect("refund", delay=5)), wait("shipped")))
        await clock.settle()
        await handle.cancel()
        await clock.settle()
        assert not handle.status().ended and rec.calls == ["charge", "refund"]
        await clock.advance(5)
        with pytest.raises(CaseCancelled):
            await handle.result()


async def test_cancel_without_compensation_and_a_second_cancel_end_at_once() -> None:
    """cancel(compensate=False) skips the refund; a second cancel during a compensation stops it."""
    async with running() as (sub, clock, sink):
        rec = Recorder(clock)
        wf = saga((rec.effect("charge"), rec.effect("refund", hang=True)), wait("shipped"))
        quick = await sub.new_case(wf)
        await clock.settle()
        await sub.cancel(quick.case_id, compensate=False)
        with pytest.raises(CaseCancelled):
            await quick.result()
        assert rec.calls == ["charge"]
        twice = await sub.new_case(wf)
        await clock.settle()
        await twice.cancel()
        await clock.settle()
        await twice.cancel()
        with pytest.raises(CaseCancelled):
            await twice.result()
    assert rec.calls == ["charge", "charge", "refund"] and rec.cancelled == ["refund"]


async def test_an_uncaught_failure_compensates_then_fails_the_case_with_the_record() -> None:
    """No on_error: the saga compensates, CaseFailed has the original error as cause and the record."""
    async with running() as (sub, clock, sink):
        rec = Recorder(clock)

        def reject(ctx: Mapping[str, Any]) -> None:
            raise ValueError("card declined")

        handle = await sub.new_case(saga((rec.effect("hold"), rec.effect("release")), task(reject)))
        with pytest.raises(CaseFailed) as info:
            await handle.result()
    assert isinstance(info.value.__cause__, ValueError) and rec.calls == ["hold", "release"]
    assert info.value.record is not None and info.value.record["compensated"] == ["release"]

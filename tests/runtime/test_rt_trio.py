"""The core scenarios on the trio backend: the runtime uses anyio only."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
import structlog

from wfsub import CaseCancelled, CaseFailed, Retry, Substrate, defer, effect, mi, par, seq, sleep, task, wait

from ..harness import Recorder, running


def on_trio(fn: Any) -> None:
    anyio.run(fn, backend="trio")


def test_trio_effects_signals_and_virtual_timers() -> None:
    """On trio: effects, a persistent signal, a sleep and a deferred-choice timeout complete correctly."""
    async def main() -> None:
        async with running() as (sub, clock, sink):
            rec = Recorder(clock)
            wf = seq(
                par(rec.effect("a", {"a": 1}, delay=1), rec.effect("b", {"b": 2})),
                wait("go"),
                sleep(5),
                defer({"approve": rec.step("approved", {"outcome": "yes"})}, timeout=10,
                      on_timeout=rec.step("expired", {"outcome": "expired"})),
            )
            handle = await sub.new_case(wf)
            await handle.signal("go", "now")
            await clock.advance(1)
            await clock.advance(5)
            assert handle.status().state == "waiting_signal"
            await clock.advance(10)
            result = await handle.result()
        assert result == {"a": 1, "b": 2, "go": "now", "outcome": "expired"}
        assert (sorted(rec.calls), rec.steps) == (["a", "b"], ["expired"])
        assert sink.kinds(handle.case_id)[-1] == "case_done"

    on_trio(main)


def test_trio_retry_failure_and_isolation() -> None:
    """On trio: retries back off on the clock; a failing case fails alone."""
    async def main() -> None:
        calls = 0

        async def flaky(ctx: Any) -> None:
            nonlocal calls
            calls += 1
            raise ConnectionError("down")

        with structlog.testing.capture_logs():
            async with running() as (sub, clock, _):
                bad = await sub.new_case(effect(flaky, retry=Retry(3, initial=1)))
                good = await sub.new_case(mi(task(lambda c: {"v": c["index"]}), count=3, collect="out"))
                await clock.advance(3)
                with pytest.raises(CaseFailed) as info:
                    await bad.result()
                assert isinstance(info.value.__cause__, ConnectionError)
                assert (await good.result())["out"] == [{"v": 0}, {"v": 1}, {"v": 2}]
        assert calls == 3

    on_trio(main)


def test_trio_cancel_and_shutdown_stop_effects() -> None:
    """On trio: cancel() and leaving the Substrate cancel in-flight effects; awaiters get CaseCancelled."""
    async def main() -> None:
        rec = Recorder()
        async with running() as (sub, clock, _):
            one = await sub.new_case(rec.effect("one", hang=True))
            two = await sub.new_case(rec.effect("two", hang=True))
            await clock.advance(0)
            await one.cancel()
            with pytest.raises(CaseCancelled, match="cancelled"):
                await one.result()
        with pytest.raises(CaseCancelled, match="substrate closed"):
            await two.result()
        assert (sorted(rec.calls), sorted(rec.cancelled)) == (["one", "two"], ["one", "two"])

    on_trio(main)


def test_trio_real_clock_sleep() -> None:
    """On trio with the real clock, a short sleep fires."""
    async def main() -> None:
        async with Substrate() as sub:
            handle = await sub.new_case(seq(sleep(0.01), task(lambda c: {"woke": True})))
            assert await handle.result(timeout=5) == {"woke": True}

    on_trio(main)


def test_trio_many_signals() -> None:
    """On trio: 20 producers x 10 signals to one case, each consumed once."""
    from wfsub import loop

    async def main() -> None:
        wf = loop(seq(wait("x"), task(lambda c: {"n": c["n"] + 1})), times=200)
        async with Substrate(trace_level="none", mailbox_size=8) as sub:
            handle = await sub.new_case(wf, {"n": 0})

            async def producer() -> None:
                for _ in range(10):
                    await handle.signal("x")

            async with anyio.create_task_group() as tg:
                for _ in range(20):
                    tg.start_soon(producer)
            assert (await handle.result())["n"] == 200

    on_trio(main)


def test_trio_leaving_right_after_starting() -> None:
    """On trio: cases whose actors never ran before the exit end cancelled."""
    async def main() -> None:
        async with Substrate(trace_level="none") as sub:
            handles = [await sub.new_case(wait("go")) for _ in range(20)]
        for handle in handles:
            with pytest.raises(CaseCancelled, match="substrate closed"):
                await handle.result()

    on_trio(main)

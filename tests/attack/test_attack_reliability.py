"""An independent attack on the reliability promises (a case's failure never disturbs another case or the
Substrate, and nothing a user gave is lost) through the public API: variations of each fixed
fault through other constructs, backends and stores.

Tests marked xfail(strict=True) are faults found on the current code (each reason says what is wrong); the
others pin behaviour that held up.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Mapping
from typing import Any

import anyio
import pytest

from wfsub import (
    CallbackSink,
    CaseFailed,
    InvalidWorkflow,
    LimitExceeded,
    MemorySink,
    Substrate,
    mi,
    seq,
    task,
    wait,
)


def _ok(ctx: Mapping[str, Any]) -> dict[str, Any]:
    return {"ok": True}


# -- huge mis ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("bound", [{}, {"max": 5}])
async def test_an_endless_items_iterable_fails_at_the_mi_without_being_read_to_the_end(bound: dict[str, int]) -> None:
    """items= returning an endless iterator fails that case at the limit instead of eating the process's memory."""
    async with Substrate(max_instances=1_000) as sub:
        handle = await sub.new_case(mi(task(_ok), items=lambda c: itertools.count(), **bound))
        with anyio.fail_after(10), pytest.raises(CaseFailed, match="more") as info:
            await handle.result()
        assert isinstance(info.value.__cause__, LimitExceeded) and info.value.record["path"] == "mi"
        assert await (await sub.new_case(task(_ok))).result() == {"ok": True}


# -- trace sinks ------------------------------------------------------------------------------------------------


async def test_a_sink_listed_twice_is_refused_rather_than_fed_every_event_twice() -> None:
    """Substrate(sinks=[s, s]) is a mistake refused at once; it never delivers each event twice."""
    sink = MemorySink()
    with pytest.raises(ValueError, match="twice"):
        Substrate(sinks=[sink, sink])
    async with Substrate(sinks=[sink, MemorySink()]) as sub:
        await (await sub.new_case(task(_ok))).result()
    assert [e.kind for e in sink.events] == ["case_started", "task", "case_done"]


# -- validation of the registry ---------------------------------------------------------------------------------


def test_a_broken_registered_workflow_is_named_in_the_error() -> None:
    """Substrate(workflows=...) refusing a broken entry says which entry (and version) it is."""
    good, broken = task(_ok), seq(task(_ok), mi(task(_ok), count=1, join=2))
    with pytest.raises(InvalidWorkflow, match=r"invalid workflows\['refund'\]: 1 issue\n  - seq\[1\]\.mi: join=2"):
        Substrate(workflows={"order": good, "refund": broken})
    with pytest.raises(InvalidWorkflow, match=r"workflows\['order'\] \(version 1 of 2, oldest first\)"):
        Substrate(workflows={"order": [broken, good]})


class Fatal(BaseException):
    """A BaseException an app defines (not cancellation, KeyboardInterrupt or SystemExit)."""


def _raise(error: BaseException) -> Any:
    def fn(*args: Any) -> None:
        raise error

    return fn


@pytest.mark.parametrize("error", [Fatal("sink"), GeneratorExit()], ids=["Fatal", "GeneratorExit"])
async def test_a_sink_raising_a_base_exception_is_a_sink_error_not_the_end_of_the_substrate(
    error: BaseException,
) -> None:
    """A sink (or its dropped()) raising any BaseException but KeyboardInterrupt/SystemExit is counted and logged."""
    called = anyio.Event()

    def sink(event: Any) -> None:
        called.set()
        raise error

    async with Substrate(sinks=[CallbackSink(sink)]) as sub:
        waiting = await sub.new_case(seq(wait("go"), task(_ok)))
        assert await (await sub.new_case(task(_ok))).result() == {"ok": True}
        with anyio.fail_after(10):
            await called.wait()
        await waiting.signal("go")
        assert await waiting.result() == {"go": None, "ok": True}
    assert sub.statistics().sink_errors >= 1


@pytest.mark.parametrize("error", [ValueError("secret-42"), Fatal("redact")], ids=["ValueError", "Fatal"])
async def test_a_redact_that_raises_withholds_the_value_and_disturbs_nothing(error: BaseException) -> None:
    """A failing redact= never crashes the Substrate, never makes status() raise, and never shows the value."""
    sink = MemorySink()
    async with Substrate(redact=_raise(error), sinks=[sink]) as sub:
        waiting = await sub.new_case(seq(wait("go"), task(_ok)))
        failing = await sub.new_case(task(lambda c: {"pin": c["pin"]}), {"secret": "s3cr3t"})
        with pytest.raises(CaseFailed):
            await failing.result()
        failure = failing.status().failure
        assert failure is not None and failure.message == f"<withheld: redact raised {type(error).__name__}>"
        await waiting.signal("go")
        assert await waiting.result() == {"go": None, "ok": True}
    assert sink.events and all("s3cr3t" not in repr(e.detail) for e in sink.events)


@pytest.mark.parametrize("given", [{"b", "a"}, frozenset({"b", "a"})], ids=["set", "frozenset"])
async def test_mi_items_that_are_a_set_fail_at_the_mi(given: Any) -> None:
    """items= returning a set is refused: its order (str hashing) differs between processes, so results would."""
    async with Substrate() as sub:
        handle = await sub.new_case(mi(task(_ok), items=lambda c: given))
        with pytest.raises(CaseFailed, match="has no order: return a list") as info:
            await handle.result()
        assert info.value.record["path"] == "mi"


async def test_a_stray_cancellation_from_an_async_sink_is_that_sinks_error_and_other_sinks_see_everything() -> None:
    """An async sink that awaited a future something else cancelled is a failing sink; the hub and sinks go on."""

    async def stray(event: Any) -> None:
        future = asyncio.get_running_loop().create_future()
        future.cancel()
        await future

    other = MemorySink()
    async with Substrate(sinks=[CallbackSink(stray), other]) as sub:
        for _ in range(3):
            assert await (await sub.new_case(task(_ok))).result() == {"ok": True}
    stats = sub.statistics()
    assert stats.trace_dropped == 0 and stats.sink_errors >= 1
    assert [e.kind for e in other.events].count("case_done") == 3

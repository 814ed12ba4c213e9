"""Attacks through the public API: races (a case's start, its end, its recovery, its loading from the store),
concurrent awaiters, odd inputs, and a durable restart on trio."""

from __future__ import annotations

import datetime
import random
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio
import pytest

import wfsub
from wfsub import CaseCancelled, CaseExists, SignalRejected, Substrate, effect, loop, seq, task, wait
from wfsub.stores import MemoryStore

from ._util import check_shape, eventually, field, kinds, wait_all_blocked

STORE_KINDS = ["memory", "sqlite"]


def make_store(kind: str, tmp_path: Path) -> Any:
    return MemoryStore() if kind == "memory" else str(tmp_path / "cases.db")


class Counted:
    """An effect that counts its calls and waits for `release` (set it to let calls return)."""

    def __init__(self) -> None:
        self.calls = 0
        self.release = anyio.Event()

    async def __call__(self, ctx: Mapping[str, Any]) -> dict[str, Any]:
        self.calls += 1
        await self.release.wait()
        return {"counted": True}


COUNTED = Counted()


@pytest.fixture
def counted() -> Counted:
    COUNTED.calls, COUNTED.release = 0, anyio.Event()
    return COUNTED


FLOWS = {
    "effect_then_wait": seq(effect(COUNTED, name="counted"), wait("go", into="go")),
    "wait_then_effect": seq(wait("go", into="go"), effect(COUNTED, name="counted")),
    "ticks": seq(loop(seq(wait("tick", into="last"), task(lambda c: {"n": c.get("n", 0) + 1})),
                      until=lambda c: c["n"] >= 40), wait("fin")),
}


async def test_concurrent_new_case_with_one_id_starts_one_case(tmp_path: Path, counted: Counted) -> None:
    """new_case with one id six times at once: five with equal data get one case (one actor), one CaseExists."""
    async with Substrate(store=str(tmp_path / "cases.db"), workflows=FLOWS) as sub:
        outcomes: list[str] = []

        async def start(data: dict[str, int]) -> None:
            try:
                handle = await sub.new_case("effect_then_wait", data, case_id="same")
                outcomes.append(f"started {handle.case_id}")
            except CaseExists:
                outcomes.append("exists")
            except wfsub.WfsubError as exc:
                outcomes.append(f"{type(exc).__name__}: {exc}")

        async with anyio.create_task_group() as tg:
            for _ in range(5):
                tg.start_soon(start, {})
            tg.start_soon(start, {"other": 1})
        assert sorted(outcomes) == ["exists"] + ["started same"] * 5, outcomes
        counted.release.set()
        await sub.signal("same", "go", 1)
        assert await sub.await_case("same") == {"counted": True, "go": 1}
        assert counted.calls == 1


@pytest.mark.parametrize("kind", STORE_KINDS)
async def test_signals_racing_the_case_end_are_journaled_iff_acknowledged(kind: str, tmp_path: Path,
                                                                         counted: Counted) -> None:
    """Signals racing a case's end: journaled (before `end`) exactly when the call returned."""
    rng = random.Random(5)
    async with Substrate(store=make_store(kind, tmp_path), workflows=FLOWS) as sub:
        await sub.new_case("wait_then_effect", {}, case_id="c")
        acknowledged: list[str] = []
        rejected: list[str] = []

        async def send(i: int) -> None:
            for _ in range(rng.randint(0, 30)):
                await anyio.lowlevel.checkpoint()
            try:
                await sub.signal("c", "go", i, request_id=f"r{i}")
                acknowledged.append(f"r{i}")
            except SignalRejected:
                rejected.append(f"r{i}")

        async with anyio.create_task_group() as tg:
            for i in range(60):
                tg.start_soon(send, i)
            for _ in range(10):
                await anyio.lowlevel.checkpoint()
            counted.release.set()
        await sub.await_case("c")
        journal = await sub.journal("c")
    check_shape(journal)
    assert sorted(field(r, "request_id") for r in journal if r.kind == "signal") == sorted(acknowledged)
    assert len(acknowledged) + len(rejected) == 60 and acknowledged


@pytest.mark.parametrize("kind", STORE_KINDS)
async def test_cancel_racing_recovery_ends_the_case_once(kind: str, tmp_path: Path, counted: Counted) -> None:
    """A case recovered with its effect in flight, cancelled as soon as the Substrate is back: cancelled, one end."""
    store = make_store(kind, tmp_path)
    async with Substrate(store=store, workflows=FLOWS) as sub:
        await sub.new_case("effect_then_wait", {}, case_id="c")
        await wait_all_blocked()
        assert counted.calls == 1
    async with Substrate(store=store, workflows=FLOWS) as sub:
        await sub.cancel("c", request_id="stop")
        with pytest.raises(CaseCancelled):
            await sub.await_case("c")
        await sub.cancel("c", request_id="stop")
        journal = await sub.journal("c")
    check_shape(journal)
    assert kinds(journal) == ["start", "cancel", "end"] and field(journal[-1], "outcome") == "cancelled"


@pytest.mark.parametrize("kind", STORE_KINDS)
async def test_many_concurrent_signals_to_a_parked_case_being_loaded(kind: str, tmp_path: Path) -> None:
    """60 concurrent signals and 5 awaiters to a parked case being loaded: each applied once."""
    store = make_store(kind, tmp_path)
    async with Substrate(store=store, workflows=FLOWS) as sub:
        await sub.new_case("ticks", {}, case_id="c")
        await wait_all_blocked()
    async with Substrate(store=store, workflows=FLOWS, mailbox_size=3) as sub:
        results: list[dict[str, Any]] = []

        async def waiter() -> None:
            results.append(await sub.await_case("c"))

        async with anyio.create_task_group() as tg:
            for _ in range(5):
                tg.start_soon(waiter)
            async with anyio.create_task_group() as senders:
                for i in range(60):
                    senders.start_soon(lambda i=i: sub.signal("c", "tick", i, request_id=f"t{i}"))
            await sub.signal("c", "fin")
        journal = await sub.journal("c")
    assert len(results) == 5 and all(r == results[0] for r in results) and results[0]["n"] == 40
    ids = [field(r, "request_id") for r in journal if r.kind == "signal" and field(r, "name") == "tick"]
    assert sorted(ids) == sorted(f"t{i}" for i in range(60))
    check_shape(journal)


async def test_concurrent_cancels_of_a_suspended_case_end_it_once(tmp_path: Path) -> None:
    """Three cancels at once of a suspended case (SQLite): one `cancel` and one `end` recorded; a cancel that comes
    after the case ended is refused as ended (as any cancel of an ended case is), never with another error."""
    from .test_versions import V3_RENAMED, started

    path = str(tmp_path / "cases.db")
    clock = wfsub.testing.VirtualClock(1000.0)
    await started(path, clock, "c")
    async with Substrate(store=path, workflows={"wf": V3_RENAMED}, clock=clock) as sub:
        await eventually(lambda: sub.status("c").state == "suspended")
        errors: list[str] = []

        async def cancel() -> None:
            try:
                await sub.cancel("c")
            except wfsub.WfsubError as exc:
                errors.append(f"{type(exc).__name__}: {exc}")

        async with anyio.create_task_group() as tg:
            for _ in range(3):
                tg.start_soon(cancel)
        assert len(errors) < 3, errors
        assert all(e.startswith("SignalRejected") and "ended" in e for e in errors), errors
        assert kinds(await sub.journal("c")) == ["start", "signal", "cancel", "end"]


# -- odd data ---------------------------------------------------------------------------------------------------


def stamp(ctx: Mapping[str, Any]) -> dict[str, Any]:
    return {"when": datetime.datetime(2025, 1, 1)}  # a task output that is not JSON


@pytest.mark.parametrize("kind", STORE_KINDS)
async def test_a_task_output_that_is_not_json_does_not_brick_a_durable_case(kind: str, tmp_path: Path) -> None:
    """A task returning a datetime: the case takes its next signal and ends with an `end` record (or fails there)."""
    async with Substrate(store=make_store(kind, tmp_path), workflows={"flow": seq(task(stamp), wait("go"))}) as sub:
        await sub.new_case("flow", {}, case_id="c")
        await wait_all_blocked()
        try:
            await sub.signal("c", "go")  # sqlite: StoreError 'cannot store the row ... datetime'
            await sub.await_case("c")
        except (wfsub.CaseFailed, wfsub.SignalRejected):  # it failed at the task: ended before the signal
            with pytest.raises(wfsub.CaseFailed, match="not JSON"):
                await sub.await_case("c")  # returns once the `end` record is written
        journal = await sub.journal("c")
        assert journal[-1].kind == "end"  # memory: no end ('could not record a case's end')


async def test_a_lone_surrogate_in_start_data_is_refused_naming_the_path() -> None:
    """Start data holding a lone surrogate (not encodable as UTF-8 JSON) raises TypeError naming the path."""
    async with Substrate(store=MemoryStore(), workflows={"flow": seq(wait("go"))}) as sub:
        with pytest.raises(TypeError, match=r'data\["s"\]'):
            await sub.new_case("flow", {"s": "ok \ud800"})


# -- trio -------------------------------------------------------------------------------------------------------


def test_a_durable_restart_on_trio(tmp_path: Path) -> None:
    """On trio: a case with an effect in flight and a parked case survive a clean exit and end after a restart."""
    gate = {"open": False}

    async def slow(ctx: Mapping[str, Any]) -> dict[str, Any]:
        if not gate["open"]:
            await anyio.sleep_forever()
        return {"slow": True}

    flows = {"eff": seq(effect(slow, name="slow")), "sig": seq(wait("go", into="go"), task(lambda c: {"t": 1}))}
    path = str(tmp_path / "cases.db")

    async def first() -> None:
        async with Substrate(store=path, workflows=flows) as sub:
            await sub.new_case("eff", {}, case_id="e")
            await sub.new_case("sig", {}, case_id="s")
            await wait_all_blocked()

    async def second() -> tuple[Any, Any, list[str]]:
        gate["open"] = True
        async with Substrate(store=path, workflows=flows) as sub:
            await sub.signal("s", "go", (1,))
            return await sub.await_case("e"), await sub.await_case("s"), kinds(await sub.journal("e"))

    anyio.run(first, backend="trio")
    e, s, journal = anyio.run(second, backend="trio")
    assert e == {"slow": True} and s == {"go": [1], "t": 1} and journal == ["start", "effect", "end"]

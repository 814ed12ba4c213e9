"""Versions: a case runs on the version whose fingerprint it recorded; with that version gone it migrates to the
newest when its whole journal applies and its effects and timers in flight match (a `version` record), and is
otherwise suspended (intact, cancellable, resumed once its version is registered again)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio
import pytest

import wfsub
from wfsub import CaseCancelled, SignalRejected, Substrate, effect, seq, sleep, task, wait
from wfsub.stores import MemoryStore
from wfsub.testing import VirtualClock

from ..lifecycle._util import KINDS, node, store_maker
from ._util import check_shape, eventually, field, kinds, outside, wait_all_blocked

T0 = 1000.0


def a_one(ctx: Mapping[str, Any]) -> dict[str, Any]:
    return {"a": 1}


def a_two(ctx: Mapping[str, Any]) -> dict[str, Any]:
    return {"a": 2}  # the same task edited: another output


def b(ctx: Mapping[str, Any]) -> dict[str, Any]:
    return {"b": True}


V1 = seq(task(a_one), wait("x", into="x"), wait("y", into="y"))
V2_COMPATIBLE = seq(task(a_one), wait("x", into="x"), wait("y", into="y"), task(b))  # a step added at the end
V3_RENAMED = seq(task(a_one), wait("z", into="x"), wait("y", into="y"))  # the first wait takes another signal
V4_EDITED = seq(task(a_two), wait("x", into="x"), wait("y", into="y"))  # a task that already ran gives another output


async def inbox_gone(cli: Any, inbox_id: int) -> bool:
    return await cli.inbox_row(inbox_id) is None


async def has_version(sub: Substrate) -> bool:
    return "version" in kinds(await sub.journal("c"))


async def started(store: Any, clock: VirtualClock, *ids: str) -> None:
    """Cases of V1 that took signal x and wait for y, left in the store."""
    async with Substrate(store=store, workflows={"wf": V1}, clock=clock) as sub:
        for cid in ids:
            await sub.new_case("wf", {}, case_id=cid)
            await sub.signal(cid, "x", cid)
        await clock.advance(0)


async def test_the_same_version_resumes_without_a_version_record() -> None:
    """With the version a case recorded registered (among others), it runs on it: no `version` record."""
    store, clock = MemoryStore(), VirtualClock(T0)
    await started(store, clock, "c")
    async with Substrate(store=store, workflows={"wf": [V1, V2_COMPATIBLE]}, clock=clock) as sub:
        await sub.signal("c", "y", 1)
        assert await sub.await_case("c") == {"a": 1, "x": "c", "y": 1}  # V1's result: no task b
        journal = await sub.journal("c")
    assert kinds(journal) == ["start", "signal", "signal", "end"]


async def test_a_compatible_change_migrates_with_a_version_record() -> None:
    """With only a compatible newer version registered, a parked case migrates (a `version` record) and runs on it."""
    store, clock = MemoryStore(), VirtualClock(T0)
    await started(store, clock, "c")
    v1, v2 = wfsub.compile(V1).fingerprint, wfsub.compile(V2_COMPATIBLE).fingerprint
    async with Substrate(store=store, workflows={"wf": V2_COMPATIBLE}, clock=clock) as sub:
        await sub.signal("c", "y", 1)
        assert await sub.await_case("c") == {"a": 1, "x": "c", "y": 1, "b": True}
        journal = await sub.journal("c")
    assert kinds(journal) == ["start", "signal", "version", "signal", "end"]
    check_shape(journal)
    version = journal[2]
    assert (field(version, "from"), field(version, "to")) == (v1, v2)
    assert field(journal[0], "fingerprint") == v1
    report = wfsub.replay(V2_COMPATIBLE, journal)
    assert report.divergence is None and report.data == {"a": 1, "x": "c", "y": 1, "b": True}
    async with Substrate(store=store, workflows={"wf": V2_COMPATIBLE}, clock=clock) as sub:  # later runs: as is
        assert sub.status("c").state == "done" and await sub.await_case("c") == report.data


async def test_a_compatible_change_keeps_an_armed_timer_and_its_due_time() -> None:
    """A case parked on a timer migrates to a compatible version; its timer keeps its due time and fires."""
    store, clock = MemoryStore(), VirtualClock(T0)
    old = seq(task(a_one), sleep(10))
    new = seq(task(a_one), sleep(10), task(b))
    async with Substrate(store=store, workflows={"wf": old}, clock=clock) as sub:
        await sub.new_case("wf", {}, case_id="c")
        await clock.advance(1)
    async with Substrate(store=store, workflows={"wf": new}, clock=clock) as sub:
        await eventually(lambda: has_version(sub))  # the version check runs beside the cases
        assert [t.due for t in sub.status("c").timers] == [T0 + 10]
        await clock.advance(9)
        assert await sub.await_case("c") == {"a": 1, "b": True}
        journal = await sub.journal("c")
    assert kinds(journal) == ["start", "version", "timer", "end"] and journal[2].time == T0 + 10


async def test_a_compatible_change_migrates_a_case_with_an_effect_in_flight() -> None:
    """A case with an effect in flight migrates to a compatible version; the effect runs again and it ends."""
    gate = anyio.Event()

    async def slow(ctx: Mapping[str, Any]) -> dict[str, Any]:
        await gate.wait()
        return {"slow": True}

    old = seq(task(a_one), effect(slow, name="slow"))
    new = seq(task(a_one), effect(slow, name="slow"), task(b))
    store = MemoryStore()
    async with Substrate(store=store, workflows={"wf": old}) as sub:
        await sub.new_case("wf", {}, case_id="c")
        await wait_all_blocked()
        assert sub.status("c").state == "waiting_effect"
    gate.set()
    async with Substrate(store=store, workflows={"wf": new}) as sub:
        assert await sub.await_case("c") == {"a": 1, "slow": True, "b": True}  # SignalRejected: suspended
        assert "version" in kinds(await sub.journal("c"))


@pytest.mark.parametrize(("newer", "names"), [(V3_RENAMED, "signal 'x'"), (V4_EDITED, "seq[0].task")])
async def test_an_incompatible_change_suspends_then_the_old_version_resumes(newer: wfsub.Term, names: str) -> None:
    """An incompatible version suspends the case intact; its old version registered resumes it."""
    store, clock = MemoryStore(), VirtualClock(T0)
    await started(store, clock, "c")
    async with outside(store) as reader:
        before = await reader.journal("c")
    async with Substrate(store=store, workflows={"wf": newer}, clock=clock) as sub:
        await clock.advance(0)
        await eventually(lambda: sub.status("c").state == "suspended")
        status = sub.status("c")
        assert status.suspended_reason is not None
        assert "diverges at journal record 1 (signal)" in status.suspended_reason
        assert names in status.suspended_reason
        assert [c.case_id for c in sub.cases(state="suspended")] == ["c"]
        with pytest.raises(SignalRejected, match="suspended"):
            await sub.signal("c", "y", 1)
    async with outside(store) as reader:
        assert await reader.journal("c") == before  # kept intact
    async with Substrate(store=store, workflows={"wf": [V1, newer]}, clock=clock) as sub:
        await sub.signal("c", "y", 1)
        assert await sub.await_case("c") == {"a": 1, "x": "c", "y": 1}
        assert kinds(await sub.journal("c")) == ["start", "signal", "signal", "end"]


async def test_a_suspended_case_can_be_cancelled_and_ends_at_once(tmp_path: Path) -> None:
    """A suspended case is cancelled at once, by the Substrate or through the inbox: `cancel` and `end` recorded."""
    store, clock = str(tmp_path / "cases.db"), VirtualClock(T0)
    await started(store, clock, "c", "d")
    async with Substrate(store=store, workflows={"wf": V3_RENAMED}, clock=clock) as sub:
        await eventually(lambda: {sub.status(c).state for c in ("c", "d")} == {"suspended"})
        await sub.cancel("c", request_id="cancel-c")
        with pytest.raises(CaseCancelled):
            await sub.await_case("c")
        journal = await sub.journal("c")
        assert kinds(journal) == ["start", "signal", "cancel", "end"]
        assert field(journal[-1], "outcome") == "cancelled" and field(journal[2], "request_id") == "cancel-c"
        with pytest.raises(SignalRejected, match="already ended"):
            await sub.cancel("c")  # ended: refused, as a signal is
        async with outside(store) as cli:
            inbox_id = await cli.inbox_put("d", "cancel", {"reason": "ops"}, request_id=None, created_at=clock.now())
            await eventually(lambda: sub.status("d").ended)
            await eventually(lambda: inbox_gone(cli, inbox_id))  # taken
        assert sub.status("d").state == "cancelled"
        assert kinds(await sub.journal("d")) == ["start", "signal", "cancel", "end"]


async def test_a_case_whose_workflow_name_is_gone_is_suspended_with_the_registered_names() -> None:
    """A case whose workflow name is no longer registered at all is suspended, the reason naming what is."""
    store, clock = MemoryStore(), VirtualClock(T0)
    await started(store, clock, "c")
    async with Substrate(store=store, workflows={"other": V2_COMPATIBLE}, clock=clock) as sub:
        await eventually(lambda: sub.status("c").state == "suspended")
        reason = sub.status("c").suspended_reason or ""
        assert "'wf'" in reason and "other" in reason


async def test_a_suspended_case_resumes_on_a_compatible_version_deployed_alone() -> None:
    """A case suspended by an incompatible version resumes, migrated, once a compatible one is registered alone."""
    store, clock = MemoryStore(), VirtualClock(T0)
    await started(store, clock, "c")
    async with Substrate(store=store, workflows={"wf": V3_RENAMED}, clock=clock) as sub:
        await clock.advance(0)
        await eventually(lambda: sub.status("c").state == "suspended")
    async with Substrate(store=store, workflows={"wf": V2_COMPATIBLE}, clock=clock) as sub:
        await clock.advance(0)
        await eventually(lambda: sub.status("c").state == "waiting_signal")
        await sub.signal("c", "y", 1)
        assert await sub.await_case("c") == {"a": 1, "x": "c", "y": 1, "b": True}
        assert kinds(await sub.journal("c")) == ["start", "signal", "version", "signal", "end"]


async def test_a_suspended_case_is_signalled_once_a_compatible_version_is_registered_beside_an_incompatible_one(
) -> None:
    """With an incompatible newest version and a compatible older one registered, a suspended case migrates to
    the compatible one when an input brings it back."""
    store, clock = MemoryStore(), VirtualClock(T0)
    await started(store, clock, "c")
    async with Substrate(store=store, workflows={"wf": V3_RENAMED}, clock=clock) as sub:
        await clock.advance(0)
        await eventually(lambda: sub.status("c").state == "suspended")
    async with Substrate(store=store, workflows={"wf": [V2_COMPATIBLE, V3_RENAMED]}, clock=clock) as sub:
        await sub.signal("c", "y", 1)
        assert await sub.await_case("c") == {"a": 1, "x": "c", "y": 1, "b": True}


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
async def test_a_version_running_another_effect_than_the_one_in_flight_suspends_the_case(
    kind: str, tmp_path: Path
) -> None:
    """A case blocked inside effect charge_v1 (its row lists it) reopened with only charge_v2 is suspended with a
    divergence naming both effects, never run on charge_v2; the old version registered again finishes it."""
    calls: list[str] = []
    gate = anyio.Event()

    async def charge_v1(ctx: Mapping[str, Any]) -> dict[str, Any]:
        calls.append("v1")
        await gate.wait()
        return {"charged": "v1"}

    async def charge_v2(ctx: Mapping[str, Any]) -> dict[str, Any]:
        calls.append("v2")
        return {"charged": "v2"}

    old = seq(task(a_one), effect(charge_v1))
    new = seq(task(a_one), effect(charge_v2))
    store: Any = MemoryStore() if kind == "memory" else str(tmp_path / "cases.db")
    clock = VirtualClock(T0)
    async with Substrate(store=store, workflows={"wf": old}, clock=clock) as sub:
        await sub.new_case("wf", {}, case_id="c")
        await clock.advance(1)  # past the moment the row records the effect in flight
    async with outside(store) as reader:
        row = await reader.row("c")
        assert row is not None and row.state == "waiting_effect"
        assert [(e["path"], e["name"]) for e in row.effects] == [("seq[1].effect", "charge_v1")]
    async with Substrate(store=store, workflows={"wf": new}, clock=clock) as sub:
        await clock.advance(0)
        await eventually(lambda: sub.status("c").state == "suspended")
        reason = sub.status("c").suspended_reason
        assert reason is not None
        assert "effects in flight: effect 1 'charge_v1' at seq[1].effect" in reason
        differs = "effect 1: in flight 'charge_v1' at seq[1].effect, the new version has 'charge_v2' at seq[1].effect"
        assert differs in reason
    assert calls == ["v1"]
    gate.set()
    async with Substrate(store=store, workflows={"wf": [old, new]}, clock=clock) as sub:
        assert await sub.await_case("c") == {"a": 1, "charged": "v1"}
        assert "version" not in kinds(await sub.journal("c"))
    assert calls == ["v1", "v1"]


async def test_a_running_row_is_checked_for_the_effects_it_listed_that_no_record_answered() -> None:
    """A row written before its last inputs were applied (a running case): each effect it lists that the journal
    did not answer must be in flight on the new version with the same name; answered ones no longer count."""
    from wfsub import compile as compile_
    from wfsub._runtime._persist import check_version

    gate = anyio.Event()

    async def charge_v1(ctx: Mapping[str, Any]) -> dict[str, Any]:
        await gate.wait()
        return {"charged": 1}

    async def charge_v2(ctx: Mapping[str, Any]) -> dict[str, Any]:
        return {"charged": 2}

    old = seq(effect(charge_v1), wait("go"), effect(charge_v1))
    new = seq(effect(charge_v2), wait("go"), effect(charge_v2))
    store, clock = MemoryStore(), VirtualClock(T0)
    async with Substrate(store=store, workflows={"wf": old}, clock=clock) as sub:
        await sub.new_case("wf", {}, case_id="c")
        await clock.advance(1)
    async with outside(store) as reader:
        row = await reader.row("c")
        records = await reader.journal("c")
    assert row is not None and [e["name"] for e in row.effects] == ["charge_v1"]
    row.state = "running"
    with pytest.raises(wfsub.ReplayDivergence, match="effect 1: in flight 'charge_v1' at seq\\[0\\].effect, the new "
                                                     "version has 'charge_v2' at seq\\[0\\].effect"):
        check_version(compile_(new), row, records)
    gate.set()
    async with Substrate(store=store, workflows={"wf": old}, clock=clock) as sub:
        await eventually(lambda: sub.status("c").state == "waiting_signal")
    async with outside(store) as reader:
        answered = await reader.journal("c")
    assert [r["kind"] for r in answered] == ["start", "effect"]
    check_version(compile_(new), row, answered)  # the listed effect was answered: nothing of it is in flight


class Inserted:
    calls = 0


async def waiting_effect(ctx: Mapping[str, Any]) -> dict[str, Any]:
    Inserted.calls += 1
    return {"inserted": True}


PARKED_V2 = seq(task(a_one), wait("go", into="go"), task(b))
INSERTED_V3 = seq(task(a_one), effect(waiting_effect), wait("go", into="go"), task(b))  # an effect before the wait


@pytest.mark.parametrize("kind", KINDS)
async def test_a_suspended_case_stays_suspended_whatever_input_arrives(kind: str, tmp_path: Path) -> None:
    """A case parked at a wait on v2, with only v3 (an effect inserted before that wait) registered, is suspended;
    a signal for the wait it parked at is then refused and runs nothing of v3, and so is every later open's check
    of suspended cases; a cancel ends it at once; v2 registered again would have resumed it."""
    make = store_maker(kind, tmp_path)
    Inserted.calls = 0
    async with Substrate(store=make(), workflows={"wf": PARKED_V2}, **node(kind)) as sub:
        for cid in ("c", "d"):
            await sub.new_case("wf", {}, case_id=cid)
            await eventually(lambda cid=cid: sub.status(cid).state == "waiting_signal")
    for _ in range(2):
        clock = VirtualClock(time.time())
        async with Substrate(store=make(), workflows={"wf": INSERTED_V3}, clock=clock, **node(kind)) as sub:
            await clock.settle()  # (its check of the versions of parked and suspended cases included)
            for cid in ("c", "d"):
                assert sub.status(cid).state == "suspended"
                assert "waiting_effect" in (sub.status(cid).suspended_reason or "")
            with pytest.raises(SignalRejected, match="it is suspended"):
                await sub.signal("c", "go", 1)
            await clock.settle()
            assert sub.status("c").state == "suspended" and Inserted.calls == 0
            assert kinds(await sub.journal("c")) == ["start"]
    async with Substrate(store=make(), workflows={"wf": INSERTED_V3}, **node(kind)) as sub:
        await sub.cancel("c", reason="gone")
        with pytest.raises(CaseCancelled):
            await sub.await_case("c")
        assert kinds(await sub.journal("c")) == ["start", "cancel", "end"]
    async with Substrate(store=make(), workflows={"wf": [PARKED_V2, INSERTED_V3]}, **node(kind)) as sub:
        await sub.signal("d", "go", 2)
        assert await sub.await_case("d") == {"a": 1, "go": 2, "b": True}
    assert Inserted.calls == 0

"""`retry` of failed cases on MemoryStore, SQLite and Postgres: after a fix and a restart, an effect that failed,
across a restart, and the refusals."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from wfsub import CaseFailed, CaseNotFound, SignalRejected, Substrate, effect, replay, saga, seq, task, wait

from ..durable._util import eventually
from ._util import KINDS, node, store_maker


class Broken(Exception):
    pass


def prepare(c: dict[str, Any]) -> dict[str, Any]:
    return {"prepared": True}


def broken_step(c: dict[str, Any]) -> dict[str, Any]:
    raise Broken("the step has a bug")


def fixed_step(c: dict[str, Any]) -> dict[str, Any]:
    return {"fixed": True}


def finish(c: dict[str, Any]) -> dict[str, Any]:
    return {"finished": True}


V1 = seq(task(prepare), wait("go"), task(broken_step, name="step"), task(finish))
V2 = seq(task(prepare), wait("go"), task(fixed_step, name="step"), task(finish))


@pytest.mark.parametrize("kind", KINDS)
async def test_a_failed_case_is_retried_after_a_fix_and_a_restart(kind: str, tmp_path: Path) -> None:
    """Fail, fix (a new version registered), restart, retry: the failed step runs on the fixed version and the
    case ends done; its journal holds both runs and replays on the fixed version."""
    make = store_maker(kind, tmp_path)
    async with Substrate(store=make(), workflows={"w": V1}, **node(kind)) as sub:
        await sub.new_case("w", case_id="c1", tags={"k": "v"})
        await sub.signal("c1", "go")
        with pytest.raises(CaseFailed, match="the step has a bug"):
            await sub.await_case("c1")
    async with Substrate(store=make(), workflows={"w": V2}, **node(kind)) as sub:
        handle = await sub.retry("c1")
        result = await handle.result()
        assert result["fixed"] is True and result["finished"] is True
        status = sub.status("c1")
        assert status.state == "done" and status.tags == {"k": "v"}
        journal = await sub.journal("c1")
        kinds = [r.kind for r in journal]
        assert kinds[:4] == ["start", "signal", "end", "retry"] and kinds[-1] == "end", kinds
        assert kinds.count("end") == 2 and "version" in kinds  # it migrated to the fixed version
        assert (journal[-1].model_extra or {}).get("run") == 1
        report = replay(V2, journal)
        assert report.divergence is None and report.state == "done"
    async with Substrate(store=make(), workflows={"w": V2}, **node(kind)) as sub:
        assert await sub.await_case("c1") == result  # the latest end is the outcome


@pytest.mark.parametrize("kind", KINDS)
async def test_a_retried_case_that_fails_again_can_be_retried_again(kind: str, tmp_path: Path) -> None:
    """On the same broken version a retry fails again (a second end, run 1); after the fix a second retry ends
    it done (run 2)."""
    make = store_maker(kind, tmp_path)
    async with Substrate(store=make(), workflows={"w": V1}, **node(kind)) as sub:
        await sub.new_case("w", case_id="c1")
        await sub.signal("c1", "go")
        with pytest.raises(CaseFailed):
            await sub.await_case("c1")
        handle = await sub.retry("c1")
        with pytest.raises(CaseFailed, match="the step has a bug"):
            await handle.result()
    async with Substrate(store=make(), workflows={"w": V2}, **node(kind)) as sub:
        assert (await (await sub.retry("c1")).result())["fixed"] is True
        ends = [r for r in await sub.journal("c1") if r.kind == "end"]
        assert [(r.model_extra or {}).get("run") for r in ends] == [None, 1, 2]


ATTEMPTS: dict[str, int] = {}


async def flaky_charge(c: dict[str, Any]) -> dict[str, Any]:
    ATTEMPTS["charge"] = ATTEMPTS.get("charge", 0) + 1
    if ATTEMPTS["charge"] == 1:
        raise ConnectionError("the payment service is down")
    return {"charged": ATTEMPTS["charge"]}


CHARGE = seq(task(prepare), effect(flaky_charge, name="charge"), wait("ship"), task(finish))


@pytest.mark.parametrize("kind", KINDS)
async def test_a_failed_effect_runs_again_and_the_retry_survives_a_restart(kind: str, tmp_path: Path) -> None:
    """An effect whose final outcome failed the case is in flight again after `retry` (same version) and runs
    again; the re-opened case waits, and a restart resumes it from the retry."""
    ATTEMPTS.clear()
    make = store_maker(kind, tmp_path)
    async with Substrate(store=make(), workflows={"pay": CHARGE}, **node(kind)) as sub:
        await sub.new_case("pay", case_id="p1")
        with pytest.raises(CaseFailed, match="the payment service is down"):
            await sub.await_case("p1")
        handle = await sub.retry("p1")
        assert not handle.status().ended
        journal = await sub.journal("p1")
        retry = next(r for r in journal if r.kind == "retry")  # (the charge may have run again already)
        assert (retry.model_extra or {})["redo"] == [1], journal
        with pytest.raises(SignalRejected, match="cannot be retried: it is "):
            await sub.retry("p1")  # live again: not failed
        await eventually(lambda: sub.status("p1").state == "waiting_signal")  # the charge's outcome recorded
    async with Substrate(store=make(), workflows={"pay": CHARGE}, **node(kind)) as sub:
        await sub.signal("p1", "ship")
        result = await sub.await_case("p1")
        assert result["charged"] == 2 and result["finished"] is True
        assert ATTEMPTS["charge"] == 2


async def undo(c: dict[str, Any]) -> dict[str, Any]:
    return {"undone": True}


async def reserve(c: dict[str, Any]) -> dict[str, Any]:
    return {"reserved": True}


COMPENSATING = saga((effect(reserve, name="reserve"), effect(undo, name="release")), task(broken_step))


async def test_retry_refuses_cases_it_cannot_reopen(tmp_path: Path) -> None:
    """A case whose failure ran compensations, a done case, a live one and an unknown id are refused with why."""
    async with Substrate(store=str(tmp_path / "s.db"), workflows={"saga": COMPENSATING, "w": V1}) as sub:
        await sub.new_case("saga", case_id="s1")
        with pytest.raises(CaseFailed):
            await sub.await_case("s1")
        with pytest.raises(SignalRejected, match=r"already ran compensations \(release\): running the failed step"):
            await sub.retry("s1")
        await sub.new_case("w", case_id="live")
        live = "case 'live' cannot be retried: it is (initializing|running|waiting_signal), and retry"
        with pytest.raises(SignalRejected, match=live):
            await sub.retry("live")
        await sub.cancel("live")
        with pytest.raises(SignalRejected, match="it is cancelled, and retry re-opens a failed case"):
            await sub.retry("live")
        with pytest.raises(CaseNotFound):
            await sub.retry("nope")
    async with Substrate(workflows={"w": V1}) as sub:
        with pytest.raises(ValueError, match="without a store keeps no journal"):
            await sub.retry("x")

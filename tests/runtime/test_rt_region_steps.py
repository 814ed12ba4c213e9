"""Region steps, detached work and MI partial joins, through the Substrate."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import anyio
import pytest

from wfsub import (
    CaseFailed,
    SignalRejected,
    Substrate,
    add_instances,
    cancel_region,
    close_instances,
    effect,
    mi,
    par,
    scope,
    seq,
    task,
    wait,
)
from wfsub.testing import VirtualClock


async def test_a_fraud_check_cancels_shipping_from_inside_the_case() -> None:
    """A branch's cancel_region step withdraws the shipping region (and its effect) of the same case."""
    started: list[str] = []

    async def ship(ctx: Mapping[str, Any]) -> None:
        started.append("ship")
        await anyio.sleep_forever()

    wf = seq(
        par(scope("shipping", effect(ship)), seq(wait("fraud"), cancel_region("shipping"))),
        task(lambda c: {"closed": True}),
    )
    async with Substrate() as sub:
        handle = await sub.new_case(wf)
        await handle.signal("fraud", {"score": 0.99})
        assert await handle.result() == {"fraud": {"score": 0.99}, "closed": True}
    assert started == ["ship"]


async def test_the_case_ends_only_after_its_detached_work() -> None:
    """The join after an unsynchronized mi fires at once; the case itself waits for the mi's instance."""
    wf = seq(par(mi(wait("x"), count=1, join=None), task(lambda c: {"b": 1})), task(lambda c: {"joined": True}))
    clock = VirtualClock()
    async with Substrate(clock=clock) as sub:
        handle = await sub.new_case(wf)
        await clock.settle()
        status = handle.status()
        assert not status.ended and status.signals == ("x",)
        await handle.signal("x", 7)
        assert await handle.result() == {"b": 1, "joined": True}


async def test_an_open_mi_grows_from_steps_and_from_the_app_until_closed() -> None:
    """add_instances steps and Substrate.add_instances feed one open mi; close_instances lets its join fire."""
    wf = seq(
        par(
            mi(task(lambda c: {"v": c["item"]}), items=lambda c: [], dynamic="open", name="jobs", collect="outs"),
            add_instances("jobs", items=lambda c: ["from-step"]),
        ),
        task(lambda c: {"n": len(c["outs"])}),
    )
    async with Substrate() as sub:
        handle = await sub.new_case(wf)
        await sub.add_instances(handle.case_id, "jobs", ["from-app"])
        await sub.close_instances(handle.case_id, "jobs")
        result = await handle.result()
    assert result["outs"] == [{"v": "from-step"}, {"v": "from-app"}] and result["n"] == 2


async def test_a_refused_region_step_fails_the_case_at_the_step() -> None:
    """A close_instances step on an mi that is already closed fails the case at that step, saying why."""
    wf = seq(
        mi(seq(wait("go"), task(lambda c: None)), count=1, dynamic="open", name="jobs"),
    )
    async with Substrate() as sub:
        handle = await sub.new_case(par(wf, seq(close_instances("jobs"), close_instances("jobs"))))
        await handle.signal("go")
        with pytest.raises(CaseFailed, match=r"close_instances\('jobs'\) refused: .*is closed"):
            await handle.result()


async def test_a_runtime_count_below_the_join_fails_the_case() -> None:
    """mi(join=2) with a count function giving 1 fails at the mi, naming the join and the count."""
    async with Substrate() as sub:
        handle = await sub.new_case(mi(task(lambda c: None), count=lambda c: 1, join=2))
        with pytest.raises(CaseFailed, match="needs at least 2 instances, but the count is 1") as info:
            await handle.result()
        assert info.value.path == "mi"


async def test_close_instances_from_the_app_is_refused_for_a_closed_mi() -> None:
    """Substrate.close_instances on an mi already closed says so (SignalRejected naming the case)."""
    async with Substrate() as sub:
        handle = await sub.new_case(seq(mi(wait("go"), count=1, dynamic="open", name="jobs"), wait("end")))
        await sub.close_instances(handle.case_id, "jobs")
        with pytest.raises(SignalRejected, match=f"case '{handle.case_id}' cannot close instances of 'jobs'"):
            await sub.close_instances(handle.case_id, "jobs")

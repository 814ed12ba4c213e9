"""Region steps, detached work and MI partial joins, through the Substrate."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio
import pytest

from wfsub import (
    CaseFailed,
    SignalRejected,
    Substrate,
    add_instances,
    call,
    cancel_region,
    close_instances,
    complete_region,
    effect,
    mi,
    par,
    scope,
    seq,
    task,
    wait,
    xor,
)
from wfsub.stores import MemoryStore
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


# -- a sliding window: each instance of a dynamic mi adds the next one at its end ----------------------------------

WIDTH = 3


def _next_item(ctx: Mapping[str, Any]) -> list[int]:
    return [ctx["item"] + 1] if ctx["item"] + 1 < WIDTH else []


def _window(last: Any = None) -> Any:
    """Each instance waits for its "go" signal, notes its item, adds the next instance; the last one runs `last`."""
    body: list[Any] = [
        wait("go"),
        task(lambda c: {"seen": c["item"]}, name="note"),
        add_instances("window", items=_next_item),
    ]
    if last is not None:
        body.append(xor((lambda c: c["item"] == WIDTH - 1, last), default=task(lambda c: None, name="pass")))
    return mi(seq(*body), items=lambda c: [0], dynamic=True, name="window", collect="outs")


BATCHES = mi(call("Window"), count=2, collect="batches")
SHAPES = {
    "call": (call("Window"), {"Window": _window()}),
    "nested": (mi(_window(), count=2, collect="batches"), {}),
    "nested call": (BATCHES, {"Window": _window()}),
    "close": (mi(_window(close_instances("window")), count=2, collect="batches"), {}),
    "complete": (mi(_window(complete_region("window")), count=2, collect="batches"), {}),
}
GOES = {"call": WIDTH, "nested": 2 * WIDTH, "nested call": 2 * WIDTH, "close": 2 * WIDTH, "complete": 2 * WIDTH}


def _expected(shape: str) -> dict[str, Any]:
    window: list[Any] = [{"go": None, "seen": i} for i in range(WIDTH)]
    if shape == "complete":  # the last instance completes the window from inside: it joins without that one
        window[-1] = None
    if shape == "call":
        return {"outs": window}
    return {"batches": [{"outs": window}] * 2}


async def _drive(sub: Substrate, shape: str, case_id: str, restart_after: int | None = None) -> Any:
    handle = await sub.new_case(shape, case_id=case_id)
    for i in range(GOES[shape]):
        if i == restart_after:
            return None
        await handle.signal("go")
    return await handle.result()


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_a_sliding_window_adds_to_its_own_activation(shape: str, backend: str) -> None:
    """A window's instances add the next one to their own activation, reached by call or nested in another mi."""
    term, library = SHAPES[shape]

    async def main() -> Any:
        async with Substrate(workflows={shape: term, **library}, trace_level="none") as sub:
            return await _drive(sub, shape, "c")

    assert anyio.run(main, backend=backend) == _expected(shape)


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
@pytest.mark.parametrize("shape", ["nested", "nested call", "complete"])
async def test_a_durable_sliding_window_replays_to_the_same_activations(shape: str, kind: str, tmp_path: Path) -> None:
    """Brought back from its store mid-way (its region steps replayed), a window goes on as the live case would."""
    term, library = SHAPES[shape]
    store: Any = MemoryStore() if kind == "memory" else str(tmp_path / "s.db")
    workflows = {shape: term, **library}
    async with Substrate(store=store, workflows=workflows, trace_level="none") as sub:
        assert await _drive(sub, shape, "c", restart_after=GOES[shape] - 2) is None
        await handle_settled(sub, "c")
    async with Substrate(store=store, workflows=workflows, trace_level="none") as sub:
        for _ in range(2):
            await sub.signal("c", "go")
        with anyio.fail_after(10):
            while not sub.status("c").ended:  # noqa: ASYNC110 - the public API has no state-change event
                await anyio.sleep(0.001)
        assert sub.status("c").state == "done"
        assert sub.data("c") == _expected(shape)


async def handle_settled(sub: Substrate, case_id: str) -> None:
    """Wait until the case waits for its next signal (the inputs so far are applied and journaled)."""
    with anyio.fail_after(10):
        while sub.status(case_id).state != "waiting_signal":  # noqa: ASYNC110 - no state-change event
            await anyio.sleep(0.001)

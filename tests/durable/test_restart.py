"""Restart at every kind of input: a scenario's first phase stops at a chosen point (a clean exit from `async with`,
or a SIGKILL of a child process from inside an effect or right after a call returned), a new Substrate on the same
store finishes it; the final result, the acknowledged inputs, the effects' calls and the journal's shape are
checked. See `_flows.SCENARIOS` for what each scenario does."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import anyio
import pytest

from wfsub import JournalRecord, Substrate, SubstrateClosed
from wfsub.stores import MemoryStore, Store

from . import _flows
from ._flows import CID, SCENARIOS, Scenario, read_side, run_phase1, run_phase2
from ._util import check_shape, field, kinds, outside, reopenable, run_child, wait_all_blocked

MODES = ["exit-memory", "exit-sqlite", "kill-sqlite"]


@pytest.fixture
def side(tmp_path: Path) -> Any:
    path = tmp_path / "side.jsonl"
    _flows.SIDE.path = str(path)
    yield path
    _flows.SIDE.path = None


async def stop_at(scenario: Scenario, mode: str, tmp_path: Path, side: Path) -> tuple[Any, list[JournalRecord] | None]:
    """Run phase 1 until its point; the store to reopen, and (clean exit) the journal as the Substrate closed."""
    if mode == "kill-sqlite":
        path = tmp_path / "cases.db"
        done = await anyio.to_thread.run_sync(lambda: run_child("scenario", scenario.name, str(path), str(side)))
        assert done.returncode == -signal.SIGKILL, f"the child did not kill itself:\n{done.stderr[-3000:]}"
        return str(path), None
    store: Store | str = MemoryStore() if mode == "exit-memory" else str(tmp_path / "cases.db")
    await run_phase1(scenario, store, "exit")
    async with outside(store) as reader:
        journal = [JournalRecord.model_validate(r) for r in await reader.journal(CID)]
    return reopenable(store), journal


def check_calls(scenario: Scenario, side: Path) -> None:
    """Each effect ran as often as the scenario says, every call of one effect with one idempotency key."""
    calls = read_side(side)
    for name, times in scenario.calls.items():
        mine = [c for c in calls if c["name"] == name]
        if times == -1:
            assert len(mine) == 1, f"{name} ran {len(mine)} times, once expected: {mine}"
        else:
            assert len(mine) >= times, f"{name} ran {len(mine)} times, at least {times} expected: {mine}"
        assert len({c["key"] for c in mine}) == 1, f"{name}: idempotency keys differ across runs: {mine}"
        assert all(c["attempt"] == 1 for c in mine), mine


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", list(SCENARIOS))
async def test_restart_at_each_input(name: str, mode: str, tmp_path: Path, side: Path) -> None:
    """A case stopped at each kind of input (clean exit or SIGKILL) finishes right after a restart, losing nothing."""
    scenario = SCENARIOS[name]
    store, at_close = await stop_at(scenario, mode, tmp_path, side)
    if at_close is not None:  # closing wrote nothing: the journal is what it was when the Substrate closed
        async with outside(store) as reader:
            assert [JournalRecord.model_validate(r) for r in await reader.journal(CID)] == at_close
    found = await run_phase2(scenario, store)
    journal = found.journals[CID]
    assert found.outcomes[CID] == scenario.result
    assert kinds(journal) == list(scenario.kinds)
    check_shape(journal)
    check_calls(scenario, side)
    # what phase 1 had acknowledged is in the journal as it was acknowledged
    if at_close is not None:
        assert journal[: len(at_close)] == at_close
    for record in journal:
        if record.kind in ("signal", "cancel", "cancel_region", "complete_region", "add_instances",
                           "close_instances") and record.seq <= 2:
            request = field(record, "request_id")
            assert request is None or request in ("go-1", "cancel-1", "cr-1", "cp-1", "add-1", "close-1")
    end = journal[-1]
    expected_outcome = "done" if isinstance(found.outcomes[CID], dict) else "cancelled"
    assert field(end, "outcome") == expected_outcome
    if expected_outcome == "done":
        assert field(end, "result") == found.outcomes[CID]


@pytest.mark.parametrize("mode", MODES)
async def test_a_timer_keeps_its_absolute_due_time_across_a_restart(mode: str, tmp_path: Path, side: Path) -> None:
    """A timer armed before the stop is due at start time + seconds after the restart, and fires no earlier."""
    scenario = SCENARIOS["timer-armed"]
    store, _ = await stop_at(scenario, mode, tmp_path, side)
    async with Substrate(store=store, workflows=_flows.WORKFLOWS) as sub:
        start = (await sub.journal(CID))[0]
        result = await sub.await_case(CID)
        journal = await sub.journal(CID)
    assert result == {"n": 2, "finished": True}
    timer = journal[1]
    assert timer.kind == "timer" and field(timer, "path") == "seq[0].sleep"
    assert timer.time >= start.time + 0.5


@pytest.mark.parametrize("mode", ["exit-memory", "exit-sqlite"])
async def test_the_recovered_timer_status_shows_the_original_due_time(mode: str, tmp_path: Path, side: Path) -> None:
    """After a clean exit, the status of a recovered case with an armed timer shows due = start time + seconds."""
    scenario = SCENARIOS["timer-armed"]
    store, _ = await stop_at(scenario, mode, tmp_path, side)
    async with Substrate(store=store, workflows=_flows.WORKFLOWS) as sub:
        start = (await sub.journal(CID))[0]
        stored = sub.status(CID)  # parked: read from the store's row
        assert [t.due for t in stored.timers] == [start.time + 0.5]
        await sub.await_case(CID)


@pytest.mark.parametrize("mode", ["exit-memory", "exit-sqlite"])
async def test_in_memory_awaiters_get_substrate_closed_and_the_case_stays_live(mode: str, tmp_path: Path) -> None:
    """Leaving `async with` with a durable case live: its awaiters get SubstrateClosed; the store keeps it live."""
    store: Any = MemoryStore() if mode == "exit-memory" else str(tmp_path / "cases.db")
    got: list[str] = []

    async def waiter(wait: Any) -> None:
        try:
            await wait()
        except SubstrateClosed:
            got.append("closed")

    async with anyio.create_task_group() as tg, Substrate(store=store, workflows=_flows.WORKFLOWS) as sub:
        handle = await sub.new_case("charge_then_wait", {"n": 1}, case_id=CID)
        await _flows.until_state(sub, CID, "waiting_signal")
        tg.start_soon(waiter, handle.result)
        tg.start_soon(waiter, lambda: sub.await_case(CID))
        await wait_all_blocked()
    assert got == ["closed", "closed"]
    async with outside(reopenable(store)) as reader:
        row = await reader.row(CID)
        assert row is not None and row.state == "waiting_signal" and row.ended_at is None
        assert kinds(await reader.journal(CID)) == ["start", "effect"]

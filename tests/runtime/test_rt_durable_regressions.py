"""Durable cases brought back from a store behave as the live case did (faults found by running the demo)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from wfsub import CaseCancelled, MemorySink, Substrate, effect, saga, seq, wait
from wfsub.testing import CapturingSink

done: list[str] = []


async def reserve(ctx: Mapping[str, Any]) -> dict[str, Any]:
    done.append("reserve")
    return {"reserved": True}


async def release(ctx: Mapping[str, Any]) -> None:
    done.append("release")


async def charge(ctx: Mapping[str, Any]) -> dict[str, Any]:
    done.append("charge")
    return {"charged": 10}


async def refund(ctx: Mapping[str, Any]) -> None:
    done.append("refund")


ORDER = saga((effect(reserve), effect(release)), (effect(charge), effect(refund)), wait("confirm"))


async def test_a_parked_case_loaded_for_a_cancel_compensates_every_completed_step(tmp_path: Path) -> None:
    """A case parked after its last effect and cancelled in a later run compensates both steps, in reverse."""
    done.clear()
    first = CapturingSink()
    async with Substrate(store=tmp_path / "s.db", workflows={"order": ORDER}, sinks=[first], trace_level="min") as sub:
        await sub.new_case("order", case_id="o")
        await first.wait_for("signal_waiting")
    assert done == ["reserve", "charge"]
    sink = MemorySink()
    async with Substrate(store=tmp_path / "s.db", workflows={"order": ORDER}, sinks=[sink], trace_level="min") as sub:
        await sub.cancel("o", reason="customer cancelled")
        with pytest.raises(CaseCancelled, match="customer cancelled"):
            await sub.await_case("o")
    assert done == ["reserve", "charge", "refund", "release"]
    completed = [e.detail.get("name") for e in sink.events if e.kind == "effect_completed"]
    assert completed == ["refund", "release"]  # the replay of the earlier run is not traced again


async def test_a_case_whose_journal_moved_on_leaves_memory_instead_of_retrying_forever() -> None:
    """A case whose append is refused for good raises StoreConflict and leaves memory with no retry loop."""
    # Another writer took its next seq: the case writes nothing more.
    from wfsub import StoreConflict
    from wfsub._store import CaseWrite
    from wfsub.stores import MemoryStore

    store = MemoryStore()
    flow = seq(wait("a"), wait("b"))
    async with Substrate(store=store, workflows={"f": flow}) as sub:
        await sub.new_case("f", case_id="c")
        row = await store.row("c")
        assert row is not None
        intruder = {"seq": row.last_seq + 1, "kind": "signal", "step": 1, "time": 0.0, "digest": None, "name": "a"}
        await store.write(CaseWrite("c", [intruder]))  # another owner appended first
        with pytest.raises(StoreConflict):
            await sub.signal("c", "a")
        assert sub.statistics().cases_in_memory == 0
        assert [r.seq for r in await sub.journal("c")] == [0, 1]

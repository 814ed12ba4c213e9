"""Durable cases brought back from a store (loaded for an input, recovered at open, reloaded after a refused append)
behave as the live case did: compensation, store conflicts, inbox retries, journals that do not replay."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio
import pytest

from wfsub import CaseCancelled, CaseFailed, MemorySink, Substrate, effect, saga, seq, task, wait
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


async def test_inputs_queued_behind_a_refused_append_are_answered_not_left_waiting() -> None:
    """Signals that reach a case while its refused append is in flight get StoreConflict saying to resend."""
    from wfsub import StoreConflict
    from wfsub._store import CaseWrite
    from wfsub.stores import MemoryStore

    class GatedStore(MemoryStore):
        """Holds the case's next append until the test opens the gate."""

        def __init__(self) -> None:
            super().__init__()
            self.gate: anyio.Event | None = None
            self.entered = anyio.Event()

        async def write(self, change: CaseWrite) -> Any:
            if self.gate is not None and change.records:
                self.entered.set()
                await self.gate.wait()
            return await super().write(change)

    store = GatedStore()
    flow = seq(wait("a"), wait("b"))
    outcomes: dict[str, str] = {}

    async def send(sub: Substrate, name: str) -> None:
        try:
            await sub.signal("c", name)
            outcomes[name] = "applied"
        except StoreConflict as exc:
            outcomes[name] = str(exc)

    async with Substrate(store=store, workflows={"f": flow}) as sub:
        await sub.new_case("f", case_id="c")
        row = await store.row("c")
        assert row is not None
        intruder = {"seq": row.last_seq + 1, "kind": "signal", "step": 1, "time": 0.0, "digest": None, "name": "a"}
        await store.write(CaseWrite("c", [intruder]))  # another owner appended first
        store.gate = anyio.Event()
        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                tg.start_soon(send, sub, "a")
                await store.entered.wait()  # the case's append of "a" is in flight
                tg.start_soon(send, sub, "b")
                await anyio.sleep(0.05)  # "b" waits in the case's mailbox
                store.gate.set()
    assert set(outcomes) == {"a", "b"}
    assert "send the input again" in outcomes["b"], outcomes


async def test_an_inbox_input_the_store_failed_to_hand_over_is_tried_again_not_refused() -> None:
    """An inbox input whose case failed to load is applied at the next poll, before that case's later ones."""
    from wfsub import StoreError
    from wfsub.stores import MemoryStore

    class FlakyStore(MemoryStore):
        """Fails the first read of case "c" after `flaky` is set, as a dropped connection would."""

        flaky = False

        async def row(self, case_id: str) -> Any:
            if self.flaky and case_id == "c":
                self.flaky = False
                raise StoreError("flaky", "connection lost")
            return await super().row(case_id)

    store = FlakyStore()
    flow = seq(wait("go"), wait("next"), task(lambda c: {"went": True}, name="went"))
    async with Substrate(store=store, workflows={"f": flow}) as sub:
        await sub.new_case("f", case_id="c")
    async with Substrate(store=store, workflows={"f": flow}) as sub:  # "c" stays parked in the store
        result: list[Any] = []

        async def wait_end() -> None:
            result.append(await sub.await_case("c"))

        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                tg.start_soon(wait_end)
                await anyio.sleep(0.05)  # the awaiter has read the row: the next read is the inbox's
                store.flaky = True
                await store.inbox_put("c", "signal", {"name": "go"}, request_id="go-1", created_at=0.0)
                await store.inbox_put("c", "signal", {"name": "next"}, request_id="next-1", created_at=0.0)
        assert result[0]["went"] and not store.flaky  # the flaky read happened, and the inputs were applied after
        signals = [r.model_dump().get("name") for r in await sub.journal("c") if r.kind == "signal"]
        assert signals == ["go", "next"]  # in the order they were sent


async def test_a_case_whose_journal_does_not_replay_is_suspended_and_the_others_run() -> None:
    """A damaged journal record stops only its own case (suspended, with the reason): the Substrate opens."""
    from wfsub._store import CaseWrite
    from wfsub.stores import MemoryStore

    store = MemoryStore()
    flow = seq(wait("a"), task(lambda c: {"x": 1}, name="x"))
    async with Substrate(store=store, workflows={"f": flow}) as sub:
        await sub.new_case("f", case_id="c")
        await sub.new_case("f", case_id="d")
    await store.open(owner=True, owner_id="damage")
    row = await store.row("c")
    assert row is not None
    damaged = {"seq": row.last_seq + 1, "kind": "signal", "step": 1, "time": 0.0, "digest": None}  # no name
    row.last_seq += 1
    row.state = "running"  # recovered when the next Substrate opens
    await store.write(CaseWrite("c", [damaged], row))
    await store.close()
    async with Substrate(store=store, workflows={"f": flow}) as sub:
        status = sub.status("c")
        assert status.state == "suspended" and "KeyError" in (status.suspended_reason or "")
        await sub.signal("d", "a")
        assert (await sub.await_case("d"))["x"] == 1


class OutOfStock(Exception):
    pass


async def ship(ctx: Mapping[str, Any]) -> None:
    raise OutOfStock("no stock left")


release_gate: list[anyio.Event] = []


async def slow_release(ctx: Mapping[str, Any]) -> None:
    done.append("slow_release")
    if release_gate:
        await release_gate[0].wait()  # still compensating when the first Substrate closes


FAILING = saga((effect(reserve), effect(slow_release)), effect(ship))


async def test_a_failure_recovered_mid_compensation_keeps_its_own_type(tmp_path: Path) -> None:
    """A case that failed and was compensating when its Substrate closed ends with the step's own error type."""
    done.clear()
    release_gate[:] = [anyio.Event()]
    async with Substrate(store=tmp_path / "s.db", workflows={"order": FAILING}) as sub:
        await sub.new_case("order", case_id="o")
        with anyio.fail_after(10):
            while "slow_release" not in done:  # noqa: ASYNC110 - an effect of the case records it
                await anyio.sleep(0.01)
    release_gate.clear()  # the compensation runs again after recovery, and finishes
    async with Substrate(store=tmp_path / "s.db", workflows={"order": FAILING}) as sub:
        with pytest.raises(CaseFailed) as failed:
            await sub.await_case("o")
        status = sub.status("o")
    assert status.failure is not None and status.failure.type == "OutOfStock", status.failure
    assert failed.value.record is not None and failed.value.record["type"] == "OutOfStock"
    assert [r["error"]["type"] for r in await _journal(tmp_path, "o") if r["kind"] == "end"] == ["OutOfStock"]


async def _journal(path: Path, case_id: str) -> list[dict[str, Any]]:
    async with Substrate(store=path / "s.db", workflows={"order": FAILING}) as sub:
        return [r.model_dump() for r in await sub.journal(case_id)]

"""A case's own last inputs are committed with its `end`: one write fewer, nothing handed out before it lands."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from wfsub import StoreError, Substrate, effect, seq, task
from wfsub._runtime import _case_journal
from wfsub._store import CaseWrite
from wfsub.stores import MemoryStore


async def _a(ctx: Mapping[str, Any]) -> dict[str, Any]:
    return {"a": 1}


async def _b(ctx: Mapping[str, Any]) -> dict[str, Any]:
    return {"items": [1, 2]}


def _grow(ctx: Mapping[str, Any]) -> dict[str, Any]:
    ctx["items"].append(3)  # changes, in place, the list the last effect's result landed in
    return {"grown": True}


FLOW = seq(effect(_a), effect(_b), task(_grow, name="grow"))


class CountingStore(MemoryStore):
    """Keeps every waited write it is given; fails the next `fail` of them with a StoreError."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[CaseWrite] = []
        self.fail = 0

    async def write(self, change: CaseWrite, *, wait: bool = True) -> list[bool]:
        if self.fail and change.records:
            self.fail -= 1
            raise StoreError(self._name, "the disk is full")
        self.writes.append(change)
        return await super().write(change, wait=wait)


async def test_the_last_effect_result_and_the_end_go_in_one_write() -> None:
    """Two effects then a task: three waited writes, the second effect's record in the same write as `end`."""
    store = CountingStore()
    async with Substrate(store=store, workflows={"f": FLOW}) as sub:
        result = await (await sub.new_case("f", case_id="c")).result()
        journal = await store.journal("c")
    assert result == {"a": 1, "items": [1, 2, 3], "grown": True}
    kinds = [[r["kind"] for r in w.records] for w in store.writes if w.records]
    assert kinds == [["start"], ["effect"], ["effect", "end"]]
    assert [r["seq"] for r in journal] == [0, 1, 2, 3]
    assert journal[2]["result"] == {"items": [1, 2]}  # as the effect returned it, not as the task left it


async def test_a_failed_write_of_applied_inputs_is_tried_again_before_the_outcome_is_handed_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The write of the last effect result with `end` fails: it is tried again, and the awaiter hears only then."""
    monkeypatch.setattr(_case_journal, "_STORE_RETRY", 0.0)
    store = CountingStore()
    async with Substrate(store=store, workflows={"f": FLOW}) as sub:
        handle = await sub.new_case("f", case_id="c")
        store.fail = 2  # the next two writes of inputs fail (the first effect's, or the last one's twice)
        assert await handle.result() == {"a": 1, "items": [1, 2, 3], "grown": True}
        journal = await store.journal("c")
    assert store.fail == 0
    assert [r["kind"] for r in journal] == ["start", "effect", "effect", "end"]
    assert [r["seq"] for r in journal] == [0, 1, 2, 3]
    async with Substrate(store=store, workflows={"f": FLOW}) as sub:
        assert await sub.await_case("c") == {"a": 1, "items": [1, 2, 3], "grown": True}

"""A `new_case` repeated with the id of a parked durable case (not in memory) while an input to that case brings
it back: the two meet on the one case, whatever order they run in; on Memory, SQLite and Postgres."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from wfsub import Substrate, seq, task, wait
from wfsub.stores import Store

from ..stores._helpers import STORE_PARAMS, make_store, twin

WORKFLOWS = {"waits": seq(wait("go"), task(lambda c: {"ran": True}))}


@pytest.fixture(params=STORE_PARAMS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    return make_store(request.param, tmp_path)


@pytest.mark.parametrize("first", ["new_case", "signal"])
async def test_a_repeated_new_case_racing_a_signal_to_the_parked_case_loses_nothing(store: Store, first: str) -> None:
    """The repeated new_case returns the existing case's handle and the signal is taken by that case (no actor
    that never runs holds the id): the case ends with the signal, its journal has one start and one signal."""
    async with Substrate(store=store, workflows=WORKFLOWS) as sub:
        await sub.new_case("waits", {"n": 1}, case_id="X")
    async with Substrate(store=twin(store), workflows=WORKFLOWS) as sub:
        assert "X" not in sub._cases  # parked in the store, not in memory
        handles = []

        async def again() -> None:
            handles.append(await sub.new_case("waits", {"n": 1}, case_id="X"))

        async def go() -> None:
            await sub.signal("X", "go", request_id="go-1")

        with anyio.fail_after(30):  # a bound against the hang, not an expected time
            async with anyio.create_task_group() as tg:
                for call in (again, go) if first == "new_case" else (go, again):
                    tg.start_soon(call)
            assert await sub.await_case("X") == {"n": 1, "go": None, "ran": True}
        assert handles[0].case_id == "X"
        journal = await sub.journal("X")
        assert [r.kind for r in journal].count("start") == 1 and [r.kind for r in journal].count("signal") == 1

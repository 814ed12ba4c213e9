"""`journal(case_id, newest=N)`: the start record and the newest N records, on every store, across a restart, from
a Substrate and from a Client; a bad `newest` is refused naming the fix."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from wfsub import Client, Substrate, loop, wait

from ..lifecycle._util import KINDS, node, store_maker

FLOWS = {"chatty": loop(wait("tick"), until=lambda c: False)}


async def _ticked(sub: Substrate, case_id: str, n: int) -> None:
    for i in range(n):
        await sub.signal(case_id, "tick", {"i": i})
    with anyio.fail_after(10):
        while sub.status(case_id).state != "waiting_signal":  # noqa: ASYNC110 - waiting on a state
            await anyio.sleep(0.002)


@pytest.mark.parametrize("kind", KINDS)
async def test_newest_gives_the_start_and_the_newest_records_across_a_restart(kind: str, tmp_path: Path) -> None:
    """newest=N returns the start record then the last N records, the same as slicing the whole journal, before
    and after a restart; newest larger than the journal returns it whole."""
    make = store_maker(kind, tmp_path)
    async with Substrate(store=make(), workflows=FLOWS, **node(kind)) as sub:
        await sub.new_case("chatty", case_id="c")
        await _ticked(sub, "c", 12)
        whole = await sub.journal("c")
        part = await sub.journal("c", newest=5)
        assert [r.seq for r in part] == [whole[0].seq, *[r.seq for r in whole[-5:]]]
        assert part[0].kind == "start" and part[1:] == whole[-5:]
        assert await sub.journal("c", newest=len(whole)) == whole
        assert [r.seq for r in await sub.journal("c", newest=0)] == [whole[0].seq]
    async with Substrate(store=make(), workflows=FLOWS, **node(kind)) as sub:
        again = await sub.journal("c", newest=5)
        assert again == part


async def test_a_client_reads_the_newest_records_and_bad_newest_is_refused(tmp_path: Path) -> None:
    """A Client's journal(newest=) slices as the Substrate's does; a negative or non-int newest is a ValueError."""
    path = tmp_path / "s.db"
    async with Substrate(store=path, workflows=FLOWS) as sub:
        await sub.new_case("chatty", case_id="c")
        await _ticked(sub, "c", 4)
        expected = await sub.journal("c", newest=2)
        with pytest.raises(ValueError, match="newest must be an int >= 0"):
            await sub.journal("c", newest=-1)
        async with Client(path) as client:
            assert await client.journal("c", newest=2) == expected
            with pytest.raises(ValueError, match="newest must be an int >= 0"):
                await client.journal("c", newest="5")  # type: ignore[arg-type]

"""The `wfsub` command on a compacted journal: `journal` prints it from its snapshot record, `trace` and `replay`
replay it from there, and `replay` says why a compacted case cannot run on another version."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from wfsub import Substrate

from .test_cli import wfsub

pytestmark = pytest.mark.anyio

ENDLESS = """
from wfsub import loop, seq, task, wait

def count(d):
    return {"n": d.get("n", 0) + 1, "total": d.get("total", 0) + d["item"]}

cart = loop(seq(wait("add", into="item"), task(count)), while_=lambda d: True)
WORKFLOWS = {"cart": cart}
"""


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def here(tmp_path: Path) -> Iterator[Path]:
    (tmp_path / "endless_flows.py").write_text(ENDLESS)
    (tmp_path / "endless_flows_v2.py").write_text(ENDLESS.replace('d["item"]}', '2 * d["item"]}'))
    sys.path.insert(0, str(tmp_path))
    try:
        yield tmp_path
    finally:
        sys.path.remove(str(tmp_path))
        for name in ("endless_flows", "endless_flows_v2"):
            sys.modules.pop(name, None)


async def test_journal_trace_and_replay_start_from_the_snapshot_record(here: Path) -> None:
    """After compactions, `wfsub journal` begins with the snapshot record, `trace` replays the records after it,
    `replay` reports the case ok on its version and DIVERGED at the snapshot record on another."""
    import endless_flows

    async with Substrate(store=here / "cases.db", workflows=endless_flows.WORKFLOWS, compact_after=5) as sub:
        await sub.new_case("cart", {}, case_id="c")
        for i in range(13):
            await sub.signal("c", "add", i)
        with anyio.fail_after(30):
            while sub.data("c").get("n") != 13:  # noqa: ASYNC110 - the case applies its inputs in the background
                await anyio.sleep(0.01)
        first = (await sub.journal("c"))[0]

    ran = await wfsub(here, "journal", "cases.db", "c")
    assert ran.code == 0, ran.err
    records = [json.loads(line) for line in ran.out.splitlines()]
    assert records[0]["kind"] == "snapshot" and records[0]["seq"] == first.seq
    assert [r["seq"] for r in records] == list(range(first.seq, first.seq + len(records)))

    ran = await wfsub(here, "trace", "cases.db", "-w", "endless_flows:WORKFLOWS", "c", "--json")
    assert ran.code == 0, ran.err
    kinds = [json.loads(line)["kind"] for line in ran.out.splitlines()]
    assert "case_started" not in kinds  # the prefix is gone: the trace starts after the snapshot

    ran = await wfsub(here, "replay", "cases.db", "-w", "endless_flows:WORKFLOWS", "c")
    assert ran.code == 0, ran.err
    assert ran.out.split() == ["ok", "c", "waiting"]

    ran = await wfsub(here, "replay", "cases.db", "-w", "endless_flows_v2:WORKFLOWS", "c")
    assert ran.code == 1
    assert ran.out.startswith("DIVERGED  c") and "(snapshot)" in ran.out and "removed by compaction" in ran.out

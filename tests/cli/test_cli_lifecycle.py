"""The case lifecycle commands (`cases --tag`, `delete`) as a subprocess beside a live owner."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .test_cli import here, owner, wfsub  # noqa: F401 (the fixture)

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_cases_by_tag_and_id_prefix(here: Path) -> None:  # noqa: F811
    """`wfsub cases --tag K=V` (repeatable) and `--id-prefix` list the matching cases; a pair without `=` is a
    usage error."""
    async with owner(here) as sub:
        await sub.new_case("order", {"amount": 1}, case_id="o-1", tags={"customer": "c-17", "tier": "gold"})
        await sub.new_case("order", {"amount": 2}, case_id="o-2", tags={"customer": "c-17"})
        await sub.new_case("order", {"amount": 3}, case_id="x-3", tags={"customer": "c-18"})
        ran = await wfsub(here, "cases", "cases.db", "--tag", "customer=c-17", "--json")
        assert ran.code == 0, ran.err
        listed = [json.loads(line) for line in ran.out.splitlines()]
        assert [c["case_id"] for c in listed] == ["o-2", "o-1"]
        assert listed[1]["tags"] == {"customer": "c-17", "tier": "gold"}
        ran = await wfsub(here, "cases", "cases.db", "--tag", "customer=c-17", "--tag", "tier=gold", "--json")
        assert [json.loads(line)["case_id"] for line in ran.out.splitlines()] == ["o-1"]
        ran = await wfsub(here, "cases", "cases.db", "--id-prefix", "x-", "--json")
        assert [json.loads(line)["case_id"] for line in ran.out.splitlines()] == ["x-3"]
        ran = await wfsub(here, "cases", "cases.db", "--tag", "nobody=here")
        assert ran.code == 0 and "no cases match" in ran.err
        ran = await wfsub(here, "cases", "cases.db", "--tag", "customer")
        assert ran.code == 2 and "give KEY=VALUE" in ran.err


async def test_delete_removes_an_ended_case_and_refuses_a_live_one(here: Path) -> None:  # noqa: F811
    """`wfsub delete` removes an ended case; a live one is refused with the fix; an unknown id says how to list."""
    async with owner(here) as sub:
        done = await sub.new_case("order", {"amount": 1}, case_id="done")
        await sub.new_case("order", {"amount": 2}, case_id="live")
        await sub.signal("done", "approve")
        await done.result()
        ran = await wfsub(here, "delete", "cases.db", "live")
        assert ran.code == 1 and "has not ended (it is waiting_signal)" in ran.err and "wfsub cancel" in ran.err
        ran = await wfsub(here, "delete", "cases.db", "done")
        assert ran.code == 0 and "deleted case 'done'" in ran.err
        ran = await wfsub(here, "cases", "cases.db", "--json")
        assert [json.loads(line)["case_id"] for line in ran.out.splitlines()] == ["live"]
        ran = await wfsub(here, "delete", "cases.db", "done")
        assert ran.code == 1 and "no case 'done'" in ran.err

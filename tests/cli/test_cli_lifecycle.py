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
        ran = await wfsub(here, "show", "cases.db", "o-1")
        assert ran.code == 0 and "customer=c-17, tier=gold" in ran.out, ran.out


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


BROKEN = """
from wfsub import seq, task, wait

FIXED = False

def step(d):
    if not FIXED:
        raise RuntimeError("not fixed yet")
    return {"fixed": True}

WORKFLOWS = {"flaky": seq(task(step), wait("go"))}
"""


async def test_retry_and_fork_through_the_owner(tmp_path: Path) -> None:
    """`wfsub retry` re-opens a failed case and `wfsub fork --at N --id NEW` starts a fork, both done by the owner;
    a refusal (a case that is not failed, an `at` past the journal) is reported with nothing sent."""
    import importlib
    import sys

    from wfsub import Substrate

    (tmp_path / "brokenflows.py").write_text(BROKEN)
    sys.path.insert(0, str(tmp_path))
    try:
        flows = importlib.import_module("brokenflows")
        async with Substrate(store=tmp_path / "cases.db", workflows=flows.WORKFLOWS) as sub:
            await sub.new_case("flaky", case_id="c1")
            with pytest.raises(Exception, match="not fixed yet"):
                await sub.await_case("c1")
            flows.FIXED = True
            ran = await wfsub(tmp_path, "retry", "cases.db", "c1")
            assert ran.code == 0 and "done: the retry of case 'c1'" in ran.err, ran.err
            assert sub.status("c1").state in ("initializing", "running", "waiting_signal")
            ran = await wfsub(tmp_path, "retry", "cases.db", "c1")
            assert ran.code == 1 and "cannot be retried: it is" in ran.err and "nothing was sent" in ran.err
            ran = await wfsub(tmp_path, "fork", "cases.db", "c1", "--at", "0", "--id", "c2")
            assert ran.code == 0 and "done: the fork 'c2' of case 'c1'" in ran.err, ran.err
            assert sub.status("c2").forked_from == "c1"
            ran = await wfsub(tmp_path, "show", "cases.db", "c2")
            assert ran.code == 0 and "forked from" in ran.out and " c1" in ran.out, ran.out
            ran = await wfsub(tmp_path, "fork", "cases.db", "c1", "--at", "99")
            assert ran.code == 1 and "has no record 99" in ran.err
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("brokenflows", None)

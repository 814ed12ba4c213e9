"""The command and child cases: `wfsub show` names a case's parent and children, `wfsub cases --parent` lists the
children of a case (read from the store, as the owner recorded them)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from wfsub import Substrate

from .. import _warm
from ..durable import _children_flows as flows
from ..durable._util import ROOT, eventually


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def wfsub(*args: str) -> tuple[int, str, str]:
    proc = await _warm.acommand(*args, cwd=ROOT, env={**os.environ, "COLUMNS": "200"})
    return proc.returncode, proc.stdout, proc.stderr


async def test_show_names_parent_and_children_and_cases_lists_by_parent(tmp_path: Path) -> None:
    """show prints a child's parent and a parent's children (also in --json); cases --parent lists only them."""
    db = str(tmp_path / "cases.db")
    async with Substrate(store=db, workflows=flows.WORKFLOWS) as sub:
        await sub.new_case("peer", {}, case_id="peer")
        await sub.new_case("parent", {"n": 1, "peer": "peer"}, case_id=flows.PARENT_ID)
        await eventually(lambda: flows.CHILD_ID in {s.case_id for s in sub.cases()}
                         and sub.status(flows.CHILD_ID).state == "waiting_signal")
        await eventually(lambda: sub._store is not None and sub._store.read_row(flows.CHILD_ID) is not None
                         and sub._store.read_row(flows.CHILD_ID).state == "waiting_signal")

        code, out, err = await wfsub("show", db, flows.PARENT_ID)
        assert code == 0, err
        assert "children" in out and flows.CHILD_ID in out
        code, out, err = await wfsub("show", db, flows.CHILD_ID)
        assert code == 0, err
        assert any(line.split() == ["parent", flows.PARENT_ID] for line in out.splitlines()), out
        code, out, err = await wfsub("show", db, flows.PARENT_ID, "--json")
        shown = json.loads(out)
        assert (shown["children"], shown["parent"]) == ([flows.CHILD_ID], None)

        code, out, err = await wfsub("cases", db, "--parent", flows.PARENT_ID, "--json")
        assert code == 0, err
        assert [json.loads(line)["case_id"] for line in out.splitlines()] == [flows.CHILD_ID]
        code, out, err = await wfsub("cases", db, "--parent", "peer")
        assert code == 0 and out == "" and "no cases match" in err

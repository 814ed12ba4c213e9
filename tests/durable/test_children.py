"""Child cases and signals to other cases on durable stores (memory, SQLite, Postgres): a parent waiting for its
child across a restart of both, each step applied once, the parent relation kept in the store, and a child started
exactly once across a SIGKILL between the parent's record and the child's start."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
from contextlib import closing
from pathlib import Path

import anyio
import pytest

from wfsub import CaseCancelled, JournalRecord, Substrate
from wfsub._store import SCHEMA_VERSION
from wfsub._store._sqlite import APPLICATION_ID, LAYOUT
from wfsub.stores import Store

from ..stores._helpers import STORE_PARAMS, make_store, twin
from . import _children_flows as flows
from ._util import ROOT, check_shape, eventually, field, kinds, outside


async def started(sub: Substrate, case_id: str, state: str) -> None:
    await eventually(lambda: case_id in {s.case_id for s in sub.cases(limit=1000)}
                     and sub.status(case_id).state == state)


def effect_records(journal: list[JournalRecord], path: str) -> list[JournalRecord]:
    return [r for r in journal if r.kind == "effect" and field(r, "path") == path]


@pytest.fixture(params=STORE_PARAMS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    return make_store(request.param, tmp_path)


async def test_a_parent_waits_for_its_child_across_a_restart_of_both(store: Store) -> None:
    """Closed while the parent waits for its parked child, both resume on the next Substrate: the child takes its
    signal, the parent gets the child's result (one effect record), then signals its peer once."""
    async with Substrate(store=store, workflows=flows.WORKFLOWS) as sub:
        await sub.new_case("peer", {}, case_id="peer")
        await sub.new_case("parent", {"n": 4, "peer": "peer"}, case_id=flows.PARENT_ID)
        await started(sub, flows.CHILD_ID, "waiting_signal")
        assert sub.status(flows.PARENT_ID).state == "waiting_effect"
    async with Substrate(store=twin(store), workflows=flows.WORKFLOWS) as sub:
        assert sub.status(flows.CHILD_ID).parent == flows.PARENT_ID
        assert sub.status(flows.PARENT_ID).children == (flows.CHILD_ID,)
        assert [s.case_id for s in sub.cases(parent=flows.PARENT_ID)] == [flows.CHILD_ID]
        await sub.signal(flows.CHILD_ID, "go")
        result = await sub.await_case(flows.PARENT_ID)
        assert result["kid"] == {"x": 4, "y": 40, "go": None, "done": True}
        assert await sub.await_case("peer") == {"thanks": 40, "seen": 40}
        parent = await sub.journal(flows.PARENT_ID)
        check_shape(parent)
        assert [field(r, "name") for r in parent if r.kind == "effect"] == [
            "start_case('child')", "signal_case('thanks')"
        ]
        assert len(effect_records(parent, "seq[0].start_case")) == 1
        child = await sub.journal(flows.CHILD_ID)
        assert kinds(child).count("start") == 1 and child[0].model_extra["parent"] == flows.PARENT_ID
        peer = await sub.journal("peer")
        signals = [r for r in peer if r.kind == "signal"]
        assert len(signals) == 1
        # the signal's request id is the step's idempotency key: sent again with it, nothing more is applied
        key = signals[0].request_id
        assert key is not None and key.startswith(f"{flows.PARENT_ID}:") and key.endswith(":seq[1].signal_case")


async def test_a_signal_case_sent_again_with_its_key_applies_once(store: Store) -> None:
    """A signal_case whose outcome was lost is sent again with the same request id: the target applies it once,
    and the repeat is answered as the first was, although that signal ended the case."""
    async with Substrate(store=store, workflows=flows.WORKFLOWS) as sub:
        peer = await sub.new_case("peer", {}, case_id="peer2")
        await sub.signal("peer2", "thanks", 2, request_id="P:7:seq[1].signal_case")
        assert await peer.result() == {"thanks": 2, "seen": 2}
        await sub.signal("peer2", "thanks", 3, request_id="P:7:seq[1].signal_case")
        assert [r.kind for r in await sub.journal("peer2")].count("signal") == 1


async def test_the_parent_cancelled_after_a_restart_cancels_its_waiting_child(store: Store) -> None:
    """A parent that waits again after a restart still cancels the child it waits for when it is cancelled."""
    async with Substrate(store=store, workflows=flows.WORKFLOWS) as sub:
        await sub.new_case("parent", {"n": 1, "peer": "none"}, case_id=flows.PARENT_ID)
        await started(sub, flows.CHILD_ID, "waiting_signal")
    async with Substrate(store=twin(store), workflows=flows.WORKFLOWS) as sub:
        await eventually(lambda: sub.status(flows.PARENT_ID).effects_pending == 1)
        await sub.cancel(flows.PARENT_ID)
        await eventually(lambda: sub.status(flows.CHILD_ID).state == "cancelled")
        with pytest.raises(CaseCancelled, match="its parent 'P' was cancelled"):
            await sub.await_case(flows.CHILD_ID, timeout=30)
        assert sub.status(flows.PARENT_ID).state == "cancelled"
        assert kinds(await sub.journal(flows.CHILD_ID))[-2:] == ["cancel", "end"]


async def test_a_store_of_the_previous_layout_opens_and_lists_children(tmp_path: Path) -> None:
    """A SQLite file of the layout before the parent column is moved forward and lists children after."""
    parent_at = next(v for v in range(1, SCHEMA_VERSION + 1) if LAYOUT.migrations[v].name.endswith("_case_parent.sql"))
    path = tmp_path / "old.db"
    with closing(sqlite3.connect(path)) as conn:
        for version in range(1, parent_at):
            for statement in LAYOUT.migrations[version].statements:
                conn.execute(statement)
        conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
        conn.execute(f"PRAGMA user_version = {parent_at - 1}")
        conn.commit()
    async with Substrate(store=str(path), workflows=flows.WORKFLOWS) as sub:
        await sub.new_case("parent", {"n": 2, "peer": "none"}, case_id=flows.PARENT_ID)
        await started(sub, flows.CHILD_ID, "waiting_signal")
        assert [s.case_id for s in sub.cases(parent=flows.PARENT_ID)] == [flows.CHILD_ID]
    with closing(sqlite3.connect(path)) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


@pytest.mark.parametrize("where", ["before-start", "child-started"])
async def test_a_child_is_started_exactly_once_across_a_sigkill(tmp_path: Path, where: str) -> None:
    """SIGKILLed before the child's start record is written, or after it (the parent's step still without an
    outcome): the recovered parent starts the child once, waits for it, and gets its result."""
    path = tmp_path / "cases.db"
    done = await anyio.to_thread.run_sync(lambda: subprocess.run(
        [sys.executable, "-m", "tests.durable._children_flows", str(path), where], cwd=ROOT, capture_output=True,
        text=True, timeout=120, check=False,
    ))
    assert done.returncode == -signal.SIGKILL, done.stderr[-3000:]
    async with outside(str(path)) as reader:
        child_start = await reader.journal(flows.CHILD_ID)
        assert (len(child_start) > 0) == (where == "child-started"), kinds(child_start)
        assert kinds(await reader.journal(flows.PARENT_ID)) == ["start"]
    async with Substrate(store=str(path), workflows=flows.WORKFLOWS) as sub:
        await started(sub, flows.CHILD_ID, "waiting_signal")
        await sub.signal(flows.CHILD_ID, "go")
        result = await sub.await_case(flows.PARENT_ID)
        assert result["kid"]["y"] == 40
        child = await sub.journal(flows.CHILD_ID)
        check_shape(child)
        assert kinds(child).count("start") == 1
        parent = await sub.journal(flows.PARENT_ID)
        assert len(effect_records(parent, "seq[0].start_case")) == 1
        assert sub.status(flows.PARENT_ID).children == (flows.CHILD_ID,)

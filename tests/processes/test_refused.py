"""Refused inputs are never silent: an input written to the store's inbox while no owner runs (a misspelled
signal from a raw inbox writer, or a payload `wfsub signal` queued that the wait's model refuses) is refused by
the owner that opens the store next; the refusal is logged at WARNING, listed in `status().refused` (of the
owner, after a restart, and of a Client) and printed by `wfsub show`."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import anyio
import pytest
import structlog
from pydantic import BaseModel, field_validator

from wfsub import Client, RefusedInput, Substrate, seq, task, wait
from wfsub.stores import MemoryStore, PostgresStore, SqliteStore, Store

from .. import _warm
from ..durable._util import eventually
from ..stores import _pg
from ._http import ROOT

BOUND = 60.0  # seconds: a bound against a hang, not a latency requirement


class Approval(BaseModel):
    by: str


def done(ctx: Mapping[str, Any]) -> dict[str, Any]:
    return {"done": True}


FLOW = seq(wait("approve", model=Approval), task(done))
FLOWS = {"loan": FLOW}
TYPO = "case 'c1' cannot take signal 'aprove': the workflow never waits for signal 'aprove'"


def reopenable(kind: str, tmp_path: Path) -> Callable[[], Any]:
    """The same store each time it is called (a new store object on one file or schema)."""
    if kind == "memory":
        memory = MemoryStore()
        return lambda: memory
    if kind == "sqlite":
        return lambda: SqliteStore(tmp_path / "cases.db")
    if not _pg.ENABLED:
        pytest.skip(_pg.SKIP_REASON)
    dsn, schema = _pg.database_dsn(), _pg.new_schema()
    return lambda: PostgresStore(dsn, schema=schema)


async def put(store: Store, case_id: str, name: str, payload: Any, request_id: str | None, sent: float) -> None:
    """Write a signal to the inbox as a raw outside writer would (no summary check on this door)."""
    await store.open(owner=False, owner_id="outside-test")
    try:
        await store.inbox_put(case_id, "signal", {"name": name, "payload": payload}, request_id=request_id,
                              created_at=sent)
    finally:
        await store.close()


def warnings(logs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in logs if e["log_level"] == "warning" and e["event"] == "an input from the inbox was refused"]


@pytest.mark.parametrize("kind", ["memory", "sqlite", "postgres"])
async def test_an_input_refused_by_the_next_owner_is_logged_and_listed_in_status(kind: str, tmp_path: Path) -> None:
    """A misspelled signal queued while no owner runs: the next owner refuses it, logs a WARNING naming the case,
    kind, name and reason, and `status().refused` lists it (in memory, after a restart, and to a Client)."""
    store = reopenable(kind, tmp_path)
    async with Substrate(store=store(), workflows=FLOWS) as sub:
        await sub.new_case("loan", {}, case_id="c1")
        assert sub.status("c1").refused == ()
    await put(store(), "c1", "aprove", {"by": "ann"}, "rid-1", 1_000.0)
    with structlog.testing.capture_logs() as logs:
        async with Substrate(store=store(), workflows=FLOWS) as sub:
            await eventually(lambda: sub.status("c1").refused, BOUND, 0.01)
            [refused] = sub.status("c1").refused
            assert refused.kind == "signal" and refused.name == "aprove" and refused.request_id == "rid-1"
            assert refused.time == 1_000.0 and refused.reason.startswith(TYPO), refused
            assert sub.status("c1").state == "waiting_signal"  # the case goes on waiting for the right one
    [logged] = warnings(logs)
    assert logged["case_id"] == "c1" and logged["kind"] == "signal" and logged["name"] == "aprove"
    assert logged["reason"] == refused.reason and logged["request_id"] == "rid-1"
    async with Substrate(store=store(), workflows=FLOWS) as sub:  # kept in the store: a restart shows it
        assert sub.status("c1").refused == (refused,)
        await sub.signal("c1", "approve", {"by": "ann"})
        assert await sub.await_case("c1", timeout=BOUND) == {"approve": {"by": "ann"}, "done": True}
        assert sub.status("c1").refused == (refused,)  # an ended case still shows what was refused
    if kind != "memory":
        async with Client(store()) as client:
            assert (await client.status("c1")).refused == (refused,)


@pytest.mark.parametrize("kind", ["memory", "sqlite", "postgres"])
async def test_a_refusal_while_the_case_is_in_memory_shows_at_once_and_the_latest_ten_are_kept(
    kind: str, tmp_path: Path
) -> None:
    """Inputs refused while the owner runs the case show in its status; only the latest ten, newest first."""
    store = reopenable(kind, tmp_path)
    async with Substrate(store=store(), workflows=FLOWS) as sub:
        await sub.new_case("loan", {}, case_id="c1")
        writer = store() if kind != "memory" else sub._store  # the owner's own store object for MemoryStore
        assert writer is not None
        if kind != "memory":
            await writer.open(owner=False, owner_id="outside-test")
        try:
            for i in range(12):
                await writer.inbox_put("c1", "signal", {"name": f"typo{i}", "payload": None}, request_id=None,
                                       created_at=float(i))
        finally:
            if kind != "memory":
                await writer.close()
        await eventually(lambda: [r.name for r in sub.status("c1").refused][:1] == ["typo11"], BOUND, 0.01)
        names = [r.name for r in sub.status("c1").refused]
        assert names == [f"typo{i}" for i in range(11, 1, -1)]
        assert all(isinstance(r, RefusedInput) for r in sub.status("c1").refused)


def test_wfsub_show_prints_the_refused_inputs(tmp_path: Path) -> None:
    """`wfsub show` prints each refused input (kind, name, when sent, request id, reason); --json lists them."""
    path = tmp_path / "cases.db"

    async def prepare() -> None:
        store = lambda: SqliteStore(path)  # noqa: E731
        async with Substrate(store=store(), workflows=FLOWS) as sub:
            await sub.new_case("loan", {}, case_id="c1")
        await put(store(), "c1", "aprove", {"by": "ann"}, "rid-7", 1_800_000_000.0)
        async with Substrate(store=store(), workflows=FLOWS) as sub:
            await eventually(lambda: sub.status("c1").refused, BOUND, 0.01)

    anyio.run(prepare)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "400"}
    shown = _warm.command("show", str(path), "c1", cwd=ROOT, env=env, timeout=60)
    assert shown.returncode == 0, shown.stderr
    text = " ".join(shown.stdout.split())
    assert "refused signal 'aprove' sent 2027-01-15" in text, shown.stdout
    assert "(request_id rid-7): " + TYPO in text, shown.stdout
    as_json = _warm.command("show", str(path), "c1", "--json", cwd=ROOT, env=env, timeout=60)
    assert as_json.returncode == 0, as_json.stderr
    [refused] = json.loads(as_json.stdout)["refused"]
    assert refused["name"] == "aprove" and refused["request_id"] == "rid-7" and refused["time"] == 1_800_000_000.0


class Signed(BaseModel):
    by: str

    @field_validator("by")
    @classmethod
    def lower(cls, value: str) -> str:  # a rule the JSON Schema does not carry: the command lets it through
        if value != value.lower():
            raise ValueError("must be lower case")
        return value


SIGNED = {"loan": seq(wait("approve", model=Signed), task(done))}


def test_a_payload_the_command_queued_and_the_owner_refuses_is_logged_shown_and_listed(tmp_path: Path) -> None:
    """`wfsub signal` with no owner running queues a payload its JSON Schema takes; the owner's model refuses it
    when the owner opens the store: a WARNING, `status().refused`, and `wfsub show` say so."""
    path = tmp_path / "cases.db"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "400"}

    async def start() -> None:
        async with Substrate(store=SqliteStore(path), workflows=SIGNED) as sub:
            await sub.new_case("loan", {}, case_id="c1")

    anyio.run(start)
    sent = _warm.command("signal", str(path), "c1", "approve", '{"by": "ANN"}', "--request-id", "cmd-1", cwd=ROOT,
                         env=env, timeout=60)
    assert sent.returncode == 0 and "queued" in sent.stderr, sent.stderr

    async def owner() -> tuple[RefusedInput, ...]:
        async with Substrate(store=SqliteStore(path), workflows=SIGNED) as sub:
            await eventually(lambda: sub.status("c1").refused, BOUND, 0.01)
            return sub.status("c1").refused

    with structlog.testing.capture_logs() as logs:
        [refused] = anyio.run(owner)
    assert (refused.kind, refused.name, refused.request_id) == ("signal", "approve", "cmd-1")
    assert "payload does not fit Signed (by: Value error, must be lower case)" in refused.reason, refused.reason
    [logged] = warnings(logs)
    assert (logged["case_id"], logged["name"], logged["reason"]) == ("c1", "approve", refused.reason)
    shown = _warm.command("show", str(path), "c1", cwd=ROOT, env=env, timeout=60)
    assert shown.returncode == 0, shown.stderr
    text = " ".join(shown.stdout.split())
    assert "refused signal 'approve' sent" in text and "(request_id cmd-1)" in text, shown.stdout
    assert "must be lower case" in text, shown.stdout

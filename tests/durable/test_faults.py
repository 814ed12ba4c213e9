"""Bad files, faults and bad input, through the Substrate: a corrupt or foreign file, a read-only file or directory,
a full disk and a second owner give a StoreError naming the file and the cause, with nothing half-written and the
acknowledged cases intact; non-JSON or oversized durable input is refused before anything is written."""

from __future__ import annotations

import datetime
import sqlite3
import subprocess
from collections.abc import Mapping
from contextlib import closing
from pathlib import Path
from typing import Any

import anyio
import pydantic
import pytest

import wfsub
from wfsub import (
    CaseExists,
    CaseFailed,
    EffectResultError,
    StoreError,
    Substrate,
    WorkflowNotRegistered,
    effect,
    mi,
    scope,
    seq,
    task,
    wait,
)
from wfsub.stores import Listing, MemoryStore

from .. import _warm
from . import _flows
from ._util import ROOT, child_cmd, child_report, kinds, outside

# -- bad files --------------------------------------------------------------------------------------------------


async def enter_fails(store: Any) -> StoreError:
    """A Substrate that may not wait as a standby (standby=False) refused on a store another one owns."""
    with pytest.raises(StoreError) as caught:
        async with Substrate(store=store, workflows=_flows.WORKFLOWS, standby=False):
            pass  # pragma: no cover
    return caught.value


async def test_a_file_that_is_not_sqlite_is_refused_by_the_substrate_and_left_alone(tmp_path: Path) -> None:
    """Substrate(store=a text file): StoreError naming the file and 'not a SQLite database'; the file untouched."""
    path = tmp_path / "notes.txt"
    path.write_text("my notes\n" * 500)
    for _ in range(2):  # and again: nothing (no owner lock) was left behind by the failed entry
        error = await enter_fails(str(path))
        assert str(path) in str(error) and "not a SQLite database" in str(error)
        assert isinstance(error.__cause__, sqlite3.DatabaseError)
    assert path.read_text() == "my notes\n" * 500


async def test_a_corrupt_store_is_refused_by_the_substrate_with_the_way_out(tmp_path: Path) -> None:
    """A store whose pages were overwritten: entering a Substrate raises StoreError (damaged, backup/.recover)."""
    path = tmp_path / "cases.db"
    async with Substrate(store=str(path), workflows=_flows.WORKFLOWS) as sub:
        for i in range(30):
            await sub.new_case("charge_then_wait", {"n": i, "pad": "x" * 300})
    size = path.stat().st_size
    with path.open("r+b") as f:
        f.seek(100)
        f.write(b"\xa5" * (size - 100))
    for _ in range(2):
        error = await enter_fails(str(path))
        assert str(path) in str(error) and "damaged" in str(error) and ".recover" in str(error)


async def test_another_applications_database_is_refused_by_the_substrate(tmp_path: Path) -> None:
    """Substrate(store=another application's SQLite file): StoreError 'not a wfsub store'; nothing written in it."""
    path = tmp_path / "app.db"
    with closing(sqlite3.connect(path)) as conn:
        conn.execute("CREATE TABLE customers (id INTEGER PRIMARY KEY)")
        conn.commit()
    error = await enter_fails(f"sqlite:///{path}")
    assert str(path) in str(error) and "not a wfsub store" in str(error)
    with closing(sqlite3.connect(path)) as conn:
        assert [n for (n,) in conn.execute("SELECT name FROM sqlite_master")] == ["customers"]


async def test_a_read_only_store_file_is_refused_by_the_substrate(tmp_path: Path) -> None:
    """A 0400 store (root's override dropped): entering a Substrate raises StoreError naming the file, read-only."""
    path = tmp_path / "cases.db"
    async with Substrate(store=str(path), workflows=_flows.WORKFLOWS) as sub:
        await sub.new_case("charge_then_wait", {"n": 1}, case_id="kept")
        await _flows.until_parked(sub, "kept")
    path.chmod(0o400)
    try:
        found = await anyio.to_thread.run_sync(lambda: child_report("readonly", str(path)))
    finally:
        path.chmod(0o600)
    assert found["error_type"] == "StoreError" and str(path) in found["error"], found
    assert "read-only" in found["error"] or "readonly" in found["error"]
    async with Substrate(store=str(path), workflows=_flows.WORKFLOWS) as sub:  # intact, writable again
        await sub.signal("kept", "go", "x")
        assert (await sub.await_case("kept"))["go"] == "x"


async def test_a_read_only_directory_is_refused_by_the_substrate(tmp_path: Path) -> None:
    """A read-only directory (no -wal, -shm, -lock can be made): StoreError naming the file and 'writable'."""
    folder = tmp_path / "ro"
    folder.mkdir()
    path = folder / "cases.db"
    async with Substrate(store=str(path), workflows=_flows.WORKFLOWS) as sub:
        await sub.new_case("basic", {"n": 1}, case_id="kept")
        await sub.await_case("kept")
    folder.chmod(0o500)
    try:
        found = await anyio.to_thread.run_sync(lambda: child_report("readonly", str(path)))
    finally:
        folder.chmod(0o700)
    assert found["error_type"] == "StoreError" and (str(path) in found["error"] or str(folder) in found["error"])
    assert "writable" in found["error"]
    async with Substrate(store=str(path), workflows=_flows.WORKFLOWS) as sub:
        assert await sub.await_case("kept") == {"n": 1, "prepped": 2, "charged": 10, "finished": True}


@pytest.mark.long
async def test_a_full_disk_refuses_new_inputs_keeps_acknowledged_cases_and_the_substrate_goes_on(
    tmp_path: Path,
) -> None:
    """A full disk: StoreError (file, cause), nothing half-written, acknowledged cases complete."""
    path = tmp_path / "cases.db"
    found = await anyio.to_thread.run_sync(lambda: child_report("full", str(path)))
    assert found["refused"], found
    for error in found["errors"]:
        assert str(path) in error and ("ulimit -f" in error or "disk is full" in error), error
    assert found["signal_error"] is None or str(path) in found["signal_error"]
    assert set(found["results"]) == set(found["acked"])
    for cid in found["acked"]:
        result = found["results"][cid]
        assert result.get("finished") is True, (cid, result)
        assert result.get("go", "ok") == ("ok" if cid != "before-0" or found["signal_error"] else "x" * 30_000)
    # an `end` the full disk refused is written by the next run's recovery
    async with Substrate(store=str(path), workflows=_flows.WORKFLOWS) as sub:
        for cid in found["acked"]:
            assert await sub.await_case(cid) == found["results"][cid]
    async with outside(path) as reader:
        stored = {row.case_id: row for row in await reader.cases(Listing(limit=10_000))}
        assert set(stored) == set(found["acked"]), "a refused new_case left a case behind"
        for cid in found["acked"]:
            journal = await reader.journal(cid)
            assert kinds(journal)[0] == "start" and kinds(journal)[-1] == "end" and stored[cid].state == "done"
            assert [r["seq"] for r in journal] == list(range(len(journal)))
    with closing(sqlite3.connect(path)) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


# -- one owner ------------------------------------------------------------------------------------------------


async def test_a_second_substrate_on_the_same_store_is_refused_naming_the_owner(tmp_path: Path) -> None:
    """A second Substrate (standby=False) on a store in use (same process: a file, a MemoryStore): StoreError."""
    path = str(tmp_path / "cases.db")
    memory = MemoryStore()
    for store in (path, memory):
        async with Substrate(store=store, workflows=_flows.WORKFLOWS) as first:
            error = await enter_fails(store)
            assert first._table.owner in str(error)
            if store is path:
                assert path in str(error) and "(this process)" in str(error)
            handle = await first.new_case("basic", {"n": 1})  # the owner goes on
            await handle.result()
        async with Substrate(store=store, workflows=_flows.WORKFLOWS) as again:  # released at close
            assert again.status(handle.case_id).state == "done"


def test_a_substrate_in_another_process_owns_the_store_until_it_ends(tmp_path: Path) -> None:
    """Another process's Substrate owns the file (standby=False: StoreError naming its pid) until it is killed."""
    path = tmp_path / "cases.db"
    holder = _warm.Popen(child_cmd("hold", str(path)), cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True)
    try:
        assert holder.stdout is not None
        _, pid, owner = holder.stdout.readline().split()
        error = anyio.run(enter_fails, str(path))
        assert f"pid {pid}" in str(error) and owner in str(error) and str(path) in str(error)
    finally:
        holder.kill()
        holder.communicate()

    async def own() -> None:
        async with Substrate(store=str(path), workflows=_flows.WORKFLOWS) as sub:
            await (await sub.new_case("basic", {"n": 1})).result()

    anyio.run(own)


# -- bad input --------------------------------------------------------------------------------------------------


def items_of(ctx: Mapping[str, Any]) -> list[Any]:
    return list(ctx.get("items", []))


def when_type(ctx: Mapping[str, Any]) -> dict[str, Any]:
    return {"when_type": type(ctx["order"]["when"]).__name__}


FLOWS = {
    "flow": seq(wait("go", into="go"), wait("more", into="more")),
    "dyn": seq(mi(wait("ok", into="ok"), count=1, dynamic=True, name="rev", collect="out"), task(lambda c: None)),
    "typed": seq(task(when_type), wait("go", into="go")),
}


class Order(pydantic.BaseModel):
    order_id: int
    when: datetime.datetime


async def nothing_stored(store: MemoryStore) -> None:
    async with outside(store) as reader:
        assert await reader.cases(Listing(limit=100)) == []


@pytest.mark.parametrize(("data", "where"), [
    ({"items": [1, 2, {"when": datetime.date(2025, 1, 1)}]}, 'data["items"][2]["when"]: date is not JSON; pass'),
    ({"a": {1: "x"}}, 'data["a"]: key 1 is int, but JSON keys are str'),
    ({"x": float("nan")}, 'data["x"]: nan is not JSON'),
    ({"x": [float("inf")]}, 'data["x"][0]: inf is not JSON'),
    ({"s": {1, 2}}, 'data["s"]: set is not JSON'),
    ({"b": b"raw"}, 'data["b"]: bytes is not JSON'),
])
async def test_non_json_start_data_is_refused_naming_the_path_before_anything_is_written(data: dict[str, Any],
                                                                                          where: str) -> None:
    """new_case with data that is not JSON raises TypeError naming the bad value's path; nothing is stored."""
    store = MemoryStore()
    async with Substrate(store=store, workflows=FLOWS) as sub:
        with pytest.raises(TypeError) as caught:
            await sub.new_case("flow", data, case_id="c")
        assert where in str(caught.value)
        assert sub.cases() == []
        await sub.new_case("flow", {}, case_id="c")  # the id was not taken


async def test_the_non_json_message_is_the_documented_one() -> None:
    """The TypeError for a datetime in the data reads exactly as documented."""
    async with Substrate(store=MemoryStore(), workflows=FLOWS) as sub:
        with pytest.raises(TypeError) as caught:
            await sub.new_case("flow", {"items": [1, 2, {"when": datetime.datetime(2025, 1, 1)}]})
    assert str(caught.value) == 'data["items"][2]["when"]: datetime is not JSON; pass .isoformat()'


async def test_a_cyclic_value_is_refused_with_a_type_error() -> None:
    """Start data that contains itself is not JSON: TypeError naming where, nothing stored."""
    cyclic: list[Any] = [1]
    cyclic.append(cyclic)
    store = MemoryStore()
    async with Substrate(store=store, workflows=FLOWS) as sub:
        with pytest.raises(TypeError, match=r'data\["c"\]'):
            await sub.new_case("flow", {"c": cyclic})
    await nothing_stored(store)


async def test_non_json_signal_payloads_and_items_are_refused_before_anything_is_journaled() -> None:
    """A non-JSON signal payload or add_instances items raise TypeError naming the path; the journal is unchanged."""
    async with Substrate(store=MemoryStore(), workflows=FLOWS) as sub:
        await sub.new_case("flow", {}, case_id="c")
        await sub.new_case("dyn", {}, case_id="d")
        with pytest.raises(TypeError, match=r'signal .go. payload\["when"\]: datetime is not JSON; pass .isoformat'):
            await sub.signal("c", "go", {"when": datetime.datetime(2025, 1, 1)})
        with pytest.raises(TypeError, match=r"items\[1\]: set is not JSON"):
            await sub.add_instances("d", "rev", [1, {2}])
        assert kinds(await sub.journal("c")) == ["start"] and kinds(await sub.journal("d")) == ["start"]
        await sub.signal("c", "go", (1, (2, 3)))  # tuples are JSON arrays: the case sees lists
        await sub.signal("c", "more", Order(order_id=1, when=datetime.datetime(2025, 1, 2)))
        assert await sub.await_case("c") == {"go": [1, [2, 3]], "more": {"order_id": 1, "when": "2025-01-02T00:00:00"}}


async def test_pydantic_start_data_is_dumped_in_json_mode() -> None:
    """A pydantic model as start data (or nested in it) is stored in JSON mode: the tasks see what replay will."""
    async with Substrate(store=MemoryStore(), workflows=FLOWS) as sub:
        await sub.new_case("typed", {"order": Order(order_id=7, when=datetime.datetime(2025, 3, 4, 5, 6))},
                           case_id="c")
        await sub.signal("c", "go", 1)
        assert await sub.await_case("c") == {
            "order": {"order_id": 7, "when": "2025-03-04T05:06:00"}, "when_type": "str", "go": 1}
        journal = await sub.journal("c")
    assert journal[0].model_extra is not None
    assert journal[0].model_extra["data"] == {"order": {"order_id": 7, "when": "2025-03-04T05:06:00"}}


async def test_payloads_over_max_payload_bytes_are_refused_before_anything_is_written() -> None:
    """Start data, a signal payload or add_instances items over max_payload_bytes: ValueError naming the limit."""
    store = MemoryStore()
    big = "x" * 2000
    async with Substrate(store=store, workflows=FLOWS, max_payload_bytes=1000) as sub:
        with pytest.raises(ValueError, match="max_payload_bytes=1,000"):
            await sub.new_case("flow", {"big": big}, case_id="too-big")
        await sub.new_case("flow", {"small": 1}, case_id="c")
        await sub.new_case("dyn", {}, case_id="d")
        with pytest.raises(ValueError, match="max_payload_bytes"):
            await sub.signal("c", "go", big)
        with pytest.raises(ValueError, match="max_payload_bytes"):
            await sub.add_instances("d", "rev", [big])
        assert kinds(await sub.journal("c")) == ["start"] and kinds(await sub.journal("d")) == ["start"]
        assert {c.case_id for c in sub.cases()} == {"c", "d"}


async def big_result(ctx: Mapping[str, Any]) -> dict[str, Any]:
    return {"blob": "y" * 5000}


async def dated_result(ctx: Mapping[str, Any]) -> dict[str, Any]:
    return {"when": datetime.datetime(2025, 1, 1)}


async def test_an_effect_result_that_cannot_be_journaled_fails_like_a_raising_effect() -> None:
    """An effect result that is not JSON or too big fails at its node like a raising effect."""
    flows = {
        "dated": seq(effect(dated_result, name="dated")),
        "big": seq(effect(big_result, name="big")),
        "caught": seq(scope("try", effect(dated_result, name="dated"), on_error=task(lambda c: {"recovered": True}))),
    }
    async with Substrate(store=MemoryStore(), workflows=flows, max_payload_bytes=1000) as sub:
        for name, text in (("dated", "datetime is not JSON"), ("big", "max_payload")):
            await sub.new_case(name, {}, case_id=name)
            with pytest.raises(CaseFailed) as failed:
                await sub.await_case(name)
            assert isinstance(failed.value.__cause__, EffectResultError) and text in str(failed.value.__cause__)
            said = str(failed.value)  # what it returned, where, and that it is not retried; never "raised"
            assert f"effect '{name}' at seq[0].effect returned" in said and "not retried" in said
            assert "raised" not in said
            record = (await sub.journal(name))[1]
            assert record.kind == "effect" and record.model_extra is not None
            assert "result" not in record.model_extra and text in record.model_extra["error"]["message"]
        await sub.new_case("caught", {}, case_id="caught")
        result = await sub.await_case("caught")
        assert result["recovered"] is True and result["error"]["type"] == "EffectResultError"


async def test_durable_start_rules() -> None:
    """With a store: a term not registered, an id stored (earlier run) with other data, a bad request_id: refused."""
    store = MemoryStore()
    async with Substrate(store=store, workflows=FLOWS) as sub:
        await sub.new_case("flow", {}, case_id="c")
    async with Substrate(store=store, workflows=FLOWS) as sub:
        with pytest.raises(WorkflowNotRegistered):
            await sub.new_case(seq(wait("go")), {})
        with pytest.raises(CaseExists, match="other start data"):
            await sub.new_case("flow", {"n": 1}, case_id="c")
        assert (await sub.new_case("flow", {}, case_id="c")).case_id == "c"  # the same start again: that case
        with pytest.raises(TypeError, match="request_id"):
            await sub.signal("c", "go", 1, request_id="")
        with pytest.raises(ValueError, match="keeps no journal"):
            async with Substrate() as plain:
                await plain.journal("c")
    assert wfsub.__name__ == "wfsub"


async def test_the_default_max_payload_is_one_mebibyte() -> None:
    """Without max_payload_bytes, start data just under 1 MiB of JSON is taken and just over it refused."""
    store = MemoryStore()
    async with Substrate(store=store, workflows=FLOWS) as sub:
        await sub.new_case("flow", {"pad": "x" * (1024 * 1024 - 100)}, case_id="under")
        with pytest.raises(ValueError, match="max_payload_bytes=1,048,576"):
            await sub.new_case("flow", {"pad": "x" * (1024 * 1024)}, case_id="over")
        assert [c.case_id for c in sub.cases()] == ["under"]


class _EndRefusedOnce(MemoryStore):
    """A store whose first commit carrying a case's `end` record fails as a full disk does."""

    def __init__(self) -> None:
        super().__init__()
        self.refused_ends = 0

    async def write(self, change: Any, *, wait: bool = True) -> list[bool]:
        if not self.refused_ends and any(r.get("kind") == "end" for r in change.records):
            self.refused_ends += 1
            raise StoreError("memory://", "committing case 'c' failed: the disk is full")
        return await super().write(change, wait=wait)


async def test_an_end_record_the_store_refused_is_written_soon_after_and_the_awaiter_gets_the_outcome() -> None:
    """A case whose `end` commit failed with a store fault is brought back and its end written within seconds (the
    sweep is asked for it at once, not at its next half-minute pass); the awaiter then gets the outcome."""
    store = _EndRefusedOnce()
    async with Substrate(store=store, workflows=_flows.WORKFLOWS) as sub:
        await sub.new_case("basic", {"n": 1}, case_id="c")
        with anyio.fail_after(10):  # (a bound: the sweep's own pass would come after 30 s)
            assert await sub.await_case("c") == {"n": 1, "prepped": 2, "charged": 10, "finished": True}
        await _flows.until_state(sub, "c", "done")
        assert [r.kind for r in await sub.journal("c")].count("end") == 1
    assert store.refused_ends == 1

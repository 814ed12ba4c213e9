"""An attack on the store layer as written once (one group commit, `open_store`, the SQL in sql/sqlite and
sql/postgres, SQLite's layout from its migrations): stores written by the older layout, errors in the middle of
a group, a closed store, and the command on what is not a store.

Each test pins either a fault the attack found (now fixed) or behaviour that held up.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import sqlite3
import subprocess
import sys
from collections.abc import Iterator, Mapping
from contextlib import closing
from pathlib import Path
from typing import Any

import anyio
import pytest

import wfsub
from wfsub import CaseCancelled, CaseFailed, CaseState, Substrate, SubstrateClosed, compile, replay, seq, task, wait
from wfsub.stores import SqliteStore, StoreError, open_store

from .. import _warm
from ..durable._util import eventually
from ..stores import _pg
from ..stores._helpers import make_store, opened

DATA = Path(__file__).parent / "data"

# The workflows the store in data/store_d8defd8.sql was written by (module `oldflows`: a workflow's fingerprint
# names the module of its functions).
OLD_FLOWS = '''
from collections.abc import Mapping
from typing import Any
from wfsub import effect, mi, saga, seq, task, wait

def reserve(c: Mapping[str, Any]) -> dict[str, Any]:
    return {"reserved": c["n"]}

def release(c: Mapping[str, Any]) -> dict[str, Any]:
    return {"released": True}

async def charge(c: Mapping[str, Any]) -> dict[str, Any]:
    return {"charged": c["n"] * 10}

def items(c: Mapping[str, Any]) -> list[int]:
    return [1, 2, 3]

def pack(c: Mapping[str, Any]) -> dict[str, Any]:
    return {"packed": True}

def ship(c: Mapping[str, Any]) -> dict[str, Any]:
    return {"shipped": c["approve"]["by"]}

def boom(c: Mapping[str, Any]) -> dict[str, Any]:
    raise ValueError("no stock")

order = seq(saga((task(reserve), task(release)), effect(charge, name="charge")),
            mi(task(pack), items=items, name="lines", collect="lines"), wait("approve"), task(ship))
failing = seq(task(reserve), task(boom))
WORKFLOWS = {"order": order, "failing": failing}
'''
# The fingerprints recorded in that store (the digest of a function's code depends on the Python that compiled
# it: the store's rows and records are given the fingerprints of the Python running the test).
OLD_FINGERPRINTS = {
    "order": "263d18e1b997f8071b92c23fedb7e2bb7e7707b37526fb997868072450cbf32b",
    "failing": "e4b14a55d4d065b18ad13a24c99628ef4c14480b47dd1921ba847275840f1dba",
}


@pytest.fixture
def old_store(tmp_path: Path) -> Iterator[tuple[Path, Any]]:
    """The store written by the older layout, as a file, and the module of its workflows (importable by name)."""
    (tmp_path / "oldflows.py").write_text(OLD_FLOWS)
    sys.path.insert(0, str(tmp_path))
    try:
        flows = importlib.import_module("oldflows")
        script = (DATA / "store_d8defd8.sql").read_text()
        for name, old in OLD_FINGERPRINTS.items():
            script = script.replace(old, compile(flows.WORKFLOWS[name]).fingerprint)
        path = tmp_path / "cases.db"
        with closing(sqlite3.connect(path)) as conn:
            conn.executescript(script)
        yield path, flows
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("oldflows", None)


def _command(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return _warm.command(*args, cwd=cwd, env={"COLUMNS": "200", **_env()})


def _env() -> dict[str, str]:
    import os

    return dict(os.environ)


# -- stores written by the older layout --------------------------------------------------------------------------


async def test_a_store_of_the_older_layout_opens_and_its_cases_go_on(old_store: tuple[Path, Any]) -> None:
    """A store of the older layout opens: outcomes, journals, queued inputs and waiting cases go on."""
    path, flows = old_store
    async with Substrate(store=SqliteStore(path), workflows=flows.WORKFLOWS) as sub:
        with anyio.fail_after(20):
            assert await sub.await_case("o0") == {
                "n": 0, "reserved": 0, "charged": 0, "lines": [{"packed": True}] * 3, "approve": {"by": "ann"},
                "shipped": "ann",
            }
            with pytest.raises(CaseCancelled, match="customer asked"):
                await sub.await_case("o1")
            with pytest.raises(CaseFailed, match="no stock"):
                await sub.await_case("f1")
            assert (await sub.await_case("o3"))["shipped"] == "queued"  # from the inbox, as the owner opened it
            await sub.signal("o2", "approve", {"by": "bob"})
            assert (await sub.await_case("o2"))["shipped"] == "bob"
            fresh = await sub.new_case("order", {"n": 7})
            await fresh.signal("approve", {"by": "new"})
            assert (await fresh.result())["charged"] == 70
        journal = await sub.journal("o0")
        assert [r.kind for r in journal][0] == "start" and journal[-1].kind == "end"
        report = replay(flows.WORKFLOWS["order"], journal)
        assert report.divergence is None and report.data["shipped"] == "ann"
        assert sub.status("o1").cancel_reason == "customer asked"
        assert sub.status("f1").state is CaseState.FAILED


def test_the_command_reads_and_steers_a_store_of_the_older_layout(old_store: tuple[Path, Any]) -> None:
    """On a store of the older layout the command says to open it with a Substrate first (only an owner migrates);
    then `cases`, `show`, `journal`, `data`, `replay --all` and `signal` work."""
    path, flows = old_store
    here = path.parent
    ran = _command(here, "cases", "cases.db")
    assert ran.returncode == 1 and "start the Substrate with this wfsub first" in ran.stderr, ran.stderr

    async def migrate() -> None:
        async with Substrate(store=SqliteStore(path), workflows=flows.WORKFLOWS):
            pass

    anyio.run(migrate)
    ran = _command(here, "cases", "cases.db")
    assert ran.returncode == 0, ran.stderr
    assert all(case in ran.stdout for case in ("o0", "o1", "o2", "o3", "f1"))
    ran = _command(here, "show", "cases.db", "o2")
    assert ran.returncode == 0 and "waiting_signal" in ran.stdout and "approve" in ran.stdout, ran.stderr
    ran = _command(here, "journal", "cases.db", "o0")
    assert ran.returncode == 0, ran.stderr
    assert [json.loads(line)["kind"] for line in ran.stdout.splitlines()][::len(ran.stdout.splitlines()) - 1] == [
        "start", "end"]
    ran = _command(here, "data", "cases.db", "o0")
    assert ran.returncode == 0 and json.loads(ran.stdout)["shipped"] == "ann", ran.stderr
    ran = _command(here, "replay", "cases.db", "-w", "oldflows:WORKFLOWS", "--all")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    ran = _command(here, "signal", "cases.db", "o2", "approve", '{"by": "cli"}')
    assert ran.returncode == 0 and "queued" in ran.stderr, ran.stderr


def test_the_command_on_a_directory_or_a_text_file_says_so(tmp_path: Path) -> None:
    """`wfsub` on a directory or a text file exits 1 saying why, with no traceback, the file untouched."""
    (tmp_path / "cases").mkdir()
    (tmp_path / "notes.db").write_text("not a database\n")
    ran = _command(tmp_path, "cases", "cases")
    assert ran.returncode == 1 and "is a directory" in ran.stderr and "Traceback" not in ran.stderr
    ran = _command(tmp_path, "show", "notes.db", "c1")
    assert ran.returncode == 1 and "not a SQLite database" in ran.stderr and "Traceback" not in ran.stderr
    assert (tmp_path / "notes.db").read_text() == "not a database\n"


# -- errors in the middle of a group -----------------------------------------------------------------------------


def _done(ctx: Mapping[str, Any]) -> dict[str, Any]:
    return {"done": True}


async def test_one_bad_write_does_not_fail_the_writes_grouped_with_it(tmp_path: Path) -> None:
    """A write that cannot be stored fails alone: the signals committed in the same group as it succeed."""
    store = SqliteStore(tmp_path / "c.db")
    async with Substrate(store=store, workflows={"w": seq(wait("go"), task(_done))}) as sub:
        handles = [await sub.new_case("w") for _ in range(30)]
        for handle in handles:
            await eventually(lambda h=handle: h.status().signals == ("go",))  # type: ignore[misc]

        async def bad() -> None:
            with pytest.raises((TypeError, StoreError)):
                await store.inbox_put(handles[0].case_id, "signal", {"name": "go"}, request_id={"a": 1},  # type: ignore[arg-type]
                                      created_at=0.0)

        outcomes = await asyncio.gather(*[h.signal("go") for h in handles[:15]], bad(),
                                        *[h.signal("go") for h in handles[15:]], return_exceptions=True)
        assert [o for o in outcomes if o is not None] == []


# -- a closed store ----------------------------------------------------------------------------------------------


_POSTGRES_SKIP = [] if _pg.ENABLED else [pytest.mark.skip(reason=_pg.SKIP_REASON)]


@pytest.mark.parametrize("kind", [
    "memory", "sqlite", pytest.param("postgres", marks=_POSTGRES_SKIP),
])
async def test_a_closed_store_says_what_could_not_be_done_in_a_sentence(tmp_path: Path, kind: str) -> None:
    """Every call on a closed store raises StoreError 'cannot <verb> ...: the store is not open' and the fix."""
    store = make_store(kind, tmp_path)
    async with opened(store):
        pass
    calls = [lambda: store.row("c1"), lambda: store.journal("c1"), lambda: store.inbox_row(1), store.inbox_take]
    for call in calls:
        with pytest.raises(StoreError, match="the store is not open") as info:
            await call()
        assert "cannot reading" not in str(info.value) and "call `await store.open(" in str(info.value)


# -- a Substrate closing while its writes wait -------------------------------------------------------------------


def _store_of(kind: str, tmp_path: Path) -> Any:
    """A factory of handles on one durable place (a file, or one Postgres schema) of this kind."""
    if kind == "sqlite":
        return lambda: SqliteStore(tmp_path / "c.db")
    schema = _pg.emptied_schema()
    return lambda: wfsub.stores.PostgresStore(_pg.database_dsn(), schema=schema)


@pytest.mark.parametrize("kind", ["sqlite", pytest.param("postgres", marks=_POSTGRES_SKIP)])
async def test_signals_in_flight_when_the_substrate_closes_are_answered(tmp_path: Path, kind: str) -> None:
    """Signals in flight when a durable Substrate closes are answered, and the journal agrees."""
    await _close_with_signals_in_flight(tmp_path, kind)


@pytest.mark.parametrize("kind", ["sqlite", pytest.param("postgres", marks=_POSTGRES_SKIP)])
def test_signals_in_flight_when_the_substrate_closes_are_answered_on_trio(tmp_path: Path, kind: str) -> None:
    """On trio too, signals in flight when a durable Substrate closes are answered, and the journal agrees."""
    anyio.run(_close_with_signals_in_flight, tmp_path, kind, backend="trio")


async def _close_with_signals_in_flight(tmp_path: Path, kind: str) -> None:
    flows = {"w": seq(wait("go"), task(_done))}
    store = _store_of(kind, tmp_path)
    answered: dict[str, str] = {}

    async def send(handle: Any) -> None:
        try:
            await handle.signal("go", {"n": 1})
            answered[handle.case_id] = "acknowledged"
        except SubstrateClosed:
            answered[handle.case_id] = "refused"

    with anyio.move_on_after(10) as bound:  # a bound against the hang, not a timing
        async with anyio.create_task_group() as senders, Substrate(store=store(), workflows=flows) as sub:
            handles = [await sub.new_case("w", case_id=f"c{i}") for i in range(5)]
            for handle in handles:
                await eventually(lambda h=handle: h.status().signals == ("go",))  # type: ignore[misc]
            for handle in handles:
                senders.start_soon(send, handle)
            for _ in range(5):  # the signals reach their cases and their commits start
                await anyio.lowlevel.checkpoint()
    assert not bound.cancelled_caught, f"senders still waiting after the Substrate closed: {5 - len(answered)}"
    async with Substrate(store=store(), workflows=flows) as sub:
        for case_id, answer in answered.items():
            journaled = any(r.kind == "signal" for r in await sub.journal(case_id))
            assert journaled == (answer == "acknowledged"), (case_id, answer)


# -- a damaged layout --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("table", ["inbox", "owner", "journal"])
async def test_a_store_missing_one_of_its_tables_is_refused_at_open(tmp_path: Path, table: str) -> None:
    """A store missing a table of its layout version is refused at open, naming the table."""
    path = tmp_path / "c.db"
    async with Substrate(store=SqliteStore(path), workflows={"w": seq(wait("go"), task(_done))}) as sub:
        await sub.new_case("w")
    with closing(sqlite3.connect(path)) as conn:
        conn.execute(f"DROP TABLE {table}")
        conn.commit()
    with pytest.raises(StoreError, match=f"{table}.*(backup|restore)"):
        async with Substrate(store=SqliteStore(path), workflows={"w": seq(wait("go"), task(_done))}):
            pass


# -- cases a Substrate took from its store -----------------------------------------------------------------------


async def test_cases_recovered_from_the_store_never_make_the_live_count_negative(tmp_path: Path) -> None:
    """Cases recovered from the store end without making statistics().cases_live negative."""
    flows = {"w": seq(wait("go"), task(_done))}
    async with Substrate(store=SqliteStore(tmp_path / "c.db"), workflows=flows) as sub:
        for i in range(3):
            await sub.new_case("w", case_id=f"c{i}")
        for i in range(3):
            await eventually(lambda i=i: sub.status(f"c{i}").signals == ("go",))  # type: ignore[misc]
    async with Substrate(store=SqliteStore(tmp_path / "c.db"), workflows=flows) as sub:
        for i in range(3):
            await sub.signal(f"c{i}", "go")
            await sub.await_case(f"c{i}")
        stats = sub.statistics()
        assert stats.cases_done == 3 and stats.cases_live == 0, stats


# -- specs open_store cannot mean --------------------------------------------------------------------------------


@pytest.mark.parametrize("spec", ["   ", "memory:?shared=1", "sqlite:cases.db", "postgresql:cases"])
def test_a_spec_that_names_no_store_is_refused_not_made_a_file(tmp_path: Path, spec: str,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A blank spec or a scheme without '//' is refused by open_store, never taken for a file name."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(StoreError, match="memory:|sqlite://|postgresql://|path"):
        open_store(spec)

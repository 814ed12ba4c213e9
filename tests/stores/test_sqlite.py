"""What is particular to the SQLite store: the file's header and modes, the layout and its migrations, group
commit in one writer thread, reads off the event loop, `changed()`, ownership rows, and index reads."""

from __future__ import annotations

import os
import re
import shutil
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

import wfsub
from wfsub._errors import StoreConflict, StoreError
from wfsub._store import SCHEMA_VERSION, CaseRow, CaseWrite, Listing
from wfsub._store import _group as group_module
from wfsub._store import _sqlite as sqlite_module
from wfsub._store import _sqlite_writer as writer_module
from wfsub._store._group import Job
from wfsub._store._rows import encode_row
from wfsub._store._sql import LAYOUT, QUERIES, load_layout, parse_queries, split_statements
from wfsub._store._sqlite_files import mode_of
from wfsub.stores import SqliteStore

from ._helpers import end, first_write, opened, row, signal, start

SQL = Path(wfsub.__file__).parent / "_store" / "sql" / "sqlite"


def raw(path: str | Path) -> sqlite3.Connection:
    return sqlite3.connect(path, isolation_level=None)


def layout_of(conn: sqlite3.Connection) -> list[tuple[str, str, str]]:
    """The layout as SQLite stores it, comments and spacing aside."""
    found = conn.execute("SELECT type, name, sql FROM sqlite_master WHERE sql IS NOT NULL ORDER BY name").fetchall()
    return [(kind, name, " ".join(re.sub(r"--[^\n]*", "", sql).split())) for kind, name, sql in found]


# -- the file --------------------------------------------------------------------------------------------------


async def test_the_file_is_wal_with_wfsubs_application_id_and_layout_version(tmp_path: Path) -> None:
    """A new store file is in WAL mode, carries wfsub's application_id and user_version = SCHEMA_VERSION."""
    store = SqliteStore(tmp_path / "s.db")
    async with opened(store):
        pass
    with closing(raw(store.path)) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA application_id").fetchone()[0] == sqlite_module.APPLICATION_ID
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


@pytest.mark.parametrize(("synchronous", "level"), [("full", 2), ("normal", 1)])
async def test_synchronous_is_set_on_the_writer_connection(tmp_path: Path, synchronous: str, level: int) -> None:
    """The writer thread's connection runs with the `synchronous` the store was given."""
    store = SqliteStore(tmp_path / "s.db", synchronous=synchronous)
    async with opened(store):
        assert store._writer is not None
        probe = Job(lambda conn: conn.execute("PRAGMA synchronous").fetchone()[0], "a probe", wait=True)
        store._writer.submit(probe)
        assert await probe.outcome() == level


async def test_database_wal_shm_and_lock_files_are_0600_whatever_the_umask(tmp_path: Path) -> None:
    """With umask 000, the store file, its -wal, -shm and -lock are created 0600, and again after a reopen."""
    path = str(tmp_path / "s.db")
    previous = os.umask(0)
    try:
        for _ in range(2):  # the second time, SQLite recreates -wal and -shm (deleted at the last close)
            store = SqliteStore(path)
            async with opened(store):
                await store.write(first_write(f"c{_}"))
                modes = {suffix: mode_of(path + suffix) for suffix in ("", "-wal", "-shm", "-lock")}
            assert modes == {"": 0o600, "-wal": 0o600, "-shm": 0o600, "-lock": 0o600}
    finally:
        os.umask(previous)


async def test_an_existing_file_keeps_its_mode(tmp_path: Path) -> None:
    """A file the store did not create (an empty 0640 file) is used as it is: the store never chmods it."""
    path = tmp_path / "s.db"
    path.touch()
    path.chmod(0o640)
    async with opened(SqliteStore(path)):
        pass
    assert mode_of(str(path)) == 0o640


def test_url_and_path_are_absolute() -> None:
    """`path` is absolute and `url` is sqlite:/// followed by it (the form open_store takes back)."""
    store = SqliteStore("rel/cases.db")
    assert store.path == os.path.abspath("rel/cases.db")
    assert store.url == "sqlite:///" + store.path
    assert "rel/cases.db" in repr(store)


def test_a_memory_database_or_a_bad_synchronous_is_refused() -> None:
    """SqliteStore(':memory:') says to use MemoryStore; synchronous must be 'full' or 'normal'."""
    with pytest.raises(StoreError, match="MemoryStore"):
        SqliteStore(":memory:")
    with pytest.raises(ValueError, match="'full'.*'normal'"):
        SqliteStore("x.db", synchronous="off")


# -- the layout and its migrations -------------------------------------------------------------------------------


async def test_a_new_file_gets_the_layout_the_migration_chain_builds(tmp_path: Path) -> None:
    """A new store file has exactly the layout that migrations 1..N build from an empty file (no other copy)."""
    async with opened(SqliteStore(tmp_path / "s.db")):
        pass
    with closing(raw(tmp_path / "s.db")) as fresh, closing(raw(":memory:")) as migrated:
        for version in range(1, SCHEMA_VERSION + 1):
            for statement in LAYOUT.migrations[version].statements:
                migrated.execute(statement)
        assert layout_of(fresh) == layout_of(migrated)
        assert fresh.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert {name for kind, name, _ in layout_of(fresh) if kind == "table"} >= {
            "cases", "journal", "snapshots", "inbox", "owner"
        }
    assert not (SQL / "schema.sql").exists() and not (SQL.parent / "schema.sql").exists()


async def test_a_file_built_by_a_layout_1_schema_opens_with_its_cases(tmp_path: Path) -> None:
    """A file at layout 1 whose tables were built in one go (as earlier versions built new files) opens as is."""
    path = tmp_path / "old.db"
    with closing(raw(path)) as conn:
        conn.executescript(LAYOUT.migrations[1].script)
        conn.execute(f"PRAGMA application_id = {sqlite_module.APPLICATION_ID}")
        conn.execute("PRAGMA user_version = 1")
    async with opened(SqliteStore(path)) as store:
        await store.write(first_write("a"))
    async with opened(SqliteStore(path, create=False)) as store:
        assert await store.journal("a") == [start("a")]
    with closing(raw(path)) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


def future_layout(tmp_path: Path, migration: str) -> type[SqliteStore]:
    """A SqliteStore of a library one layout version ahead: one more migration (text given) after the released ones."""
    folder = tmp_path / "sql_v2"
    shutil.copytree(SQL, folder)
    (folder / "migrations" / NEXT_MIGRATION).write_text(migration)

    class FutureStore(SqliteStore):
        _layout = load_layout(folder, SCHEMA_VERSION + 1)

    return FutureStore


NEXT_MIGRATION = f"{SCHEMA_VERSION + 1:04d}_case_notes.sql"
TAGS = "ALTER TABLE cases ADD COLUMN notes TEXT;\nCREATE INDEX cases_by_notes ON cases (notes);\n"


async def test_an_owner_migrates_an_older_file_and_keeps_its_cases(tmp_path: Path) -> None:
    """A file of the current layout opened by a library one layout ahead: its migration runs, cases intact."""
    path = tmp_path / "s.db"
    async with opened(SqliteStore(path)) as store:
        await store.write(first_write("a"))
    future = future_layout(tmp_path, TAGS)
    async with opened(future(path)) as store:
        assert [r["seq"] for r in await store.journal("a")] == [0]
    with closing(raw(path)) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION + 1
        assert "notes" in [col[1] for col in conn.execute("PRAGMA table_info(cases)")]
        migrated = layout_of(conn)
    fresh = tmp_path / "fresh.db"
    async with opened(future(fresh)):
        pass
    with closing(raw(fresh)) as conn:
        assert layout_of(conn) == migrated  # a new file runs the chain 1 -> 2 too


async def test_a_non_owner_does_not_migrate(tmp_path: Path) -> None:
    """open(owner=False) on an older file raises StoreError: only an owner migrates; the file stays as it was."""
    path = tmp_path / "s.db"
    async with opened(SqliteStore(path)):
        pass
    with pytest.raises(StoreError, match="only an owner migrates"):
        await future_layout(tmp_path, TAGS)(path).open(owner=False, owner_id="cli")
    with closing(raw(path)) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


async def test_a_failing_migration_leaves_the_file_at_its_version(tmp_path: Path) -> None:
    """A migration that fails raises StoreError naming its file; the file keeps its version and opens as before."""
    path = tmp_path / "s.db"
    async with opened(SqliteStore(path)) as store:
        await store.write(first_write("a"))
    broken = future_layout(tmp_path, "ALTER TABLE cases ADD COLUMN notes TEXT;\nALTER TABLE nowhere ADD COLUMN x;\n")
    failed = rf"{SCHEMA_VERSION + 1:04d}_case_notes\.sql.*no such table: nowhere"
    with pytest.raises(StoreError, match=failed) as caught:
        await broken(path).open(owner=True, owner_id="future")
    assert isinstance(caught.value.__cause__, sqlite3.OperationalError)
    with closing(raw(path)) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert "notes" not in [col[1] for col in conn.execute("PRAGMA table_info(cases)")]
    async with opened(SqliteStore(path)) as store:
        assert await store.journal("a") == [start("a")]


def test_migrations_must_be_numbered_without_gaps(tmp_path: Path) -> None:
    """A migrations folder with a gap (one number skipped after the last) is refused when the layout is loaded."""
    folder = tmp_path / "sql"
    shutil.copytree(SQL, folder)
    after = SCHEMA_VERSION + 2
    (folder / "migrations" / f"{after:04d}_later.sql").write_text("SELECT 1;\n")
    numbers = ", ".join(str(n) for n in [*range(1, SCHEMA_VERSION + 1), after])
    with pytest.raises(ValueError, match=rf"numbered \[{numbers}\]: expected 1\.\.{after}"):
        load_layout(folder, after)


# -- the queries file --------------------------------------------------------------------------------------------


def test_every_query_compiles_against_the_schema() -> None:
    """Each named query in queries.sql is one statement that SQLite compiles against the migrated layout."""
    with closing(raw(":memory:")) as conn:
        for migration in LAYOUT.migrations.values():
            for statement in migration.statements:
                conn.execute(statement)
        for name, sql in QUERIES.items():
            params = dict.fromkeys(re.findall(r":([a-z_]+)", sql))
            conn.execute("EXPLAIN " + sql, params).fetchall()  # compiles, does not run
            assert split_statements(sql) == [sql], name


def test_every_query_is_used_and_no_value_is_spliced_into_sql() -> None:
    """Every named query is used; no query holds a literal value; only the header PRAGMAs are formatted in code."""
    source = "\n".join(p.read_text() for p in SQL.parent.parent.glob("*.py"))
    composed = ("pragma_synchronous_",)
    unused = [name for name in QUERIES if f'"{name}"' not in source and not name.startswith(composed)]
    assert unused == []
    literals = {lit for sql in QUERIES.values() for lit in re.findall(r"'[^']*'", sql)}
    # the kind a case ends with, the kind of a compaction's record (it keeps the request ids it replaced), and the
    # states of a queue item: part of a rule, not a value (a partial index on a state is used only by a query that
    # names that state as a literal), and '' in coalesce(part, ''), the partition key of the items without one (an
    # expression index is used only by a query that spells its expression as written), and the JSON path of a row's
    # parent step (where to look, not a value looked for)
    assert literals == {"'end'", "'snapshot'", "'queued'", "'started'", "'ended'", "'cancelled'", "'deleted'", "''",
                        "'$.parent_step'"}
    formatted = re.findall(r'execute\(f"([^"]*)"', source)
    assert formatted == [
        "PRAGMA application_id = {int(APPLICATION_ID)}",
        "PRAGMA user_version = {int(target)}",
    ]


def test_a_bad_queries_file_is_refused() -> None:
    """queries.sql parsing refuses a query with two statements and a name defined twice."""
    with pytest.raises(ValueError, match="exactly one SQL statement"):
        parse_queries("-- name: two\nSELECT 1; SELECT 2;\n")
    with pytest.raises(ValueError, match="defined twice"):
        parse_queries("-- name: a\nSELECT 1;\n-- name: a\nSELECT 2;\n")


# -- group commit and threads ------------------------------------------------------------------------------------


@contextmanager
def write_lock_held(path: str) -> Iterator[sqlite3.Connection]:
    """Another connection holds the file's write lock: the writer thread waits in BEGIN IMMEDIATE meanwhile."""
    with closing(raw(path)) as conn:
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield conn
        finally:
            if conn.in_transaction:
                conn.execute("ROLLBACK")


async def until(condition: Callable[[], bool]) -> None:
    """Wait for a condition another thread makes true (polled: there is nothing to await on)."""
    with anyio.fail_after(10):
        while not condition():  # noqa: ASYNC110
            await anyio.sleep(0.001)


async def plug(store: SqliteStore) -> None:
    """Queue one write and wait until the writer thread has taken it (and is blocked in BEGIN on it)."""
    assert store._writer is not None
    taken = store._writer.jobs
    await store.write(first_write("plug"), wait=False)
    await until(lambda: store._writer is not None and store._writer.jobs == taken + 1)


async def test_writes_queued_during_a_commit_go_into_one_transaction(tmp_path: Path) -> None:
    """100 writes that arrive while a commit is under way are committed together, in one transaction."""
    store = SqliteStore(tmp_path / "s.db")
    async with opened(store):
        writer = store._writer
        assert writer is not None
        await store.write(first_write("warm"))
        groups = writer.groups
        with write_lock_held(store.path) as lock:
            await plug(store)
            async with anyio.create_task_group() as tg:
                for i in range(100):
                    tg.start_soon(store.write, first_write(f"c{i}"))
                await until(lambda: writer.queued() == 100)
                lock.execute("ROLLBACK")
        assert writer.groups - groups == 2  # the plug's group, then all 100 together
        assert len(await store.cases(Listing(limit=1000))) == 102


@pytest.mark.parametrize("one_statement", [True, False], ids=["json_each", "executemany"])
async def test_a_refused_write_in_a_group_fails_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, one_statement: bool
) -> None:
    """A second `end` breaks the batched group: it is redone one write at a time, and that write alone fails."""
    if not one_statement:  # an SQLite before 3.38: one executemany per table
        monkeypatch.setattr(sqlite_module, "JSON_EACH", False)
        monkeypatch.setattr(sqlite_module, "JSON_ROWS", False)
    store = SqliteStore(tmp_path / "s.db")
    outcomes: dict[str, Any] = {}

    async def attempt(name: str, change: CaseWrite) -> None:
        try:
            outcomes[name] = await store.write(change)
        except StoreError as exc:
            outcomes[name] = exc

    async with opened(store):
        writer = store._writer
        assert writer is not None
        await store.write(CaseWrite("ended", records=[start("ended"), end(1)], row=row("ended", "done")))
        groups = writer.groups
        with write_lock_held(store.path) as lock:
            await plug(store)
            async with anyio.create_task_group() as tg:
                tg.start_soon(attempt, "before", first_write("before"))
                tg.start_soon(attempt, "bad", CaseWrite("ended", records=[signal(2), end(3)],
                                                        row=row("ended", "failed", last_seq=3)))
                tg.start_soon(attempt, "after", first_write("after"))
                await until(lambda: writer.queued() == 3)
                lock.execute("ROLLBACK")
        assert writer.groups - groups == 2 and writer.redone == 1
        assert outcomes["before"] == [True] and outcomes["after"] == [True]
        assert isinstance(outcomes["bad"], StoreError) and "already has its `end`" in str(outcomes["bad"])
        assert isinstance(outcomes["bad"].__cause__, sqlite3.IntegrityError)
        assert [r["seq"] for r in await store.journal("ended")] == [0, 1]
        ended = await store.row("ended")
        assert ended is not None and ended.state == "done"


@pytest.mark.parametrize("one_statement", [True, False], ids=["json_each", "executemany"])
async def test_a_group_of_good_writes_commits_in_one_batched_pass(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, one_statement: bool
) -> None:
    """Writes that break no rule commit together without being redone; records and rows keep their order."""
    if not one_statement:  # an SQLite before 3.38: one executemany per table
        monkeypatch.setattr(sqlite_module, "JSON_EACH", False)
        monkeypatch.setattr(sqlite_module, "JSON_ROWS", False)
    store = SqliteStore(tmp_path / "s.db")
    async with opened(store):
        writer = store._writer
        assert writer is not None
        await store.write(first_write("a"))
        with write_lock_held(store.path) as lock:
            await plug(store)
            async with anyio.create_task_group() as tg:
                tg.start_soon(store.write, CaseWrite("a", records=[signal(1), signal(2)], row=row("a", last_seq=2)))
                await until(lambda: writer.queued() == 1)
                tg.start_soon(store.write, CaseWrite("a", records=[signal(3)], row=row("a", "done", last_seq=3)))
                await until(lambda: writer.queued() == 2)
                tg.start_soon(store.write, first_write("b"))
                await until(lambda: writer.queued() == 3)
                lock.execute("ROLLBACK")
        assert writer.redone == 0
        assert [r["seq"] for r in await store.journal("a")] == [0, 1, 2, 3]
        a = await store.row("a")
        assert a is not None and (a.state, a.last_seq) == ("done", 3)
        assert [r.case_id for r in await store.cases(Listing())] == ["b", "plug", "a"]


@pytest.mark.parametrize("one_statement", [True, False], ids=["json_each", "executemany"])
async def test_a_retried_request_in_a_group_is_skipped_and_the_others_appended(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, one_statement: bool
) -> None:
    """A retried request_id sends its batched group back one write at a time: it is skipped, the others appended."""
    if not one_statement:  # an SQLite before 3.38: one executemany per table
        monkeypatch.setattr(sqlite_module, "JSON_EACH", False)
        monkeypatch.setattr(sqlite_module, "JSON_ROWS", False)
    store = SqliteStore(tmp_path / "s.db")
    outcomes: dict[str, Any] = {}

    async def attempt(name: str, change: CaseWrite) -> None:
        outcomes[name] = await store.write(change)

    async with opened(store):
        writer = store._writer
        assert writer is not None
        await store.write(CaseWrite("a", records=[start("a"), signal(1, request_id="r1")], row=row("a", last_seq=1)))
        with write_lock_held(store.path) as lock:
            await plug(store)
            async with anyio.create_task_group() as tg:
                tg.start_soon(attempt, "retry", CaseWrite("a", records=[signal(2, request_id="r1")]))
                await until(lambda: writer.queued() == 1)
                tg.start_soon(attempt, "fresh", CaseWrite("a", records=[signal(2, request_id="r2")]))
                await until(lambda: writer.queued() == 2)
                tg.start_soon(attempt, "other", first_write("b"))
                await until(lambda: writer.queued() == 3)
                lock.execute("ROLLBACK")
        assert writer.redone == 1
        assert outcomes == {"retry": [False], "fresh": [True], "other": [True]}
        assert [r.get("request_id") for r in await store.journal("a")] == [None, "r1", "r2"]


async def test_rows_written_in_one_statement_keep_every_float_exactly(tmp_path: Path) -> None:
    """A group's rows go through JSON in one statement: their times come back as the very same doubles."""
    import random

    rng = random.Random(7)
    times = [rng.uniform(0, 2e9) for _ in range(200)]
    times += [rng.random() * 10.0 ** rng.randint(-300, 300) for _ in range(200)]
    times += [0.0, -0.0, 5e-324, 1.7976931348623157e308, 0.1, 1e16, 1 / 3]
    store = SqliteStore(tmp_path / "s.db")
    async with opened(store):
        async with anyio.create_task_group() as tg:
            for i, t in enumerate(times):
                tg.start_soon(store.write, first_write(f"c{i}", started_at=t, next_due=-t, ended_at=t / 3))
        for i, t in enumerate(times):
            found = await store.row(f"c{i}")
            assert found is not None
            assert (found.started_at, found.updated_at, found.next_due, found.ended_at) == (t, t, -t, t / 3), i


async def test_jobs_that_are_not_case_writes_keep_their_place_in_a_batched_group(tmp_path: Path) -> None:
    """An inbox input queued between case writes is applied between them: a prune queued after an `end` sees it."""
    store = SqliteStore(tmp_path / "s.db")
    async with opened(store):
        writer = store._writer
        assert writer is not None
        await store.write(first_write("a"))
        with write_lock_held(store.path) as lock:
            await plug(store)
            async with anyio.create_task_group() as tg:
                tg.start_soon(store.write, CaseWrite("a", records=[end(1)], row=row("a", "done", last_seq=1,
                                                                                    ended_at=5.0)))
                await until(lambda: writer.queued() == 1)
                tg.start_soon(store.prune, 10.0)
                await until(lambda: writer.queued() == 2)
                tg.start_soon(store.write, first_write("b"))
                await until(lambda: writer.queued() == 3)
                lock.execute("ROLLBACK")
        assert writer.redone == 0
        assert await store.journal("a") == [] and await store.row("b") is not None


async def test_a_failed_transaction_fails_every_write_of_its_group_and_keeps_none(tmp_path: Path) -> None:
    """An error of the transaction itself (an I/O error mid-group) rolls all back; each waiter gets StoreError."""
    store = SqliteStore(tmp_path / "s.db")
    outcomes: dict[str, Any] = {}

    def failing_disk(conn: sqlite3.Connection) -> None:
        conn.execute(QUERIES["inbox_put"], {"case_id": "x", "kind": "signal", "body": "{}", "request_id": None,
                                            "created_at": 1.0})
        raise sqlite3.OperationalError("disk I/O error")

    async def attempt(name: str, change: CaseWrite | None) -> None:
        try:
            if change is None:
                assert store._writer is not None
                job = Job(failing_disk, "a failing job", wait=True)
                store._writer.submit(job)
                outcomes[name] = await job.outcome()
            else:
                outcomes[name] = await store.write(change)
        except StoreError as exc:
            outcomes[name] = exc

    async with opened(store):
        writer = store._writer
        assert writer is not None
        with write_lock_held(store.path) as lock:
            await plug(store)
            async with anyio.create_task_group() as tg:
                tg.start_soon(attempt, "a", CaseWrite("a", records=[start("a"), signal(1)], row=row("a")))
                await until(lambda: writer.queued() == 1)
                tg.start_soon(attempt, "boom", None)
                await until(lambda: writer.queued() == 2)
                tg.start_soon(attempt, "b", first_write("b"))
                await until(lambda: writer.queued() == 3)
                lock.execute("ROLLBACK")
        assert set(outcomes) == {"a", "boom", "b"}
        for name, outcome in outcomes.items():
            assert isinstance(outcome, StoreError), name
            assert isinstance(outcome.__cause__, sqlite3.OperationalError)
            assert "(one transaction with 2 other writes) failed" in str(outcome) and store.path in str(outcome)
        assert await store.journal("a") == [] and await store.row("b") is None
        assert await store.inbox_take() == []
        assert await store.write(first_write("c")) == [True]  # the writer goes on
        assert [r.case_id for r in await store.cases(Listing())] == ["c", "plug"]


async def test_writes_run_in_one_dedicated_thread_and_reads_in_worker_threads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every write is applied in the one writer thread, every read in a worker thread; none on the loop's thread."""
    writers: set[threading.Thread] = set()
    readers: set[threading.Thread] = set()
    apply_write, apply_writes = sqlite_module._apply_write, sqlite_module._apply_writes

    def spy_write(*args: Any) -> Any:
        writers.add(threading.current_thread())
        return apply_write(*args)

    def spy_writes(*args: Any) -> Any:
        writers.add(threading.current_thread())
        return apply_writes(*args)

    monkeypatch.setattr(sqlite_module, "_apply_write", spy_write)
    monkeypatch.setattr(sqlite_module, "_apply_writes", spy_writes)
    store = SqliteStore(tmp_path / "s.db")
    read_sync = store._read_sync

    def spy_read(*args: Any) -> Any:
        readers.add(threading.current_thread())
        return read_sync(*args)

    monkeypatch.setattr(store, "_read_sync", spy_read)
    async with opened(store):
        async with anyio.create_task_group() as tg:
            for i in range(50):
                tg.start_soon(store.write, first_write(f"c{i}"))
        async with anyio.create_task_group() as tg:
            for i in range(20):
                tg.start_soon(store.load, f"c{i}")
    loop_thread = threading.current_thread()
    assert len(writers) == 1 and next(iter(writers)).name.startswith("wfsub-store-writer")
    assert readers and loop_thread not in readers | writers


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_waiters_are_woken_through_from_thread_run_sync_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, backend: str
) -> None:
    """On the pre-4.16 anyio path (the loop's own thread-safe call) 200 concurrent writers are all woken."""
    monkeypatch.setattr(group_module, "WAKE_WITHOUT_WAITING", False)

    async def main() -> None:
        async with opened(SqliteStore(tmp_path / "s.db")) as store:
            async with anyio.create_task_group() as tg:
                for i in range(200):
                    tg.start_soon(store.write, first_write(f"c{i}"))
            assert len(await store.cases(Listing(limit=1000))) == 200

    anyio.run(main, backend=backend)


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_a_wake_up_runs_prompt_waiters_then_tells_the_writer_then_runs_the_others(backend: str) -> None:
    """The writer hears once per wake-up that the loop has turned, after the prompt waiters (order: asyncio only)."""
    async def main() -> None:
        order: list[str] = []

        async def waiter(name: str, job: Job) -> None:
            await job.outcome()
            order.append(name)

        def turned(group: int) -> None:
            order.append(f"turned {group}")

        for early_waiting in (True, False):  # without an early waiter, a callback after the woken tasks tells
            order.clear()
            prompt = [Job(lambda conn: None, f"p{i}", wait=True) for i in range(2)]
            early = [Job(lambda conn: None, f"e{i}", wait=True) for i in range(2 if early_waiting else 0)]
            async with anyio.create_task_group() as tg:
                for job in prompt + early:
                    tg.start_soon(waiter, job.label, job)
                await anyio.wait_all_tasks_blocked()
                group_module._wake(prompt, early, turned, 7)
            assert order.count("turned 7") == 1 and len(order) == 5 - 2 * (not early_waiting)
            if backend == "asyncio":
                assert order[:2] == ["p0", "p1"] and order[2] == "turned 7"

    anyio.run(main, backend=backend)


async def test_a_cancelled_waiter_still_lets_the_writer_hear_of_the_turn() -> None:
    """A waiter chosen to tell the writer tells it even when cancelled; one cancelled before is passed over."""
    told: list[int] = []
    prompt = [Job(lambda conn: None, "p", wait=True)]
    early = [Job(lambda conn: None, f"e{i}", wait=True) for i in range(3)]
    async with anyio.create_task_group() as tg:
        scopes = []
        for job in prompt + early:
            scope = anyio.CancelScope()
            scopes.append(scope)

            async def wait(job: Job = job, scope: anyio.CancelScope = scope) -> None:
                with scope:
                    await job.outcome()

            tg.start_soon(wait)
        await anyio.wait_all_tasks_blocked()
        scopes[1].cancel()  # e0: gone before the wake-up
        await anyio.wait_all_tasks_blocked()
        assert not early[0].waiting
        group_module._wake(prompt, early, told.append, 3)
        assert early[1].then is not None  # e1 tells
        scopes[2].cancel()  # ... and is cancelled before it runs
    assert told == [3]


async def test_a_loop_that_never_turns_holds_the_writer_back_no_longer_than_linger(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When the woken loop never says it has turned, the writer waits LINGER and goes on with the next group."""
    wake = group_module._wake
    monkeypatch.setattr(group_module, "_wake", lambda prompt, early, turned, group: wake(prompt, early, None, group))
    monkeypatch.setattr(writer_module, "LINGER", 0.05)
    store = SqliteStore(tmp_path / "s.db")
    async with opened(store):
        writer = store._writer
        assert writer is not None
        lingered = []
        linger = writer._linger

        def timed() -> None:
            start = time.monotonic()
            linger()
            lingered.append(time.monotonic() - start)

        monkeypatch.setattr(writer, "_linger", timed)
        with write_lock_held(store.path) as lock:
            async with anyio.create_task_group() as tg:
                tg.start_soon(store.write, first_write("prompt"))
                await until(lambda: writer.jobs == 1)  # taken; the writer waits in BEGIN
                await store.write(first_write("queued"), wait=False)
                lock.execute("ROLLBACK")
        await until(lambda: len(lingered) == 1)
        await store.write(first_write("after"))  # committed after (or with) the queued one
        assert 0.04 <= lingered[0] < 1.0, lingered
        assert {r.case_id for r in await store.cases(Listing())} == {"prompt", "queued", "after"}


async def test_nothing_queued_at_a_wake_up_means_no_lingering(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One write at a time: the writer never lingers (the next write wakes it), so a lone writer pays nothing."""
    store = SqliteStore(tmp_path / "s.db")
    async with opened(store):
        writer = store._writer
        assert writer is not None
        lingered = []
        monkeypatch.setattr(writer, "_linger", lambda: lingered.append(1))
        for i in range(20):
            await store.write(first_write(f"c{i}"))
        assert lingered == [] and writer.groups == 20


async def test_close_commits_the_writes_still_queued(tmp_path: Path) -> None:
    """Writes queued with wait=False just before close() are in the file when it is opened again."""
    path = tmp_path / "s.db"
    async with opened(SqliteStore(path)) as store:
        for i in range(200):
            await store.write(first_write(f"c{i}"), wait=False)
    async with opened(SqliteStore(path)) as store:
        assert len(await store.cases(Listing(limit=1000))) == 200


# -- changed(), ownership rows -----------------------------------------------------------------------------------


async def test_changed_sees_a_commit_by_another_connection_and_holds_no_transaction(tmp_path: Path) -> None:
    """changed() turns true when another connection commits (here a bare sqlite3 one) and leaves no read open."""
    store = SqliteStore(tmp_path / "s.db")
    async with opened(store):
        store.changed()
        assert store.changed() is False
        with closing(raw(store.path)) as other:
            other.execute("INSERT INTO inbox (case_id, kind, body, created_at) VALUES ('a', 'signal', '{}', 1)")
        assert store.changed() is True
        assert store._watch is not None and not store._watch.in_transaction


async def test_each_owner_records_itself_with_a_new_epoch(tmp_path: Path) -> None:
    """The owner row names the owner id, pid and host; each new owner gets the next epoch."""
    path = tmp_path / "s.db"
    for epoch, owner_id in ((1, "first"), (2, "second")):
        async with opened(SqliteStore(path), owner_id=owner_id) as store:
            assert isinstance(store, SqliteStore) and store.owner_epoch == epoch
        with closing(raw(path)) as conn:
            found = conn.execute("SELECT owner_id, pid, epoch FROM owner").fetchone()
        assert found == (owner_id, os.getpid(), epoch)
    async with opened(SqliteStore(path), owner=False) as store:
        assert isinstance(store, SqliteStore) and store.owner_epoch is None


async def test_a_non_owner_sees_the_owner_through_its_lock(tmp_path: Path) -> None:
    """owner() from another store object is the live owner while its lock is held, and None once it is released."""
    path = tmp_path / "s.db"
    async with opened(SqliteStore(path), owner_id="main") as owning, opened(SqliteStore(path), owner=False) as other:
        found = await other.owner()
        assert found is not None and (found.owner_id, found.pid) == ("main", os.getpid())
        assert await owning.owner() == found
    async with opened(SqliteStore(path), owner=False) as other:
        assert await other.owner() is None


async def test_create_false_refuses_a_missing_or_empty_file_and_creates_nothing(tmp_path: Path) -> None:
    """SqliteStore(create=False) (the wfsub command) opens only an existing wfsub store; it never makes one."""
    missing = tmp_path / "missing.db"
    with pytest.raises(StoreError, match="no store file here"):
        await SqliteStore(missing, create=False).open(owner=False, owner_id="cli")
    assert not missing.exists()
    empty = tmp_path / "empty.db"
    empty.write_bytes(b"")
    with pytest.raises(StoreError, match="empty, not a wfsub store"):
        await SqliteStore(empty, create=False).open(owner=False, owner_id="cli")
    assert empty.read_bytes() == b""
    async with opened(SqliteStore(tmp_path / "s.db")):
        pass
    async with opened(SqliteStore(tmp_path / "s.db", create=False), owner=False) as store:
        assert await store.cases(Listing()) == []


async def test_the_owner_heartbeat_is_refreshed_while_idle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An idle owner's writer thread refreshes the owner row's heartbeat every HEARTBEAT_EVERY seconds."""
    monkeypatch.setattr(sqlite_module, "HEARTBEAT_EVERY", 0.02)
    store = SqliteStore(tmp_path / "s.db")

    def beats() -> tuple[float, float]:
        with closing(raw(store.path)) as conn:
            since, heartbeat = conn.execute("SELECT since, heartbeat FROM owner").fetchone()
        return since, heartbeat

    async with opened(store):
        await until(lambda: beats()[1] > beats()[0])


# -- index reads -------------------------------------------------------------------------------------------------


def vm_steps(conn: sqlite3.Connection, sql: str, params: dict[str, Any]) -> int:
    """SQLite virtual-machine steps (in hundreds) a query takes: a measure of the work, not of the time."""
    steps = [0]

    def count() -> int:
        steps[0] += 1
        return 0

    conn.set_progress_handler(count, 100)
    conn.execute(sql, params).fetchall()
    conn.set_progress_handler(None, 0)
    return steps[0]


async def test_a_page_of_cases_is_an_index_read_among_30000(tmp_path: Path) -> None:
    """Among 30,000 cases, listings plan as index searches and a page of 100 costs under 2% of a table scan."""
    path = tmp_path / "s.db"
    async with opened(SqliteStore(path)):
        pass
    states = ["running", "done", "waiting_timer", "waiting_signal", "failed"]
    with closing(raw(path)) as conn:
        conn.execute("BEGIN")
        conn.executemany(QUERIES["case_put"], (
            encode_row("t", CaseRow(f"case-{i:06d}", f"wf{i % 7}", "fp", states[i % 5], 1.0, 1.0,
                                    next_due=float(i) if i % 5 == 2 else None)).params
            for i in range(30_000)
        ))
        conn.execute("COMMIT")
        params = {"before": 2**63 - 1, "limit": 100, "state": "done", "workflow": "wf3", "until": 1e9,
                  "after_due": 10.0, "after_order": 3, "after": 10.0}
        listings = [Listing(), Listing(state="done"), Listing(workflow="wf3"), Listing(state="done", workflow="wf3")]
        planned = [listing.sqlite() for listing in listings]
        planned += [(QUERIES[name], params) for name in ("cases_due", "cases_next_due")]
        for sql, bound in planned:
            plan = " | ".join(step[3] for step in conn.execute("EXPLAIN QUERY PLAN " + sql, bound))
            assert plan.startswith("SEARCH cases USING"), (sql, plan)
            assert "TEMP B-TREE" not in plan, (sql, plan)
        sql, bound = Listing(tags={"customer": "c-17"}).sqlite()  # driven by the tag index: only its cases are read
        plan = " | ".join(step[3] for step in conn.execute("EXPLAIN QUERY PLAN " + sql, bound))
        assert "SEARCH case_tags USING COVERING INDEX case_tags_by_value" in plan, plan
        scan = vm_steps(conn, "SELECT count(*) FROM cases WHERE detail LIKE '%never%'", {})
        page = vm_steps(conn, *Listing(limit=100).sqlite())
        deep_page = vm_steps(conn, *Listing(state="done", limit=100, before=500).sqlite())
        assert page * 50 < scan and deep_page * 50 < scan, (page, deep_page, scan)


async def test_a_sqlite_owner_claims_the_cases_queued_for_it(tmp_path: Path) -> None:
    """A case queued on SQLite (by a process that does not own the file) is claimed once, by its version's owner."""
    path = tmp_path / "q.db"
    async with opened(SqliteStore(path), owner=False) as outside:
        await outside.queue_case(first_write("a"))
        assert await outside.claim_queued(["fp-1"], 10) == []  # only the owner claims
        with pytest.raises(StoreConflict):
            await outside.queue_case(first_write("a"))
    async with opened(SqliteStore(path)) as owner:
        assert await owner.live() == []  # queued: not resumed by recovery until claimed
        assert await owner.claim_queued(["another-version"], 10) == []
        assert await owner.claim_queued(["fp-1"], 10) == ["a"]
        assert await owner.claim_queued(["fp-1"], 10) == []
        assert [row.case_id for row in await owner.live()] == ["a"]

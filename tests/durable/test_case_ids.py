"""Case ids and request ids are checked in one place (`check_case_id`, `request_id`), at every door: the API on each
store, a Client, the command, a `start_case` step, a schedule, a queue's keys. What every store can index is
taken (up to `MAX_CASE_ID_BYTES` of incompressible UTF-8, beside a request id of `MAX_REQUEST_ID_BYTES`); what
some store cannot hold is refused before anything is written, with a message naming the id and the fix."""

from __future__ import annotations

import hashlib
import socket
import sqlite3
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio
import pytest
from click.testing import CliRunner

import wfsub
from wfsub import CaseFailed, StoreError, Substrate, scope, seq, signal_case, start_case, task, wait
from wfsub._errors import StoreConflict
from wfsub._runtime._inputs import (
    MAX_CASE_ID_BYTES,
    MAX_REQUEST_ID_BYTES,
    derived_request_id,
    request_id,
)
from wfsub._store import refused_for_good
from wfsub.cli import main
from wfsub.lowlevel import check_case_id
from wfsub.stores import MemoryStore

from ..stores import _pg
from ..stores._helpers import STORE_PARAMS, make_store, twin

BOUND = 30.0  # seconds: a bound against a hang, never a latency requirement


def _noise(n: int) -> str:
    """`n` ASCII characters that do not compress (a store may compress an index entry that repeats itself)."""
    text = "".join(hashlib.sha256(str(i).encode()).hexdigest() for i in range(n // 64 + 1))
    return text[:n]


FLOWS = {
    "wait": seq(wait("go", into="go")),
    "kid": task(lambda c: {"kid": True}),
}


@pytest.fixture(params=STORE_PARAMS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    return make_store(str(request.param), tmp_path)


async def _waiting(sub: Substrate, case_id: str) -> None:
    with anyio.fail_after(BOUND):
        while sub.status(case_id).state != "waiting_signal":  # noqa: ASYNC110 - a state, not a time
            await anyio.sleep(0.005)


# -- the check itself ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "words"),
    [
        ("a\x00b", "holds a NUL character at index 1"),
        ("a\tb", "holds a tab at index 1"),
        ("line\nbreak", "holds a line break at index 4"),
        ("del\x7f", "holds a control character (U+007F) at index 3"),
        ("c1\x85", "holds a control character (U+0085) at index 2"),
        ("half\ud800", "holds half of a surrogate pair (U+D800: not valid Unicode) at index 4"),
        ("", "is empty or has leading or trailing spaces"),
        (" x", "is empty or has leading or trailing spaces"),
        ("x" * (MAX_CASE_ID_BYTES + 1), f"is 1,001 bytes of UTF-8 ('{'x' * 60}'... (1,001 characters)), more than"),
        ("é" * 501, "is 1,002 bytes of UTF-8"),
    ],
)
def test_a_new_case_id_is_refused_naming_what_is_wrong(given: str, words: str) -> None:
    """A new case id with a control character, a lone surrogate, no visible text or too many bytes is a ValueError
    naming the id (shortened), what is wrong and the fix."""
    with pytest.raises(ValueError, match="case_id") as info:
        check_case_id(given)
    said = str(info.value)
    assert words in said, said
    assert "or omit it to get a fresh one" in said and len(said) < 600


def test_a_new_case_id_every_store_can_index_is_taken() -> None:
    """Visible ids up to the byte bound are taken as given: spaces inside, any script, emoji, punctuation."""
    for ok in ("order-42", "a b", "über/straße@2026-01-01T00:00:00Z", "🦆" * 250, "x" * MAX_CASE_ID_BYTES):
        assert check_case_id(ok) == ok
    with pytest.raises(TypeError, match="case_id must be a str, got int 7"):
        check_case_id(7)


def test_an_id_to_look_up_is_refused_only_when_no_store_could_hold_it() -> None:
    """Looking a case up refuses a NUL or a lone surrogate (no store keeps either), not what older versions
    accepted for a new id (a tab, a long id): such a case can still be found."""
    assert check_case_id("a\tb", new=False) == "a\tb"
    assert check_case_id("x" * 5000, new=False) == "x" * 5000
    for bad in ("a\x00b", "\udfff"):
        with pytest.raises(ValueError, match="no store keeps it, so no case has this id"):
            check_case_id(bad, new=False)


def test_request_ids_are_bounded_and_derived_ones_kept_within_the_bound() -> None:
    """A request id with a NUL or over MAX_REQUEST_ID_BYTES is refused naming it; one wfsub derives from long case
    ids is replaced by a digest of itself (the same every time), a short one kept as it is."""
    assert request_id("r" * MAX_REQUEST_ID_BYTES) == "r" * MAX_REQUEST_ID_BYTES
    with pytest.raises(ValueError, match="request_id holds a NUL character at index 1"):
        request_id("r\x00", "c1")
    with pytest.raises(ValueError, match="request_id is 1,501 bytes of UTF-8"):
        request_id("r" * (MAX_REQUEST_ID_BYTES + 1), "c1")
    short = "p:3:seq[0].signal_case"
    assert derived_request_id(short) == short
    long = f"{'p' * 1000}:ended:cancel:{'c' * 1000}"
    digest = derived_request_id(long)
    assert digest == derived_request_id(long) and digest.startswith("sha256:") and len(digest) == 71
    assert digest != derived_request_id(long + "x")


# -- the API, on every store -----------------------------------------------------------------------------------


async def test_every_api_door_refuses_an_id_no_store_can_hold(store: Any) -> None:
    """new_case, fork, handle, status, signal, update, cancel and journal refuse a NUL in the case id, and new_case
    and fork an id over the bound, before the store sees them; nothing is written."""
    async with Substrate(store=store, workflows=FLOWS) as sub:
        for bad, words in (("a\x00b", "NUL character"), ("x" * 1001, "1,001 bytes")):
            with pytest.raises(ValueError, match=words):
                await sub.new_case("wait", {}, case_id=bad)
        await sub.new_case("wait", {}, case_id="c")
        await _waiting(sub, "c")
        for bad, words in (("n\x00", "fork of case 'c': new_case_id holds a NUL"), ("n\tx", "holds a tab"),
                           ("n" * 1001, "1,001 bytes")):
            with pytest.raises(ValueError, match=words):
                await sub.fork("c", at=0, new_case_id=bad)
        with pytest.raises(ValueError, match="NUL"):
            sub.handle("c\x00")
        with pytest.raises(ValueError, match="NUL"):
            sub.status("c\x00")
        with pytest.raises(ValueError, match="NUL"):
            await sub.signal("c\x00", "go")
        with pytest.raises(ValueError, match="NUL"):
            await sub.update("c\x00", "go")
        with pytest.raises(ValueError, match="NUL"):
            await sub.cancel("c\x00")
        with pytest.raises(ValueError, match="NUL"):
            await sub.journal("c\x00")
        with pytest.raises(ValueError, match="parent holds a NUL"):
            sub.cases(parent="c\x00")
        for bad_rid, words in (("r\x00", "request_id holds a NUL"), ("r" * 1501, "request_id is 1,501 bytes")):
            with pytest.raises(ValueError, match=words):
                await sub.signal("c", "go", request_id=bad_rid)
            with pytest.raises(ValueError, match=words):
                await sub.cancel("c", request_id=bad_rid)
        assert [s.case_id for s in sub.cases()] == ["c"]
        assert sub.status("c").state == "waiting_signal"


async def test_the_longest_ids_round_trip_on_every_store(store: Any) -> None:
    """A case id of MAX_CASE_ID_BYTES incompressible bytes starts, forks, takes a signal with a request id of
    MAX_REQUEST_ID_BYTES (indexed together), is found and read back on every store; a child's default id under
    a long parent id is found by `cases(parent=)`."""
    long_id, long_rid = _noise(MAX_CASE_ID_BYTES), _noise(MAX_REQUEST_ID_BYTES)
    flows = {**FLOWS, "parent": seq(start_case("kid", into="kid"), wait("go", into="go"))}
    async with Substrate(store=store, workflows=flows) as sub:
        await sub.new_case("wait", {}, case_id=long_id)
        await _waiting(sub, long_id)
        await sub.signal(long_id, "go", 1, request_id=long_rid)
        await sub.signal(long_id, "go", 1, request_id=long_rid)  # applied once
        assert await sub.await_case(long_id, timeout=BOUND) == {"go": 1}
        forked_id = long_id[:-1] + "f"
        await sub.fork(long_id, at=0, new_case_id=forked_id)
        await _waiting(sub, forked_id)
        assert sub.status(forked_id).forked_from == long_id
        parent_id = long_id[: MAX_CASE_ID_BYTES - len("/seq[0].start_case")]
        await sub.new_case("parent", {}, case_id=parent_id)
        await _waiting(sub, parent_id)
        assert [s.case_id for s in sub.cases(parent=parent_id)] == [f"{parent_id}/seq[0].start_case"]


async def test_a_signal_case_from_the_longest_parent_id_applies_once(store: Any) -> None:
    """signal_case's request id ({case id}:{effect id}:{path}) from a parent whose id is as long as may be is
    within the bound, and the signal applies once."""
    long_id = _noise(MAX_CASE_ID_BYTES)
    flows = {**FLOWS, "sender": signal_case("go", case_id=lambda c: "target", payload=lambda c: 7)}
    async with Substrate(store=store, workflows=flows) as sub:
        await sub.new_case("wait", {}, case_id="target")
        await _waiting(sub, "target")
        await (await sub.new_case("sender", {}, case_id=long_id)).result(timeout=BOUND)
        assert await sub.await_case("target", timeout=BOUND) == {"go": 7}


# -- a Client ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", [k for k in STORE_PARAMS if k != "memory"])
async def test_a_client_refuses_the_same_ids_the_substrate_does(kind: str, tmp_path: Path) -> None:
    """A Client's new_case, fork, signal, handle and status refuse what Substrate refuses, with the same words."""
    store = make_store(kind, tmp_path)
    async with Substrate(store=store, workflows=FLOWS) as sub:
        await sub.new_case("wait", {}, case_id="c")
        await _waiting(sub, "c")
        async with wfsub.Client(twin(store)) as client:
            for bad, words in (("a\x00b", "case_id holds a NUL character"), ("a\tb", "case_id holds a tab"),
                               ("x" * 1001, "case_id is 1,001 bytes")):
                with pytest.raises(ValueError, match=words):
                    await client.new_case("wait", {}, case_id=bad)
            with pytest.raises(ValueError, match="new_case_id holds a NUL"):
                await client.fork("c", at=0, new_case_id="n\x00")
            with pytest.raises(ValueError, match="request_id is 1,501 bytes"):
                await client.signal("c", "go", request_id="r" * 1501)
            with pytest.raises(ValueError, match="NUL"):
                await client.handle("c\x00")
            with pytest.raises(ValueError, match="NUL"):
                await client.status("c\x00")
            with pytest.raises(TypeError, match="case_id must be a str"):
                await client.signal(5, "go")  # type: ignore[arg-type]
            await client.signal("c", "go", 2, request_id="r" * 1500)
        assert await sub.await_case("c", timeout=BOUND) == {"go": 2}
        assert [s.case_id for s in sub.cases()] == ["c"]


# -- the command ------------------------------------------------------------------------------------------------


async def _one_waiting(db: Path) -> None:
    async with Substrate(store=db, workflows=FLOWS) as sub:
        await sub.new_case("wait", {}, case_id="c")
        await _waiting(sub, "c")


def test_the_command_refuses_bad_ids_as_usage_errors(tmp_path: Path) -> None:
    """`wfsub fork --id`, a CASE_ID, `cases --parent` and `signal`/`update --request-id` refuse what the API refuses
    (exit 2, the same words), before the store is opened for writing."""
    db = tmp_path / "cases.db"
    anyio.run(_one_waiting, db)

    def run(*args: str) -> tuple[int, str]:
        result = CliRunner().invoke(main, [*args], env={"COLUMNS": "300"})
        return result.exit_code, result.output

    code, said = run("fork", str(db), "c", "--at", "0", "--id", "new\tid")
    assert code == 2 and "the new case id (--id) holds a tab at index 3" in said, said
    code, said = run("fork", str(db), "c", "--at", "0", "--id", "n" * 1001)
    assert code == 2 and "is 1,001 bytes of UTF-8" in said, said
    code, said = run("show", str(db), "c\x00")
    assert code == 2 and "holds a NUL character" in said, said
    code, said = run("cases", str(db), "--parent", "p\x00")
    assert code == 2 and "--parent holds a NUL character" in said, said
    for command in ("signal", "update"):
        code, said = run(command, str(db), "c", "go", "--request-id", "r" * 1501)
        assert code == 2 and "request_id is 1,501 bytes" in said, (command, said)
    code, said = run("show", str(db), "c")
    assert code == 0 and "waiting_signal" in said, said


# -- start_case children ----------------------------------------------------------------------------------------


def _kid_id(ctx: Mapping[str, Any]) -> str:
    return str(ctx["kid_id"])


async def test_a_child_id_no_case_may_have_fails_the_step_and_on_error_catches_it(tmp_path: Path) -> None:
    """start_case whose case_id= gives an id with a tab or over the bound fails the parent's step at once (not
    retried) naming the parent, the node path and the child id; scope(on_error=) catches it; nothing is started."""
    flows = {
        "kid": FLOWS["kid"],
        "parent": start_case("kid", case_id=_kid_id),
        "careful": scope("s", start_case("kid", case_id=_kid_id), on_error=task(lambda c: {"caught": True})),
    }
    for store in (MemoryStore(), tmp_path / "s.db"):
        async with Substrate(store=store, workflows=flows) as sub:
            handle = await sub.new_case("parent", {"kid_id": "k\tid"}, case_id="p1")
            with pytest.raises(CaseFailed) as info:
                await handle.result(timeout=BOUND)
            said = str(info.value)
            assert "start_case('kid') at start_case of case 'p1': the child's case id holds a tab at index 1" in said
            assert "make case_id(ctx) return an id a case may have" in said
            assert sub.status("p1").state == "failed"
            careful = await sub.new_case("careful", {"kid_id": "k" * 1001}, case_id="p2")
            data = await careful.result(timeout=BOUND)
            assert data["caught"] is True and "is 1,001 bytes of UTF-8" in data["error"]["message"]
            assert [s.case_id for s in sub.cases()] == ["p2", "p1"]


async def test_a_default_child_id_over_the_bound_says_to_give_case_id() -> None:
    """A parent whose id leaves no room for its child's default id ({parent}/{path}) fails the step saying to pass
    case_id= (a parent id at the bound itself is fine)."""
    flows = {"kid": FLOWS["kid"], "parent": start_case("kid")}
    async with Substrate(workflows=flows) as sub:
        handle = await sub.new_case("parent", {}, case_id="p" * MAX_CASE_ID_BYTES)
        with pytest.raises(CaseFailed, match="give the step case_id=fn returning a shorter id"):
            await handle.result(timeout=BOUND)


@pytest.mark.parametrize("kind", STORE_PARAMS)
async def test_a_child_start_with_data_no_store_keeps_fails_the_step_not_retried(kind: str, tmp_path: Path) -> None:
    """A child start whose data holds a NUL in a string (which Postgres's JSON cannot store, so no store keeps it)
    fails the parent's step with the reason, naming the parent and the step, instead of being retried;
    scope(on_error=) catches it."""
    nul = {"note": "a\x00b"}
    flows = {
        "kid": FLOWS["kid"],
        "parent": start_case("kid", data=lambda c: nul),
        "careful": scope("s", start_case("kid", data=lambda c: nul), on_error=task(lambda c: {"caught": True})),
    }
    async with Substrate(store=make_store(kind, tmp_path), workflows=flows) as sub:
        handle = await sub.new_case("parent", {}, case_id="p1")
        with pytest.raises(CaseFailed) as info:
            await handle.result(timeout=BOUND)
        said = str(info.value)
        assert "NUL character" in said and "start_case('kid')" in said, said
        careful = await sub.new_case("careful", {}, case_id="p2")
        assert (await careful.result(timeout=BOUND))["caught"] is True
        assert sorted(s.case_id for s in sub.cases()) == ["p1", "p2"]


@pytest.mark.skipif(not _pg.ENABLED, reason=_pg.SKIP_REASON)
async def test_store_errors_refused_for_good_are_told_from_outages(tmp_path: Path) -> None:
    """What a child start retries: a store error caused by what the request holds (Postgres SQLSTATE classes 22,
    23, 54; SQLite's integrity errors) is refused for good, an unreachable server or a busy file is not, and a
    StoreConflict (fenced, a seq taken) never is."""
    import asyncpg

    def wrapped(cause: BaseException) -> StoreError:
        error = StoreError("test", "what the store said")
        error.__cause__ = cause
        return error

    conn = await asyncpg.connect(_pg.database_dsn())
    try:
        with pytest.raises(asyncpg.PostgresError) as bad_json:
            await conn.fetchval("SELECT $1::jsonb", '{"a": "\\u0000"}')
    finally:
        await conn.close()
    assert refused_for_good(wrapped(bad_json.value))
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    with pytest.raises(OSError) as refused:
        await asyncpg.connect(f"postgresql://postgres@127.0.0.1:{port}/x", timeout=2)
    assert not refused_for_good(wrapped(refused.value))
    db = sqlite3.connect(tmp_path / "t.db")
    db.execute("CREATE TABLE t (k TEXT PRIMARY KEY)")
    db.execute("INSERT INTO t VALUES ('a')")
    with pytest.raises(sqlite3.IntegrityError) as twice:
        db.execute("INSERT INTO t VALUES ('a')")
    db.close()
    assert refused_for_good(wrapped(twice.value))
    assert not refused_for_good(wrapped(sqlite3.OperationalError("database is locked")))
    conflict = StoreConflict("test", "fenced")
    conflict.__cause__ = twice.value
    assert not refused_for_good(conflict)


# -- schedules and queues ---------------------------------------------------------------------------------------


def test_a_schedule_name_that_makes_no_case_id_is_refused() -> None:
    """A schedule's name becomes its cases' ids ('{name}@{slot}'): one with a control character is refused."""
    with pytest.raises(ValueError, match=r"Schedule\('a\\tb'\): the id of each case it starts .* holds a tab"):
        wfsub.Schedule("a\tb", "wait", every=60)


async def test_queue_keys_the_store_cannot_index_are_refused() -> None:
    """A dedup or partition key with a NUL, or over MAX_CASE_ID_BYTES, is refused by new_case naming it."""
    async with Substrate(workflows=FLOWS, queues={"q": wfsub.Queue(concurrency=1)}) as sub:
        with pytest.raises(ValueError, match="new_case: dedup holds a NUL character"):
            await sub.new_case("wait", {}, queue="q", dedup="d\x00")
        with pytest.raises(ValueError, match="new_case: partition is 1,001 bytes"):
            await sub.new_case("wait", {}, queue="q", partition="p" * 1001)
        assert sub.cases() == []

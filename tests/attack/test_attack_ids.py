"""Attacks on case ids and request ids: ids at the byte bound in multibyte characters, the ids wfsub composes
(children of children, forks), every door agreeing (API, Client, command, inspector) on new ids and on lookups,
listing by id prefix, and a `start_case` child whose start meets a Postgres outage, loses its commit answer, or
both, with a restart in between."""

from __future__ import annotations

import logging
import random
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import anyio
import pytest
from click.testing import CliRunner

import wfsub
from wfsub import Client, Substrate, seq, start_case, task, wait
from wfsub._runtime import _loader
from wfsub.cli import main as cli_main
from wfsub.lowlevel import check_case_id
from wfsub.stores import MemoryStore, PostgresStore, SqliteStore

from ..contrib.test_web import token
from ..stores import _pg
from ..stores._helpers import make_store
from ..stores._proxy import PROXY_CONNECT, Proxy

BOUND = 30.0  # seconds: a bound against a hang, never a latency requirement
needs_pg = pytest.mark.skipif(not _pg.ENABLED, reason=_pg.SKIP_REASON)
STORES = ["memory", "sqlite", pytest.param("postgres", marks=needs_pg)]


def _multibyte(n_bytes: int, width: int, seed: int = 7) -> str:
    """Exactly `n_bytes` of UTF-8 in distinct characters of `width` bytes each (3: CJK, 4: beyond the BMP), padded
    with ASCII: text no store compresses, at the bound in bytes while far below it in characters."""
    rng = random.Random(seed)
    low, high = (0x4E00, 0x9FFF) if width == 3 else (0x20000, 0x2A6DF)
    chars = [chr(rng.randint(low, high)) for _ in range(n_bytes // width)]
    text = "".join(chars) + "x" * (n_bytes % width)
    assert len(text.encode("utf-8")) == n_bytes
    return text


async def until(predicate: Callable[[], Any]) -> None:
    """Wait on a state the runtime reaches on its own, bounded against hangs."""
    with anyio.fail_after(BOUND):
        while not predicate():  # noqa: ASYNC110 - a state, not a time
            await anyio.sleep(0.005)


FLOWS = {
    "wait": seq(wait("go", into="go")),
    "kid": task(lambda c: {"kid": True}),
}


# -- ids at the bound, in multibyte characters -----------------------------------------------------------------------


@pytest.mark.parametrize("kind", STORES)
@pytest.mark.parametrize("width", [3, 4])
async def test_multibyte_ids_at_the_bound_round_trip(kind: str, width: int, tmp_path: Path) -> None:
    """A case id of exactly MAX_CASE_ID_BYTES in 3- or 4-byte characters starts, takes a signal and a cancel with
    request ids of exactly MAX_REQUEST_ID_BYTES in the same script, forks to another such id, and is listed."""
    case_id = _multibyte(1000, width)
    fork_id = _multibyte(1000, width, seed=8)
    rid = _multibyte(1500, width, seed=9)
    async with Substrate(store=make_store(kind, tmp_path), workflows=FLOWS) as sub:
        await sub.new_case("wait", {}, case_id=case_id)
        await until(lambda: sub.status(case_id).signals == ("go",))
        await sub.fork(case_id, at=0, new_case_id=fork_id)
        await until(lambda: sub.status(fork_id).signals == ("go",))
        await sub.signal(case_id, "go", 1, request_id=rid)
        await sub.signal(case_id, "go", 1, request_id=rid)
        assert await sub.await_case(case_id, timeout=BOUND) == {"go": 1}
        await sub.cancel(fork_id, request_id=rid)
        await until(lambda: sub.status(fork_id).state == "cancelled")
        assert sorted(s.case_id for s in sub.cases()) == sorted([case_id, fork_id])
        with pytest.raises(ValueError, match="1,001 bytes"):
            await sub.new_case("wait", {}, case_id=case_id + "x")


# -- a child's start meeting Postgres trouble ----------------------------------------------------------------------

BIG = 20_000  # bytes of a child's start data: its start write is the only request this large


class _Retried(logging.Handler):
    """Counts the runtime's "store trouble; trying again" warnings (the step met a StoreError and will retry)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.seen: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if text.startswith("store trouble; trying again"):
            self.seen.append(text)


@pytest.fixture
def retried() -> Any:
    handler = _Retried()
    log = logging.getLogger("wfsub.runtime")
    log.addHandler(handler)
    try:
        yield handler
    finally:
        log.removeHandler(handler)


def _child_flows(data: Callable[[Mapping[str, Any]], Any]) -> dict[str, Any]:
    return {
        "kid": task(lambda c: {"kid": True}),
        "parent": seq(wait("go"), start_case("kid", data=data, into="kid"), task(lambda c: {"after": True})),
    }


def _big(ctx: Mapping[str, Any]) -> dict[str, Any]:
    return {"blob": "b" * BIG}


async def _one_child(sub: Substrate, parent: str) -> None:
    """The parent ended with its child's result, and its one child ran once (one start, one end)."""
    data = await sub.await_case(parent, timeout=BOUND)
    assert data["kid"]["kid"] is True and data["after"] is True
    kids = [s.case_id for s in sub.cases(parent=parent)]
    assert kids == [f"{parent}/seq[1].start_case"], kids
    kinds = [r.kind for r in await sub.journal(kids[0])]
    assert kinds.count("start") == 1 and kinds.count("end") == 1, kinds


@needs_pg
async def test_a_child_start_whose_commit_answer_is_lost_starts_it_once() -> None:
    """The answer to the commit of a child's start is lost (the connection reset after Postgres ran it): the step
    goes on with the child it wrote, which runs once, and the parent ends with its result."""
    proxy = Proxy(_pg.database_dsn())
    schema = _pg.new_schema()
    try:
        store = PostgresStore(proxy.dsn, schema=schema, retry_for=5, connect_timeout=PROXY_CONNECT)
        async with Substrate(store=store, workflows=_child_flows(_big), node_id="n1") as sub:
            await sub.new_case("parent", {}, case_id="p")
            await until(lambda: sub.status("p").signals == ("go",))
            proxy.drop_answers(1, after=BIG)
            await sub.signal("p", "go")
            await _one_child(sub, "p")
            assert proxy.dropped == 1
    finally:
        proxy.down()


class _DownAfterDrop(Proxy):
    """A proxy that, having swallowed an answer, goes down: the store cannot ask Postgres how the write went, so
    the writer reports CommitUnknown to the runtime."""

    def _take_drop(self, server: Any) -> bool:
        taken = super()._take_drop(server)
        if taken:
            import threading

            threading.Thread(target=self.down, daemon=True).start()
        return taken


@needs_pg
async def test_a_child_start_whose_commit_is_unknown_is_retried_and_starts_it_once(
    retried: _Retried, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A child's start whose commit answer is lost while Postgres cannot be reached (CommitUnknown: an outage, not
    a refusal) is retried, not failed; once Postgres is back the step finds the child it wrote, and the child is
    brought back into memory and run then, not left owned and idle until the periodic sweep of live cases."""
    monkeypatch.setattr(_loader, "SWEEP_EVERY", 3600.0)  # (30 s by default: the sweep alone would mask the fault)
    proxy = _DownAfterDrop(_pg.database_dsn())
    schema = _pg.new_schema()
    try:
        store = PostgresStore(proxy.dsn, schema=schema, retry_for=0.3, connect_timeout=PROXY_CONNECT)
        async with Substrate(store=store, workflows=_child_flows(_big), node_id="n1") as sub:
            await sub.new_case("parent", {}, case_id="p")
            await until(lambda: sub.status("p").signals == ("go",))
            proxy.drop_answers(1, after=BIG)
            await sub.signal("p", "go")
            await until(lambda: any("the start of child" in s for s in retried.seen))
            proxy.up()
            await _one_child(sub, "p")
            assert proxy.dropped == 1
    finally:
        proxy.down()


@needs_pg
async def test_a_child_start_during_an_outage_is_retried_not_failed(retried: _Retried) -> None:
    """Postgres becomes unreachable just as a child is about to be started: the step is retried (not failed as a
    refusal), and once Postgres is back the child runs once and the parent ends with its result."""
    proxy = Proxy(_pg.database_dsn())
    schema = _pg.new_schema()

    def cut(ctx: Mapping[str, Any]) -> dict[str, Any]:
        proxy.down()
        return {"small": 1}

    try:
        store = PostgresStore(proxy.dsn, schema=schema, retry_for=0.3, connect_timeout=PROXY_CONNECT)
        async with Substrate(store=store, workflows=_child_flows(cut), node_id="n1") as sub:
            await sub.new_case("parent", {}, case_id="p")
            await until(lambda: sub.status("p").signals == ("go",))
            await sub.signal("p", "go")
            await until(lambda: any("the start of child" in s for s in retried.seen))
            proxy.up()
            await _one_child(sub, "p")
    finally:
        proxy.down()


@needs_pg
async def test_a_child_start_cut_off_then_a_restart_starts_the_child_once(retried: _Retried) -> None:
    """Postgres is cut off while a child's start is being retried and the Substrate is closed meanwhile: a new
    Substrate on the same store (reached directly) recovers the parent, whose step starts the child once."""
    proxy = Proxy(_pg.database_dsn())
    schema = _pg.new_schema()

    def cut(ctx: Mapping[str, Any]) -> dict[str, Any]:
        proxy.down()
        return {"small": 1}

    try:
        store = PostgresStore(proxy.dsn, schema=schema, retry_for=0.3, connect_timeout=PROXY_CONNECT)
        async with Substrate(store=store, workflows=_child_flows(cut), node_id="n1") as sub:
            await sub.new_case("parent", {}, case_id="p")
            await until(lambda: sub.status("p").signals == ("go",))
            await sub.signal("p", "go")
            await until(lambda: any("the start of child" in s for s in retried.seen))
        direct = PostgresStore(_pg.database_dsn(), schema=schema)
        async with Substrate(store=direct, workflows=_child_flows(_big), node_id="n1") as sub:
            await _one_child(sub, "p")
    finally:
        proxy.down()


# -- ids wfsub composes ----------------------------------------------------------------------------------------------

SUFFIX = "/start_case/start_case"  # a grandchild's default id: {top}/{path in top}/{path in the child}


def _nested() -> dict[str, Any]:
    return {
        "kid": task(lambda c: {"kid": True}),
        "mid": start_case("kid", into="kid"),
        "top": start_case("mid", into="mid"),
    }


@pytest.mark.parametrize("kind", STORES)
async def test_a_grandchild_s_default_id_at_the_bound_starts_and_one_past_it_fails_each_level(
    kind: str, tmp_path: Path
) -> None:
    """A grandchild's default id ({top}/{path}/{path}) of exactly MAX_CASE_ID_BYTES in 4-byte characters is
    started and listed under its parent; one byte more fails the middle case's step naming the child id, and the
    top case fails with the middle case's failure."""
    top = _multibyte(1000 - len(SUFFIX), 4)
    async with Substrate(store=make_store(kind, tmp_path), workflows=_nested()) as sub:
        data = await (await sub.new_case("top", {}, case_id=top)).result(timeout=BOUND)
        assert data["mid"]["kid"]["kid"] is True
        grandchild = top + SUFFIX
        assert len(grandchild.encode()) == 1000
        assert [s.case_id for s in sub.cases(parent=top + "/start_case")] == [grandchild]
        longer = _multibyte(1000 - len(SUFFIX) + 1, 4)
        with pytest.raises(wfsub.CaseFailed) as info:
            await (await sub.new_case("top", {}, case_id=longer)).result(timeout=BOUND)
        said = str(info.value)
        assert "failed" in said
        mid = sub.status(longer + "/start_case")
        assert mid.state == "failed" and mid.error is not None
        assert "the child's case id is 1,001 bytes of UTF-8" in mid.error, mid.error
        assert sub.cases(parent=longer + "/start_case") == []


# -- every door agreeing ---------------------------------------------------------------------------------------------


async def test_every_door_takes_an_id_at_the_bound_and_refuses_one_byte_more(tmp_path: Path) -> None:
    """An id of exactly MAX_CASE_ID_BYTES in 3-byte characters is taken as a new id by the API, a Client, the
    command (fork --id) and the web inspector (fork form); one byte more is refused by each, with the same words."""
    import httpx

    from wfsub.contrib import web

    db = tmp_path / "s.db"
    at = [_multibyte(1000, 3, seed=s) for s in range(4)]
    over = _multibyte(1001, 3)
    words = "is 1,001 bytes of UTF-8"
    async with Substrate(store=db, workflows=FLOWS) as sub:
        await sub.new_case("wait", {}, case_id="c")
        await until(lambda: sub.status("c").signals == ("go",))
        with pytest.raises(ValueError, match=words):
            await sub.fork("c", at=0, new_case_id=over)
        await sub.fork("c", at=0, new_case_id=at[0])
        async with Client(str(db)) as client:
            with pytest.raises(ValueError, match=words):
                await client.fork("c", at=0, new_case_id=over)
            with pytest.raises(ValueError, match=words):
                await client.new_case("wait", {}, case_id=over)
            await client.new_case("wait", {}, case_id=at[1])
        asgi = web.app(sub, workflows=FLOWS)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=asgi), base_url="http://i") as http:
            csrf = await token(http)
            page = await http.post("/case/c", data={"csrf": csrf, "action": "fork", "at": "0", "new_case_id": over})
            assert page.status_code == 400 and words in page.text, page.text[:500]
            page = await http.post("/case/c", data={"csrf": csrf, "action": "fork", "at": "0",
                                                    "new_case_id": at[2]})
            assert page.status_code in (200, 303), page.text[:500]
            page = await http.get(f"/case/{at[2]}")
            assert page.status_code == 200 and "waiting_signal" in page.text
        runner = CliRunner()
        done = await anyio.to_thread.run_sync(
            lambda: runner.invoke(cli_main, ["fork", str(db), "c", "--at", "0", "--id", over]))
        assert done.exit_code == 2 and words in done.output, done.output
        done = await anyio.to_thread.run_sync(
            lambda: runner.invoke(cli_main, ["fork", str(db), "c", "--at", "0", "--id", at[3]]))
        assert done.exit_code == 0, done.output
        for made in at:
            await until(lambda made=made: sub.status(made).signals == ("go",))
        assert check_case_id(at[3]) == at[3]


@pytest.mark.parametrize("kind", STORES)
async def test_listing_by_id_prefix_finds_ids_holding_the_highest_code_point(kind: str, tmp_path: Path) -> None:
    """cases(id_prefix=) finds every id that starts with the prefix on every store, the command's --id-prefix too,
    including ids whose next character is U+10FFFF (a visible-enough id every door takes): SQLite bounded the
    range by prefix + U+10FFFF and missed them."""
    ids = ["a\U0010ffffb", "a\U0010ffff", "ab", "\U0010ffff", "\U0010ffff\U0010ffffz", "b"]
    store = make_store(kind, tmp_path)
    async with Substrate(store=store, workflows=FLOWS) as sub:
        for case_id in ids:
            await sub.new_case("wait", {}, case_id=case_id)
        assert sorted(s.case_id for s in sub.cases(id_prefix="a")) == sorted(ids[:3])
        assert sorted(s.case_id for s in sub.cases(id_prefix="a\U0010ffff")) == sorted(ids[:2])
        assert sorted(s.case_id for s in sub.cases(id_prefix="\U0010ffff")) == sorted(ids[3:5])
        assert sorted(s.case_id for s in sub.cases(id_prefix="\U0010ffff\U0010ffff")) == [ids[4]]
    if kind == "sqlite":
        done = await anyio.to_thread.run_sync(lambda: CliRunner().invoke(
            cli_main, ["cases", str(tmp_path / "cases.db"), "--id-prefix", "a", "--json"]))
        assert done.exit_code == 0 and done.output.count('"case_id"') == 3, done.output


async def test_a_default_child_id_holding_a_control_character_says_which_name_not_to_shorten() -> None:
    """A start_case under a defer branch whose signal name holds a tab makes a default child id with that tab: the
    step fails saying a name in the node path holds what no case id may and to give case_id= a visible id, not
    to return "a shorter id" (the id is short)."""
    flows = {"kid": FLOWS["kid"], "p": wfsub.defer({"go\tnow": start_case("kid")})}
    async with Substrate(workflows=flows) as sub:
        handle = await sub.new_case("p", {}, case_id="p")
        await until(lambda: sub.status("p").signals == ("go\tnow",))
        await sub.signal("p", "go\tnow")
        with pytest.raises(wfsub.CaseFailed) as info:
            await handle.result(timeout=BOUND)
        said = str(info.value)
        assert "the child's case id holds a tab at index 10" in said, said
        assert "returning a visible id (a name in the node path" in said and "shorter" not in said, said
        assert sub.cases(parent="p") == []


@pytest.mark.parametrize("kind", ["sqlite", pytest.param("postgres", marks=needs_pg)])
async def test_looking_up_an_id_longer_than_any_case_has_is_not_found_at_every_door(kind: str, tmp_path: Path) -> None:
    """An id to look up may be of any length (only a NUL or a lone surrogate is refused): one of 9,000 characters
    is CaseNotFound from the Substrate and a Client (signal, update, cancel, status: nothing reaches an index that
    could not hold it), a 404 from the inspector and exit 1 from the command, the error showing the id shortened
    rather than echoing it whole."""
    import httpx

    from wfsub.contrib import web

    long = "z" * 9000
    store = make_store(kind, tmp_path)
    async with Substrate(store=store, workflows=FLOWS) as sub:
        await sub.new_case("wait", {}, case_id="c")
        calls: list[Callable[[], Any]] = [
            lambda: sub.signal(long, "go"), lambda: sub.cancel(long), lambda: sub.update(long, "go")]
        async with Client(make_store(kind, tmp_path) if kind == "sqlite" else PostgresStore(
                store.dsn, schema=store.schema)) as client:
            calls += [lambda: client.signal(long, "go"), lambda: client.cancel(long), lambda: client.status(long),
                      lambda: client.update(long, "go", timeout=1)]
            for call in calls:
                with pytest.raises(wfsub.CaseNotFound) as info:
                    await call()
                assert "(9,000 characters)" in str(info.value) and len(str(info.value)) < 400, str(info.value)
        with pytest.raises(wfsub.CaseNotFound, match=r"\(9,000 characters\)"):
            sub.status(long)
        asgi = web.app(sub, workflows=FLOWS)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=asgi), base_url="http://i") as http:
            page = await http.get(f"/case/{long}")
            assert page.status_code == 404 and "(9,000 characters)" in page.text  # (the page names its address)
    if kind == "sqlite":
        done = await anyio.to_thread.run_sync(
            lambda: CliRunner().invoke(cli_main, ["show", str(tmp_path / "cases.db"), long], env={"COLUMNS": "300"}))
        assert done.exit_code == 1 and "(9,000 characters)" in done.output and long not in done.output, done.output


@needs_pg
async def test_a_signal_payload_holding_a_nul_is_refused_on_postgres(tmp_path: Path) -> None:
    """A signal whose payload holds a NUL character in a string is refused at the door, naming it, and nothing is
    applied (Postgres's JSON cannot store it: taken, it broke every later write of that case)."""
    schema = _pg.new_schema()
    flows = {"w": seq(wait("go", into="go"))}
    async with Substrate(store=PostgresStore(_pg.database_dsn(), schema=schema), workflows=flows) as sub:
        await sub.new_case("w", {}, case_id="t")
        await until(lambda: sub.status("t").signals == ("go",))
        with pytest.raises(TypeError, match=r"NUL character \(U\+0000\)"):
            await sub.signal("t", "go", {"note": "a\x00b"})
        assert sub.status("t").signals == ("go",)
        await sub.signal("t", "go", {"note": "ab"})
        await sub.await_case("t", timeout=BOUND)
    async with Client(PostgresStore(_pg.database_dsn(), schema=schema)) as client:
        assert (await client.status("t")).state == "done"


@pytest.mark.parametrize(
    ("given", "words"),
    [
        ("\u200b", "has no visible character"),  # a zero-width space alone: a blank cell in every listing
        ("\u2060\u0301", "has no visible character"),
        ("order\u2028two", "holds a line separator (U+2028, a line break) at index 5"),
        ("a\u2029b", "holds a paragraph separator (U+2029, a line break) at index 1"),
    ],
)
async def test_a_new_id_that_shows_nothing_or_breaks_a_line_is_refused_at_every_door(
    given: str, words: str, tmp_path: Path
) -> None:
    """A new case id of only invisible characters, or with Unicode's line or paragraph separator (a line break as
    a tab or \\n is), is refused by the API, a Client and the command, with the same words; ids using such
    characters among visible ones (an emoji sequence joined by U+200D, a combining accent) are taken."""
    db = tmp_path / "s.db"
    async with Substrate(store=db, workflows=FLOWS) as sub:
        with pytest.raises(ValueError, match=re.escape(words)):
            await sub.new_case("wait", {}, case_id=given)
        for fine in ("👨\u200d👩\u200d👧", "e\u0301", "a\u200bb"):
            await sub.new_case("wait", {}, case_id=fine)
        async with Client(str(db)) as client:
            with pytest.raises(ValueError, match=re.escape(words)):
                await client.new_case("wait", {}, case_id=given)
        done = await anyio.to_thread.run_sync(lambda: CliRunner().invoke(
            cli_main, ["fork", str(db), "e\u0301", "--at", "0", "--id", given], env={"COLUMNS": "300"}))
        assert done.exit_code == 2 and words in done.output, done.output
        assert len(sub.cases()) == 3


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
async def test_a_nul_in_case_data_is_refused_alike_on_every_store(kind: str, tmp_path: Path) -> None:
    """Start data holding a NUL is refused at new_case, and a task whose output holds one fails its case naming
    the NUL, on the stores that could keep it too (a case keeps only what every store keeps)."""
    store = MemoryStore() if kind == "memory" else SqliteStore(tmp_path / "c.db")
    flows = {"w": seq(task(lambda c: {"note": "a\x00b"}, name="nul"))}
    async with Substrate(store=store, workflows=flows) as sub:
        with pytest.raises(TypeError, match=r"NUL character \(U\+0000\) at index 1"):
            await sub.new_case("w", {"given": "x\x00"}, case_id="refused")
        with pytest.raises(wfsub.CaseFailed, match="NUL character"):
            await sub.await_case((await sub.new_case("w", {}, case_id="t")).case_id, timeout=BOUND)

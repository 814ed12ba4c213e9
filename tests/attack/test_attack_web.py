"""Attacks on the web inspector through httpx's ASGI transport: hostile addresses and forms, CSRF, read only, the
escaping of case data, each action's refusals, and the store going away under it (a Postgres server cut behind a
proxy, a SQLite file locked by another process): every answer is a clear message, never a 500 with a traceback."""

from __future__ import annotations

import re
import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

pytest.importorskip("starlette", reason="the web extra (starlette) is not installed")
pytest.importorskip("jinja2", reason="the web extra (jinja2) is not installed")

import wfsub
from wfsub import Substrate, loop, seq, task, wait
from wfsub.contrib import web
from wfsub.stores import MemoryStore, PostgresStore

from ..contrib.test_web import csrf_cookie, message, token, unescape
from ..stores import _pg
from ..stores._proxy import PROXY_CONNECT, Proxy

FLOWS = {
    "greet": seq(wait("go"), task(lambda c: {"greeted": True}, name="greet")),
    "echo": loop(wait("ask", into="asked", reply=lambda c: {"echo": c["asked"]}), until=lambda c: False),
}


async def _waiting(sub: Substrate, case_id: str) -> None:
    with anyio.fail_after(10):
        while sub.status(case_id).state != "waiting_signal":  # noqa: ASYNC110 - waiting on a state
            await anyio.sleep(0.005)


@asynccontextmanager
async def inspector(store: Any = None, **options: Any) -> AsyncIterator[tuple[Substrate, httpx.AsyncClient]]:
    async with Substrate(store=store if store is not None else MemoryStore(), workflows=FLOWS) as sub:
        await sub.new_case("greet", {"note": "<script>data</script>"}, case_id="c-1",
                           tags={"<script>k": "<script>v"})
        await _waiting(sub, "c-1")
        asgi = web.app(sub, workflows=FLOWS, **options)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=asgi), base_url="http://i") as client:
            yield sub, client


def _no_traceback(page: httpx.Response) -> None:
    assert page.status_code != 500 and "Traceback" not in page.text, page.text[:2000]


# -- hostile addresses -----------------------------------------------------------------------------------------


async def test_a_before_cursor_beyond_64_bits_is_a_400_not_a_store_overflow(tmp_path: Path) -> None:
    """?before= larger than a store's order column can hold is refused with a 400 naming it (SQLite overflowed)."""
    async with inspector(tmp_path / "s.db") as (_, client):
        page = await client.get("/", params={"before": "9" * 30})
        assert page.status_code == 400 and "before must be 1 or more and at most" in page.text
        assert (await client.get("/", params={"before": str(2**63 - 1)})).status_code == 200
        for bad in ("0", "-5", "x", "1.5", "9" * 5000):
            refused = await client.get("/", params={"before": bad})
            assert refused.status_code == 400 and "before must be" in refused.text
        refused = await client.get("/", params={"limit": "501"})
        assert refused.status_code == 400 and "limit must be 1 or more and at most 500" in refused.text


def _stores(tmp_path: Path) -> list[Any]:
    made: list[Any] = [MemoryStore(), tmp_path / "s.db"]
    if _pg.ENABLED:
        made.append(PostgresStore(_pg.database_dsn(), schema=_pg.emptied_schema()))
    return made


async def test_a_nul_character_in_a_filter_or_case_id_is_a_400_on_every_store(tmp_path: Path) -> None:
    """%00 in workflow, parent, tag or the case id is refused with a 400 naming it (Postgres raised a 500)."""
    for store in _stores(tmp_path):
        async with inspector(store) as (_, client):
            csrf = await token(client)
            for params in ({"workflow": "\x00"}, {"parent": "a\x00"}, {"tag": "a=\x00"}, {"tag": "\x00=b"}):
                page = await client.get("/", params=params)
                assert page.status_code == 400 and "NUL character" in page.text, (store, params, page.text[:500])
            page = await client.get("/case/a%00b")
            assert page.status_code == 400 and "the case id holds a NUL character" in page.text
            sent = await client.post("/case/a%00b", data={"csrf": csrf, "action": "signal", "name": "go"})
            assert sent.status_code == 400 and "NUL character" in sent.text
            events = await client.get("/events", params={"view": "case", "case": "\x00"})
            assert events.status_code == 400 and "case holds a NUL character" in events.text


async def test_odd_filter_values_are_answered_never_a_500() -> None:
    """Unknown states, empty and odd tags, a parent or workflow nobody has: 400 with a reason or an empty list."""
    async with inspector() as (_, client):
        bad = await client.get("/", params={"state": "<script>"})
        assert bad.status_code == 400 and "<script>" not in bad.text.replace("'<script>'", "")
        for params in ({"tag": "=v"}, {"tag": "novalue"}):
            page = await client.get("/", params=params)
            assert page.status_code == 400 and "tag must be key=value" in page.text
        for params in ({"tag": "k="}, {"parent": "nobody"}, {"workflow": "<b>x</b>"}, {"tag": "a=b=c"}):
            page = await client.get("/", params=params)
            assert page.status_code == 200 and "<b>x</b>" not in page.text, params
        page = await client.get("/", params={"tag": "<script>k=<script>v"})
        assert page.status_code == 200 and 'data-case="c-1"' in page.text and "<script>k" not in page.text
        bad = await client.get("/events", params={"view": "nope"})
        assert bad.status_code == 400 and "events?view=" in bad.text


# -- escaping --------------------------------------------------------------------------------------------------


async def test_script_in_ids_tags_update_answers_and_refusals_stays_text() -> None:
    """A <script> in a case id, tag, update answer or refusal reason is escaped in every page that shows it."""
    async with inspector() as (sub, client):
        await sub.new_case("echo", {}, case_id="<script>id</script>")
        await _waiting(sub, "<script>id</script>")
        csrf = await token(client)
        listing = await client.get("/")
        assert "<script>id" not in listing.text and "<script>k" not in listing.text
        page = await client.get("/case/c-1")
        assert "<script>data" not in page.text and "&lt;script&gt;data" in page.text
        assert "<script>v" not in page.text and "&lt;script&gt;v" in page.text
        answered = await client.post("/case/<script>id</script>",
                                     data={"csrf": csrf, "action": "update", "name": "ask",
                                           "payload": '"<script>answer</script>"'})
        assert answered.status_code == 200, answered.text[:1000]
        assert "<script>answer" not in answered.text and "<script>id" not in answered.text
        assert "<script>answer</script>" in unescape(message(answered))
        refused = await client.post("/case/c-1", data={"csrf": csrf, "action": "signal",
                                                       "name": "<script>sig</script>"})
        assert refused.status_code == 409 and "<script>sig" not in refused.text
        assert "<script>sig</script>" in unescape(message(refused))
        shown = await client.get("/case/c-1")
        assert "<script>sig" not in shown.text
        bad = await client.post("/case/c-1", data={"csrf": csrf, "action": "<img src=x>"})
        assert bad.status_code == 400 and "<img" not in bad.text


# -- CSRF, read only -------------------------------------------------------------------------------------------


async def test_a_token_from_another_browser_or_a_forged_cookie_is_refused() -> None:
    """A form carrying another browser's token, a cookie set to a token the app never issued, or none, is 403."""
    async with inspector() as (sub, client):
        other = httpx.AsyncClient(transport=client._transport, base_url="http://i")  # noqa: SLF001 - same app
        async with other:
            theirs = await token(other)
            await token(client)
            for form in ({"csrf": theirs}, {"csrf": ""}, {}, {"csrf": "x" * 40}):
                sent = await client.post("/case/c-1", data={"action": "signal", "name": "go", **form})
                assert sent.status_code == 403 and "CSRF token" in sent.text
            forged = "f" * 40
            client.cookies.set(csrf_cookie(client.cookies)[0], forged)
            sent = await client.post("/case/c-1", data={"csrf": "g" * 40, "action": "signal", "name": "go"})
            assert sent.status_code == 403
        assert sub.status("c-1").state == "waiting_signal"


async def test_read_only_refuses_every_action_and_takes_none() -> None:
    """read_only=True answers 403 to each of the five actions (with a valid token) and the case does not move."""
    async with inspector(read_only=True) as (sub, client):
        page = await client.get("/case/c-1")
        assert page.status_code == 200 and 'name="action"' not in page.text
        csrf = csrf_cookie(client.cookies)[1]
        assert csrf
        for form in ({"action": "signal", "name": "go"}, {"action": "update", "name": "x"},
                     {"action": "cancel"}, {"action": "retry"}, {"action": "fork", "at": "0"}):
            sent = await client.post("/case/c-1", data={"csrf": csrf, **form})
            assert sent.status_code == 403 and "read only" in sent.text, form
        assert sub.status("c-1").state == "waiting_signal"
        assert [s.case_id for s in sub.cases()] == ["c-1"]


async def test_auth_that_raises_is_refused_without_a_traceback() -> None:
    """An auth function that raises refuses the request with a 403, and never shows a traceback."""
    def auth(request: Any) -> bool:
        raise RuntimeError("<script>boom</script>")

    async with inspector(auth=auth) as (_, client):
        for url in ("/", "/case/c-1", "/events?view=cases", "/static/inspector.css"):
            page = await client.get(url)
            assert page.status_code == 403 and "Traceback" not in page.text, url
            assert page.headers["content-type"].startswith("text/plain")


# -- actions' refusals -----------------------------------------------------------------------------------------


async def test_each_action_refusal_names_what_and_how_over_a_client(tmp_path: Path) -> None:
    """Over a Client: unknown case, ended case, bad, deep and huge payloads, a huge number, a bad fork seq each
    answer 4xx with the API's message, and a huge number in a payload says it is the payload (not Python)."""
    db = tmp_path / "s.db"
    async with Substrate(store=db, workflows=FLOWS) as sub:
        await sub.new_case("greet", {}, case_id="c-1")
        await _waiting(sub, "c-1")
        async with wfsub.Client(db) as source:
            asgi = web.app(source, workflows=FLOWS)
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=asgi), base_url="http://i") as client:
                csrf = await token(client)

                async def post(case_id: str, **form: str) -> tuple[int, str]:
                    sent = await client.post(f"/case/{case_id}", data={"csrf": csrf, **form})
                    _no_traceback(sent)
                    if sent.status_code in (303, 404):
                        return sent.status_code, sent.text
                    return sent.status_code, unescape(message(sent))

                code, text = await post("c-1", action="signal", name="go", payload="{bad")
                assert code == 400 and "the payload is not JSON" in text
                code, text = await post("c-1", action="signal", name="go", payload="[" * 5000)
                assert code == 400 and "nested deeper than" in text
                code, text = await post("c-1", action="signal", name="go", payload='"' + "a" * 1_100_000 + '"')
                assert code == 400 and "max_payload_bytes" in text
                code, text = await post("c-1", action="signal", name="go", payload="9" * 5000)
                assert code == 400 and "an int of 5,000 digits" in text and "send it as a str" in text, text
                assert "set_int_max" not in text
                code, text = await post("c-1", action="fork", at="-1")
                assert code == 400 and "at must be the seq" in text
                code, text = await post("c-1", action="fork", at="lots")
                assert code == 400 and "fork needs the seq" in text
                code, text = await post("c-1", action="retry")
                assert code == 409 and "cannot be retried" in text
                code, text = await post("c-1", action="signal", name="")
                assert code == 400 and "needs a name" in text
                code, text = await post("nope", action="cancel")
                assert code == 404 and "nope" in text
                code, _ = await post("c-1", action="cancel", reason="<script>why</script>")
                assert code == 303
                with anyio.fail_after(10):
                    while not (await source.status("c-1")).ended:  # noqa: ASYNC110 - the store's row, as the Client reads
                        await anyio.sleep(0.005)
                for form in ({"action": "signal", "name": "go"}, {"action": "update", "name": "ask"},
                             {"action": "cancel", "reason": "again"}):
                    code, text = await post("c-1", **form)
                    assert code == 409 and "already ended (cancelled)" in text, (form, text)
                page = await client.get("/case/c-1")
                assert page.status_code == 200 and "<script>why" not in page.text
                big = await client.post("/case/c-1", data={"csrf": csrf, "action": "signal", "name": "go",
                                                           "payload": "x" * (3 * 1024 * 1024)})
                assert big.status_code == 413 and "larger than" in big.text


async def test_a_fork_to_a_new_id_with_a_nul_is_refused_by_the_form(tmp_path: Path) -> None:
    """The fork form refuses a new case id holding a NUL with a 400 naming it (SQLite answered 'no case' for it)."""
    async with inspector(tmp_path / "s.db") as (sub, client):
        csrf = await token(client)
        sent = await client.post("/case/c-1", data={"csrf": csrf, "action": "fork", "at": "0",
                                                    "new_case_id": "n\x00"})
        assert sent.status_code == 400 and "holds a NUL character" in unescape(message(sent))
        assert [s.case_id for s in sub.cases()] == ["c-1"]


async def test_the_fork_form_refuses_an_id_no_case_may_have_as_the_api_does(tmp_path: Path) -> None:
    """The fork form refuses a new case id with a tab or over the byte bound with a 400 in the API's words (the
    shared check), and an address with a lone surrogate is answered, never a 500; nothing is forked."""
    async with inspector(tmp_path / "s.db") as (sub, client):
        csrf = await token(client)
        for new_id, words in (("new\tid", "the new case id holds a tab at index 3"),
                              ("n" * 1001, "the new case id is 1,001 bytes of UTF-8")):
            sent = await client.post("/case/c-1", data={"csrf": csrf, "action": "fork", "at": "0",
                                                        "new_case_id": new_id})
            assert sent.status_code == 400 and words in unescape(message(sent)), message(sent)
        page = await client.get("/case/a%ED%A0%80b")  # (a lone surrogate, as the address decodes it)
        _no_traceback(page)
        assert [s.case_id for s in sub.cases()] == ["c-1"]


async def test_the_api_refuses_a_case_id_holding_a_nul_with_a_clear_message(tmp_path: Path) -> None:
    """new_case and fork refuse a case id holding a NUL with a ValueError naming it, on every store."""
    for store in _stores(tmp_path):
        async with Substrate(store=store, workflows=FLOWS) as sub:
            with pytest.raises(ValueError, match="NUL"):
                await sub.new_case("greet", {}, case_id="a\x00b")
            await sub.new_case("greet", {}, case_id="c")
            with pytest.raises(ValueError, match="NUL"):
                await sub.fork("c", at=0, new_case_id="n\x00")


# -- the store going away --------------------------------------------------------------------------------------


@pytest.mark.long
@pytest.mark.skipif(not _pg.ENABLED, reason=_pg.SKIP_REASON)
async def test_a_postgres_store_cut_away_answers_503_with_the_reason_then_recovers() -> None:
    """Over a Client whose Postgres is cut: the list, the case page and an action answer 503 or 4xx with the
    store's reason (never a 500 traceback); once the server is back the pages answer again."""
    schema = _pg.emptied_schema()
    proxy = Proxy(_pg.database_dsn())
    try:
        async with Substrate(store=PostgresStore(_pg.database_dsn(), schema=schema), workflows=FLOWS) as sub:
            await sub.new_case("greet", {}, case_id="c-1")
            await _waiting(sub, "c-1")
            store = PostgresStore(proxy.dsn, schema=schema, retry_for=0.3, connect_timeout=PROXY_CONNECT)
            async with wfsub.Client(store) as source:
                asgi = web.app(source, workflows=FLOWS)
                async with httpx.AsyncClient(transport=httpx.ASGITransport(app=asgi),
                                             base_url="http://i") as client:
                    csrf = await token(client)
                    proxy.down()
                    for url in ("/?state=failed", "/case/c-1", "/case/c-1?journal=all"):
                        page = await client.get(url)
                        assert page.status_code == 503, (url, page.text[:500])
                        assert "the store could not be read" in page.text and "could not be reached" in page.text
                    sent = await client.post("/case/c-1", data={"csrf": csrf, "action": "signal", "name": "go"})
                    assert sent.status_code in (400, 503) and "could not be reached" in sent.text
                    assert sub.status("c-1").state == "waiting_signal"  # nothing half-sent reached the case
                    proxy.up()
                    with anyio.fail_after(20):
                        while (await client.get("/case/c-1")).status_code != 200:  # noqa: ASYNC110 - a state
                            await anyio.sleep(0.05)
                    assert (await client.get("/")).status_code == 200
    finally:
        proxy.down()


@pytest.mark.skipif(not _pg.ENABLED, reason=_pg.SKIP_REASON)
async def test_a_signal_whose_commit_answer_was_lost_and_is_sent_again_is_applied_once() -> None:
    """A signal form whose commit answer is lost answers 503 and keeps its request id; sending that form again
    applies the signal once (the form carried no request id: the resend was applied twice)."""
    flows = {"count": loop(wait("add", into="last"), until=lambda c: False)}
    schema = _pg.emptied_schema()
    proxy = Proxy(_pg.database_dsn())
    try:
        async with Substrate(store=PostgresStore(_pg.database_dsn(), schema=schema), workflows=flows) as sub:
            await sub.new_case("count", {}, case_id="c-1")
            await _waiting(sub, "c-1")
            store = PostgresStore(proxy.dsn, schema=schema, retry_for=5, connect_timeout=PROXY_CONNECT)
            async with wfsub.Client(store) as source:
                asgi = web.app(source, workflows=flows)
                async with httpx.AsyncClient(transport=httpx.ASGITransport(app=asgi),
                                             base_url="http://i") as client:
                    page = await client.get("/case/c-1")

                    def form_of(page: httpx.Response) -> dict[str, str]:
                        found = re.search(r'id="signal-form">(.*?)</form>', page.text, re.S)
                        assert found
                        return dict(re.findall(r'type="hidden" name="([^"]+)" value="([^"]*)"', found.group(1)))

                    form = {**form_of(page), "name": "add", "payload": '{"n": 1}'}
                    assert form["request_id"]
                    # the reads a signal makes before its write (its id checked against the journal) prepared, so
                    # the first answer to a request of 150 bytes or more is the write's
                    await store.journaled_request("c-1", form["request_id"])
                    proxy.drop_answers(1, after=150)
                    lost = await client.post("/case/c-1", data=form)
                    assert proxy.dropped == 1
                    assert lost.status_code == 503 and "send the form again" in unescape(message(lost))
                    assert form_of(lost)["request_id"] == form["request_id"]
                    again = await client.post("/case/c-1", data={**form, **form_of(lost)})
                    assert again.status_code == 303
                    with anyio.fail_after(10):
                        while sub.data("c-1").get("last") is None:  # noqa: ASYNC110 - a state
                            await anyio.sleep(0.01)
                    fresh = await client.get("/case/c-1")
                    assert form_of(fresh)["request_id"] != form["request_id"]
                    await sub.signal("c-1", "add", {"n": 2})  # a later input: every earlier one is applied by now
                    with anyio.fail_after(10):
                        while (sub.data("c-1").get("last") or {}).get("n") != 2:  # noqa: ASYNC110 - a state
                            await anyio.sleep(0.01)
                    kinds = [r.kind for r in await sub.journal("c-1")]
                    assert kinds.count("signal") == 2, kinds
    finally:
        proxy.down()


async def test_a_sqlite_file_locked_by_another_process_still_serves_the_pages(tmp_path: Path) -> None:
    """An exclusive lock held on the SQLite file by another connection does not stop the pages (WAL reads)."""
    db = tmp_path / "s.db"
    async with Substrate(store=db, workflows=FLOWS) as sub:
        await sub.new_case("greet", {}, case_id="c-1")
        await _waiting(sub, "c-1")
    async with wfsub.Client(db) as source:
        asgi = web.app(source, workflows=FLOWS)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=asgi), base_url="http://i") as client:
            lock = sqlite3.connect(db, timeout=0)
            try:
                lock.execute("BEGIN EXCLUSIVE")
                listing = await client.get("/")
                assert listing.status_code == 200 and re.search(r'data-case="c-1"', listing.text)
                page = await client.get("/case/c-1")
                assert page.status_code == 200 and "waiting_signal" in page.text
            finally:
                lock.rollback()
                lock.close()

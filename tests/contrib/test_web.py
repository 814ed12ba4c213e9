"""The case inspector, `wfsub.contrib.web.app`, driven through httpx's ASGI transport over a live Substrate: every
page and action, the refusals, escaping, the security headers, and the live streams through the app's own ASGI
interface (httpx's transport buffers a response whole, so a stream is read message by message here)."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

pytest.importorskip("starlette", reason="the web extra (starlette) is not installed")
pytest.importorskip("jinja2", reason="the web extra (jinja2) is not installed")

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.routing import Mount

import wfsub
from wfsub import Substrate, effect, loop, saga, seq, sleep, task, wait
from wfsub.contrib import web
from wfsub.contrib.web import _app as web_app
from wfsub.stores import MemoryStore

STATIC = Path(web.__file__).parent / "static"


# -- workflows and helpers -------------------------------------------------------------------------------------


async def _pay(ctx: Mapping[str, Any]) -> Any:
    return {"paid": True}


async def _refuse(ctx: Mapping[str, Any]) -> Any:
    raise RuntimeError("card <declined> for <script>alert('e')</script>")


async def _undo(ctx: Mapping[str, Any]) -> Any:
    return {"refunded": True}


ORDER = seq(task(lambda c: {"prepared": True}, name="prepare"), effect(_pay, name="pay"), wait("approved"),
            task(lambda c: {"shipped": True}, name="ship"))
BROKEN = seq(effect(_refuse, name="charge"))
NAP = seq(sleep(3600))
SAGA = saga((effect(_pay, name="pay"), effect(_undo, name="refund")), wait("go"))
CHATTY = loop(wait("tick"), until=lambda c: False)
WORKFLOWS = {"order": ORDER, "broken": BROKEN, "nap": NAP, "saga": SAGA, "chatty": CHATTY}


@asynccontextmanager
async def inspector(**options: Any) -> AsyncIterator[tuple[Substrate, httpx.AsyncClient]]:
    """A Substrate on a MemoryStore and an httpx client of its inspector (a context manager, not a fixture:
    the Substrate's task group must open and close in the test's own task)."""
    store = options.pop("store", MemoryStore())
    async with Substrate(store=store, workflows=WORKFLOWS) as sub:
        asgi = web.app(sub, workflows=WORKFLOWS, **options)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=asgi), base_url="http://inspector") as client:
            yield sub, client


async def until(sub: Substrate, case_id: str, state: str) -> None:
    """Wait until the case is in `state` (its state, not a time, is what the test waits for)."""
    with anyio.fail_after(10):
        while sub.status(case_id).state != state:  # noqa: ASYNC110 - the public API has no state-change event
            await anyio.sleep(0.002)


async def started(sub: Substrate, workflow: str, data: Mapping[str, Any] | None = None, state: str = "") -> str:
    handle = await sub.new_case(workflow, dict(data or {}))
    if state:
        await until(sub, handle.case_id, state)
    return handle.case_id


def csrf_cookie(cookies: httpx.Cookies) -> tuple[str, str]:
    """The inspector's CSRF cookie in a browser's jar, as (its name, which is the app's own, its token); ("", "")
    when there is none."""
    found = [(c.name, c.value or "") for c in cookies.jar if c.name.startswith(web_app.CSRF_COOKIE)]
    assert len(found) <= 1, found
    return found[0] if found else ("", "")


async def token(client: httpx.AsyncClient) -> str:
    """The CSRF token the pages put in their forms (and in this browser's cookie)."""
    page = await client.get("/")
    assert page.status_code == 200
    found = csrf_cookie(client.cookies)[1]
    assert found
    return found


def message(page: httpx.Response) -> str:
    found = re.search(r'id="message"[^>]*>(.*?)</p>', page.text, re.S)
    assert found, page.text[:2000]
    return found.group(1)


def unescape(text: str) -> str:
    return text.replace("&#39;", "'").replace("&#34;", '"').replace("&lt;", "<").replace("&gt;", ">").replace(
        "&amp;", "&")


def rows(page: httpx.Response) -> list[tuple[str, str]]:
    """(case id, state) of each row of a cases page, in order."""
    return re.findall(r'<tr data-case="([^"]+)" data-state="([^"]+)">', page.text)


# -- the cases page ----------------------------------------------------------------------------------------------


async def test_cases_page_lists_cases_newest_first_with_counts_and_times() -> None:
    """The root lists every case newest first, with its workflow, state, place, wait and ISO times, and counts."""
    async with inspector() as (sub, client):
        waiting = await started(sub, "order", state="waiting_signal")
        napping = await started(sub, "nap", state="waiting_timer")
        failed = await started(sub, "broken", state="failed")
        page = await client.get("/")
        assert page.status_code == 200
        assert rows(page) == [(failed, "failed"), (napping, "waiting_timer"), (waiting, "waiting_signal")]
        row = page.text[page.text.index(f'data-case="{waiting}"'):]
        row = row[: row.index("</tr>")]
        assert f'href="/case/{waiting}"' in row and "<td>order</td>" in row
        assert "seq[2].wait" in row and "signal approved" in row
        assert re.search(r'<td class="time">\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}\+00:00</td>', row)
        nap_row = page.text[page.text.index(f'data-case="{napping}"'):]
        assert re.search(r"timer due \d{4}-\d\d-\d\dT[\d:.]+\+00:00", nap_row[: nap_row.index("</tr>")])
        counts = dict((s, n) for n, s in re.findall(r"<b>(\S+)</b> (\w+)</a>", page.text))
        assert counts == {"initializing": "0", "queued": "0", "running": "0", "waiting_effect": "0",
                          "waiting_signal": "1", "waiting_timer": "1", "suspended": "0", "done": "0", "failed": "1",
                          "cancelled": "0"}


async def test_cases_page_filters_by_state_and_workflow() -> None:
    """?state= and ?workflow= are the list API's filters; an unknown state is a 400 that names the known ones."""
    async with inspector() as (sub, client):
        first = await started(sub, "order", state="waiting_signal")
        await started(sub, "nap", state="waiting_timer")
        second = await started(sub, "order", state="waiting_signal")
        await started(sub, "broken", state="failed")
        assert rows(await client.get("/", params={"state": "waiting_signal"})) == [
            (second, "waiting_signal"), (first, "waiting_signal")]
        assert [r[0] for r in rows(await client.get("/", params={"workflow": "order"}))] == [second, first]
        assert rows(await client.get("/", params={"workflow": "nap", "state": "failed"})) == []
        refused = await client.get("/", params={"state": "sleeping"})
        assert refused.status_code == 400 and "waiting_signal" in refused.text
        assert (await client.get("/", params={"limit": "0"})).status_code == 400


async def test_cases_page_pages_by_cursor_through_every_case_once() -> None:
    """Following the 'older' link with limit=2 visits every case once, newest first (before= is the cursor)."""
    async with inspector() as (sub, client):
        ids = [await started(sub, "order", state="waiting_signal") for _ in range(5)]
        seen: list[str] = []
        url: str | None = "/?limit=2"
        while url is not None:
            page = await client.get(url)
            seen.extend(case_id for case_id, _ in rows(page))
            older = re.search(r'id="older" href="([^"]+)"', page.text)
            url = unescape(older.group(1)) if older else None
        assert seen == ids[::-1]


# -- the case page -----------------------------------------------------------------------------------------------


async def test_case_page_shows_status_data_highlighted_drawing_and_timeline() -> None:
    """A waiting case: its state, data, its drawing with status.at highlighted, and its journal as a timeline."""
    async with inspector() as (sub, client):
        case_id = await started(sub, "order", {"customer": "ana"}, state="waiting_signal")
        page = await client.get(f"/case/{case_id}")
        assert page.status_code == 200
        text = unescape(page.text)
        assert 'id="case-state">waiting_signal<' in text
        assert '"customer": "ana"' in text and '"paid": true' in text
        drawing = unescape(re.search(r'<pre class="mermaid" id="diagram">(.*?)</pre>', page.text, re.S).group(1))
        assert drawing == wfsub.to_mermaid(ORDER, highlight=sub.status(case_id).at)
        assert "class n3 highlight" in drawing
        titles = re.findall(r'<span class="title">(.*?)</span>', text)
        assert titles[0].startswith("started order (version ")
        assert titles[1:] == ["effect pay at seq[1].effect returned"]
        assert '<script src="/static/mermaid.min.js"></script>' in page.text


async def test_case_page_shows_armed_timers_with_their_due_times() -> None:
    """A sleeping case's timeline ends with its armed timer and the due time, as ISO 8601."""
    async with inspector() as (sub, client):
        case_id = await started(sub, "nap", state="waiting_timer")
        due = sub.status(case_id).timers[0].due
        page = await client.get(f"/case/{case_id}")
        assert f"timer at seq[0].sleep due {web._view.when(due)}" in page.text
        assert web._view.when(due).endswith("+00:00")


async def test_failed_case_shows_its_failure_and_traceback_escaped() -> None:
    """A failed case: the failure's type, path, message and traceback, and the effect's error in the timeline;
    a `<script>` in the error message stays text."""
    async with inspector() as (sub, client):
        case_id = await started(sub, "broken", state="failed")
        page = await client.get(f"/case/{case_id}")
        assert page.status_code == 200
        assert 'id="failure"' in page.text and "<b>RuntimeError</b>" in page.text
        assert "Traceback (most recent call last)" in page.text
        assert "effect charge at seq[0].effect failed" in page.text
        assert "<script>alert" not in page.text and "&lt;script&gt;alert(&#39;e&#39;)&lt;/script&gt;" in page.text
        assert "ended failed at seq[0].effect" in page.text


async def test_script_in_case_data_and_payloads_stays_text() -> None:
    """A `<script>` in start data, in a signal payload and in a case id is escaped everywhere it is shown."""
    evil = "<script>alert(1)</script>"
    async with inspector() as (sub, client):
        handle = await sub.new_case("order", {"note": evil}, case_id=f"x{evil}")
        await until(sub, handle.case_id, "waiting_signal")
        await sub.signal(handle.case_id, "approved", {"by": evil})
        await handle.result()
        for url in ("/", f"/case/{handle.case_id}"):
            page = await client.get(url)
            assert page.status_code == 200
            assert evil not in page.text
            assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page.text
            # the only scripts of the page are the app's own files
            assert re.findall(r"<script[^>]*>", page.text) == [
                f'<script src="/static/{name}">' for name in (["inspector.js"] if url == "/" else
                                                               ["mermaid.min.js", "inspector.js"])]


async def test_unknown_case_page_is_a_404_with_the_api_message() -> None:
    """A case id nobody knows answers 404 with CaseNotFound's own text."""
    async with inspector() as (sub, client):
        page = await client.get("/case/nobody")
        assert page.status_code == 404
        with pytest.raises(wfsub.CaseNotFound) as raised:
            sub.status("nobody")
        assert unescape(re.search(r'id="missing">(.*?)</p>', page.text, re.S).group(1)) == str(raised.value)


async def test_long_journal_shows_the_newest_records_until_asked_for_all() -> None:
    """Beyond 500 records the page shows the start and the newest 500, and ?journal=all shows every one."""
    async with inspector() as (sub, client):
        case_id = await started(sub, "chatty", state="waiting_signal")
        for i in range(520):
            await sub.signal(case_id, "tick", {"i": i})
        assert len(await sub.journal(case_id)) == 521
        page = await client.get(f"/case/{case_id}")
        assert page.text.count('<span class="title">') == 501
        assert "20 older records are not shown" in page.text
        assert '"i": 519' in unescape(page.text) and '"i": 19\n' not in unescape(page.text)
        everything = await client.get(f"/case/{case_id}", params={"journal": "all"})
        assert everything.text.count('<span class="title">') == 521


async def test_redact_applies_to_the_data_and_journal_values_shown() -> None:
    """app(redact=) hides what it says in the data and in the journal's values; one that raises withholds."""

    def hide_card(value: Any) -> Any:
        return {k: "***" if k == "card" else v for k, v in value.items()} if isinstance(value, dict) else value

    async with inspector(redact=hide_card) as (sub, client):
        case_id = await started(sub, "order", {"card": "4111-1111"}, state="waiting_signal")
        page = await client.get(f"/case/{case_id}")
        assert "4111" not in page.text and "***" in page.text

    def broken(value: Any) -> Any:
        raise KeyError("card")

    async with inspector(redact=broken) as (sub, client):
        case_id = await started(sub, "order", {"card": "4111-1111"}, state="waiting_signal")
        page = await client.get(f"/case/{case_id}")
        assert "4111" not in page.text and "withheld: redact raised KeyError" in page.text


async def test_case_page_without_a_store_says_there_is_no_journal() -> None:
    """Over a Substrate without a store the case page works, says why it shows no journal, and draws the case from
    the Substrate's own workflows (none passed to the app)."""
    async with Substrate(workflows=WORKFLOWS) as sub:
        client = httpx.AsyncClient(transport=httpx.ASGITransport(app=web.app(sub)), base_url="http://inspector")
        async with client:
            case_id = await started(sub, "order", state="waiting_signal")
            page = await client.get(f"/case/{case_id}")
            assert page.status_code == 200
            assert "keeps no journal" in page.text
            assert '<pre class="mermaid" id="diagram">flowchart LR' in page.text
            assert rows(await client.get("/")) == [(case_id, "waiting_signal")]


# -- actions -----------------------------------------------------------------------------------------------------


async def test_signal_from_the_form_moves_the_case_on() -> None:
    """A signal posted with the token is sent: the answer leads to the case page, which says so."""
    async with inspector() as (sub, client):
        case_id = await started(sub, "order", state="waiting_signal")
        sent = await client.post(f"/case/{case_id}", data={"csrf": await token(client), "action": "signal",
                                                           "name": "approved", "payload": '{"by": "ana"}'})
        assert sent.status_code == 303
        await until(sub, case_id, "done")
        page = await client.get(sent.headers["location"])
        assert unescape(message(page)) == "signal 'approved' sent"
        assert 'id="case-state">done<' in page.text and "signal approved" in page.text
        assert sub.data(case_id)["approved"] == {"by": "ana"}


async def test_signal_refusals_are_answered_with_the_api_message() -> None:
    """Bad JSON, an unknown signal, an ended case and an unknown case are each answered on the page, with the
    API's own message and a status saying which; nothing is sent."""
    async with inspector() as (sub, client):
        csrf = await token(client)
        case_id = await started(sub, "order", state="waiting_signal")
        form = {"csrf": csrf, "action": "signal", "name": "approved", "payload": "{by: ana}"}
        bad = await client.post(f"/case/{case_id}", data=form)
        assert bad.status_code == 400 and "the payload is not JSON" in message(bad)
        assert "{by: ana}" in bad.text  # the form keeps what was typed
        unknown = await client.post(f"/case/{case_id}", data={**form, "name": "shipped", "payload": ""})
        with pytest.raises(wfsub.SignalRejected) as rejected:
            await sub.signal(case_id, "shipped")
        assert unknown.status_code == 409 and unescape(message(unknown)) == str(rejected.value)
        nameless = await client.post(f"/case/{case_id}", data={**form, "name": " ", "payload": ""})
        assert nameless.status_code == 400 and "needs a name" in message(nameless)
        assert sub.status(case_id).state == "waiting_signal"
        ended = await started(sub, "broken", state="failed")
        late = await client.post(f"/case/{ended}", data={**form, "payload": ""})
        assert late.status_code == 409 and "has already ended (failed)" in message(late)
        missing = await client.post("/case/nobody", data={**form, "payload": ""})
        assert missing.status_code == 404 and 'id="missing">no case &#39;nobody&#39;' in missing.text


async def test_a_link_cannot_make_the_case_page_say_anything() -> None:
    """The message after an action is built by the app from what was sent: a crafted link shows no free text."""
    async with inspector() as (sub, client):
        case_id = await started(sub, "order", state="waiting_signal")
        crafted = await client.get(f"/case/{case_id}", params={"done": "session expired: log in at evil.example"})
        assert "evil.example" not in crafted.text and 'id="message"' not in crafted.text
        named = await client.get(f"/case/{case_id}", params={"sent": "signal", "name": "<script>x</script>"})
        assert message(named) == "signal sent"  # a name the workflow does not take is not shown
        known = await client.get(f"/case/{case_id}", params={"sent": "signal", "name": "approved"})
        assert unescape(message(known)) == "signal 'approved' sent"


async def test_a_post_without_the_matching_csrf_token_is_refused() -> None:
    """No token, or one that is not this browser's, is a 403 and sends nothing."""
    async with inspector() as (sub, client):
        case_id = await started(sub, "order", state="waiting_signal")
        await token(client)
        form = {"action": "signal", "name": "approved", "payload": ""}
        assert (await client.post(f"/case/{case_id}", data=form)).status_code == 403
        other = await client.post(f"/case/{case_id}", data={**form, "csrf": "A" * 43})
        assert other.status_code == 403 and "CSRF token" in other.text
        client.cookies.clear()
        assert (await client.post(f"/case/{case_id}", data={**form, "csrf": "A" * 43})).status_code == 403
        assert sub.status(case_id).state == "waiting_signal"


async def test_cancel_with_and_without_compensation() -> None:
    """Cancel from the form ends the case cancelled with its reason; the checkbox chooses compensation, which
    the journal's cancel record carries."""
    async with inspector() as (sub, client):
        csrf = await token(client)
        for compensate in (True, False):
            case_id = await started(sub, "saga", state="waiting_signal")
            form = {"csrf": csrf, "action": "cancel", "reason": "customer asked"}
            if compensate:
                form["compensate"] = "yes"
            sent = await client.post(f"/case/{case_id}", data=form)
            assert sent.status_code == 303
            await until(sub, case_id, "cancelled")
            assert sub.status(case_id).cancel_reason == "customer asked"
            cancel = [r for r in await sub.journal(case_id) if r.kind == "cancel"]
            assert [(r.model_extra or {})["compensate"] for r in cancel] == [compensate]
            page = await client.get(sent.headers["location"])
            how = "with" if compensate else "without"
            assert message(page) == f"cancel sent ({how} compensation)"
            assert f"cancel {how} compensation: customer asked" in page.text


async def test_read_only_removes_the_actions_and_refuses_posts() -> None:
    """read_only=True: the case page has no forms, and a POST (even with a token) is a 403; the case is as it was."""
    async with inspector(read_only=True) as (sub, client):
        case_id = await started(sub, "order", state="waiting_signal")
        page = await client.get(f"/case/{case_id}")
        assert page.status_code == 200 and "<form" not in page.text and "read only" in page.text
        csrf = await token(client)
        refused = await client.post(f"/case/{case_id}", data={"csrf": csrf, "action": "signal", "name": "approved"})
        assert refused.status_code == 403 and "read only" in refused.text
        assert sub.status(case_id).state == "waiting_signal"


async def test_a_post_that_is_not_a_urlencoded_form_is_refused() -> None:
    """The actions take the pages' urlencoded forms only (415 otherwise)."""
    async with inspector() as (sub, client):
        case_id = await started(sub, "order", state="waiting_signal")
        sent = await client.post(f"/case/{case_id}", json={"action": "signal"})
        assert sent.status_code == 415


# -- safety ------------------------------------------------------------------------------------------------------


async def test_auth_guards_every_route() -> None:
    """auth returning False is a 401, raising HTTPException its status, raising anything else a 403; pages,
    static files and streams alike; an async auth returning True lets the request through."""
    answers: dict[str, Callable[[], Any]] = {
        "no": lambda: False,
        "teapot": lambda: (_ for _ in ()).throw(HTTPException(418, "short and stout")),
        "boom": lambda: (_ for _ in ()).throw(PermissionError("not an operator")),
    }

    async def auth(request: Request) -> bool:
        who = request.headers.get("x-user", "")
        if who in answers:
            return bool(answers[who]())
        return who == "ana"

    async with inspector(auth=auth) as (sub, client):
        case_id = await started(sub, "order", state="waiting_signal")
        for url in ("/", f"/case/{case_id}", "/static/inspector.css", "/events?view=cases"):
            assert (await client.get(url, headers={"x-user": "no"})).status_code == 401
            teapot = await client.get(url, headers={"x-user": "teapot"})
            assert (teapot.status_code, teapot.text) == (418, "short and stout")
            boom = await client.get(url, headers={"x-user": "boom"})
            assert boom.status_code == 403 and "not an operator" in boom.text
        assert (await client.get("/", headers={"x-user": "ana"})).status_code == 200
        refused = await client.post(f"/case/{case_id}", data={"action": "signal", "name": "approved"})
        assert refused.status_code == 401 and sub.status(case_id).state == "waiting_signal"


async def test_every_response_carries_the_security_headers() -> None:
    """A CSP allowing only the app's own scripts and connections, nosniff and no framing, on every response."""
    async with inspector() as (sub, client):
        case_id = await started(sub, "order", state="waiting_signal")
        for url in ("/", f"/case/{case_id}", "/case/nobody", "/static/inspector.js", "/?state=bad"):
            answer = await client.get(url)
            csp = answer.headers["content-security-policy"]
            assert "script-src 'self';" in csp and "default-src 'none'" in csp and "connect-src 'self'" in csp
            assert answer.headers["x-content-type-options"] == "nosniff"
            assert answer.headers["x-frame-options"] == "DENY"


async def test_mermaid_is_shipped_with_its_licence_and_the_pages_load_nothing_from_the_network() -> None:
    """The package holds mermaid.min.js and its MIT licence, served by the app; no page names another origin."""
    assert "MIT License" in (STATIC / "mermaid.LICENSE").read_text()
    assert (STATIC / "mermaid.min.js").stat().st_size > 1_000_000
    async with inspector() as (sub, client):
        served = await client.get("/static/mermaid.min.js")
        assert served.status_code == 200 and served.headers["content-type"].startswith("text/javascript")
        case_id = await started(sub, "order", state="waiting_signal")
        for url in ("/", f"/case/{case_id}"):
            page = (await client.get(url)).text
            assert re.findall(r'(?:src|href)="(?:https?:)?//', page) == []


async def test_the_app_mounts_under_a_prefix() -> None:
    """Mounted at /inspect in a Starlette app, its links, forms, stream and static files are under /inspect."""
    async with Substrate(store=MemoryStore(), workflows=WORKFLOWS) as sub:
        outer = Starlette(routes=[Mount("/inspect", app=web.app(sub, workflows=WORKFLOWS))])
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=outer), base_url="http://site") as client:
            case_id = await started(sub, "order", state="waiting_signal")
            listing = await client.get("/inspect/")
            assert f'href="/inspect/case/{case_id}"' in listing.text
            assert 'data-live="/inspect/events?view=cases' in listing.text
            page = await client.get(f"/inspect/case/{case_id}")
            assert f'action="/inspect/case/{case_id}"' in page.text
            assert (await client.get("/inspect/static/inspector.css")).status_code == 200
            csrf = csrf_cookie(client.cookies)[1]
            sent = await client.post(f"/inspect/case/{case_id}",
                                     data={"csrf": csrf, "action": "signal", "name": "approved"})
            assert sent.status_code == 303 and sent.headers["location"].startswith(f"/inspect/case/{case_id}?")


async def test_the_app_mounts_in_fastapi_as_the_readme_shows() -> None:
    """Mounted in FastAPI with an auth reading a header, as in the docs: the operator sees the pages, others 401."""
    fastapi = pytest.importorskip("fastapi")

    def is_operator(request: Request) -> bool:
        return request.headers.get("x-role") == "operator"

    async with Substrate(store=MemoryStore(), workflows=WORKFLOWS) as sub:
        api = fastapi.FastAPI()
        api.mount("/inspect", web.app(sub, workflows=WORKFLOWS, auth=is_operator))
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=api), base_url="http://site") as client:
            case_id = await started(sub, "order", state="waiting_signal")
            page = await client.get(f"/inspect/case/{case_id}", headers={"x-role": "operator"})
            assert page.status_code == 200 and 'id="case-state">waiting_signal<' in page.text
            assert (await client.get("/inspect/", headers={"x-role": "guest"})).status_code == 401


def test_app_checks_its_arguments() -> None:
    """A source without the API's methods, a bad auth, redact, workflows or page size are refused by name."""
    with pytest.raises(TypeError, match="has no status"):
        web.app(object())  # type: ignore[arg-type]

    class Half:
        def status(self, case_id: str) -> None: ...

    with pytest.raises(TypeError, match="Half has no data"):
        web.app(Half())  # type: ignore[arg-type]
    sub = Substrate()
    with pytest.raises(TypeError, match="auth must be"):
        web.app(sub, auth="yes")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="redact must be"):
        web.app(sub, redact=3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"workflows\['order'\]"):
        web.app(sub, workflows={"order": "not a term"})
    with pytest.raises(ValueError, match="page_size"):
        web.app(sub, page_size=0)


def test_public_names_and_no_import_from_wfsub() -> None:
    """The module exports app and CaseSource; `import wfsub` loads neither starlette nor jinja2."""
    assert web.__all__ == ["CaseSource", "app"]
    extras = "('starlette', 'jinja2', 'wfsub.contrib.web')"
    code = f"import sys, wfsub; print(sorted(m for m in {extras} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


# -- live streams ------------------------------------------------------------------------------------------------


class Stream:
    """One EventSource request to the app, read message by message through its ASGI interface."""

    def __init__(self, asgi: Any, query: str) -> None:
        self.asgi, self.query = asgi, query
        self.events: list[str] = []
        self.status = 0
        self.headers: dict[str, str] = {}
        self.arrived = anyio.Event()
        self.left = anyio.Event()

    async def run(self) -> None:
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET",
                 "scheme": "http", "path": "/events", "raw_path": b"/events", "root_path": "",
                 "query_string": self.query.encode(), "headers": [(b"host", b"inspector")],
                 "client": ("127.0.0.1", 1), "server": ("inspector", 80)}

        async def receive() -> dict[str, Any]:
            await self.left.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                self.status = message["status"]
                self.headers = {k.decode(): v.decode() for k, v in message["headers"]}
            elif message.get("body", b"").startswith(b"event: update"):
                self.events.append(message["body"].decode())
                self.arrived.set()

        await self.asgi(scope, receive, send)

    async def next_update(self) -> str:
        with anyio.fail_after(10):
            await self.arrived.wait()
        self.arrived = anyio.Event()
        return self.events[-1]


async def test_case_stream_sends_the_case_part_of_the_page_when_the_case_moves() -> None:
    """A case page's stream sends nothing while the page is current, then the new part of the page (escaped,
    as the page renders it) once a signal moves the case on."""
    async with Substrate(store=MemoryStore(), workflows=WORKFLOWS) as sub:
        asgi = web.app(sub, workflows=WORKFLOWS)
        case_id = await started(sub, "order", {"note": "<script>x</script>"}, state="waiting_signal")
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=asgi), base_url="http://i") as client:
            page = await client.get(f"/case/{case_id}")
        live = unescape(re.search(r'data-live="([^"]+)"', page.text).group(1))
        stream = Stream(asgi, live.split("?", 1)[1])
        async with anyio.create_task_group() as tg:
            tg.start_soon(stream.run)
            await sub.signal(case_id, "approved")
            update = await stream.next_update()
            while 'id="case-state">done<' not in update:  # a read may catch it on its way
                update = await stream.next_update()
            assert "<script>x" not in update and "&lt;script&gt;x" in update
            assert all(line.startswith(("event: ", "data: ")) for line in update.strip().splitlines())
            stream.left.set()
        assert stream.status == 200 and stream.headers["content-type"].startswith("text/event-stream")
        assert 1 <= len(stream.events) <= 3


async def test_list_stream_sends_new_cases_and_state_changes() -> None:
    """The cases page's stream sends the new list when a case starts and again when one ends."""
    async with Substrate(store=MemoryStore(), workflows=WORKFLOWS) as sub:
        asgi = web.app(sub, workflows=WORKFLOWS)
        stream = Stream(asgi, "view=cases&sig=stale")
        async with anyio.create_task_group() as tg:
            tg.start_soon(stream.run)
            assert "no cases" in await stream.next_update()  # the page's signature was not the list's: sent at once
            case_id = await started(sub, "order")
            update = await stream.next_update()
            while f'data-case="{case_id}" data-state="waiting_signal"' not in update:
                update = await stream.next_update()
            await sub.signal(case_id, "approved")
            while f'data-case="{case_id}" data-state="done"' not in update:
                update = await stream.next_update()
            stream.left.set()


async def test_a_burst_of_changes_reaches_a_watcher_as_a_few_updates_ending_at_the_newest() -> None:
    """300 signals to a watched case arrive as fewer updates than changes (one per read at most, not one per
    change), the last showing the last signal; the feed is gone once its watcher is."""
    async with Substrate(store=MemoryStore(), workflows=WORKFLOWS) as sub:
        asgi = web.app(sub, workflows=WORKFLOWS)
        case_id = await started(sub, "chatty", state="waiting_signal")
        stream = Stream(asgi, f"view=case&case={case_id}&sig=stale")
        async with anyio.create_task_group() as tg:
            tg.start_soon(stream.run)
            await stream.next_update()
            for i in range(300):
                await sub.signal(case_id, "tick", {"i": i})
            update = await stream.next_update()
            while "&#34;i&#34;: 299" not in update:
                update = await stream.next_update()
            stream.left.set()
        assert 2 <= len(stream.events) < 300
        assert _live_of(asgi).feeds == 0


class CountingSource:
    """A Substrate whose list reads are counted."""

    def __init__(self, sub: Substrate) -> None:
        self.sub = sub
        self.lists = 0
        self.status, self.data, self.journal = sub.status, sub.data, sub.journal
        self.signal, self.cancel, self.update = sub.signal, sub.cancel, sub.update
        self.retry, self.fork = sub.retry, sub.fork

    def cases(self, **query: Any) -> list[wfsub.CaseStatus]:
        if query.get("limit") != web_app.COUNT_CAP + 1:
            self.lists += 1
        return self.sub.cases(**query)


async def test_many_watchers_of_one_view_share_one_reader_and_leave_nothing_behind() -> None:
    """Fifty clients on the cases page cost one page read per interval, all get the change, a client that never
    reads does not hold the others up, and when they leave the app holds no feed."""
    async with Substrate(store=MemoryStore(), workflows=WORKFLOWS) as sub:
        source = CountingSource(sub)
        inspector_app = web_app.app(source)  # type: ignore[arg-type]
        live = _live_of(inspector_app)
        streams = [Stream(inspector_app, "view=cases&sig=stale") for _ in range(50)]
        stuck = anyio.Event()

        class Stuck(Stream):
            async def run(self) -> None:
                original = self.asgi

                async def blocked(scope: Any, receive: Any, send: Any) -> None:
                    async def never(message: Any) -> None:
                        if message.get("body", b"").startswith(b"event: update"):
                            await stuck.wait()

                    await original(scope, receive, never)

                self.asgi = blocked
                await super().run()

        slow = Stuck(inspector_app, "view=cases&sig=stale")
        async with anyio.create_task_group() as tg:
            tg.start_soon(slow.run)
            for s in streams:
                tg.start_soon(s.run)
            for s in streams:
                await s.next_update()
            before, since = source.lists, time.perf_counter()
            case_id = await started(sub, "order", state="waiting_signal")
            for s in streams:
                update = await s.next_update()
                while case_id not in update:
                    update = await s.next_update()
            assert live.feeds == 1 and live.watchers() == 51
            # one reader, whose reads are at least an interval apart: not one reader per client
            assert source.lists - before <= (time.perf_counter() - since) / live.interval + 2
            for s in [*streams, slow]:
                s.left.set()
            stuck.set()
        assert live.feeds == 0 and live.watchers() == 0


async def test_a_stream_names_its_view() -> None:
    """/events without a known view is a 400 that says which views there are."""
    async with inspector() as (sub, client):
        answer = await client.get("/events?view=everything")
        assert answer.status_code == 400 and "'cases'" in answer.text


def _live_of(asgi: Any) -> web._live.Live:
    """The Live of an app (the guard wraps the Starlette app whose routes hold the inspector's methods)."""
    for route in asgi.inner.routes:
        endpoint = getattr(route, "endpoint", None)
        owner = getattr(endpoint, "__self__", None)
        if owner is not None:
            return owner.live  # type: ignore[no-any-return]
    raise AssertionError("no inspector route")


async def test_a_live_view_that_cannot_be_read_warns_once_per_outage(caplog: pytest.LogCaptureFixture) -> None:
    """A store away for many polls logs one warning (with its traceback) and one when reading works again, not one
    per poll."""
    from wfsub import StoreError

    failing = {"on": True}

    async def read(key: Any) -> tuple[Any, Callable[[], Any]]:
        if failing["on"]:
            raise StoreError("the store is away")

        async def render() -> str:
            return "<p>back</p>"

        return "sig", render

    live = web._live.Live(read)
    feed = web._live._Feed(("case", "", "c", False))
    with caplog.at_level("WARNING", logger="wfsub.web"):
        for _ in range(20):
            await live._poll(feed)
        failing["on"] = False
        await live._poll(feed)
    said = [r.getMessage() for r in caplog.records if r.name == "wfsub.web"]
    assert said == ["reading a live view failed; trying again at each poll until it works",
                    "reading a live view works again"]
    assert b"back" in feed.payload

"""Faults an attacker or a user finds in the inspector through its public doors (`wfsub.contrib.web.app`, `wfsub web`):
each test pins the behaviour the contract asks for and is marked xfail(strict) while the fault stands."""

from __future__ import annotations

import html
import re
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

pytest.importorskip("starlette", reason="the web extra (starlette) is not installed")
pytest.importorskip("jinja2", reason="the web extra (jinja2) is not installed")

import wfsub
from wfsub import Client, Queue, Substrate, defer, seq, task, wait
from wfsub.contrib import web
from wfsub.stores import MemoryStore

from .test_web import Stream

FLOWS = {"order": seq(wait("approved"), task(lambda c: {"shipped": True}, name="ship"))}
V1 = seq(task(lambda c: {"priced": 1}, name="price"), wait("approved"), task(lambda c: {}, name="ship"))
V2 = seq(task(lambda c: {"priced": 2}, name="price"), wait("approved"), wait("packed"),
         task(lambda c: {}, name="ship"))


async def _until(sub: Substrate, case_id: str, state: str) -> None:
    with anyio.fail_after(10):
        while sub.status(case_id).state != state:  # noqa: ASYNC110 - the public API has no state-change event
            await anyio.sleep(0.005)


def _drawing(page: str) -> str:
    found = re.search(r'<pre class="mermaid" id="diagram">(.*?)</pre>', page, re.S)
    return html.unescape(found.group(1)) if found else ""


def _message(page: str) -> str:
    found = re.search(r'id="message"[^>]*>(.*?)</p>', page, re.S)
    return html.unescape(found.group(1)) if found else ""


def _sse_data(event: str) -> str:
    """The `data` of one server-sent event as a browser's EventSource reads it: lines end at CRLF, LF or CR only
    (the HTML standard's event stream grammar), and the data lines are joined with LF."""
    lines = re.split(r"\r\n|\r|\n", event)
    return "\n".join(line[6:] if line.startswith("data: ") else line[5:] for line in lines
                     if line.startswith("data:"))


# -- Host ------------------------------------------------------------------------------------------------------


async def test_a_host_whose_port_holds_a_digit_that_is_not_ascii_is_refused_with_400_not_a_500() -> None:
    """A Host such as `localhost:²` (a Latin-1 superscript digit, as raw bytes on the wire) is refused with 400 like
    any other host not allowed, never answered with a 500 (`wfsub web` logs a traceback for each such request)."""
    async with Substrate(store=MemoryStore(), workflows=FLOWS) as sub:
        await sub.new_case("order", case_id="c1")
        asgi = web.app(sub, allowed_hosts=["localhost:8377"])
        transport = httpx.ASGITransport(app=asgi, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost:8377") as client:
            for host in (b"localhost:\xb2", b"localhost:8377\xb9", b"localhost:\xbc"):
                answer = await client.get("/case/c1", headers={b"host": host})
                assert answer.status_code == 400, (host, answer.status_code)
                assert "answers only requests for localhost:8377" in answer.text


def test_allowed_hosts_with_a_port_of_digits_that_are_not_ascii_is_refused_as_not_a_host_name() -> None:
    """`allowed_hosts=['localhost:²']` (or `wfsub web --allow-host`) is refused as not a host name, with the fix."""
    sub = Substrate(workflows=FLOWS)
    with pytest.raises(ValueError, match="not a host name"):
        web.app(sub, allowed_hosts=["localhost:²"])


# -- links and messages ----------------------------------------------------------------------------------------


async def test_a_link_with_a_fork_record_that_is_not_an_ascii_number_still_shows_the_case_page() -> None:
    """`/case/c1?sent=fork&from=x&at=²` (a link anyone can send) shows the case page (no message), never a 500."""
    async with Substrate(store=MemoryStore(), workflows=FLOWS) as sub:
        await sub.new_case("order", case_id="c1")
        transport = httpx.ASGITransport(app=web.app(sub), raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://i") as client:
            for at in ("²", "1²", "³"):
                page = await client.get("/case/c1", params={"sent": "fork", "from": "x", "at": at})
                assert page.status_code == 200, (at, page.status_code)


async def test_a_link_cannot_make_the_case_page_say_text_of_its_choosing() -> None:
    """The message a case page shows after an action is built by the app ("built here, so a link cannot make the
    page say anything"): a crafted link (`?sent=signal&name=...`, `?sent=fork&from=...`) does not put the sender's
    own sentence in the page's status line."""
    lure = "Session expired: sign in again at https://evil.example/login"
    async with Substrate(store=MemoryStore(), workflows=FLOWS) as sub:
        await sub.new_case("order", case_id="c1")
        await _until(sub, "c1", "waiting_signal")
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=web.app(sub)), base_url="http://i") as client:
            for query in ({"sent": "signal", "name": f"approved' sent. {lure} '"},
                          {"sent": "fork", "from": f"c1' at record 0. {lure} '", "at": "0"}):
                page = await client.get("/case/c1", params=query)
                assert page.status_code == 200
                assert "evil.example" not in _message(page.text), _message(page.text)


# -- CSRF ------------------------------------------------------------------------------------------------------


class _ByPort(httpx.AsyncBaseTransport):
    """One browser that reaches several servers on one host name, by port (its cookie jar is shared between them,
    as a browser's is: cookies do not isolate ports, RFC 6265 section 8.5)."""

    def __init__(self, apps: Mapping[int, Any]) -> None:
        self.transports = {port: httpx.ASGITransport(app=app) for port, app in apps.items()}

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        return await self.transports[request.url.port or 80].handle_async_request(request)


async def test_two_inspectors_on_one_host_name_do_not_break_each_others_forms() -> None:
    """An operator with `wfsub web prod.db --port 8377` and `wfsub web staging.db --port 8378` open (each with its
    own random secret) opens a case page on the first, then one on the second, then sends the first page's form:
    it is taken (the second inspector's cookie does not replace the first's token)."""
    async with (Substrate(store=MemoryStore(), workflows=FLOWS) as prod,
                Substrate(store=MemoryStore(), workflows=FLOWS) as staging):
        for sub in (prod, staging):
            await sub.new_case("order", case_id="c1")
            await _until(sub, "c1", "waiting_signal")
        transport = _ByPort({8377: web.app(prod), 8378: web.app(staging)})
        async with httpx.AsyncClient(transport=transport) as browser:
            first = await browser.get("http://localhost:8377/case/c1")
            found = re.search(r'name="csrf" value="([^"]+)"', first.text)
            assert found
            second = await browser.get("http://localhost:8378/case/c1")
            assert second.status_code == 200
            sent = await browser.post("http://localhost:8377/case/c1",
                                      data={"csrf": found.group(1), "action": "signal", "name": "approved"})
            assert sent.status_code == 303, sent.text[:300]
        await _until(prod, "c1", "done")


# -- live updates ----------------------------------------------------------------------------------------------


async def test_a_live_update_shows_case_data_as_the_page_does() -> None:
    """Data holding U+2028, U+2029 or U+0085 (valid JSON text) reads the same in a live update, as a browser's
    EventSource parses it, as in the page: the live view does not turn them into line breaks."""
    note = "a\u2028b\u2029c\x85d"
    async with Substrate(store=MemoryStore(), workflows=FLOWS) as sub:
        await sub.new_case("order", {"note": note}, case_id="c1")
        await _until(sub, "c1", "waiting_signal")
        asgi = web.app(sub)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=asgi), base_url="http://i") as client:
            page = await client.get("/case/c1")
        shown = re.search(r'<pre class="json" id="case-data">(.*?)</pre>', page.text, re.S)
        assert shown and note in html.unescape(shown.group(1))
        stream = Stream(asgi, "view=case&case=c1&sig=stale")
        async with anyio.create_task_group() as tg:
            tg.start_soon(stream.run)
            update = _sse_data(await stream.next_update())
            stream.left.set()
        live = re.search(r'<pre class="json" id="case-data">(.*?)</pre>', update, re.S)
        assert live is not None
        assert html.unescape(live.group(1)) == html.unescape(shown.group(1))


# -- drawings --------------------------------------------------------------------------------------------------


async def test_a_queued_case_is_drawn_on_the_version_it_will_start_on_after_a_deploy(tmp_path: Path) -> None:
    """A long-running inspector over a Client (`wfsub web STORE`) draws a queued case (its status names no version
    yet) on the newest version of its workflow; once the owner restarts with a new version, it draws it on that one,
    as a fresh inspector does and as the case then starts (not on the version that was newest when first drawn)."""
    db = tmp_path / "s.db"
    queues = {"q": Queue(concurrency=1)}
    async with Substrate(store=db, workflows={"order": V1}, queues=queues) as sub:
        await sub.new_case("order", case_id="runs", queue="q")
        await sub.new_case("order", case_id="waits", queue="q")
        await _until(sub, "waits", "queued")
    async with Client(db) as client:
        asgi = web.app(client)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=asgi), base_url="http://i") as http:
            before = await http.get("/case/waits")
            assert _drawing(before.text) == wfsub.to_mermaid(V1)
            async with Substrate(store=db, workflows={"order": [V1, V2]}, queues=queues) as sub:
                assert sub.status("waits").state == "queued"
                after = await http.get("/case/waits")
                assert _drawing(after.text) == wfsub.to_mermaid(V2)
                assert '<option value="packed">' in after.text  # the forms offer the new version's signals
                await sub.cancel("runs")
                await _until(sub, "waits", "waiting_signal")
                assert sub.status("waits").version == wfsub.compile(V2).fingerprint


async def test_a_name_in_the_workflow_cannot_reconfigure_the_drawing() -> None:
    """A defer branch's signal name (or a net node's name) holding `%%{init: ...}%%` is drawn as text: the case
    page's Mermaid text carries no directive for the renderer (labels escape `%`; the comments must too)."""
    name = 'go%%{init: {"theme": "dark", "flowchart": {"htmlLabels": true}}}%%'
    flows = {"d": seq(defer({name: task(lambda c: {}, name="a"), "other": task(lambda c: {}, name="b")}))}
    async with Substrate(store=MemoryStore(), workflows=flows) as sub:
        await sub.new_case("d", case_id="c1")
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=web.app(sub)), base_url="http://i") as http:
            page = await http.get("/case/c1")
        drawn = _drawing(page.text)
        assert drawn.startswith("flowchart LR")
        assert "%%{" not in drawn, [line for line in drawn.splitlines() if "%%{" in line]


CHROMIUM = "/usr/bin/chromium"
HAVE_CHROMIUM = Path(CHROMIUM).exists()
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]


@pytest.mark.long
async def test_a_workflow_of_more_than_500_edges_is_drawn_in_the_browser() -> None:
    """A case of a 510-step workflow (a long but ordinary sequence) is drawn in the page as an SVG of its shapes
    with where it waits marked, not as Mermaid's error picture."""
    if not HAVE_CHROMIUM:
        pytest.skip(f"no {CHROMIUM}")
    playwright_api = pytest.importorskip("playwright.async_api", reason="playwright is not installed")
    uvicorn = pytest.importorskip("uvicorn", reason="uvicorn is not installed")
    big = seq(*[task(lambda c: {}, name=f"step{i}") for i in range(510)], wait("go"))
    async with Substrate(store=MemoryStore(), workflows={"big": big}) as sub:
        await sub.new_case("big", case_id="c1")
        await _until(sub, "c1", "waiting_signal")
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
            server = uvicorn.Server(uvicorn.Config(web.app(sub), log_level="warning", lifespan="off",
                                                   timeout_graceful_shutdown=1))
            async with anyio.create_task_group() as tg:
                tg.start_soon(server.serve, [sock])
                with anyio.fail_after(10):
                    while not server.started:  # noqa: ASYNC110 - uvicorn has no start event
                        await anyio.sleep(0.01)
                try:
                    async with playwright_api.async_playwright() as pw:
                        try:
                            browser = await pw.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
                        except playwright_api.Error as exc:
                            pytest.skip(f"{CHROMIUM} did not start: {str(exc).splitlines()[0]}")
                        try:
                            page = await browser.new_page()
                            # (deadlines, not delays: laying out 500 shapes takes seconds on a loaded machine)
                            await page.goto(f"http://127.0.0.1:{port}/case/c1", timeout=120_000)
                            await page.wait_for_selector("#diagram svg", timeout=120_000)
                            assert await page.get_attribute("#diagram", "data-error") is None
                            assert "Syntax error" not in await page.locator("#diagram").inner_text()
                            await playwright_api.expect(page.locator("#diagram svg g.node.highlight")).to_have_count(1)
                        finally:
                            await browser.close()
                finally:
                    server.should_exit = True
                    server.force_exit = True


# -- filters ---------------------------------------------------------------------------------------------------


async def test_the_tag_filter_finds_the_case_whose_tag_it_names_and_not_another() -> None:
    """Tag values are any str (`tags={'tier': ' gold'}` is taken): `?tag=tier= gold` lists that case, not the case
    tagged `tier=gold`."""
    async with Substrate(store=MemoryStore(), workflows=FLOWS) as sub:
        await sub.new_case("order", case_id="spaced", tags={"tier": " gold"})
        await sub.new_case("order", case_id="plain", tags={"tier": "gold"})
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=web.app(sub)), base_url="http://i") as client:
            listing = await client.get("/", params={"tag": "tier= gold"})
        assert re.findall(r'<tr data-case="([^"]+)"', listing.text) == ["spaced"]


async def test_a_tag_key_holding_an_equals_sign_or_a_percent_is_filtered_with_it_percent_encoded() -> None:
    """`?tag=` splits at its first `=` and percent-decodes the key: `a%3Db=1` filters the key `a=b`, `a=b=1` the
    key `a` with the value `b=1`; the page's own links and filter form write a key the same way."""
    async with Substrate(store=MemoryStore(), workflows=FLOWS) as sub:
        await sub.new_case("order", case_id="key-eq", tags={"a=b": "1"})
        await sub.new_case("order", case_id="value-eq", tags={"a": "b=1"})
        await sub.new_case("order", case_id="pct", tags={"50%": "x"})
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=web.app(sub)), base_url="http://i") as client:

            async def listed(tag: str) -> list[str]:
                page = await client.get("/", params={"tag": tag})
                assert page.status_code == 200, page.text[:300]
                return re.findall(r'<tr data-case="([^"]+)"', page.text)

            assert await listed("a%3Db=1") == ["key-eq"]
            assert await listed("a=b=1") == ["value-eq"]
            assert await listed("50%25=x") == ["pct"]
            page = await client.get("/", params={"tag": "a%3Db=1"})
            assert 'id="filter-tag" value="a%3Db=1"' in page.text  # the form sends it back as it came
            links = re.findall(r'href="(/\?[^"]*tag=[^"]*)"', page.text)
            shown = set()
            for link in links:  # the page's own links (by state, ...) keep the filter
                again = await client.get(html.unescape(link))
                shown.add(tuple(re.findall(r'<tr data-case="([^"]+)"', again.text)))
            assert shown and shown <= {("key-eq",), ()} and ("key-eq",) in shown, (links, shown)


# -- headers ---------------------------------------------------------------------------------------------------

SECURITY = ("content-security-policy", "x-content-type-options", "referrer-policy", "x-frame-options")


async def test_a_refusal_of_the_host_or_of_auth_carries_the_security_headers() -> None:
    """A request refused for its Host (400, the refusal quotes the Host) or by `auth` (401, 403, its own status)
    goes out with the same security headers as every other response."""

    def auth(request: Any) -> bool:
        if request.headers.get("x-user") == "raise":
            raise RuntimeError("no such user")
        return request.headers.get("x-user") == "ops"

    async with Substrate(store=MemoryStore(), workflows=FLOWS) as sub:
        await sub.new_case("order", case_id="c1")
        asgi = web.app(sub, allowed_hosts=["localhost:8377"], auth=auth)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=asgi), base_url="http://localhost:8377") as c:
            answers = [await c.get("/case/c1", headers={"host": "evil.example", "x-user": "ops"}),
                       await c.get("/case/c1", headers={"x-user": "eve"}),
                       await c.get("/case/c1", headers={"x-user": "raise"}),
                       await c.get("/case/c1", headers={"x-user": "ops"})]
    assert [a.status_code for a in answers] == [400, 401, 403, 200]
    for answer in answers:
        assert all(answer.headers.get(h) for h in SECURITY), (answer.status_code, dict(answer.headers))
        assert answer.headers["x-frame-options"] == "DENY"


async def test_a_page_carrying_a_csrf_token_is_not_kept_by_caches() -> None:
    """The HTML pages (the cases page, a case page, a missing case's page: each is rendered with this browser's CSRF
    token and may set its cookie) are sent with Cache-Control: no-store; the static files may be kept."""
    async with Substrate(store=MemoryStore(), workflows=FLOWS) as sub:
        await sub.new_case("order", case_id="c1")
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=web.app(sub)), base_url="http://i") as client:
            for path in ("/", "/case/c1", "/case/ghost"):
                page = await client.get(path)
                assert page.headers.get("cache-control") == "no-store", (path, page.headers.get("cache-control"))
            static = await client.get("/static/inspector.js")
            assert static.status_code == 200 and static.headers.get("cache-control") != "no-store"

"""The inspector's safety against a page the operator visits on another site: the `Host` a request must name
(DNS rebinding), CSRF tokens the server issues and signs, and case ids that no link or form can turn into another
case's (`a/../b`, `%2F`, `..`). Driven through httpx's ASGI transport over a live Substrate, links followed as a
browser follows them."""

from __future__ import annotations

import html
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx
import pytest

pytest.importorskip("starlette", reason="the web extra (starlette) is not installed")
pytest.importorskip("jinja2", reason="the web extra (jinja2) is not installed")

from wfsub import Substrate, seq, start_case, task, wait
from wfsub.contrib import web
from wfsub.stores import MemoryStore

from .test_web import csrf_cookie, token

FLOWS = {
    "order": seq(wait("approved"), task(lambda c: {"shipped": True}, name="ship")),
    "parent": seq(start_case("order", case_id=lambda c: c["child"], wait=False), wait("end")),
}
ODD_IDS = ["evil/../victim", "victim", "a%2Fb", "a/b", "..", ".", "x/./y", "x/y", "q?x=1#f", "%2e%2e", "sp ace",
           "b\\..\\victim", "é/../victim"]


@asynccontextmanager
async def inspector(**options: Any) -> AsyncIterator[tuple[Substrate, httpx.AsyncClient]]:
    async with Substrate(store=MemoryStore(), workflows=FLOWS) as sub:
        asgi = web.app(sub, **options)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=asgi), base_url="http://localhost:8377",
                                     headers={"host": "localhost:8377"}) as client:
            yield sub, client


async def until(sub: Substrate, case_id: str, state: str) -> None:
    with anyio.fail_after(10):
        while sub.status(case_id).state != state:  # noqa: ASYNC110 - the public API has no state-change event
            await anyio.sleep(0.002)


def as_a_browser_asks(href: str) -> str:
    """The path (and query) a browser requests for a link: the URL standard reads a `\\` as a `/` (in http URLs)
    and drops dot segments (`.` and `..`, percent-encoded as `%2e` too) before it sends anything."""
    path, sep, query = html.unescape(href).partition("?")
    segments = path.replace("\\", "/").split("/")[1:]
    kept: list[str] = []
    for i, segment in enumerate(segments):
        last = i == len(segments) - 1
        if segment.lower() in ("..", ".%2e", "%2e.", "%2e%2e"):
            if kept:
                kept.pop()
            if last:
                kept.append("")
        elif segment.lower() in (".", "%2e"):
            if last:
                kept.append("")
        else:
            kept.append(segment)
    return "/" + "/".join(kept) + sep + query


def shown_case(page: httpx.Response) -> str:
    """The id of the case a case page shows (its heading)."""
    found = re.search(r'<h1><span class="mono">(.*?)</span>', page.text, re.S)
    assert found, page.text[:1500]
    return html.unescape(found.group(1))


def form_action(page: httpx.Response, form: str) -> str:
    found = re.search(rf'<form method="post" action="([^"]+)" id="{form}">', page.text)
    assert found, page.text[:1500]
    return found.group(1)


# -- Host: DNS rebinding ---------------------------------------------------------------------------------------


async def test_a_request_for_a_host_not_allowed_is_refused_before_anything_is_read_or_done() -> None:
    """With allowed_hosts=, a request whose Host names another name or port (a rebound DNS name) gets 400 saying
    which hosts it serves, reads nothing and acts on nothing; the names given (with their port) are served."""
    async with inspector(allowed_hosts=["localhost:8377", "127.0.0.1:8377", "*.ops.example"]) as (sub, client):
        await sub.new_case("order", case_id="c1")
        await until(sub, "c1", "waiting_signal")
        csrf = await token(client)
        for host in ("rebound.attacker.example:8377", "localhost:9999", "localhost", "127.0.0.1.nip.io:8377",
                     "ops.example", ""):
            headers = {"host": host}
            for method, path, data in (("GET", "/", None), ("GET", "/case/c1", None), ("GET", "/static/inspector.js",
                                       None), ("POST", "/case/c1", {"csrf": csrf, "action": "cancel"})):
                refused = await client.request(method, path, data=data, headers=headers)
                assert refused.status_code == 400, (host, path, refused.status_code)
                assert "answers only requests for localhost:8377, 127.0.0.1:8377, *.ops.example" in refused.text
                assert "c1" not in refused.text
        assert sub.status("c1").state == "waiting_signal"  # the refused cancel did nothing
        for host in ("localhost:8377", "127.0.0.1:8377", "LocalHost:8377", "inspect.ops.example:443"):
            served = await client.get("/case/c1", headers={"host": host})
            assert served.status_code == 200, host
            assert shown_case(served) == "c1"


async def test_without_allowed_hosts_the_app_leaves_the_host_to_the_app_it_is_mounted_in() -> None:
    """app(sub) with allowed_hosts=None answers whatever Host a request names (the mounting app checks it)."""
    async with inspector() as (sub, client):
        await sub.new_case("order", case_id="c1")
        page = await client.get("/case/c1", headers={"host": "anything.example"})
        assert page.status_code == 200 and shown_case(page) == "c1"


def test_allowed_hosts_that_are_not_host_names_are_refused_with_the_fix() -> None:
    """allowed_hosts must be a list of host names: a bare str, or an entry with a path or a bad port, is refused."""
    sub = Substrate(workflows=FLOWS)
    with pytest.raises(TypeError, match="allowed_hosts must be a list of host names"):
        web.app(sub, allowed_hosts="localhost")  # type: ignore[arg-type]
    for wrong in ("http://localhost/", "localhost:http", "localhost:70000", ""):
        with pytest.raises(ValueError, match="not a host name"):
            web.app(sub, allowed_hosts=[wrong])


# -- CSRF: tokens the server issued ---------------------------------------------------------------------------


async def test_a_csrf_token_the_server_did_not_issue_is_refused_whatever_cookie_comes_with_it() -> None:
    """A POST whose form and cookie carry the same token the sender made up is refused (403) and does nothing;
    the token a page was served with is taken."""
    async with inspector() as (sub, client):
        await sub.new_case("order", case_id="c1")
        await until(sub, "c1", "waiting_signal")
        made_up = "A" * 43
        await token(client)
        name = csrf_cookie(client.cookies)[0]
        for forged in (made_up, f"{'A' * 32}.{'B' * 43}"):
            client.cookies.clear()
            client.cookies.set(name, forged)
            refused = await client.post("/case/c1", data={"csrf": forged, "action": "signal", "name": "approved"})
            assert refused.status_code == 403 and "not issued by this inspector" in refused.text
        assert sub.status("c1").state == "waiting_signal"
        client.cookies.clear()
        issued = await token(client)
        assert issued != made_up
        sent = await client.post("/case/c1", data={"csrf": issued, "action": "signal", "name": "approved"})
        assert sent.status_code == 303
        await until(sub, "c1", "done")


async def test_a_token_issued_by_another_inspector_is_refused_and_one_with_the_same_secret_is_taken() -> None:
    """Tokens are signed with the app's secret: another app's token is refused (and the page issues a fresh
    one); two apps given the same secret= (processes behind one address) take each other's."""
    async with Substrate(store=MemoryStore(), workflows=FLOWS) as sub:
        await sub.new_case("order", case_id="c1")
        await until(sub, "c1", "waiting_signal")
        secret = b"k" * 32
        apps = [web.app(sub), web.app(sub, secret=secret), web.app(sub, secret=secret)]
        clients = [httpx.AsyncClient(transport=httpx.ASGITransport(app=a), base_url="http://i") for a in apps]
        try:
            foreign = await token(clients[0])
            await token(clients[1])
            name = csrf_cookie(clients[1].cookies)[0]  # (the other app's token under this app's own cookie)
            clients[1].cookies.clear()
            cookie = {"cookie": f"{name}={foreign}"}
            refused = await clients[1].post("/case/c1", data={"csrf": foreign, "action": "signal", "name": "nope"},
                                            headers=cookie)
            assert refused.status_code == 403 and "not issued by this inspector" in refused.text
            page = await clients[1].get("/case/c1", headers=cookie)  # the page replaces a cookie it did not sign
            fresh = page.cookies.get(name)
            assert fresh and fresh != foreign and f'value="{fresh}"' in page.text
            taken = await clients[2].post("/case/c1", data={"csrf": fresh, "action": "signal", "name": "approved"},
                                          headers={"cookie": f"{name}={fresh}"})
            assert taken.status_code == 303
        finally:
            for c in clients:
                await c.aclose()
        with pytest.raises(ValueError, match="16 bytes or more"):
            web.app(sub, secret="short")


# -- case ids: no link or form leads to another case -----------------------------------------------------------


async def row_links(client: httpx.AsyncClient) -> dict[str, str]:
    """Each case id on the cases page -> the href of its row's link."""
    listing = await client.get("/", params={"limit": "500"})
    found = re.findall(r'<tr data-case="([^"]+)"[^>]*>\s*<td class="id"><a href="([^"]+)">', listing.text)
    return {html.unescape(case_id): href for case_id, href in found}


async def test_every_case_link_and_form_leads_to_and_acts_on_that_case_whatever_its_id() -> None:
    """Ids with slashes, dot segments, `%`, `?` and `#` (`evil/../victim` beside `victim`, `..`, `a%2Fb` beside
    `a/b`): each row's link, followed as a browser follows it, opens that case; its cancel form cancels it and no
    other; the page the action leads to is the same case's."""
    async with inspector() as (sub, client):
        for case_id in ODD_IDS:
            await sub.new_case("order", case_id=case_id)
            await until(sub, case_id, "waiting_signal")
        links = await row_links(client)
        assert sorted(links) == sorted(ODD_IDS)
        csrf = await token(client)
        cancelled: list[str] = []
        for case_id, href in links.items():
            page = await client.get(as_a_browser_asks(href))
            assert page.status_code == 200, (case_id, href)
            assert shown_case(page) == case_id, (case_id, href)
            action = form_action(page, "cancel-form")
            form = {"csrf": csrf, "action": "cancel", "reason": "odd ids"}
            done = await client.post(as_a_browser_asks(action), data=form)
            assert done.status_code == 303, (case_id, action)
            cancelled.append(case_id)
            await until(sub, case_id, "cancelled")
            assert sorted(c for c in ODD_IDS if sub.status(c).state == "cancelled") == sorted(cancelled)
            after = await client.get(as_a_browser_asks(done.headers["location"]))
            assert shown_case(after) == case_id


async def test_links_between_a_parent_and_its_children_and_to_the_whole_journal_keep_their_case() -> None:
    """From a parent with an odd id its child's link, from the child the parent's link, and the "show all"
    journal link each open the case they name (`/../` in the ids, and the dot-segment ids `..` and `.`)."""
    async with inspector() as (sub, client):
        await sub.new_case("order", case_id="victim")
        pairs = (("p/../victim", "kid/../victim"), ("..", "."))
        for parent, child in pairs:
            await sub.new_case("parent", {"child": child}, case_id=parent)
            await until(sub, parent, "waiting_signal")
        links = await row_links(client)
        for parent, child in pairs:
            page = await client.get(as_a_browser_asks(links[parent]))
            assert shown_case(page) == parent
            kid = re.search(r'id="case-children"><a href="([^"]+)">', page.text)
            assert kid, page.text[:2000]
            kid_page = await client.get(as_a_browser_asks(kid.group(1)))
            assert shown_case(kid_page) == child
            up = re.search(r'id="case-parent" href="([^"]+)"', kid_page.text)
            assert up and shown_case(await client.get(as_a_browser_asks(up.group(1)))) == parent
            whole = re.search(r'<a href="([^"]+)">show all</a>', page.text)
            if whole is not None:  # (shown only for a journal longer than the page shows)
                assert shown_case(await client.get(as_a_browser_asks(whole.group(1)))) == parent

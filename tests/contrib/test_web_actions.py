"""The inspector's newer views and actions through httpx's ASGI transport over a live Substrate: the tag and parent
filters, a case's lineage, version, queue and refused inputs, and the update, retry and fork actions with each of
their refusals (answered with the API's own message)."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import quote

import anyio
import httpx
import pytest

pytest.importorskip("starlette", reason="the web extra (starlette) is not installed")
pytest.importorskip("jinja2", reason="the web extra (jinja2) is not installed")

from pydantic import BaseModel

from wfsub import Queue, Substrate, loop, seq, start_case, task, wait
from wfsub.contrib import web
from wfsub.stores import MemoryStore

from .test_web import message, rows, token, unescape


class Add(BaseModel):
    n: int


BROKEN = {"on": True}


def _step(c: dict[str, Any]) -> dict[str, Any]:
    if BROKEN["on"]:
        raise RuntimeError("the step is broken")
    return {"stepped": True}


FLOWS = {
    "order": seq(wait("approved"), task(lambda c: {"shipped": True}, name="ship")),
    "counter": loop(wait("add", model=Add, into="added", reply=lambda c: {"seen": c["added"]["n"], "note": "<b>"}),
                    until=lambda c: False),
    "flaky": seq(task(_step, name="step"), wait("approved")),
    "parent": seq(start_case("order", wait=False), start_case("order", wait=False), wait("end")),
    "strict": seq(wait("first"), wait("second", check=lambda c, p: None if p and p.get("ok") else "second needs ok")),
}


@asynccontextmanager
async def inspector(**options: Any) -> AsyncIterator[tuple[Substrate, httpx.AsyncClient]]:
    """A Substrate on a MemoryStore (with a queue) and an httpx client of its inspector."""
    async with Substrate(store=MemoryStore(), workflows=FLOWS, queues={"slow": Queue(concurrency=1)}) as sub:
        asgi = web.app(sub, workflows=FLOWS, **options)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=asgi), base_url="http://inspector") as client:
            yield sub, client


async def until(sub: Substrate, case_id: str, state: str) -> None:
    """Wait until the case is in `state` (a state, never a time)."""
    with anyio.fail_after(10):
        while sub.status(case_id).state != state:  # noqa: ASYNC110 - the public API has no state-change event
            await anyio.sleep(0.002)


async def post(client: httpx.AsyncClient, case_id: str, **form: str) -> httpx.Response:
    return await client.post(f"/case/{case_id}", data={"csrf": await token(client), **form})


# -- the cases page --------------------------------------------------------------------------------------------


async def test_cases_page_filters_by_several_tags_and_shows_them_in_the_row() -> None:
    """Every tag=key=value given must hold; the row shows the case's tags as key=value."""
    async with inspector() as (sub, client):
        await sub.new_case("order", case_id="a", tags={"customer": "ana", "tier": "gold"})
        await sub.new_case("order", case_id="b", tags={"customer": "ana", "tier": "silver"})
        await sub.new_case("order", case_id="c", tags={"customer": "bo"})
        await until(sub, "a", "waiting_signal")
        both = await client.get("/", params=[("tag", "customer=ana"), ("tag", "tier=gold")])
        assert [r[0] for r in rows(both)] == ["a"]
        assert "customer=ana, tier=gold" in both.text
        one = await client.get("/", params={"tag": "customer=ana"})
        assert [r[0] for r in rows(one)] == ["b", "a"]
        bad = await client.get("/", params={"tag": "customer"})
        assert bad.status_code == 400 and "tag must be key=value" in bad.text


async def test_paging_with_tag_and_parent_filters_reaches_every_match_once() -> None:
    """A page's older link keeps the tag and parent filters, so paging visits each matching case once."""
    async with inspector() as (sub, client):
        for i in range(5):
            await sub.new_case("order", case_id=f"t{i}", tags={"batch": "x"})
            await sub.new_case("order", case_id=f"u{i}", tags={"batch": "y"})
        seen: list[str] = []
        page = await client.get("/", params={"tag": "batch=x", "limit": "2"})
        while True:
            seen += [r[0] for r in rows(page)]
            older = re.search(r'id="older" href="/\?([^"]+)"', page.text)
            if older is None:
                break
            assert "tag=batch%3Dx" in older.group(1)
            page = await client.get("/?" + older.group(1).replace("&amp;", "&"))
        assert seen == [f"t{i}" for i in reversed(range(5))]
        parent = await sub.new_case("parent", case_id="p")
        await until(sub, "p", "waiting_signal")
        children = sub.status("p").children
        assert len(children) == 2
        seen = []
        page = await client.get("/", params={"parent": "p", "limit": "1"})
        while True:
            seen += [r[0] for r in rows(page)]
            older = re.search(r'id="older" href="/\?([^"]+)"', page.text)
            if older is None:
                break
            assert "parent=p" in older.group(1)
            page = await client.get("/?" + older.group(1).replace("&amp;", "&"))
        assert sorted(seen) == sorted(children) and parent.case_id not in seen


async def test_a_queued_case_is_counted_and_its_page_shows_its_queue() -> None:
    """A case waiting in a queue counts under queued (not under a tag filter: it has no tags yet), and its page
    shows the queue and priority."""
    async with inspector() as (sub, client):
        await sub.new_case("order", case_id="q1", queue="slow", priority=3, delay=3600)
        listing = await client.get("/")
        assert re.search(r'data-state="queued"><b>1</b> queued', listing.text)
        page = await client.get("/case/q1")
        assert page.status_code == 200
        assert re.search(r'id="case-queue"><span class="mono">slow</span>, priority 3', page.text)
        assert "(queued)" in page.text
        tagged = await client.get("/", params={"tag": "team=ops"})  # a queued case has no tags yet
        assert re.search(r'data-state="queued"><b>0</b> queued', tagged.text)
        assert sub.cases(state="queued", tags={"team": "ops"}) == []
        assert [s.case_id for s in sub.cases(state="queued", id_prefix="q")] == ["q1"]


# -- the case page ---------------------------------------------------------------------------------------------


async def test_case_page_shows_tags_version_parent_and_children_as_links() -> None:
    """A parent's page links its children (and the filtered list of them); a child's links its parent."""
    async with inspector() as (sub, client):
        await sub.new_case("parent", case_id="p", tags={"team": "ops"})
        await until(sub, "p", "waiting_signal")
        kids = sub.status("p").children
        page = await client.get("/case/p")
        assert 'id="case-tags">team=ops<' in page.text
        assert f'title="{sub.status("p").version}"' in page.text
        for kid in kids:
            assert f'href="/case/{quote(kid, safe="")}">{kid}</a>' in page.text
        assert 'href="/?parent=p"' in page.text
        child = await client.get(f"/case/{quote(kids[0])}")
        assert '<a id="case-parent" href="/case/p">p</a>' in child.text


async def test_refused_inputs_are_listed_with_their_reason() -> None:
    """An input the case's check refused is shown in its own section with its kind, name and reason."""
    async with inspector() as (sub, client):
        await sub.new_case("strict", case_id="s")
        await until(sub, "s", "waiting_signal")
        await sub.signal("s", "second", {"ok": False})  # buffered: the wait refuses it later
        await sub.signal("s", "first")
        with anyio.fail_after(10):
            while not sub.status("s").refused:  # noqa: ASYNC110 - waiting on a state
                await anyio.sleep(0.002)
        page = await client.get("/case/s")
        section = page.text[page.text.index('id="refused"'):page.text.index('class="diagram"')]
        assert 'class="title">refused signal second<' in section
        assert "second needs ok (at seq[1].wait)" in section


async def test_signal_and_update_forms_offer_the_names_the_version_takes() -> None:
    """The forms list the signal and update names of the case's version and say what a refusal says."""
    async with inspector() as (sub, client):
        await sub.new_case("counter", case_id="n")
        await until(sub, "n", "waiting_signal")
        page = await client.get("/case/n")
        assert '<datalist id="update-names"><option value="add"></datalist>' in page.text
        assert "this version takes signals: add; updates: add." in page.text


# -- actions ---------------------------------------------------------------------------------------------------


async def test_update_from_the_form_is_answered_on_the_page_escaped() -> None:
    """An update's answer is shown on the page (as JSON, escaped), and the case took the payload."""
    async with inspector() as (sub, client):
        await sub.new_case("counter", case_id="n")
        await until(sub, "n", "waiting_signal")
        answered = await post(client, "n", action="update", name="add", payload='{"n": 7}')
        assert answered.status_code == 200
        shown = message(answered)
        assert "&lt;b&gt;" in shown and "<b>" not in shown
        assert unescape(shown).startswith("update 'add' answered: {")
        assert '"seen": 7' in unescape(shown)
        assert sub.data("n")["added"] == {"n": 7}


async def test_update_refusals_are_answered_with_the_api_message() -> None:
    """An unknown name, a payload the model refuses, a payload that is not JSON and an unknown case are each
    refused with the API's own message; no token and read only are refused before anything is sent."""
    async with inspector() as (sub, client):
        await sub.new_case("counter", case_id="n")
        await until(sub, "n", "waiting_signal")
        unknown = await post(client, "n", action="update", name="nope", payload="")
        assert unknown.status_code == 409 and "nope" in unescape(message(unknown))
        model = await post(client, "n", action="update", name="add", payload='{"n": "many"}')
        assert model.status_code == 409 and "Add" in unescape(message(model))
        not_json = await post(client, "n", action="update", name="add", payload="{n: 1}")
        assert not_json.status_code == 400 and "the payload is not JSON" in message(not_json)
        missing = await post(client, "ghost", action="update", name="add", payload='{"n": 1}')
        assert missing.status_code == 404 and "no case &#39;ghost&#39;" in missing.text
        no_token = await client.post("/case/n", data={"action": "update", "name": "add", "payload": '{"n": 1}'})
        assert no_token.status_code == 403 and "CSRF" in no_token.text
        assert "added" not in sub.data("n")
    async with inspector(read_only=True) as (sub, client):
        await sub.new_case("counter", case_id="n")
        page = await client.get("/case/n")
        assert "update-form" not in page.text and "fork-form" not in page.text
        refused = await client.post("/case/n", data={"csrf": "x" * 40, "action": "update", "name": "add"})
        assert refused.status_code == 403 and "read only" in refused.text


async def test_retry_reopens_a_failed_case_and_refuses_one_that_is_not_failed() -> None:
    """Retry is offered on a failed case and re-opens it at the failed step (the timeline says so); a retry of a
    case that is not failed, or of no case, is refused with the API's message."""
    BROKEN["on"] = True
    async with inspector() as (sub, client):
        await sub.new_case("flaky", case_id="f")
        await until(sub, "f", "failed")
        page = await client.get("/case/f")
        assert 'id="retry-form"' in page.text
        BROKEN["on"] = False
        retried = await post(client, "f", action="retry")
        assert retried.status_code == 303 and retried.headers["location"] == "/case/f?sent=retry"
        await until(sub, "f", "waiting_signal")
        after = await client.get(retried.headers["location"])
        assert "retried: the case is re-opened at the step that failed" in message(after)
        assert re.search(r'class="title">retried \(run 1\): the end at record \d+ is dropped', after.text)
        assert 'id="retry-form"' not in after.text
        again = await post(client, "f", action="retry")
        assert again.status_code == 409 and "is waiting_signal" in unescape(message(again))
        missing = await post(client, "ghost", action="retry")
        assert missing.status_code == 404


async def test_fork_leads_to_the_new_case_and_refuses_a_bad_seq() -> None:
    """A fork at a record leads to the new case's page, which names its origin; a seq the journal does not hold,
    one that is not a number, a taken id and an unknown case are refused with the API's message."""
    async with inspector() as (sub, client):
        await sub.new_case("order", case_id="o")
        await until(sub, "o", "waiting_signal")
        forked = await post(client, "o", action="fork", at="0", new_case_id="o-copy")
        assert forked.status_code == 303
        assert forked.headers["location"] == "/case/o-copy?sent=fork&at=0"
        page = await client.get(forked.headers["location"])
        assert "forked from case &#39;o&#39; at record 0" in message(page)
        assert '<a id="case-forked-from" href="/case/o">o</a>' in page.text
        assert "forked from o at record 0" in page.text  # its start record, in the timeline
        await until(sub, "o-copy", "waiting_signal")
        bad_seq = await post(client, "o", action="fork", at="99")
        assert bad_seq.status_code == 400 and "99" in unescape(message(bad_seq))
        not_a_number = await post(client, "o", action="fork", at="first")
        assert not_a_number.status_code == 400 and "a whole number" in message(not_a_number)
        taken = await post(client, "o", action="fork", at="0", new_case_id="o-copy")
        assert taken.status_code == 409 and "o-copy" in unescape(message(taken))
        missing = await post(client, "ghost", action="fork", at="0")
        assert missing.status_code == 404


async def test_an_ended_case_offers_fork_but_not_signal() -> None:
    """Once a case has ended its page offers fork (and no signal, update or cancel)."""
    async with inspector() as (sub, client):
        await sub.new_case("order", case_id="o")
        await until(sub, "o", "waiting_signal")
        await sub.signal("o", "approved")
        await until(sub, "o", "done")
        page = await client.get("/case/o")
        assert 'id="fork-form"' in page.text
        assert 'id="signal-form"' not in page.text and 'id="update-form"' not in page.text


@pytest.mark.parametrize("form", [
    {"action": "update", "name": "add", "payload": '{"n": 1}'},
    {"action": "retry"},
    {"action": "fork", "at": "0"},
])
async def test_each_new_action_is_refused_without_the_token_and_when_read_only(form: dict[str, str]) -> None:
    """Update, retry and fork without the page's CSRF token, or on a read-only inspector, are refused (403) and
    change nothing."""
    async with inspector() as (sub, client):
        await sub.new_case("counter", case_id="n")
        await until(sub, "n", "waiting_signal")
        await token(client)
        refused = await client.post("/case/n", data={"csrf": "forged-" + "x" * 40, **form})
        assert refused.status_code == 403 and "CSRF" in refused.text
        assert "added" not in sub.data("n") and [s.case_id for s in sub.cases()] == ["n"]
    async with inspector(read_only=True) as (sub, client):
        await sub.new_case("counter", case_id="n")
        await until(sub, "n", "waiting_signal")
        refused = await post(client, "n", **form)
        assert refused.status_code == 403 and "read only" in refused.text
        assert "added" not in sub.data("n") and [s.case_id for s in sub.cases()] == ["n"]


async def test_an_update_not_answered_in_time_says_the_case_keeps_it() -> None:
    """An update that no wait takes within the form's wait is answered 202, saying the case keeps it; the case
    answers it later when a wait takes it (time is a VirtualClock's)."""
    from wfsub.contrib.web import _app as web_app
    from wfsub.testing import VirtualClock

    clock = VirtualClock()
    flows = {"later": seq(wait("first"), wait("add", into="added", reply=lambda c: c["added"]))}
    async with Substrate(store=MemoryStore(), workflows=flows, clock=clock) as sub:
        asgi = web.app(sub, workflows=flows)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=asgi), base_url="http://i") as client:
            await sub.new_case("later", case_id="l")
            await until(sub, "l", "waiting_signal")
            answers: list[httpx.Response] = []

            async def send() -> None:
                answers.append(await post(client, "l", action="update", name="add", payload="3"))

            async with anyio.create_task_group() as tg:
                tg.start_soon(send)
                with anyio.fail_after(10):
                    while not answers:  # the form's wait is armed once the update is sent: time moves past it
                        await clock.advance(web_app.UPDATE_WAIT + 1)
            assert answers[0].status_code == 202
            assert "the case has not answered it within 10 s; it keeps the update" in message(answers[0])
            await sub.signal("l", "first")
            await until(sub, "l", "done")
            assert sub.data("l")["added"] == 3

"""What the inspector draws a case with: a Substrate's own workflows (`app(sub)`, nothing more passed), and over a
`wfsub.Client` or `wfsub web STORE` the drawing the program summary keeps for each version, so every case is
drawn on the version it runs, with where it is marked; a summary from before drawings still loads."""

from __future__ import annotations

import html
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

pytest.importorskip("starlette", reason="the web extra (starlette) is not installed")
pytest.importorskip("jinja2", reason="the web extra (jinja2) is not installed")

import wfsub
from wfsub import Client, Substrate, effect, seq, task, wait
from wfsub.contrib import web
from wfsub.stores import MemoryStore, PostgresStore, SqliteStore

from ..stores import _pg

V1 = seq(task(lambda c: {"priced": 1}, name="price"), wait("approved"), task(lambda c: {}, name="ship"))
V2 = seq(task(lambda c: {"priced": 2}, name="price"), wait("approved"), wait("packed"),
         task(lambda c: {}, name="ship"))


def reopenable(kind: str, tmp_path: Path) -> Callable[[], Any]:
    """The same store each time it is called (a new store object on one file or schema); None: no store."""
    if kind == "none":
        return lambda: None
    if kind == "memory":
        memory = MemoryStore()
        return lambda: memory
    if kind == "sqlite":
        return lambda: SqliteStore(tmp_path / "cases.db")
    if not _pg.ENABLED:
        pytest.skip(_pg.SKIP_REASON)
    dsn, schema = _pg.database_dsn(), _pg.new_schema()
    return lambda: PostgresStore(dsn, schema=schema)


async def until(read: Callable[[], Any], state: str) -> None:
    """Wait until a case's status (sync or awaited: a Substrate's or a Client's) is in `state`."""
    with anyio.fail_after(10):
        while True:
            status = read()
            if not isinstance(status, wfsub.CaseStatus):
                status = await status
            if status.state == state:
                return
            await anyio.sleep(0.005)


async def case_page(source: Any, case_id: str, **options: Any) -> str:
    asgi = web.app(source, **options)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=asgi), base_url="http://i") as http:
        page = await http.get(f"/case/{case_id}")
        assert page.status_code == 200, page.text[:500]
        return page.text


def drawing(page: str) -> str:
    """The Mermaid text a case page draws ('' when it draws none)."""
    found = re.search(r'<pre class="mermaid" id="diagram">(.*?)</pre>', page, re.S)
    return html.unescape(found.group(1)) if found else ""


def note(page: str) -> str:
    found = re.search(r'<section class="diagram">.*?(?:<p class="note">(.*?)</p>)?\s*</section>', page, re.S)
    return html.unescape(found.group(1) or "") if found else ""


def marked_labels(mermaid: str) -> list[str]:
    """The labels of the shapes a Mermaid drawing marks as highlighted."""
    classes = re.search(r"^\s*class ([\w,]+) highlight$", mermaid, re.M)
    if classes is None:
        return []
    labels = dict(re.findall(r'^\s*(\w+)\W+"([^"]*)"', mermaid, re.M))
    return [labels[i] for i in classes.group(1).split(",")]


@pytest.mark.parametrize("kind", ["none", "memory", "sqlite", "postgres"])
async def test_app_of_a_substrate_draws_its_own_workflows_with_nothing_more_passed(kind: str, tmp_path: Path) -> None:
    """`app(sub)` draws a case on its version from the Substrate's own workflows, marking where it waits, and its
    forms offer that version's signal names; a case on an older version is drawn on that one."""
    store = reopenable(kind, tmp_path)
    async with Substrate(store=store(), workflows={"order": [V1, V2]}) as sub:
        await sub.new_case("order", case_id="new")
        await until(lambda: sub.status("new"), "waiting_signal")
        page = await case_page(sub, "new")
        assert drawing(page) == wfsub.to_mermaid(V2, highlight=sub.status("new").at)
        assert marked_labels(drawing(page)) == ["signal: approved"]
        assert note(page) == ""
        assert '<datalist id="signal-names"><option value="approved"><option value="packed"></datalist>' in page
    if kind in ("none", "memory"):
        return
    async with Substrate(store=store(), workflows={"order": V1}) as sub:  # (a case started on V1 alone)
        await sub.new_case("order", case_id="old")
        await until(lambda: sub.status("old"), "waiting_signal")
    async with Substrate(store=store(), workflows={"order": [V1, V2]}) as sub:
        await until(lambda: sub.status("old"), "waiting_signal")
        page = await case_page(sub, "old")
        assert drawing(page) == wfsub.to_mermaid(V1, highlight=sub.status("old").at)


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
async def test_a_client_draws_each_case_on_its_version_from_the_summary_the_store_keeps(
    kind: str, tmp_path: Path
) -> None:
    """Over a Client (what `wfsub web STORE` serves), with no workflows passed, each case is drawn on the version
    it runs, from the drawing its program summary keeps, with where it is marked, as to_mermaid draws it; with no
    owner running too."""
    store = reopenable(kind, tmp_path)
    async with Substrate(store=store(), workflows={"order": V1}) as sub:
        await sub.new_case("order", case_id="on-v1")
        await until(lambda: sub.status("on-v1"), "waiting_signal")
    async with Substrate(store=store(), workflows={"order": [V1, V2]}) as sub:
        await sub.new_case("order", case_id="on-v2")
        await until(lambda: sub.status("on-v2"), "waiting_signal")
        await sub.signal("on-v2", "approved")
        await until(lambda: sub.status("on-v2"), "waiting_signal")
        async with Client(store()) as client:
            for case_id, term, mark in (("on-v1", V1, "signal: approved"), ("on-v2", V2, "signal: packed")):
                status = await client.status(case_id)
                page = await case_page(client, case_id)
                assert drawing(page) == wfsub.to_mermaid(term, highlight=status.at), case_id
                assert marked_labels(drawing(page)) == [mark]
                assert note(page) == ""
    async with Client(store()) as client:  # no owner: the store alone
        page = await case_page(client, "on-v2")
        assert marked_labels(drawing(page)) == ["signal: packed"]


async def test_wfsub_web_draws_cases_without_being_given_the_workflows(tmp_path: Path) -> None:
    """`wfsub web STORE` (no --workflow) draws a case on its version, marked where it waits."""
    from .test_web_client import WFSUB, _free_port

    db = tmp_path / "s.db"
    async with Substrate(store=db, workflows={"order": V1}) as sub:
        await sub.new_case("order", case_id="c-1")
        await until(lambda: sub.status("c-1"), "waiting_signal")
        at = sub.status("c-1").at
    port = _free_port()
    async with await anyio.open_process([*WFSUB, "web", str(db), "--port", str(port)]) as proc:
        try:
            with anyio.fail_after(60):
                while True:
                    try:
                        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
                            page = await http.get("/case/c-1")
                        break
                    except httpx.ConnectError:
                        await anyio.sleep(0.1)
            assert page.status_code == 200
            assert drawing(page.text) == wfsub.to_mermaid(V1, highlight=at)
        finally:
            proc.terminate()
            with anyio.move_on_after(15):
                await proc.wait()


async def test_a_summary_written_before_drawings_still_loads_and_draws_from_the_workflows_given(
    tmp_path: Path,
) -> None:
    """A store whose program summary has no drawing (format 2, an older wfsub) still checks inputs; the inspector
    says the summary keeps no drawing and how to get one, and draws from `workflows=` when they are given."""
    from wfsub._store import ProgramSummary

    db = tmp_path / "s.db"
    fingerprint = wfsub.compile(V1).fingerprint
    old = {"format": 2, "workflow": "order", "input": None, "root": "seq", "signals": {"approved": None},
           "waits": {"approved": ["seq[1].wait"]}, "updates": {}, "regions": {}, "compensations": {}}
    store = SqliteStore(db)
    await store.open(owner=True, owner_id="an-older-wfsub")
    await store.put_program(ProgramSummary(fingerprint, "order", old))
    await store.close()
    async with Substrate(store=db, workflows={"order": V1}) as sub:
        await sub.new_case("order", case_id="c-1")
        await until(lambda: sub.status("c-1"), "waiting_signal")
        async with Client(db) as client:
            with pytest.raises(wfsub.SignalRejected, match="never waits for signal 'aproved'"):
                await client.signal("c-1", "aproved")
            page = await case_page(client, "c-1")
            assert drawing(page) == ""
            assert "written by an older wfsub, before summaries kept drawings" in note(page)
            assert "wfsub web --workflow" in note(page)
            page = await case_page(client, "c-1", workflows={"order": V1})
            assert marked_labels(drawing(page)) == ["signal: approved"] and note(page) == ""


async def _bad(ctx: Mapping[str, Any]) -> Any:
    raise RuntimeError("card declined")


async def _good(ctx: Mapping[str, Any]) -> Any:
    return {"charged": True}


async def test_a_retried_case_that_migrated_is_drawn_on_the_version_it_runs_with_no_note(tmp_path: Path) -> None:
    """A case that failed on v1 and, retried once only v2 is registered, migrated to it: drawn on v2 (the version
    it runs, which the app holds), marked where it waits, with no note that the app lacks its version."""
    one = seq(effect(_bad, name="charge"), wait("go"))
    two = seq(effect(_good, name="charge"), wait("go"))
    db = tmp_path / "s.db"
    async with Substrate(store=db, workflows={"pay": one}) as sub:
        await sub.new_case("pay", case_id="c")
        await until(lambda: sub.status("c"), "failed")
    async with Substrate(store=db, workflows={"pay": two}) as sub:
        await sub.retry("c")
        await until(lambda: sub.status("c"), "waiting_signal")
        status = sub.status("c")
        assert status.migrated_from == wfsub.compile(one).fingerprint  # (the case this test is about)
        for options in ({"workflows": {"pay": two}}, {}):
            page = await case_page(sub, "c", **options)
            assert drawing(page) == wfsub.to_mermaid(two, highlight=status.at), options
            assert note(page) == "", options

"""The inspector over a `wfsub.Client` (a store another process owns), and `wfsub web STORE`, the command that
serves it: pages, actions through the store's inbox, the address it binds and says, and its refusals."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx
import pytest

pytest.importorskip("starlette", reason="the web extra (starlette) is not installed")
pytest.importorskip("jinja2", reason="the web extra (jinja2) is not installed")
pytest.importorskip("uvicorn", reason="uvicorn (the web extra's server) is not installed")

import wfsub
from wfsub import Substrate, loop, seq, start_case, task, wait
from wfsub.contrib import web

from .. import _warm
from .test_web import csrf_cookie

FLOWS = {"greet": seq(wait("go"), task(lambda c: {"greeted": True}, name="greet"))}
WFSUB = [sys.executable, "-m", "wfsub"]


async def _waiting(sub: Substrate, case_id: str) -> None:
    with anyio.fail_after(10):
        while sub.status(case_id).state != "waiting_signal":  # noqa: ASYNC110 - waiting on a state
            await anyio.sleep(0.005)


async def test_the_inspector_over_a_client_lists_shows_and_signals_through_the_store(tmp_path: Path) -> None:
    """Over a Client, the list and case pages read the store, and a signal from the form reaches the owner."""
    db = tmp_path / "s.db"
    async with Substrate(store=db, workflows=FLOWS) as sub:
        await sub.new_case("greet", {"note": "<script>x</script>"}, case_id="c-1")
        await _waiting(sub, "c-1")
        async with wfsub.Client(db) as client:
            asgi = web.app(client, workflows=FLOWS)
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=asgi), base_url="http://i") as http:
                listing = await http.get("/")
                assert listing.status_code == 200
                assert re.findall(r'<tr data-case="([^"]+)" data-state="([^"]+)">', listing.text) == [
                    ("c-1", "waiting_signal")]
                page = await http.get("/case/c-1")
                assert page.status_code == 200
                assert "&lt;script&gt;x&lt;/script&gt;" in page.text and "<script>x</script>" not in page.text
                assert "flowchart LR" in page.text
                csrf = csrf_cookie(http.cookies)[1]
                sent = await http.post("/case/c-1", data={"csrf": csrf, "action": "signal", "name": "go"})
                assert sent.status_code == 303
                assert await sub.await_case("c-1", timeout=10) == {"note": "<script>x</script>", "go": None,
                                                                   "greeted": True}
                refused = await http.post("/case/c-1", data={"csrf": csrf, "action": "signal", "name": "go"})
                assert refused.status_code == 409 and "ended" in refused.text
                missing = await http.get("/case/nope")
                assert missing.status_code == 404


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def served(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[tuple[Path, subprocess.Popen[str]]]:
    """A store with one waiting case, written by a Substrate that has exited (so the inspector's process is the
    only one open on it), and `wfsub web` serving it on a free port; stopped with SIGINT (Ctrl+C)."""
    (tmp_path / "flows.py").write_text(textwrap.dedent("""
        import wfsub
        FLOWS = {"greet": wfsub.seq(wfsub.wait("go"), wfsub.task(lambda c: {"greeted": True}, name="greet"))}
    """))
    db = tmp_path / "s.db"

    async def make() -> None:
        async with Substrate(store=db, workflows=FLOWS) as sub:
            await sub.new_case("greet", {}, case_id="c-1")
            await _waiting(sub, "c-1")

    anyio.run(make)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(wfsub.__file__).parents[1]), str(tmp_path)])}
    extra = list(getattr(request, "param", []))  # more options, from @pytest.mark.parametrize(indirect=True)
    proc = _warm.Popen([*WFSUB, "web", str(db), "--port", "0", "-w", "flows:FLOWS", *extra], cwd=tmp_path,
                       env=env, stderr=subprocess.PIPE, text=True)
    try:
        yield db, proc
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()


def test_wfsub_web_serves_the_inspector_on_localhost_and_says_where(
    served: tuple[Path, subprocess.Popen[str]],
) -> None:
    """`wfsub web STORE --port 0` binds 127.0.0.1, prints its address, serves the pages, and stops on Ctrl+C."""
    _, proc = served
    assert proc.stderr is not None
    line = proc.stderr.readline()  # blocks until the command has bound and said where (or exited)
    found = re.search(r"at http://127\.0\.0\.1:(\d+)/; only this machine can reach it", line)
    assert found, line + proc.stderr.read() if proc.poll() is not None else line
    base = f"http://127.0.0.1:{found.group(1)}"
    listing = httpx.get(base + "/", timeout=10)
    assert listing.status_code == 200 and 'data-case="c-1"' in listing.text
    page = httpx.get(base + "/case/c-1", timeout=10)
    assert page.status_code == 200 and "flowchart LR" in page.text
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=15) == 0


def _served_port(proc: subprocess.Popen[str]) -> str:
    assert proc.stderr is not None
    line = proc.stderr.readline()  # blocks until the command has bound and said where (or exited)
    found = re.search(r"at http://127\.0\.0\.1:(\d+)/", line)
    assert found, line + proc.stderr.read() if proc.poll() is not None else line
    return found.group(1)


def test_wfsub_web_answers_only_requests_for_the_address_it_serves(
    served: tuple[Path, subprocess.Popen[str]],
) -> None:
    """`wfsub web` answers a request only when its Host names the address it serves (127.0.0.1, localhost, with
    its port): a page whose own DNS name was rebound to 127.0.0.1 gets 400, reads no case and cancels nothing."""
    _, proc = served
    port = _served_port(proc)
    base = f"http://127.0.0.1:{port}"
    for host in (f"127.0.0.1:{port}", f"localhost:{port}"):
        page = httpx.get(base + "/case/c-1", headers={"host": host}, timeout=10)
        assert page.status_code == 200 and "c-1" in page.text, host
    for host in (f"rebound.attacker.example:{port}", "rebound.attacker.example", f"localhost:{int(port) + 1}"):
        for path in ("/", "/case/c-1"):
            refused = httpx.get(base + path, headers={"host": host}, timeout=10)
            assert refused.status_code == 400, (host, path)
            assert "answers only requests for" in refused.text and "c-1" not in refused.text
    with httpx.Client(base_url=base, headers={"host": f"localhost:{port}"}, timeout=10) as browser:
        browser.get("/")  # (the CSRF cookie a page of the attacker's origin would hold)
        csrf = csrf_cookie(browser.cookies)[1]
        cancel = browser.post("/case/c-1", data={"csrf": csrf, "action": "cancel"},
                              headers={"host": f"rebound.attacker.example:{port}"})
        assert cancel.status_code == 400
        assert 'data-state="waiting_signal"' in browser.get("/").text


@pytest.mark.parametrize("served", [["--allow-host", "inspect.example"]], indirect=True)
def test_wfsub_web_answers_the_names_allow_host_adds(served: tuple[Path, subprocess.Popen[str]]) -> None:
    """`--allow-host NAME` adds a name the inspector answers (any port); other names stay refused."""
    _, proc = served
    port = _served_port(proc)
    base = f"http://127.0.0.1:{port}"
    assert httpx.get(base + "/", headers={"host": f"inspect.example:{port}"}, timeout=10).status_code == 200
    assert httpx.get(base + "/", headers={"host": f"other.example:{port}"}, timeout=10).status_code == 400


def test_wfsub_web_refuses_a_taken_port_and_a_single_term(tmp_path: Path) -> None:
    """A port in use and a --workflow that is one term (not the name -> workflow dict) are refused with the fix."""
    (tmp_path / "flows.py").write_text("import wfsub\nONE = wfsub.task(lambda c: {})\n")
    db = tmp_path / "s.db"

    async def make() -> None:
        async with Substrate(store=db, workflows=FLOWS):
            pass

    anyio.run(make)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(wfsub.__file__).parents[1]), str(tmp_path)])}
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        busy = _warm.run([*WFSUB, "web", str(db), "--port", str(port)], cwd=tmp_path, env=env, timeout=60)
    assert busy.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}" in busy.stderr and "pass another --port" in busy.stderr
    one = _warm.run([*WFSUB, "web", str(db), "--port", str(_free_port()), "-w", "flows:ONE"], cwd=tmp_path,
                    env=env, timeout=60)
    assert one.returncode == 1 and "needs the dict of name -> workflow" in one.stderr


BROKEN = {"on": True}


def _step(c: dict[str, object]) -> dict[str, object]:
    if BROKEN["on"]:
        raise RuntimeError("the step is broken")
    return {"stepped": True}


ACTION_FLOWS = {
    "counter": loop(wait("add", into="added", reply=lambda c: {"seen": c["added"]}), until=lambda c: False),
    "flaky": seq(task(_step, name="step"), wait("go")),
}


async def _in_state(sub: Substrate, case_id: str, state: str) -> None:
    with anyio.fail_after(10):
        while sub.status(case_id).state != state:  # noqa: ASYNC110 - waiting on a state
            await anyio.sleep(0.005)


async def test_update_retry_and_fork_over_a_client_reach_the_owner(tmp_path: Path) -> None:
    """Over a Client, an update is answered on the page by the owner, an unknown name is refused by the program
    summary's check, a retry re-opens a failed case and a fork leads to the new case's page."""
    db = tmp_path / "s.db"
    BROKEN["on"] = True
    async with Substrate(store=db, workflows=ACTION_FLOWS) as sub:
        await sub.new_case("counter", case_id="n", tags={"team": "ops"})
        await sub.new_case("flaky", case_id="f")
        await _in_state(sub, "n", "waiting_signal")
        await _in_state(sub, "f", "failed")
        async with wfsub.Client(db) as client:
            asgi = web.app(client, workflows=ACTION_FLOWS)
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=asgi), base_url="http://i") as http:
                listing = await http.get("/", params={"tag": "team=ops"})
                assert re.findall(r'<tr data-case="([^"]+)"', listing.text) == ["n"]
                page = await http.get("/case/n")
                assert '<datalist id="update-names"><option value="add"></datalist>' in page.text
                csrf = csrf_cookie(http.cookies)[1]
                assert csrf
                answered = await http.post("/case/n", data={"csrf": csrf, "action": "update", "name": "add",
                                                           "payload": "5"})
                assert answered.status_code == 200
                assert "update &#39;add&#39; answered: {\n  &#34;seen&#34;: 5\n}" in answered.text
                unknown = await http.post("/case/n", data={"csrf": csrf, "action": "update", "name": "nope"})
                assert unknown.status_code == 409 and "nope" in unknown.text
                BROKEN["on"] = False
                retried = await http.post("/case/f", data={"csrf": csrf, "action": "retry"})
                assert retried.status_code == 303
                await _in_state(sub, "f", "waiting_signal")
                not_failed = await http.post("/case/f", data={"csrf": csrf, "action": "retry"})
                assert not_failed.status_code == 409 and "retried" in not_failed.text
                forked = await http.post("/case/f", data={"csrf": csrf, "action": "fork", "at": "0",
                                                         "new_case_id": "f2"})
                assert forked.status_code == 303 and forked.headers["location"].startswith("/case/f2?")
                await _in_state(sub, "f2", "waiting_signal")
                copy = await http.get(forked.headers["location"])
                assert '<a id="case-forked-from" href="/case/f">f</a>' in copy.text
                bad = await http.post("/case/f", data={"csrf": csrf, "action": "fork", "at": "999"})
                assert bad.status_code == 400 and "999" in bad.text


async def test_a_client_source_counts_and_shows_queued_cases(tmp_path: Path) -> None:
    """Over a Client, a case waiting in a queue is listed and counted as queued, and its page shows its queue."""
    db = tmp_path / "s.db"
    async with Substrate(store=db, workflows=FLOWS, queues={"slow": wfsub.Queue(concurrency=1)}) as sub:
        await sub.new_case("greet", case_id="q1", queue="slow", priority=2, delay=3600)
        async with wfsub.Client(db) as client:
            assert [s.case_id for s in await client.cases(state="queued")] == ["q1"]
            assert await client.cases(state="queued", tags={"a": "b"}) == []
            asgi = web.app(client, workflows=FLOWS)
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=asgi), base_url="http://i") as http:
                listing = await http.get("/", params={"state": "queued"})
                assert re.findall(r'<tr data-case="([^"]+)" data-state="([^"]+)">', listing.text) == [
                    ("q1", "queued")]
                assert re.search(r'data-state="queued"><b>1</b> queued', listing.text)
                page = await http.get("/case/q1")
                assert re.search(r'id="case-queue"><span class="mono">slow</span>, priority 2', page.text)


async def test_a_client_source_filters_by_parent(tmp_path: Path) -> None:
    """Over a Client, ?parent= lists the cases a case started (Client.cases(parent=)), and the parent's page
    links them."""
    flows = {**FLOWS, "parent": seq(start_case("greet", wait=False), wait("end"))}
    db = tmp_path / "s.db"
    async with Substrate(store=db, workflows=flows) as sub:
        await sub.new_case("parent", case_id="p")
        await sub.new_case("greet", case_id="other")
        await _in_state(sub, "p", "waiting_signal")
        kids = sub.status("p").children
        assert len(kids) == 1
        async with wfsub.Client(db) as client:
            assert [s.case_id for s in await client.cases(parent="p")] == list(kids)
            with pytest.raises(ValueError, match="parent must be a case id"):
                await client.cases(parent="")
            asgi = web.app(client, workflows=flows)
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=asgi), base_url="http://i") as http:
                listing = await http.get("/", params={"parent": "p"})
                assert re.findall(r'<tr data-case="([^"]+)"', listing.text) == list(kids)
                page = await http.get("/case/p")
                assert f">{kids[0]}</a>" in page.text

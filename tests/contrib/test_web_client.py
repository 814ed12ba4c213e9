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
from wfsub import Substrate, seq, task, wait
from wfsub.contrib import web
from wfsub.contrib.web import _app as web_app

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
                csrf = http.cookies.get(web_app.CSRF_COOKIE)
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
def served(tmp_path: Path) -> Iterator[tuple[Path, subprocess.Popen[str]]]:
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
    proc = subprocess.Popen([*WFSUB, "web", str(db), "--port", "0", "-w", "flows:FLOWS"], cwd=tmp_path, env=env,
                            stderr=subprocess.PIPE, text=True)
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
        busy = subprocess.run([*WFSUB, "web", str(db), "--port", str(port)], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=60)
    assert busy.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}" in busy.stderr and "pass another --port" in busy.stderr
    one = subprocess.run([*WFSUB, "web", str(db), "--port", str(_free_port()), "-w", "flows:ONE"], cwd=tmp_path,
                         env=env, capture_output=True, text=True, timeout=60)
    assert one.returncode == 1 and "needs the dict of name -> workflow" in one.stderr

"""The case inspector in a real browser: headless Chromium (Debian's `chromium` package) driven by Playwright for
Python, against a live Substrate served by uvicorn on 127.0.0.1.

Skipped, with the reason, when /usr/bin/chromium, playwright or uvicorn is missing, or chromium does not start
(`.ci/run` installs chromium where it is missing; playwright and uvicorn are in the dev extra; `playwright
install` is never needed). The test saves a screenshot of the case page; with `WFSUB_UPDATE_SCREENSHOT=1` it also
replaces docs/operations/web-inspector.png, the one the inspector's page shows.
"""

from __future__ import annotations

import os
import shutil
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio
import pytest

CHROMIUM = "/usr/bin/chromium"
if not Path(CHROMIUM).exists():
    pytest.skip(f"no {CHROMIUM}: install Debian's chromium (apt-get install -y chromium)", allow_module_level=True)
playwright_api = pytest.importorskip("playwright.async_api", reason="playwright is not installed (the dev extra)")
uvicorn = pytest.importorskip("uvicorn", reason="uvicorn is not installed (the dev extra)")
pytest.importorskip("starlette", reason="the web extra is not installed")

import wfsub  # noqa: E402
from wfsub import Substrate, effect, seq, sleep, task, wait  # noqa: E402
from wfsub.contrib import web  # noqa: E402
from wfsub.stores import SqliteStore  # noqa: E402

ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]
SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "operations" / "web-inspector.png"


@pytest.mark.long
async def test_operator_lists_filters_opens_a_case_signals_it_and_watches_it_move_on(tmp_path: Path) -> None:
    """List, filter, open a case, see its node highlighted in the drawn SVG, send a signal from the form, and
    watch the case page (then the list) move on without a reload; retry a failed case from its page; open and cancel
    a case whose id holds a dot segment (`evil/../victim`) as itself; all with no CSP violation or script error."""
    release = anyio.Event()

    async def pack(ctx: Mapping[str, Any]) -> Any:
        await release.wait()  # the test lets the case move on once the page shows it waiting here
        return {"packed": True}

    async def charge(ctx: Mapping[str, Any]) -> Any:
        return {"charged": ctx["total"]}

    async def refuse(ctx: Mapping[str, Any]) -> Any:
        raise RuntimeError("card declined")

    order = seq(task(lambda c: {"total": 42}, name="price"), effect(charge, name="charge"), wait("approved"),
                effect(pack, name="pack"), task(lambda c: {"shipped": True}, name="ship"))
    workflows = {"order": order, "nap": seq(sleep(3600)), "broken": seq(effect(refuse, name="charge"))}

    async with Substrate(store=SqliteStore(tmp_path / "cases.db"), workflows=workflows) as sub:
        cases = {}
        for name in ("nap", "broken", "order", "order"):
            cases.setdefault(name, []).append((await sub.new_case(name, {"customer": "ana"})).case_id)
        cancelled = await sub.new_case("nap", {"customer": "bo"})
        await _until(sub, cancelled.case_id, "waiting_timer")
        await sub.cancel(cancelled.case_id, reason="customer asked")
        await _until(sub, cases["broken"][0], "failed")
        target, other = cases["order"]
        for case_id in (target, other):
            await _until(sub, case_id, "waiting_signal")

        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        server = uvicorn.Server(uvicorn.Config(web.app(sub, workflows=workflows), log_level="warning",
                                               lifespan="off", timeout_graceful_shutdown=1))
        async with anyio.create_task_group() as tg:
            tg.start_soon(server.serve, [sock])
            with anyio.fail_after(10):
                while not server.started:  # noqa: ASYNC110 - uvicorn has no start event
                    await anyio.sleep(0.01)
            base = f"http://127.0.0.1:{port}"
            try:
                await _drive(base, sub, target, other, cases["broken"][0], release, tmp_path)
            finally:
                release.set()
                server.should_exit = True
                server.force_exit = True  # the page's event streams stay open: do not wait for them


async def _drive(
    base: str, sub: Substrate, target: str, other: str, broken: str, release: anyio.Event, tmp: Path
) -> None:
    problems: list[str] = []
    playwright_api.expect.set_options(timeout=30_000)  # a bound for a loaded machine: each wait is on the DOM
    async with playwright_api.async_playwright() as pw:
        try:
            browser = await pw.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        except playwright_api.Error as exc:  # installed but unable to start here (a missing library, no /dev/shm)
            pytest.skip(f"{CHROMIUM} did not start: {str(exc).splitlines()[0]}")
        try:
            page = await browser.new_page(viewport={"width": 1400, "height": 1000})
            page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: problems.append(str(e)))
            requested: list[str] = []
            page.on("request", lambda r: requested.append(r.url))

            # the list: every case, then only those waiting for a signal
            await page.goto(base + "/")
            rows = page.locator("table.cases tbody tr[data-case]")
            await playwright_api.expect(rows).to_have_count(5)
            await page.select_option("#filter-state", "waiting_signal")
            await page.click("#filter-apply")
            await playwright_api.expect(rows).to_have_count(2)
            assert {await r.get_attribute("data-state") for r in await rows.all()} == {"waiting_signal"}
            await playwright_api.expect(page.locator("#live-dot.on")).to_have_count(1)  # its stream is open

            # a new case shows up in the list without a reload
            await page.evaluate("window.__sameDocument = true")
            late = await sub.new_case("order", {"customer": "cy"})
            await playwright_api.expect(page.locator(f'tr[data-case="{late.case_id}"]')).to_have_count(1)
            assert await page.evaluate("window.__sameDocument") is True

            # open a case: its drawing is an SVG with the node it waits at highlighted
            await page.click(f'td.id a:text-is("{target}")')
            await playwright_api.expect(page.locator("#case-state")).to_have_text("waiting_signal")
            highlighted = page.locator("#diagram svg g.node.highlight")
            await playwright_api.expect(highlighted).to_have_count(1)
            await playwright_api.expect(highlighted).to_contain_text("signal: approved")

            # send a signal from the form: the case moves on to the effect, then (released) to its end
            await page.fill("#signal-name", "approved")
            await page.fill("#signal-payload", '{"by": "ana"}')
            await page.click("#signal-send")
            await playwright_api.expect(page.locator("#message")).to_have_text("signal 'approved' sent")
            await playwright_api.expect(page.locator("#case-state")).to_have_text("waiting_effect")
            await playwright_api.expect(highlighted).to_contain_text("effect: pack")
            await playwright_api.expect(page.locator("#timeline")).to_contain_text("signal approved")
            await page.screenshot(path=str(tmp / "web-inspector.png"))
            await page.evaluate("window.__sameDocument = true")
            release.set()
            await playwright_api.expect(page.locator("#case-state")).to_have_text("done")
            await playwright_api.expect(page.locator("#timeline")).to_contain_text("ended done")
            await playwright_api.expect(page.locator("#diagram svg g.node.highlight")).to_have_count(0)
            assert await page.evaluate("window.__sameDocument") is True
            assert sub.data(target)["approved"] == {"by": "ana"}

            # the list shows the end too
            await page.goto(base + "/")
            await playwright_api.expect(page.locator(f'tr[data-case="{target}"]')).to_have_attribute(
                "data-state", "done")

            # retry the failed case from its page: re-opened, it fails again, and its timeline says it was retried
            await page.click(f'td.id a:text-is("{broken}")')
            await playwright_api.expect(page.locator("#case-state")).to_have_text("failed")
            await page.click("#retry-send")
            await playwright_api.expect(page.locator("#message")).to_have_text(
                "retried: the case is re-opened at the step that failed")
            await playwright_api.expect(page.locator("#timeline")).to_contain_text("retried (run 1)")
            await playwright_api.expect(page.locator("#case-state")).to_have_text("failed")

            # a case whose id holds a dot segment opens, and is cancelled, as itself (not as the case it names)
            for case_id in ("victim", "evil/../victim"):
                await sub.new_case("order", {"customer": "dee"}, case_id=case_id)
                await _until(sub, case_id, "waiting_signal")
            await page.goto(base + "/")
            await page.click('td.id a:text-is("evil/../victim")')
            await playwright_api.expect(page.locator("main h1 span.mono")).to_have_text("evil/../victim")
            await page.fill('input[name="reason"]', "opened by its odd id")  # (a blank reason is refused)
            await page.click("#cancel-send")
            await playwright_api.expect(page.locator("#case-state")).to_have_text("cancelled")
            assert sub.status("evil/../victim").state == "cancelled"
            assert sub.status("victim").state == "waiting_signal"
        finally:
            await browser.close()
    assert problems == []
    assert all(url.startswith(base) for url in requested), [u for u in requested if not u.startswith(base)]
    assert (tmp / "web-inspector.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    if os.environ.get("WFSUB_UPDATE_SCREENSHOT") == "1":
        SCREENSHOT.parent.mkdir(exist_ok=True)
        shutil.copyfile(tmp / "web-inspector.png", SCREENSHOT)
    assert other != target and wfsub.CaseState(sub.status(other).state) == "waiting_signal"


async def _until(sub: Substrate, case_id: str, state: str) -> None:
    with anyio.fail_after(10):
        while sub.status(case_id).state != state:  # noqa: ASYNC110 - the public API has no state-change event
            await anyio.sleep(0.005)

"""The case inspector (wfsub.contrib.web): server time of its pages over a big store.

A SQLite store is filled through the API with 100,000 cases (done, failed and waiting for a signal, started by
100 concurrent starters, each tagged with one of ten shards) and one case whose journal holds 10,000 records (a
loop of waits, signalled 10,000 times). Each page is then asked for through the app's ASGI interface (no network, no client: the time is the
server's), and the p50 of the samples is reported:

- the cases page (the newest 50 with the counts per state), the counts shared between requests as the app does
  (it reads them at most once a second); then the same with the counts read for every request (the first request
  after a quiet second pays it); then a filtered page deep in the list (`state=`, `before=`);
- the case page of the 10,000-record case (the timeline shows the start and the newest 500 records), its journal
  read for each request (`journal(case_id, newest=500)`: every record is read, only those shown are validated);
  then the journal kept from an earlier read at the same status, as the app does; then with `?journal=all`
  (every record validated);
- a page filtered by a tag that a tenth of the cases carry.

`WFSUB_BENCH_WEB_CASES` sets the number of cases (default 100,000). Filling the store goes through the API at the
runtime's pace (600-1,000 cases/s on the 2-core development machine shared with other jobs: about three minutes
there); a smaller number gives a quicker look.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio

from wfsub import Substrate, effect, loop, seq, task, wait

from ._figures import percentile, record

N_CASES = int(os.environ.get("WFSUB_BENCH_WEB_CASES", "100000"))
N_RECORDS = 10_000
STARTERS = 100
ROUNDS = 30
LIST_TARGET_MS = 50.0
CASE_TARGET_MS = 200.0


async def _refuse(ctx: Mapping[str, Any]) -> Any:
    raise RuntimeError("card declined")


WORKFLOWS = {
    "quick": seq(task(lambda c: {"done": True}, name="finish")),
    "broken": seq(effect(_refuse, name="charge")),
    "waits": seq(wait("go")),
    "chatty": loop(wait("tick"), until=lambda c: False),
}


async def _get(asgi: Any, path: str, query: str = "") -> tuple[int, float]:
    """(status, seconds) of one GET through the app's ASGI interface."""
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET", "scheme": "http",
             "path": path, "raw_path": path.encode(), "root_path": "", "query_string": query.encode(),
             "headers": [(b"host", b"bench")], "client": ("127.0.0.1", 1), "server": ("bench", 80)}
    status = 0

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]

    start = time.perf_counter()
    await asgi(scope, receive, send)
    return status, time.perf_counter() - start


async def _samples(asgi: Any, path: str, query: str = "", *, before: Any = None) -> list[float]:
    times = []
    for _ in range(ROUNDS):
        if before is not None:
            before()
        status, seconds = await _get(asgi, path, query)
        assert status == 200, (path, query, status)
        times.append(seconds)
    return times


async def measure(path: Path) -> dict[str, Any]:
    from wfsub.contrib import web

    out: dict[str, Any] = {}
    async with Substrate(store=path, workflows=WORKFLOWS, trace_level="none", retain_ended=100) as sub:
        start = time.perf_counter()
        kinds = ["quick"] * 17 + ["waits"] * 2 + ["broken"]  # 85% done, 10% waiting, 5% failed

        async def starter(first: int) -> None:
            for i in range(first, N_CASES, STARTERS):
                await sub.new_case(kinds[i % len(kinds)], case_id=f"c{i:06d}", tags={"shard": str(i % 10)})

        async with anyio.create_task_group() as tg:
            for first in range(STARTERS):
                tg.start_soon(starter, first)
        chatty = (await sub.new_case("chatty", case_id="chatty")).case_id

        async def ticker(first: int) -> None:
            for i in range(first, N_RECORDS - 1, STARTERS):
                await sub.signal(chatty, "tick", {"i": i})

        async with anyio.create_task_group() as tg:
            for first in range(STARTERS):
                tg.start_soon(ticker, first)
        while sub.cases(state="initializing", limit=1) or sub.cases(state="running", limit=1):
            await anyio.sleep(0.05)  # the last cases settle
        out["setup_s"] = time.perf_counter() - start
        out["records"] = len(await sub.journal(chatty))

        asgi = web.app(sub, workflows=WORKFLOWS)
        inspector = _inspector(asgi)
        await _get(asgi, "/")  # templates compiled, counts read once
        out["list"] = await _samples(asgi, "/")
        out["list_cold"] = await _samples(asgi, "/", before=inspector.counts_at.clear)
        middle = sub.cases(state="waiting_signal", limit=1)[0].order // 2
        out["list_deep"] = await _samples(asgi, "/", f"state=waiting_signal&before={middle}")
        out["list_tag"] = await _samples(asgi, "/", "tag=shard%3D3")
        out["case_first"] = await _samples(asgi, f"/case/{chatty}", before=inspector.journals.clear)
        out["case"] = await _samples(asgi, f"/case/{chatty}")
        out["case_all"] = await _samples(asgi, f"/case/{chatty}", "journal=all")
    return out


def _inspector(asgi: Any) -> Any:
    for route in asgi.inner.routes:
        owner = getattr(getattr(route, "endpoint", None), "__self__", None)
        if owner is not None:
            return owner
    raise RuntimeError("no inspector route")


def _verdict(ms: float, target: float) -> str:
    return "PASS" if ms <= target else "FAIL"


def run() -> list[str]:
    lines = [f"== web inspector ({N_CASES:,} cases, SQLite store) =="]
    try:
        import jinja2  # noqa: F401
        import starlette  # noqa: F401
    except ImportError as exc:
        return [*lines, f"not run: the web extra is not installed ({exc.name}); pip install '.[web]'"]
    with tempfile.TemporaryDirectory(prefix="wfsub-bench-") as folder:
        m = anyio.run(measure, Path(folder) / "web.db")
    ms = {key: percentile(m[key], 0.5) * 1e3 for key in ("list", "list_cold", "list_deep", "list_tag", "case_first", "case",
                                                      "case_all")}
    record("web_list_p50_ms", ms["list"], "ms")
    record("web_list_counts_read_p50_ms", ms["list_cold"], "ms")
    record("web_case_10k_p50_ms", ms["case_first"], "ms")
    record("web_case_10k_kept_p50_ms", ms["case"], "ms")
    lines.append(f"setup: {N_CASES:,} cases and a {m['records']:,}-record journal through the API in {m['setup_s']:.1f} s")
    lines.append(f"cases page, newest 50, counts shared     p50 {ms['list']:7.1f} ms  (target <= {LIST_TARGET_MS:.0f} ms) {_verdict(ms['list'], LIST_TARGET_MS)}")
    lines.append(f"  the same, counts read for the request  p50 {ms['list_cold']:7.1f} ms  (no target)")
    lines.append(f"  state= filter, before= deep in the list p50 {ms['list_deep']:7.1f} ms  (no target)")
    lines.append(f"  tag= filter (a tenth of the cases)     p50 {ms['list_tag']:7.1f} ms  (no target)")
    lines.append(f"case page, {m['records']:,}-record journal     p50 {ms['case_first']:7.1f} ms  (target <= {CASE_TARGET_MS:.0f} ms) {_verdict(ms['case_first'], CASE_TARGET_MS)}")
    lines.append(f"  the same, journal kept from a read     p50 {ms['case']:7.1f} ms  (no target)")
    lines.append(f"  the same with ?journal=all             p50 {ms['case_all']:7.1f} ms  (no target)")
    return lines

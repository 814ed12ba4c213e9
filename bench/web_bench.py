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


STREAM_CASES = 1_000  # cases, each signalled once a second
STREAM_SECONDS = 10
STREAM_SLOTS = 10  # the signals of a second are sent in this many slots, a tenth of the cases each
CASE_WATCHERS = 20


async def measure_stream() -> dict[str, Any]:
    """1,000 cases each changing once a second (1,000 signals/s, durable on a MemoryStore), watched by the list
    page's stream and by the case-page streams of 20 of them: per second, the signals sent and how late the
    sender's slots ran (a backlog shows as a lag that grows), and the updates each watcher received."""
    from wfsub.contrib import web
    from wfsub.stores import MemoryStore

    out: dict[str, Any] = {}
    async with Substrate(store=MemoryStore(), workflows=WORKFLOWS, trace_level="none") as sub:
        ids = [(await sub.new_case("chatty", case_id=f"s{i:04d}")).case_id for i in range(STREAM_CASES)]
        while sub.cases(state="initializing", limit=1) or sub.cases(state="running", limit=1):
            await anyio.sleep(0.05)
        asgi = web.app(sub, workflows=WORKFLOWS)
        stop = anyio.Event()
        views = ["view=cases", *(f"view=case&case={ids[i * (STREAM_CASES // CASE_WATCHERS)]}"
                                 for i in range(CASE_WATCHERS))]
        updates: list[list[float]] = [[] for _ in views]

        async def watch(n: int) -> None:
            scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET",
                     "scheme": "http", "path": "/events", "raw_path": b"/events", "root_path": "",
                     "query_string": views[n].encode(), "headers": [(b"host", b"bench")],
                     "client": ("127.0.0.1", 1), "server": ("bench", 80)}

            async def receive() -> dict[str, Any]:
                await stop.wait()
                return {"type": "http.disconnect"}

            async def send(message: dict[str, Any]) -> None:
                if message.get("body", b"").startswith(b"event: update"):
                    updates[n].append(time.perf_counter())

            await asgi(scope, receive, send)

        lags: list[tuple[int, float]] = []  # (second, how late its slot started)
        sent: list[int] = [0] * STREAM_SECONDS
        tick = 0
        async with anyio.create_task_group() as tg:
            for n in range(len(views)):
                tg.start_soon(watch, n)
            start = time.perf_counter()
            per_slot = STREAM_CASES // STREAM_SLOTS
            for slot in range(STREAM_SECONDS * STREAM_SLOTS):
                due = start + slot / STREAM_SLOTS
                now = time.perf_counter()
                if now < due:
                    await anyio.sleep(due - now)
                second = slot // STREAM_SLOTS
                lags.append((second, time.perf_counter() - due))
                part = ids[(slot % STREAM_SLOTS) * per_slot:(slot % STREAM_SLOTS + 1) * per_slot]
                tick += 1
                async with anyio.create_task_group() as senders:
                    for case_id in part:
                        senders.start_soon(sub.signal, case_id, "tick", {"i": tick})
                sent[second] += len(part)
            end = time.perf_counter()
            stop.set()
        out["sent"] = sent
        out["lag"] = [max(lag for s, lag in lags if s == second) for second in range(STREAM_SECONDS)]
        out["rate"] = sum(sent) / (end - start)
        out["updates_per_s"] = [len([t for t in u if start <= t <= end]) / (end - start) for u in updates]
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
    st = anyio.run(measure_stream)
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
    lag_ms = [round(lag * 1e3, 1) for lag in st["lag"]]
    grows = lag_ms[-1] > max(100.0, 2 * max(lag_ms[: len(lag_ms) // 2]))
    record("web_stream_rate_per_s", st["rate"], "/s")
    lines.append(f"event stream, {STREAM_CASES:,} cases changing each second, {STREAM_SECONDS} s, list + "
                 f"{CASE_WATCHERS} case watchers:")
    lines.append(f"  signals sent {st['rate']:,.0f}/s (target {STREAM_CASES:,}/s); the sender's worst lag per second "
                 f"(ms): {lag_ms} {'FAIL: it grows' if grows else 'PASS: no backlog growth'}")
    ups = st["updates_per_s"]
    lines.append(f"  updates per watcher per second: list {ups[0]:.1f}, cases {min(ups[1:]):.1f}-{max(ups[1:]):.1f}")
    return lines

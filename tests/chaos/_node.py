"""A process of the chaos campaign: `python -m tests.chaos._node CONFIG.json` (cwd: the repo root).

CONFIG's `mode` says which:

    pg              a node: a Substrate on the campaign's Postgres server (through its own proxy) that starts its
                    share of the plan's cases and makes the client calls of the next node's share
    sqlite          the owner of the SQLite store: starts the SQLite cases and runs them
    sqlite-client   an outside writer of the SQLite store: makes the SQLite cases' calls through its inbox

Each acts as a careful client: a call that failed with an error is made again with the same request id (a case
start with the same case id) until it returns; it prints one `ack` line per outcome (see `_workload.emit`), so
the campaign knows what was acknowledged. Calls acknowledged by an earlier process of the same index are in
CONFIG's `skip` and are not made again. It prints `ready` once open and `workload_done` when all its calls have
returned, then serves until its stdin closes.
"""

from __future__ import annotations

import json
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio

from wfsub import CaseExists, CaseNotFound, SignalRejected, StoreError, Substrate
from wfsub.stores import PostgresStore, SqliteStore, Store

from ._workload import FLOWS, NODE, CaseSpec, LeaseView, Op, WatchedStore, emit

ENDED = {"done", "failed", "cancelled"}
OPEN_FAILED = 3  # the exit status of a node whose store could not be opened (it printed an `open-failed` line)


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:400]


async def _until(t: float) -> None:
    delay = t - time.time()
    if delay > 0:
        await anyio.sleep(delay)


async def _t0(go: str) -> float:
    """When the plan's times count from: written by the campaign to the `go` file once every process is ready."""
    path = anyio.Path(go)
    while not await path.exists():  # noqa: ASYNC110 - another process writes it
        await anyio.sleep(0.1)
    return float(await path.read_text())


async def _start(sub: Substrate, spec: CaseSpec, go: str) -> None:
    await _until(await _t0(go) + spec.at)
    key = f"start:{spec.case_id}"
    for attempt in range(1, 10_000):
        try:
            await sub.new_case(spec.workflow, spec.data, case_id=spec.case_id)
        except CaseExists as exc:  # the same data: never raised for a start made again
            emit(ev="ack", op="start", case=spec.case_id, key=key, attempt=attempt, outcome="refused",
                 error=_error(exc))
            return
        except Exception as exc:  # a careful client starts again with the same case id
            emit(ev="ack", op="start", case=spec.case_id, key=key, attempt=attempt, outcome="error", error=_error(exc))
            await anyio.sleep(min(0.2 * attempt, 2.0))
            continue
        emit(ev="ack", op="start", case=spec.case_id, key=key, attempt=attempt, outcome="ok")
        return


Send = Callable[[CaseSpec, Op], Awaitable[None]]


async def _ops(read: Store, send: Send, spec: CaseSpec, skip: set[str]) -> None:
    for op in spec.ops:
        key = f"{op.kind}:{op.request_id}"
        if key in skip:
            continue
        while True:  # until the case waits for the signal (or has ended: then the call is not made)
            try:
                row = await read.row(spec.case_id)
            except Exception:
                row = None
            if row is not None and row.state in ENDED:
                emit(ev="ack", op=op.kind, case=spec.case_id, key=key, rid=op.request_id, outcome="not-sent",
                     state=row.state)
                return
            if row is not None and row.state == "waiting_signal" and op.name in row.signals:
                break
            await anyio.sleep(0.2)
        for attempt in range(1, 10_000):
            try:
                await send(spec, op)
            except SignalRejected as exc:
                emit(ev="ack", op=op.kind, case=spec.case_id, key=key, rid=op.request_id, attempt=attempt,
                     outcome="rejected", error=_error(exc))
                return
            except CaseNotFound as exc:  # not in the store yet as this process reads it
                emit(ev="ack", op=op.kind, case=spec.case_id, key=key, rid=op.request_id, attempt=attempt,
                     outcome="error", error=_error(exc))
            except Exception as exc:  # CommitUnknown, StoreError: made again with the same request id
                emit(ev="ack", op=op.kind, case=spec.case_id, key=key, rid=op.request_id, attempt=attempt,
                     outcome="error", error=_error(exc))
            else:
                emit(ev="ack", op=op.kind, case=spec.case_id, key=key, rid=op.request_id, attempt=attempt,
                     outcome="ok")
                break
            await anyio.sleep(min(0.2 * attempt, 2.0))


async def _workload(starts: list[CaseSpec], calls: list[CaseSpec], start: Callable[[CaseSpec], Awaitable[None]],
                    read: Store, send: Send, skip: set[str]) -> None:
    async with anyio.create_task_group() as tg:
        for spec in starts:
            if f"start:{spec.case_id}" not in skip:
                tg.start_soon(start, spec)
        for spec in calls:
            tg.start_soon(_ops, read, send, spec, skip)
    emit(ev="workload_done")


async def _serve() -> None:
    await anyio.to_thread.run_sync(sys.stdin.read)  # until the campaign closes our stdin


async def pg_node(cfg: dict[str, Any]) -> None:
    """A node; opening again while the node id's previous process (killed) still holds its lease, as a supervisor
    restarting a crashed node would (the store refuses the id until that lease expires)."""
    deadline = time.monotonic() + 3 * cfg["lease"] + 5.0
    while True:
        opened: list[bool] = []
        began = time.monotonic()
        try:
            await _pg_node(cfg, opened)
            return
        except StoreError as exc:
            if opened:
                raise
            if "holds that node id" in str(exc) and time.monotonic() < deadline:
                emit(ev="open-refused", node=cfg["node_id"], error=_error(exc))
                await anyio.sleep(0.5)
                continue
            # The store could not be opened: the campaign starts this process again and judges how soon it gave up.
            emit(ev="open-failed", node=cfg["node_id"], error=_error(exc), after=round(time.monotonic() - began, 3),
                 retry_for=cfg["retry_for"])
            sys.exit(OPEN_FAILED)


async def _pg_node(cfg: dict[str, Any], opened: list[bool]) -> None:
    specs = [CaseSpec.from_json(s) for s in cfg["specs"]]
    skip = set(cfg["skip"])
    NODE.id = cfg["node_id"]
    NODE.view = view = LeaseView(cfg["lease"])
    options = {"schema": cfg["schema"], "lease_seconds": cfg["lease"], "retry_for": cfg["retry_for"]}
    store = WatchedStore(cfg["dsn"], view, **options)
    reader = PostgresStore(cfg["dsn"], create=False, **options)
    async with Substrate(store=store, workflows=FLOWS, node_id=cfg["node_id"], trace_level="none",
                         evict_after=cfg["evict_after"]) as sub:
        opened.append(True)
        await reader.open(owner=False, owner_id=f"reader-{cfg['node_id']}")
        emit(ev="ready", node=cfg["node_id"])

        async def send(spec: CaseSpec, op: Op) -> None:
            if op.kind == "signal":
                await sub.signal(spec.case_id, op.name, {"by": cfg["node_id"]}, request_id=op.request_id)
            else:
                await sub.cancel(spec.case_id, reason="the plan cancels it", request_id=op.request_id)

        async def start(spec: CaseSpec) -> None:
            await _start(sub, spec, cfg["go"])

        me = cfg["index"]
        await _workload([s for s in specs if s.starter == me], [s for s in specs if s.sender == me], start, reader,
                        send, skip)
        await _serve()
        await reader.close()


async def sqlite_owner(cfg: dict[str, Any]) -> None:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # past a file size limit, writes fail with EFBIG: a full disk
    specs = [CaseSpec.from_json(s) for s in cfg["specs"]]
    skip = set(cfg["skip"])
    NODE.id = "sqlite"
    async with Substrate(store=cfg["path"], workflows=FLOWS, trace_level="none", evict_after=cfg["evict_after"],
                         node_id="sqlite-owner") as sub:
        emit(ev="ready", node="sqlite")
        async with anyio.create_task_group() as tg:
            for spec in specs:
                if f"start:{spec.case_id}" not in skip:
                    tg.start_soon(_start, sub, spec, cfg["go"])
        emit(ev="workload_done")
        await _serve()


async def sqlite_client(cfg: dict[str, Any]) -> None:
    specs = [CaseSpec.from_json(s) for s in cfg["specs"]]
    skip = set(cfg["skip"])
    store = SqliteStore(cfg["path"])
    while True:  # the owner creates the file
        try:
            await store.open(owner=False, owner_id="sqlite-client")
            break
        except Exception:
            await anyio.sleep(0.2)
    emit(ev="ready", node="sqlite-client")

    async def send(spec: CaseSpec, op: Op) -> None:
        if op.kind == "signal":
            body: dict[str, Any] = {"name": op.name, "payload": {"by": "sqlite-client"}}
        else:
            body = {"reason": "the plan cancels it", "compensate": True}
        await store.inbox_put(spec.case_id, op.kind, body, request_id=op.request_id, created_at=time.time())

    async def nothing(spec: CaseSpec) -> None:
        return None

    await _workload([], specs, nothing, store, send, skip)
    await _serve()
    await store.close()


if __name__ == "__main__":
    with open(sys.argv[1], encoding="utf-8") as f:
        config = json.load(f)
    mode = {"pg": pg_node, "sqlite": sqlite_owner, "sqlite-client": sqlite_client}[config["mode"]]
    anyio.run(mode, config)

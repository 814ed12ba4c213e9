"""Processes the durable tests start and kill: `python -m tests.durable._child MODE ARGS...` (cwd: the repo root).

    scenario NAME PATH SIDE     phase 1 of a restart scenario (`_flows.SCENARIOS`), SIGKILLing itself at its point
    load PATH SIDE SEED N       a Substrate under load (see `_load.py`); prints each acknowledged call at once
    hold PATH                   own the store with a Substrate until stdin closes; prints "owned PID OWNER"
    readonly PATH               enter a Substrate on a store the test made read-only (root's override dropped)
    full PATH                   run cases into a file size limit (RLIMIT_FSIZE, SIGXFSZ ignored) and past it

Modes that report print one JSON line last.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import sys
from typing import Any

import anyio

from wfsub import StoreError, Substrate

from . import _flows, _load


def report(**found: Any) -> None:
    print(json.dumps(found), flush=True)


async def scenario(name: str, path: str, side: str) -> None:
    _flows.SIDE.path = side
    await _flows.run_phase1(_flows.SCENARIOS[name], path, "kill")


async def hold(path: str) -> None:
    async with Substrate(store=path, workflows=_flows.WORKFLOWS) as sub:
        print(f"owned {os.getpid()} {sub._table.owner}", flush=True)
        await anyio.to_thread.run_sync(sys.stdin.read)


async def readonly(path: str) -> None:
    from tests.stores._child import drop_root_override

    drop_root_override()
    try:
        async with Substrate(store=path, workflows=_flows.WORKFLOWS) as sub:
            await sub.new_case("basic", {"n": 1}, case_id="ro-case")
    except StoreError as exc:
        report(error=str(exc), error_type=type(exc).__name__, cause=type(exc.__cause__).__name__)
        return
    report(error=None)


async def full(path: str) -> None:
    """Acknowledged cases before the limit; at the limit new_case and signal fail with StoreError and leave
    nothing half-written; with the limit raised the Substrate goes on and every acknowledged case completes."""
    acked: list[str] = []
    refused: list[str] = []
    errors: list[str] = []
    results: dict[str, Any] = {}
    pad = "x" * 30_000
    async with Substrate(store=path, workflows=_flows.WORKFLOWS) as sub:
        for i in range(3):
            await sub.new_case("charge_then_wait", {"n": i}, case_id=f"before-{i}")
            acked.append(f"before-{i}")
        for cid in acked:
            await _flows.until_state(sub, cid, "waiting_signal")
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # else the kernel kills us at the limit: we want EFBIG
        _, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
        sizes = [(await anyio.Path(p).stat()).st_size for p in (path, path + "-wal") if await anyio.Path(p).exists()]
        resource.setrlimit(resource.RLIMIT_FSIZE, (max(sizes) + 200_000, hard))
        for i in range(200):
            cid = f"big-{i}"
            try:
                await sub.new_case("charge_then_wait", {"n": i, "pad": pad}, case_id=cid)
                acked.append(cid)
            except StoreError as exc:
                refused.append(cid)
                errors.append(str(exc))
                if len(refused) >= 3:
                    break
        signal_error = None
        try:
            await sub.signal("before-0", "go", pad)
        except StoreError as exc:
            signal_error = str(exc)
        resource.setrlimit(resource.RLIMIT_FSIZE, (hard, hard))
        for cid in acked:
            if cid == "before-0" and signal_error is None:
                continue  # its signal went through while the disk was full
            await _flows.until_state(sub, cid, "waiting_signal")
            await sub.signal(cid, "go", "ok")
        await sub.new_case("basic", {"n": 1}, case_id="after")
        acked.append("after")
        for cid in acked:
            results[cid] = await sub.await_case(cid)
    report(acked=acked, refused=refused, errors=errors, signal_error=signal_error, results=results)


def main(argv: list[str]) -> None:
    mode, *rest = argv
    if mode == "scenario":
        anyio.run(scenario, *rest)
    elif mode == "load":
        path, side, seed, n = rest
        anyio.run(_load.child, path, side, int(seed), int(n))
    elif mode == "hold":
        anyio.run(hold, rest[0])
    elif mode == "readonly":
        anyio.run(readonly, rest[0])
    elif mode == "full":
        anyio.run(full, rest[0])
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main(sys.argv[1:])

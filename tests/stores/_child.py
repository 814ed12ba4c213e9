"""Processes the store tests start, kill and watch: `python _child.py MODE ARGS...`.

    crash PATH PREFIX SEED SYNC WRITES BACKEND
                                         write WRITES CaseWrites from 50 tasks on BACKEND (asyncio or trio);
                                         print "ack CASE SEQ,SEQ" as soon as each write returns
    unwoken PATH SYNC BACKEND            acknowledge 20 writes ("ack CASE SEQ"), then queue 10 more and SIGKILL
                                         this process right after their group commits, before any waiter is woken
    hold PATH OWNER_ID                   own the store until stdin closes; print "owned PID" once it does
    readonly PATH OWNER                  open a store the test made read-only (as a user without root's override)
    full PATH                            write under a small file size limit (RLIMIT_FSIZE) until the disk is "full"

Modes that report print one JSON line last.
"""

from __future__ import annotations

import ctypes
import json
import os
import random
import resource
import signal
import sys
from typing import Any

import anyio

from wfsub._errors import StoreError
from wfsub._store import CaseRow, CaseWrite, Snapshot
from wfsub.stores import Listing, PostgresStore, SqliteStore, Store

TASKS = 50


def row(case_id: str, state: str, last_seq: int, **fields: Any) -> CaseRow:
    return CaseRow(case_id=case_id, workflow="orders", fingerprint="fp", state=state, started_at=1.0,
                   updated_at=1.0 + last_seq, last_seq=last_seq, **fields)


async def crash(path: str, prefix: str, seed: int, synchronous: str, writes: int) -> None:
    """Cases written as the runtime writes them: `start` + row, inputs (1-3 records) + row, sometimes a snapshot,
    then `end` + row; each acknowledged write printed at once. The test kills this process at random moments."""
    store: Store = (
        PostgresStore(path) if path.startswith("postgresql://") else SqliteStore(path, synchronous=synchronous)
    )
    await store.open(owner=True, owner_id=f"crash-{prefix}")
    print("ready", flush=True)
    rng = random.Random(seed)
    budget = [writes]
    out = sys.stdout

    async def commit(change: CaseWrite) -> None:
        await store.write(change)
        out.write(f"ack {change.case_id} {','.join(str(r['seq']) for r in change.records)}\n")
        out.flush()

    async def worker(task: int) -> None:
        case = 0
        while budget[0] > 0:
            case_id = f"{prefix}-{task}-{case}"
            case += 1
            budget[0] -= 1
            await commit(CaseWrite(case_id, records=[{"seq": 0, "kind": "start", "case_id": case_id, "data": {}}],
                                   row=row(case_id, "running", 0)))
            seq = 0
            for _ in range(rng.randint(1, 6)):
                if budget[0] <= 0:
                    return
                budget[0] -= 1
                records = []
                for _ in range(rng.randint(1, 3)):
                    seq += 1
                    records.append({"seq": seq, "kind": "signal", "step": seq, "time": 1.0 + seq, "digest": "d",
                                    "name": "go", "payload": {"n": seq}, "request_id": f"{case_id}/{seq}"})
                snap = Snapshot(case_id, seq, 1, 1, {"after": seq}) if rng.random() < 0.3 else None
                await commit(CaseWrite(case_id, records=records, row=row(case_id, "waiting_signal", seq),
                                       snapshot=snap))
            seq += 1
            budget[0] -= 1
            await commit(CaseWrite(case_id, records=[{"seq": seq, "kind": "end", "time": 9.0, "outcome": "done"}],
                                   row=row(case_id, "done", seq, ended_at=9.0)))

    async with anyio.create_task_group() as tg:
        for task in range(TASKS):
            tg.start_soon(worker, task)
    await store.close()
    print("done", flush=True)


async def unwoken(path: str, synchronous: str) -> None:
    from wfsub._store._group import GroupQueue

    store = SqliteStore(path, synchronous=synchronous)
    await store.open(owner=True, owner_id="unwoken")
    for i in range(20):
        await store.write(CaseWrite(f"a{i}", records=[{"seq": 0, "kind": "start"}], row=row(f"a{i}", "running", 0)))
        print(f"ack a{i} 0", flush=True)
    assert store._writer is not None
    deliver = GroupQueue.deliver

    def die_once_committed(self: GroupQueue, group: list[Any], *, turns: bool = False) -> int:
        if any(job.label == "case 'u0'" for job in group):
            os.kill(os.getpid(), signal.SIGKILL)
        return deliver(self, group, turns=turns)

    GroupQueue.deliver = die_once_committed  # type: ignore[method-assign]
    async with anyio.create_task_group() as tg:
        for i in range(10):
            tg.start_soon(store.write, CaseWrite(f"u{i}", records=[{"seq": 0, "kind": "start"}],
                                                 row=row(f"u{i}", "running", 0)))
    print("not killed", flush=True)


async def hold(path: str, owner_id: str) -> None:
    store = SqliteStore(path)
    await store.open(owner=True, owner_id=owner_id)
    print(f"owned {os.getpid()}", flush=True)
    await anyio.to_thread.run_sync(sys.stdin.read)  # until the test closes our stdin (or kills us)
    await store.close()


def drop_root_override() -> None:
    """As root, give up the capabilities that bypass file permissions (root then meets a 0400 file like its owner
    does); as any other user there is nothing to drop."""
    if os.geteuid() != 0:
        return

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                    ("inheritable", ctypes.c_uint32)]

    libc = ctypes.CDLL(None, use_errno=True)
    header, data = Header(0x20080522, 0), (Data * 2)()  # _LINUX_CAPABILITY_VERSION_3
    if libc.capget(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capget")
    for half in data:
        half.effective = 0
    if libc.capset(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capset")


def report(error: BaseException | None, **extra: Any) -> None:
    found: dict[str, Any] = dict(extra)
    if error is not None:
        cause = error.__cause__
        found.update(error=str(error), error_type=type(error).__name__, cause=type(cause).__name__,
                     errorname=getattr(cause, "sqlite_errorname", None))
    print(json.dumps(found), flush=True)


async def readonly(path: str, owner: bool) -> None:
    drop_root_override()
    store = SqliteStore(path)
    try:
        await store.open(owner=owner, owner_id="readonly-test")
        await store.write(CaseWrite("x", records=[{"seq": 0, "kind": "start"}], row=row("x", "running", 0)))
    except StoreError as exc:
        report(exc)
        return
    await store.close()
    report(None)


async def full(path: str) -> None:
    """Fill the file size limit: a lone write fails, then a group of 20 fails whole; with the limit raised again
    the store goes on, and nothing of the failed writes is in it."""
    store = SqliteStore(path)
    await store.open(owner=True, owner_id="full-test")
    await store.write(CaseWrite("before", records=[{"seq": 0, "kind": "start"}], row=row("before", "running", 0)))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # else the kernel kills us at the limit: we want EFBIG
    _, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    size = await anyio.Path(path).stat()
    resource.setrlimit(resource.RLIMIT_FSIZE, (size.st_size + 256 * 1024, hard))
    pad = "x" * 20_000
    lone_error: StoreError | None = None
    written = 0
    for i in range(1000):
        try:
            await store.write(CaseWrite(f"lone{i}", records=[{"seq": 0, "kind": "start", "pad": pad}],
                                        row=row(f"lone{i}", "running", 0)))
            written += 1
        except StoreError as exc:
            lone_error = exc
            break
    group: list[str] = []

    async def one(k: int) -> None:
        try:
            await store.write(CaseWrite(f"group{k}", records=[{"seq": 0, "kind": "start", "pad": pad}],
                                        row=row(f"group{k}", "running", 0)))
            group.append("ok")
        except StoreError as exc:
            group.append(str(exc))

    async with anyio.create_task_group() as tg:
        for k in range(20):
            tg.start_soon(one, k)
    resource.setrlimit(resource.RLIMIT_FSIZE, (hard, hard))
    await store.write(CaseWrite("after", records=[{"seq": 0, "kind": "start"}], row=row("after", "running", 0)))
    kept = sorted(r.case_id for r in await store.cases(Listing(limit=10_000)))
    await store.close()
    report(lone_error, written=written, group=group, kept=kept)


def main(argv: list[str]) -> None:
    mode, path, *rest = argv
    if mode == "crash":
        prefix, seed, synchronous, writes, backend = rest
        anyio.run(crash, path, prefix, int(seed), synchronous, int(writes), backend=backend)
    elif mode == "unwoken":
        anyio.run(unwoken, path, rest[0], backend=rest[1])
    elif mode == "hold":
        anyio.run(hold, path, rest[0])
    elif mode == "readonly":
        anyio.run(readonly, path, rest[0] == "owner")
    elif mode == "full":
        anyio.run(full, path)
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main(sys.argv[1:])

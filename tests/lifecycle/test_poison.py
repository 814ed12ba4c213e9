"""Poison cases: a case whose process dies (or hangs) each time it is recovered, without a new journal record, is
suspended after `max_recoveries` recoveries instead of being recovered again; `retry` re-opens it after a fix."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from wfsub import SignalRejected, Substrate, effect, seq, task
from wfsub.testing import VirtualClock

from .. import _warm
from ..durable._util import ROOT, eventually
from ..stores import _pg
from . import _poison
from ._util import KINDS, node, store_maker


def child(mode: str, path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return _warm.run([sys.executable, "-m", "tests.lifecycle._poison", mode, str(path)], cwd=ROOT,
                     env={**os.environ, **env})


def last_json(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert done.returncode == 0, done.stderr[-4000:]
    found: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


def lingered(found: dict[str, Any]) -> None:
    """What a `linger` child reports of a poison case left alone: still suspended with its reason, a signal to it
    refused with that reason, and the other case run to its end beside it."""
    assert found["state"] == "suspended", found
    assert found["reason"].startswith(f"recovered {_poison.MAX_RECOVERIES} times without journaling a new record")
    assert found["refused"] is not None and "recovered 2 times" in found["refused"], found
    assert found["ok"] is True


def test_a_case_that_kills_its_process_each_time_is_suspended_then_retried(tmp_path: Path) -> None:
    """A real process SIGKILLed by its case's effect: recovered `max_recoveries` times, then suspended with the
    reason; then nothing loads it again (a later process's background passes, the version check of suspended
    cases included, nor a signal: refused) and that process lives; after a fix `retry` ends it done."""
    path = tmp_path / "cases.db"
    assert child("start", path).returncode == -signal.SIGKILL
    for _ in range(_poison.MAX_RECOVERIES):
        done = child("recover", path)
        assert done.returncode == -signal.SIGKILL, done.stderr[-3000:]
    found = last_json(child("recover", path))
    assert found["state"] == "suspended"
    assert found["reason"].startswith(f"recovered {_poison.MAX_RECOVERIES} times without journaling a new record")
    assert "then `retry` it" in found["reason"]
    done = child("linger", path)  # left alone: its effect does not run, this process lives
    assert done.returncode == 0, (done.returncode, done.stderr[-3000:])
    lingered(last_json(done))
    done = last_json(child("retry", path, POISON_FIXED="1"))
    assert done["state"] == "done" and done["data"]["survived"] is True and done["data"]["finished"] is True


def node_child(mode: str, schema: str, node_id: str) -> subprocess.CompletedProcess[str]:
    return _warm.run([sys.executable, "-m", "tests.lifecycle._poison_nodes", mode, _pg.database_dsn(), schema,
                      node_id], cwd=ROOT)


@pytest.mark.skipif(not _pg.ENABLED, reason=_pg.SKIP_REASON)
def test_a_case_that_kills_each_node_that_takes_it_over_is_suspended() -> None:
    """A case whose effect SIGKILLs its process, on Postgres nodes that each have a new node id (so only a
    takeover, never a restart's recovery, brings it back): taken over `max_recoveries` times, each taker killed,
    then the next taker suspends it with the reason instead of running it again; that node restarted under its
    id loads it no more (its version check of suspended cases included) and lives."""
    schema = _pg.new_schema()
    done = node_child("start", schema, "n0")
    assert done.returncode == -signal.SIGKILL, done.stderr[-3000:]
    for i in range(1, _poison.MAX_RECOVERIES + 1):
        done = node_child("takeover", schema, f"n{i}")
        assert done.returncode == -signal.SIGKILL, done.stderr[-3000:]
    found = last_json(node_child("takeover", schema, f"n{_poison.MAX_RECOVERIES + 1}"))
    assert found["state"] == "suspended"
    assert found["reason"].startswith(f"recovered {_poison.MAX_RECOVERIES} times without journaling a new record")
    done = node_child("linger", schema, f"n{_poison.MAX_RECOVERIES + 1}")
    assert done.returncode == 0, (done.returncode, done.stderr[-3000:])
    lingered(last_json(done))


class Hang:
    event: anyio.Event | None = None
    calls = 0


async def hang(c: dict[str, Any]) -> dict[str, Any]:
    Hang.calls += 1
    if Hang.event is not None:
        await Hang.event.wait()
    return {"answered": True}


HANGS = {"h": seq(task(lambda c: {"ready": True}), effect(hang, name="hang"), task(lambda c: {"over": True}))}


@pytest.mark.parametrize("kind", KINDS)
async def test_a_case_that_hangs_each_time_is_suspended_and_progress_resets_the_count(
    kind: str, tmp_path: Path
) -> None:
    """Recovered while its journal stands still, a case is suspended on the recovery past `max_recoveries`; a
    later open's background passes leave it alone and a signal is refused; a retry is a new record, so after it
    the count starts again and the case is recovered and finishes."""
    make = store_maker(kind, tmp_path)
    Hang.event = anyio.Event()
    async with Substrate(store=make(), workflows=HANGS, max_recoveries=2, **node(kind)) as sub:
        await sub.new_case("h", case_id="h1")
        await eventually(lambda: sub.status("h1").state == "waiting_effect")
    for _ in range(2):  # two recoveries: the effect starts again each time and hangs
        async with Substrate(store=make(), workflows=HANGS, max_recoveries=2, **node(kind)) as sub:
            await eventually(lambda: sub.status("h1").state == "waiting_effect")
    async with Substrate(store=make(), workflows=HANGS, max_recoveries=2, **node(kind)) as sub:
        status = sub.status("h1")
        assert status.state == "suspended" and "recovered 2 times without journaling" in (status.suspended_reason or "")
        assert [s.case_id for s in sub.cases(state="suspended")] == ["h1"]
    calls = Hang.calls
    clock = VirtualClock(time.time())
    async with Substrate(store=make(), workflows=HANGS, max_recoveries=2, clock=clock, **node(kind)) as sub:
        await clock.settle()  # (its version check of suspended cases included)
        with pytest.raises(SignalRejected, match="it is suspended: recovered 2 times.* until it is retried"):
            await sub.signal("h1", "go")
        assert sub.status("h1").state == "suspended" and Hang.calls == calls  # left alone, its effect not run
    async with Substrate(store=make(), workflows=HANGS, max_recoveries=2, **node(kind)) as sub:
        await sub.retry("h1")
        await eventually(lambda: sub.status("h1").state == "waiting_effect")
    async with Substrate(store=make(), workflows=HANGS, max_recoveries=2, **node(kind)) as sub:
        Hang.event.set()  # recovered again (the retry was progress), and answered this time
        assert (await sub.await_case("h1"))["over"] is True

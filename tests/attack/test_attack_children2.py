"""Attacks on child cases whose waiting step their parent withdrew while it lives on, on cases cancelled in their
queue, and on queue claims whose store answer was lost: SIGKILLs at the wrong moment, store outages, two nodes."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import anyio
import pytest

from wfsub import Queue, Substrate, seq, wait
from wfsub.stores import PostgresStore

from .. import _warm
from ..durable._util import ROOT, eventually, kinds
from ..stores import _pg
from ..stores._proxy import Proxy

WAITS = seq(wait("go"))


def pg() -> tuple[str, str]:
    if not _pg.ENABLED:
        pytest.skip(_pg.SKIP_REASON)
    return _pg.database_dsn(), _pg.new_schema()


async def test_the_status_of_a_case_in_memory_answers_while_the_store_is_out_on_a_substrate_with_queues() -> None:
    """A case that never went through a queue, running in memory: its status answers from memory while the
    Postgres store is unreachable, as it does on a Substrate without queues."""
    dsn, schema = pg()
    proxy = Proxy(dsn)
    store = PostgresStore(proxy.dsn, schema=schema, retry_for=0.5, sync_timeout=0.5)
    async with Substrate(store=store, workflows={"waits": WAITS}, queues={"q": Queue()}) as sub:
        await sub.new_case("waits", case_id="w")
        await eventually(lambda: sub.status("w").state == "waiting_signal")
        proxy.down()
        try:
            assert sub.status("w").state == "waiting_signal"
        finally:
            proxy.up()


def spec_of(kind: str, tmp_path: Path) -> str:
    if kind == "sqlite":
        return str(tmp_path / "cases.db")
    dsn, schema = pg()
    return f"{dsn}{'&' if '?' in dsn else '?'}schema={schema}&lease_seconds=0.5"


@pytest.mark.parametrize("shape", ["mi", "queued", "nested"])
@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
async def test_children_of_a_cancelled_region_end_cancelled_once_after_a_sigkill_in_their_compensation(
    kind: str, shape: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGKILLed in the first compensation a withdrawn child runs (an mi of children, an mi of queued children, a
    child waiting for its own child): after a restart each child ends cancelled with one cancel record, each
    compensation completes once, and the parent lives on waiting."""
    from ._kids_child import QUEUES, WORKFLOWS, waiting

    monkeypatch.setenv("WFSUB_KIDS_DIR", str(tmp_path))
    spec = spec_of(kind, tmp_path)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with anyio.fail_after(60):
        done = await _warm.run_process([sys.executable, "-m", "tests.attack._kids_child", spec, shape], cwd=ROOT,
                                       env=env)
    assert done.returncode == -9, (done.stdout.decode(), done.stderr.decode()[-3000:])
    assert done.stdout.decode().split() == ["ready"], done.stdout
    for _ in range(2):
        async with Substrate(store=spec, workflows=WORKFLOWS, queues=QUEUES) as sub:
            for child in waiting(shape):
                await eventually(lambda child=child: sub.status(child).state == "cancelled")
                assert kinds(await sub.journal(child)).count("cancel") == 1, (child, kinds(await sub.journal(child)))
            await eventually(lambda: sub.status("P").state == "waiting_signal")
    undone = sorted((tmp_path / "undone").read_text().split())
    if shape == "queued":  # (the one still in its queue when cancelled never ran its step)
        assert undone in (["a", "b"], ["a", "c"], ["b", "c"], ["a", "b", "c"]), undone
    else:
        assert undone == (["G", "M"] if shape == "nested" else ["a", "b", "c"]), undone

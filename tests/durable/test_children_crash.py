"""A process SIGKILLed between cancelling a parent case and cancelling the child it waits for: the next
Substrate on the store cancels the child (with compensation) exactly once; a child the parent abandons or did not
wait for runs on. SQLite and Postgres."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from wfsub import Queue, Substrate, par, seq, start_case, task, wait

from .. import _warm
from ._util import ROOT, eventually, kinds

CHILD = seq(wait("go"), task(lambda c: {"done": True}))
PARENT = seq(par(
    start_case("child"),
    start_case("child", case_id=lambda c: "abandoned", on_parent_cancel="abandon"),
    start_case("child", case_id=lambda c: "unwaited", wait=False),
    start_case("child", case_id=lambda c: "queued-a", queue="kids"),
    start_case("child", case_id=lambda c: "queued-b", queue="kids"),
    wait("never"),
))
WORKFLOWS: dict[str, Any] = {"parent": PARENT, "child": CHILD}
QUEUES = {"kids": Queue(concurrency=1)}
CHILD_ID = "P/seq[0].par[0].start_case"


def spec_of(kind: str, tmp_path: Path) -> str:
    if kind == "sqlite":
        return str(tmp_path / "cases.db")
    from ..stores import _pg

    if not _pg.ENABLED:
        pytest.skip(_pg.SKIP_REASON)
    dsn = _pg.database_dsn()
    return f"{dsn}{'&' if '?' in dsn else '?'}schema={_pg.new_schema()}&lease_seconds=0.5"


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
async def test_a_child_whose_parent_ended_before_its_cancel_is_cancelled_once_after_a_sigkill(
    kind: str, tmp_path: Path
) -> None:
    """Killed after the parent's cancelled end is durable and before the child's cancel was sent: the next
    Substrate cancels the waited-for children once (one cancel record, across another restart too; the one still
    queued in its queue, whichever of the two the queue took first); the abandoned and the unwaited children stay
    live."""
    spec = spec_of(kind, tmp_path)
    with anyio.fail_after(120):  # (a bound against a hang, not an expected duration)
        done = await _warm.run_process([sys.executable, "-m", "tests.durable._cancel_child", spec], cwd=ROOT)
    assert done.returncode == -9, done.stderr.decode()[-3000:]
    assert done.stdout.decode().split() == ["parent-ended"], done.stdout
    for _ in range(2):
        async with Substrate(store=spec, workflows=WORKFLOWS, queues=QUEUES) as sub:
            assert sub.status("P").state == "cancelled"
            for child in (CHILD_ID, "queued-a", "queued-b"):
                await eventually(lambda child=child: sub.status(child).state == "cancelled")
            ran = next(c for c in ("queued-a", "queued-b") if sub.status(c).started_at is not None)
            for child in (CHILD_ID, ran):
                assert sub.status(child).cancel_reason == "its parent 'P' was cancelled"
            for child in (CHILD_ID, "queued-a", "queued-b"):
                assert kinds(await sub.journal(child)).count("cancel") == 1
            for other in ("abandoned", "unwaited"):
                assert sub.status(other).state == "waiting_signal"

"""A process SIGKILLed between withdrawing a parent's waiting `start_case` step (its region cancelled) and
cancelling the child, while the parent lives on: the next Substrate on the store (or, on Postgres, the node that
takes the parent over) cancels the child with compensation exactly once, whether the parent's row still said it
ran or already said it waited for a signal; a child the parent abandons, or still waits for, runs on. SQLite and
Postgres."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from wfsub import Queue, Substrate, effect, par, saga, scope, start_case, wait

from ._util import ROOT, eventually, kinds
from .test_children_crash import spec_of

UNDONE: list[str] = []


async def do(ctx: Any) -> None:
    return None


async def undo(ctx: Any) -> None:
    UNDONE.append(ctx["who"])


CHILD = saga((effect(do, name="do"), effect(undo, name="undo")), wait("go"))


def kids() -> Any:
    return scope("kids", par(
        start_case("child", data=lambda c: {"who": "waited"}, case_id=lambda c: "waited"),
        start_case("child", data=lambda c: {"who": "abandoned"}, case_id=lambda c: "abandoned",
                   on_parent_cancel="abandon"),
        start_case("child", data=lambda c: {"who": "queued-a"}, case_id=lambda c: "queued-a", queue="kids"),
        start_case("child", data=lambda c: {"who": "queued-b"}, case_id=lambda c: "queued-b", queue="kids"),
    ))


# "live": a child outside the region is still waited for (its step stays in flight); "parked": nothing is left in
# flight once the region is withdrawn, so the parent's row says it waits for a signal.
LIVE = par(kids(), start_case("child", data=lambda c: {"who": "kept"}, case_id=lambda c: "kept"), wait("never"))
PARKED = par(kids(), wait("never"))
WORKFLOWS: dict[str, Any] = {"live": LIVE, "parked": PARKED, "child": CHILD}
QUEUES = {"kids": Queue(concurrency=1)}


@pytest.mark.parametrize("when", ["live", "parked"])
@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
async def test_a_child_whose_step_was_withdrawn_before_its_cancel_is_cancelled_once_after_a_sigkill(
    kind: str, when: str, tmp_path: Path
) -> None:
    """Killed after the region's cancel is durable and before the withdrawn step cancelled its child: the next
    Substrate cancels the children of the withdrawn steps once, compensating (one cancel record each, across
    another restart too; the one still queued in its queue), and leaves the abandoned child and the child whose
    step is still in flight running; the parent lives on."""
    spec = spec_of(kind, tmp_path)
    with anyio.fail_after(120):  # (a bound on a hang: the process dies by its own hand well before)
        done = await anyio.run_process([sys.executable, "-m", "tests.durable._withdrawn_child", spec, when],
                                       cwd=ROOT, check=False)
    assert done.returncode == -9, done.stderr.decode()[-3000:]
    assert done.stdout.decode().split() == [when], done.stdout
    UNDONE.clear()
    for _ in range(2):
        async with Substrate(store=spec, workflows=WORKFLOWS, queues=QUEUES) as sub:
            for child in ("waited", "queued-a", "queued-b"):
                await eventually(lambda child=child: sub.status(child).state == "cancelled")
            journals = {child: await sub.journal(child) for child in ("waited", "queued-a", "queued-b")}
            for child, journal in journals.items():
                assert kinds(journal).count("cancel") == 1
                if "effect" in kinds(journal):  # it started (the queue starts either queued child first, and
                    # the other too if it made room before the cancel reached that one)
                    assert "its parent 'P'" in (sub.status(child).cancel_reason or "")
            # compensated once each, those whose `do` had run (a child cancelled in its queue never ran it)
            did = sorted(child for child, journal in journals.items() if _did(journal))
            assert "waited" in did
            assert sub.status("abandoned").state == "waiting_signal"
            if when == "live":
                assert sub.status("kept").state == "waiting_signal"
                await eventually(lambda: [e.path for e in sub.status("P").effects] == ["par[1].start_case"])
            await eventually(lambda: sub.status("P").state == ("waiting_effect" if when == "live" else
                                                               "waiting_signal"))
    assert sorted(UNDONE) == did, (UNDONE, did)


def _did(journal: list[Any]) -> bool:
    """Whether the child's `do` effect ran (its result is journaled, with no error)."""
    return any(r.kind == "effect" and getattr(r, "name", None) == "do" and getattr(r, "error", None) is None
               for r in journal)

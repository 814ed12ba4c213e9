"""`fork`: a new case from a prefix of another's journal, on MemoryStore, SQLite and Postgres; forking at every
record of a real journal gives what a replay of that prefix gives, then runs on to the origin's result."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from wfsub import CaseExists, CaseNotFound, Substrate, effect, replay, seq, task, wait
from wfsub.lowlevel import fork_records

from ..durable._util import eventually
from ._util import KINDS, node, store_maker


class Gate:
    event: anyio.Event | None = None


GATE = Gate()


def prepare(c: dict[str, Any]) -> dict[str, Any]:
    return {"prepared": c["amount"] * 2}


async def pay(c: dict[str, Any]) -> dict[str, Any]:
    if GATE.event is not None:
        await GATE.event.wait()  # a fork's payment waits here until the test has looked at the fork
    return {"paid": c["amount"]}


def after_pay(c: dict[str, Any]) -> dict[str, Any]:
    return {"after_pay": c["paid"] + 1}


def finish(c: dict[str, Any]) -> dict[str, Any]:
    return {"finished": c["approval"]["by"]}


FLOW = seq(task(prepare), wait("approve", into="approval"), effect(pay, name="pay"), task(after_pay), wait("ship"),
           task(finish))
PARKED = ("waiting_signal", "waiting_effect", "done")


async def drive(sub: Substrate, case_id: str) -> Any:
    """Send a forked case the signals it waits for until it ends; its result."""
    while True:
        await eventually(lambda: sub.status(case_id).state in PARKED)
        status = sub.status(case_id)
        if status.ended:
            return await sub.await_case(case_id)
        if "approve" in status.signals:
            await sub.signal(case_id, "approve", {"by": "ann"})
        elif "ship" in status.signals:
            await sub.signal(case_id, "ship")
        else:  # the payment runs (a fork's waits at the gate until it opens)
            if GATE.event is not None:
                GATE.event.set()
            await eventually(lambda: sub.status(case_id).state != "waiting_effect")


@pytest.mark.parametrize("kind", KINDS)
async def test_a_fork_at_every_record_equals_a_replay_of_that_prefix(kind: str, tmp_path: Path) -> None:
    """For each record of a real journal, a fork there holds that prefix (its start naming the origin), has the
    data a replay of the prefix has, keeps the origin's tags, and runs on to the origin's result."""
    GATE.event = None
    make = store_maker(kind, tmp_path)
    async with Substrate(store=make(), workflows={"flow": FLOW}, **node(kind)) as sub:
        await sub.new_case("flow", {"amount": 5}, case_id="origin", tags={"customer": "c-17"})
        await sub.signal("origin", "approve", {"by": "ann"})
        await eventually(lambda: "ship" in sub.status("origin").signals)
        await sub.signal("origin", "ship")
        expected = await sub.await_case("origin")
        journal = [r.model_dump() for r in await sub.journal("origin")]
        assert [r["kind"] for r in journal] == ["start", "signal", "effect", "signal", "end"]
        for record in journal[:-1]:
            at = record["seq"]
            GATE.event = anyio.Event()
            fork = await sub.fork("origin", at=at, new_case_id=f"fork-{at}")
            await eventually(lambda fork=fork: sub.status(fork.case_id).state in PARKED)
            forked = [r.model_dump() for r in await sub.journal(fork.case_id)]
            prefix = journal[: at + 1]
            assert forked[0]["forked_from"] == {"case_id": "origin", "seq": at}
            assert forked[0]["case_id"] == fork.case_id
            strip = ("case_id", "forked_from")
            assert {k: v for k, v in forked[0].items() if k not in strip} == {
                k: v for k, v in prefix[0].items() if k not in strip
            }
            assert forked[1 : at + 1] == prefix[1:]
            report = replay(FLOW, prefix)
            assert report.divergence is None
            assert sub.data(fork.case_id) == report.data, at
            status = fork.status()
            assert status.forked_from == "origin" and status.tags == {"customer": "c-17"}
            assert await drive(sub, fork.case_id) == expected
            GATE.event.set()
        assert [s.case_id for s in sub.cases(tags={"customer": "c-17"})][-1] == "origin"


@pytest.mark.parametrize("kind", KINDS)
async def test_a_fork_survives_a_restart(kind: str, tmp_path: Path) -> None:
    """A fork waiting for a signal is in the store: after a restart it resumes, still naming its origin."""
    GATE.event = None
    make = store_maker(kind, tmp_path)
    async with Substrate(store=make(), workflows={"flow": FLOW}, **node(kind)) as sub:
        await sub.new_case("flow", {"amount": 2}, case_id="origin")
        fork = await sub.fork("origin", at=0)
        assert fork.case_id != "origin"
        await eventually(lambda: sub.status(fork.case_id).state == "waiting_signal")
    async with Substrate(store=make(), workflows={"flow": FLOW}, **node(kind)) as sub:
        assert sub.status(fork.case_id).forked_from == "origin"
        assert await drive(sub, fork.case_id) == {
            "amount": 2, "prepared": 4, "approval": {"by": "ann"}, "paid": 2, "after_pay": 3, "ship": None,
            "finished": "ann",
        }


async def test_fork_refuses_what_it_cannot_copy(tmp_path: Path) -> None:
    """An `at` outside the journal, a taken new id, an unknown origin and a bad `at` are refused with the fix."""
    async with Substrate(store=str(tmp_path / "s.db"), workflows={"flow": FLOW}) as sub:
        await sub.new_case("flow", {"amount": 1}, case_id="origin")
        with pytest.raises(ValueError, match=r"case 'origin' has no record 7: its journal holds records 0 to 0"):
            await sub.fork("origin", at=7)
        with pytest.raises(TypeError, match="at must be the seq of a record"):
            await sub.fork("origin", at="1")  # type: ignore[arg-type]
        with pytest.raises(CaseExists):
            await sub.fork("origin", at=0, new_case_id="origin")
        with pytest.raises(CaseNotFound):
            await sub.fork("nope", at=0)
        assert [s.case_id for s in sub.cases()] == ["origin"]


def test_fork_of_a_compacted_journal_names_the_first_record_kept() -> None:
    """A journal whose records before a snapshot were removed: an `at` before it names the first record kept."""
    compacted = [{"seq": 40, "kind": "snapshot"}, {"seq": 41, "kind": "signal", "step": 3}]
    with pytest.raises(ValueError, match=r"record 12 of case 'c' is no longer kept .* seq 40, the first record"):
        fork_records("c", compacted, 12, "new", 0.0)

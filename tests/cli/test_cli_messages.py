"""What the `wfsub` command tells a person about a case: times, suspended cases, compensations, region cancels,
replayed failures. Run as a subprocess against a SQLite store written by a real Substrate in the test."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from wfsub import CaseCancelled, CaseFailed, Substrate, seq, wait

from ..durable._util import eventually
from .test_cli import anyio_backend, here, wfsub  # noqa: F401  (fixtures)

pytestmark = pytest.mark.anyio

FLOWS = """
from wfsub import effect, saga, scope, seq, task, wait

class LedgerRejected(Exception):
    pass

async def reserve(d):
    return {"reserved": True}

async def release(d):
    return {"released": True}

async def post(d):
    raise LedgerRejected("amount 5000 over the limit")

loan = seq(saga((effect(reserve, name="reserve"), effect(release, name="release")),
                (task(lambda d: {"held": True}, name="hold"), task(lambda d: {"held": False}, name="unhold")),
                wait("decision")))
regional = seq(scope("decision", saga((effect(reserve, name="reserve"), effect(release, name="release")),
                                      wait("decision"))))
ledger = seq(saga((effect(reserve, name="reserve"), effect(release, name="release")), effect(post, name="post")))
WORKFLOWS = {"loan": loan, "regional": regional, "ledger": ledger}
"""

ISO = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?\+00:00")


@pytest.fixture
def loans(here: Path) -> Path:  # noqa: F811
    (here / "loanflows.py").write_text(FLOWS)
    return here


def workflows() -> dict[str, object]:
    import importlib

    return importlib.import_module("loanflows").WORKFLOWS  # type: ignore[no-any-return]


async def test_times_people_read_are_iso_8601_with_their_zone_and_json_keeps_the_epoch(loans: Path) -> None:
    """cases, show, journal and trace show ISO 8601 times with a zone; --json keeps the epoch beside `_iso`."""
    async with Substrate(store=loans / "cases.db", workflows=workflows()) as sub:
        await sub.new_case("loan", {}, case_id="L-1")
        await eventually(lambda: sub.status("L-1").state == "waiting_signal")
        for args in (("cases", "cases.db"), ("show", "cases.db", "L-1"),
                     ("trace", "cases.db", "-w", "loanflows:WORKFLOWS", "L-1")):
            ran = await wfsub(loans, *args)
            assert ran.code == 0 and ISO.search(ran.out), (args, ran.out, ran.err)
        row = json.loads((await wfsub(loans, "cases", "cases.db", "--json")).out)
        assert isinstance(row["started_at"], float) and ISO.fullmatch(row["started_at_iso"])
        shown = json.loads((await wfsub(loans, "show", "cases.db", "L-1", "--json")).out)
        assert isinstance(shown["started_at"], float) and ISO.fullmatch(shown["started_at_iso"])
        first = json.loads((await wfsub(loans, "journal", "cases.db", "L-1")).out.splitlines()[0])
        assert isinstance(first["time"], float) and ISO.fullmatch(first["time_iso"])
        event = json.loads((await wfsub(loans, "trace", "cases.db", "-w", "loanflows:WORKFLOWS", "L-1", "--json"))
                           .out.splitlines()[0])
        assert isinstance(event["time"], float) and ISO.fullmatch(event["time_iso"])


async def test_a_suspended_case_is_listed_as_waiting_for_a_version_first(loans: Path) -> None:
    """cases and show say a suspended case waits for a version that can run it, and why, before its signals."""
    async with Substrate(store=loans / "cases.db", workflows=workflows()) as sub:
        await sub.new_case("loan", {}, case_id="L-1")
        await eventually(lambda: sub.status("L-1").state == "waiting_signal")
    async with Substrate(store=loans / "cases.db", workflows={"other": seq(wait("x"))}) as sub:
        await eventually(lambda: sub.status("L-1").state == "suspended")
        ran = await wfsub(loans, "cases", "cases.db")
        line = next(line for line in ran.out.splitlines() if line.startswith("L-1"))
        waiting = line.split("suspended", 1)[1]
        assert waiting.index("a workflow version that can run it") < waiting.index("then signal decision")
        assert "'loan'" in waiting  # the reason: no workflow 'loan' is registered
        ran = await wfsub(loans, "show", "cases.db", "L-1")
        lines = ran.out.splitlines()
        suspended = next(i for i, line in enumerate(lines) if line.startswith("suspended"))
        assert "waits for a workflow version that can run it" in lines[suspended]
        assert suspended < next(i for i, line in enumerate(lines) if line.startswith("then waits for"))
        row = json.loads((await wfsub(loans, "cases", "cases.db", "--json")).out)
        assert row["suspended_reason"] and "'loan'" in row["suspended_reason"]


async def test_show_lists_the_compensations_of_a_cancelled_case_with_their_outcomes(loans: Path) -> None:
    """show names each compensation a cancel ran and its outcome, as it does for a failed case."""
    async with Substrate(store=loans / "cases.db", workflows=workflows()) as sub:
        handle = await sub.new_case("loan", {}, case_id="L-1")
        await eventually(lambda: sub.status("L-1").state == "waiting_signal")
        await sub.cancel("L-1", reason="customer withdrew")
        with pytest.raises(CaseCancelled):
            await handle.result()
        failed = await sub.new_case("ledger", {}, case_id="G-1")
        with pytest.raises(CaseFailed):
            await failed.result()
    for case_id in ("L-1", "G-1"):
        ran = await wfsub(loans, "show", "cases.db", case_id)
        line = next(line for line in ran.out.splitlines() if line.startswith("compensated"))
        assert "release at seq[0].saga[0.compensation].effect: done" in line, ran.out
    ran = await wfsub(loans, "show", "cases.db", "L-1")
    assert "unhold at seq[0].saga[1.compensation].task: done" in ran.out  # a task: where, from the summary
    shown = json.loads((await wfsub(loans, "show", "cases.db", "L-1", "--json")).out)
    assert shown["compensations"] == [
        {"name": "release", "path": "seq[0].saga[0.compensation].effect", "outcome": "done", "error": None},
        {"name": "unhold", "path": "seq[0].saga[1.compensation].task", "outcome": "done", "error": None},
    ]


async def test_a_region_cancel_that_ends_the_case_says_which_region_and_why(loans: Path) -> None:
    """`wfsub cancel --region` on a region holding the case's last thread: the case says that cancel ended it."""
    async with Substrate(store=loans / "cases.db", workflows=workflows()) as sub:
        handle = await sub.new_case("regional", {}, case_id="R-1")
        await eventually(lambda: sub.status("R-1").state == "waiting_signal")
        ran = await wfsub(loans, "cancel", "cases.db", "R-1", "--region", "decision")
        assert ran.code == 0, ran.err
        with pytest.raises(CaseCancelled) as info:
            await handle.result()
    text = str(info.value)
    assert "cancel_region('decision') ended it" in text and "at seq[0].scope" in text
    assert "held every thread the case had left" in text and "root thread" not in text
    ran = await wfsub(loans, "show", "cases.db", "R-1")
    assert "cancel_region('decision') ended it" in ran.out


async def test_trace_shows_a_replayed_failure_as_the_steps_own_error(loans: Path) -> None:
    """trace shows an effect's failure with its own type and message, never wrapped as RestoredError(...)."""
    async with Substrate(store=loans / "cases.db", workflows=workflows()) as sub:
        failed = await sub.new_case("ledger", {}, case_id="G-1")
        with pytest.raises(CaseFailed):
            await failed.result()
    ran = await wfsub(loans, "trace", "cases.db", "-w", "loanflows:WORKFLOWS", "G-1")
    line = next(line for line in ran.out.splitlines() if "effect_failed" in line)
    assert 'type="LedgerRejected"' in line and "amount 5000 over the limit" in line
    assert "RestoredError" not in ran.out


async def test_the_command_reads_a_registry_of_workflow_entries(loans: Path) -> None:
    """validate and graph take a dict whose entries are Workflow(term, input=Model), alone or among terms."""
    (loans / "typedflows.py").write_text(
        "import pydantic\nfrom wfsub import Workflow, seq, task, wait\n"
        "class Loan(pydantic.BaseModel):\n    amount: int\n"
        "flow = seq(wait('decision'))\n"
        "WORKFLOWS = {'loan': [flow, Workflow(flow, input=Loan)], 'plain': Workflow(flow)}\n"
    )
    ran = await wfsub(loans, "validate", "typedflows:WORKFLOWS")
    assert ran.code == 0 and "[loan]: valid" in ran.out and "[plain]: valid" in ran.out, ran.err
    ran = await wfsub(loans, "graph", "typedflows:WORKFLOWS", "--name", "loan")
    assert ran.code == 0 and "decision" in ran.out, ran.err


async def test_the_command_says_what_it_waits_for_when_the_database_does_not_answer(here: Path) -> None:  # noqa: F811
    """Opening a Postgres store nobody answers for says on stderr, within a second or so, that the command waits
    for that database and for how long, then fails naming it (no silent wait that looks like a hang)."""
    import socket

    with socket.socket() as free:  # a port nothing listens on
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    url = f"postgresql://postgres@127.0.0.1:{port}/nothing?retry_for=1.5"
    ran = await wfsub(here, "cases", url)
    assert ran.code == 1, ran
    assert "waiting for" in ran.err and "1.5 s (retry_for=)" in ran.err, ran.err
    assert "could not be reached for 1.5 s" in ran.err, ran.err
